"""qwen-resnorm-fp4: gated residual + LayerNorm + adaLN modulation + NVFP4 quantization in one CUDA kernel.

Ops: ``torch.ops.qwen_fp4.resnorm_quant``, ``.resnorm``, ``.nvfp4_quantize`` and their out-variants
``.resnorm_quant_out``, ``.resnorm_out``, ``.nvfp4_quantize_out`` (CUDA kernels where built, the
pure-PyTorch reference on CPU). Typed wrappers: :func:`resnorm_quant`, :func:`resnorm`,
:func:`nvfp4_quantize`, :func:`dequantize_nvfp4`, :func:`resnorm_quant_out`, :func:`resnorm_out`,
:func:`nvfp4_quantize_out`. FP8 (E4M3): :func:`resnorm_quant_fp8`, :func:`fp8_quantize`, :func:`gelu_tanh_fp8_quantize`, the no-residual
:func:`norm_modulate_quant` (NVFP4) and :func:`norm_modulate_quant_fp8`, their out-variants, and
:class:`FP8Linear`. Launch switches of the CUDA kernels: :func:`set_launch_options`.
"""

from . import recipe
from .api import dequantize_nvfp4, nvfp4_quantize, resnorm, resnorm_quant
from .api import empty_quantize_outputs, empty_resnorm_outputs, empty_resnorm_quant_outputs
from .api import nvfp4_quantize_out, resnorm_out, resnorm_quant_out
from .api import check_fp8_input_scale, empty_resnorm_quant_fp8_outputs, fp8_quantize, fp8_quantize_out
from .api import gelu_tanh_fp8_quantize, gelu_tanh_fp8_quantize_out
from .api import norm_modulate_quant, norm_modulate_quant_fp8, norm_modulate_quant_fp8_out
from .api import resnorm_quant_fp8, resnorm_quant_fp8_out
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

__all__ = ["resnorm_quant", "resnorm", "nvfp4_quantize", "dequantize_nvfp4", "sf_offset_128x4", "__version__",
           "try_fused_resnorm_quant", "last_decline_reason", "last_decline_detail", "DeclineReason",
           "NVFP4Linear", "apply_nvfp4_gemm_prequantized", "NVFP44Over6Config", "recipe", "resnorm_quant_out",
           "resnorm_out", "nvfp4_quantize_out", "empty_resnorm_quant_outputs", "empty_resnorm_outputs",
           "empty_quantize_outputs", "set_launch_options", "launch_options", "LaunchOptions",
           # FP8 (E4M3) output and the no-residual ops
           "resnorm_quant_fp8", "resnorm_quant_fp8_out", "fp8_quantize", "fp8_quantize_out", "norm_modulate_quant",
           "norm_modulate_quant_fp8", "norm_modulate_quant_fp8_out", "empty_resnorm_quant_fp8_outputs",
           "check_fp8_input_scale", "FP8Linear", "try_fused_resnorm_quant_fp8", "gelu_tanh_fp8_quantize",
           "gelu_tanh_fp8_quantize_out", "try_fused_norm_modulate_quant_fp8", "try_fused_gelu_tanh_fp8_quantize",
           # the gates that return their Decline (compile-safe reasons, kept by the call site)
           "Decline", "serve_fused_resnorm_quant", "serve_fused_resnorm_quant_fp8",
           "serve_fused_norm_modulate_quant_fp8", "serve_fused_gelu_tanh_fp8_quantize"]
