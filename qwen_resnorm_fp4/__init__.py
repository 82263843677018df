"""qwen-resnorm-fp4: gated residual + LayerNorm + adaLN modulation + NVFP4 quantization in one CUDA kernel.

Ops: ``torch.ops.qwen_fp4.resnorm_quant``, ``.resnorm``, ``.nvfp4_quantize`` and their out-variants
``.resnorm_quant_out``, ``.resnorm_out``, ``.nvfp4_quantize_out`` (CUDA kernels where built, the
pure-PyTorch reference on CPU). Typed wrappers: :func:`resnorm_quant`, :func:`resnorm`,
:func:`nvfp4_quantize`, :func:`dequantize_nvfp4`, :func:`resnorm_quant_out`, :func:`resnorm_out`,
:func:`nvfp4_quantize_out`. FP8 (E4M3): :func:`resnorm_quant_fp8`, :func:`fp8_quantize`, the no-residual
:func:`norm_modulate_quant` (NVFP4) and :func:`norm_modulate_quant_fp8`, and their out-variants.
"""

from . import ops  # defines the op schemas first
from . import _library

_library.load()  # then the CUDA kernels register for the CUDA key, if built

from .api import dequantize_nvfp4, nvfp4_quantize, resnorm, resnorm_quant  # noqa: E402
from .api import empty_quantize_outputs, empty_resnorm_outputs, empty_resnorm_quant_outputs  # noqa: E402
from .api import nvfp4_quantize_out, resnorm_out, resnorm_quant_out  # noqa: E402
from .api import check_fp8_input_scale, empty_resnorm_quant_fp8_outputs, fp8_quantize, fp8_quantize_out  # noqa: E402
from .api import norm_modulate_quant, norm_modulate_quant_fp8, norm_modulate_quant_fp8_out  # noqa: E402
from .api import resnorm_quant_fp8, resnorm_quant_fp8_out  # noqa: E402
from .layout import sf_offset_128x4  # noqa: E402
from . import recipe  # noqa: E402
from .recipe import NVFP44Over6Config  # noqa: E402
from .gemm import apply_nvfp4_gemm_prequantized  # noqa: E402
from .linear import NVFP4Linear  # noqa: E402
from .fused_path import DeclineReason, last_decline_detail, last_decline_reason, try_fused_resnorm_quant  # noqa: E402
from .linear_fp8 import FP8Linear  # noqa: E402
from .fused_path_fp8 import try_fused_resnorm_quant_fp8  # noqa: E402

try:
    from ._version import __version__  # written by setup.py
except ImportError:  # a source tree that was never built: no version of its own
    __version__ = "0+source"

__all__ = ["resnorm_quant", "resnorm", "nvfp4_quantize", "dequantize_nvfp4", "sf_offset_128x4", "__version__",
           "try_fused_resnorm_quant", "last_decline_reason", "last_decline_detail", "DeclineReason",
           "NVFP4Linear", "apply_nvfp4_gemm_prequantized", "NVFP44Over6Config", "recipe", "resnorm_quant_out",
           "resnorm_out", "nvfp4_quantize_out", "empty_resnorm_quant_outputs", "empty_resnorm_outputs",
           "empty_quantize_outputs",
           # FP8 (E4M3) output and the no-residual ops
           "resnorm_quant_fp8", "resnorm_quant_fp8_out", "fp8_quantize", "fp8_quantize_out", "norm_modulate_quant",
           "norm_modulate_quant_fp8", "norm_modulate_quant_fp8_out", "empty_resnorm_quant_fp8_outputs",
           "check_fp8_input_scale", "FP8Linear", "try_fused_resnorm_quant_fp8"]
