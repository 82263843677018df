"""qwen_resnorm_fp4: gated residual + LayerNorm + adaLN modulation + NVFP4 or FP8 quantization in one CUDA kernel.

The ops are ``torch.ops.qwen_fp4.*``, one entry each in the op table (:data:`qwen_resnorm_fp4.ops.OPS`: CUDA
kernels where built, the pure-PyTorch reference on CPU); their typed wrappers (:mod:`qwen_resnorm_fp4.api`)
are exported here, with the fused-path gates, the NVFP4 and FP8 Linear layers, the NVFP4 GEMM and the launch
switches of the CUDA kernels (:func:`set_launch_options`).
"""

from . import api, recipe
from .api import *  # noqa: F401,F403 - the typed wrappers, api.__all__
from ._fused_common import Decline
from .fused_path import DeclineReason, last_decline_detail, last_decline_reason, try_fused_resnorm_quant
from .fused_path import serve_fused_resnorm_quant
from .fused_path_fp8 import try_fused_gelu_tanh_fp8_quantize, try_fused_norm_modulate_quant_fp8
from .fused_path_fp8 import try_fused_resnorm_quant_fp8
from .fused_path_fp8 import serve_fused_gelu_tanh_fp8_quantize, serve_fused_norm_modulate_quant_fp8
from .fused_path_fp8 import serve_fused_resnorm_quant_fp8
from .gemm import apply_nvfp4_gemm_prequantized
from .launch import LaunchOptions, launch_options, set_launch_options
from .layout import sf_offset_128x4
from .linear import NVFP4Linear
from .linear_fp8 import FP8Linear
from .recipe import NVFP44Over6Config

from .info import package_version

__version__ = package_version()

__all__ = [*api.__all__, "sf_offset_128x4", "__version__", "try_fused_resnorm_quant", "last_decline_reason",
           "last_decline_detail", "DeclineReason", "NVFP4Linear", "apply_nvfp4_gemm_prequantized", "NVFP44Over6Config",
           "recipe", "set_launch_options", "launch_options", "LaunchOptions", "FP8Linear",
           "try_fused_resnorm_quant_fp8", "try_fused_norm_modulate_quant_fp8", "try_fused_gelu_tanh_fp8_quantize",
           # the gates that return their Decline (compile-safe reasons, kept by the call site)
           "Decline", "serve_fused_resnorm_quant", "serve_fused_resnorm_quant_fp8",
           "serve_fused_norm_modulate_quant_fp8", "serve_fused_gelu_tanh_fp8_quantize"]
