"""The ``qwen_fp4`` op schemas (defined once, here), their fake implementations and their CPU
implementations (the pure-PyTorch reference). The CUDA implementations live in csrc/ and register
themselves for the CUDA dispatch key when the compiled library is loaded (after this module).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import reference
from .layout import round_up
from .validation import nvfp4_4over6_code_problem, quantize_out_problem, quantize_problem, require
from .validation import resnorm_out_problem, resnorm_problem, resnorm_quant_out_problem, resnorm_quant_problem

Tensor = torch.Tensor

NAMESPACE = "qwen_fp4"

SCHEMAS = {
    "resnorm_quant": (
        "resnorm_quant(Tensor residual, Tensor x, Tensor? bias, Tensor gate, Tensor scale, Tensor shift, "
        "Tensor global_scale, float eps, bool fast_math, Tensor? weight=None, Tensor? norm_bias=None, "
        "Tensor? modulate_index=None, int nvfp4_4over6_code=0) -> (Tensor packed, Tensor scales, Tensor residual_out)"
    ),
    "resnorm": (
        "resnorm(Tensor residual, Tensor x, Tensor? bias, Tensor gate, Tensor scale, Tensor shift, float eps, "
        "Tensor? weight=None, Tensor? norm_bias=None, Tensor? modulate_index=None) -> (Tensor y, Tensor residual_out)"
    ),
    # nvfp4_4over6_code: the block-scale recipe, 0 (standard) or FlashInfer's packing of NVFP44Over6Config
    # (qwen_resnorm_fp4/recipe.py); the same last argument in resnorm_quant.
    "nvfp4_quantize": (
        "nvfp4_quantize(Tensor y, Tensor global_scale, bool fast_math, int nvfp4_4over6_code=0) "
        "-> (Tensor packed, Tensor scales)"
    ),
    # The out-variants: the same ops writing into caller-provided outputs (the functional ops' outputs, in
    # their order, after the functional ops' required arguments). residual_out may be residual itself.
    "resnorm_quant_out": (
        "resnorm_quant_out(Tensor residual, Tensor x, Tensor? bias, Tensor gate, Tensor scale, Tensor shift, "
        "Tensor global_scale, float eps, bool fast_math, Tensor(a!) packed, Tensor(b!) scales, "
        "Tensor(c!) residual_out, Tensor? weight=None, Tensor? norm_bias=None, Tensor? modulate_index=None, "
        "int nvfp4_4over6_code=0) -> ()"
    ),
    "resnorm_out": (
        "resnorm_out(Tensor residual, Tensor x, Tensor? bias, Tensor gate, Tensor scale, Tensor shift, float eps, "
        "Tensor(a!) y, Tensor(b!) residual_out, Tensor? weight=None, Tensor? norm_bias=None, "
        "Tensor? modulate_index=None) -> ()"
    ),
    "nvfp4_quantize_out": (
        "nvfp4_quantize_out(Tensor y, Tensor global_scale, bool fast_math, Tensor(a!) packed, Tensor(b!) scales, "
        "int nvfp4_4over6_code=0) -> ()"
    ),
    # The GPU's rcp.approx.ftz.f32, element-wise on fp32: lets the reference reproduce fast mode exactly.
    "_rcp_approx": "_rcp_approx(Tensor x) -> Tensor",
    # E2M1 codes of fp32 values by the kernels' conversion, or (toolkit=True) by cuda_fp4.h: for tests.
    "_e2m1_codes": "_e2m1_codes(Tensor x, bool toolkit) -> Tensor",
    # NVFP4 -> bf16 [rows, K] of e2m1 * e4m3 block scale (no global scale): exact, the tensor-core GEMM's operand.
    "nvfp4_dequantize_bf16": "nvfp4_dequantize_bf16(Tensor packed, Tensor scales) -> Tensor",
}

_lib = torch.library.Library(NAMESPACE, "DEF")
for _schema in SCHEMAS.values():
    _lib.define(_schema)


def _quant_shapes(like: Tensor) -> Tuple[Tensor, Tensor]:
    d = like.shape[-1]
    rows = like.numel() // d
    packed = like.new_empty((rows, d // 2), dtype=torch.uint8)
    scales = like.new_empty((round_up(rows, 128), d // 16), dtype=torch.uint8)
    return packed, scales


@torch.library.register_fake(f"{NAMESPACE}::resnorm_quant")
def _resnorm_quant_fake(residual, x, bias, gate, scale, shift, global_scale, eps, fast_math,
                        weight=None, norm_bias=None, modulate_index=None, nvfp4_4over6_code=0):
    packed, scales = _quant_shapes(x)
    return packed, scales, torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake(f"{NAMESPACE}::resnorm")
def _resnorm_fake(residual, x, bias, gate, scale, shift, eps, weight=None, norm_bias=None, modulate_index=None):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format))


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_quantize")
def _nvfp4_quantize_fake(y, global_scale, fast_math, nvfp4_4over6_code=0):
    return _quant_shapes(y)


# The out-variants' fakes write nothing and return nothing; they check the static rules (shapes, dtypes,
# devices, contiguity), so a traced call with wrong outputs fails when traced, not when run.
@torch.library.register_fake(f"{NAMESPACE}::resnorm_quant_out")
def _resnorm_quant_out_fake(residual, x, bias, gate, scale, shift, global_scale, eps, fast_math, packed, scales,
                            residual_out, weight=None, norm_bias=None, modulate_index=None, nvfp4_4over6_code=0):
    require(resnorm_quant_out_problem(residual, x, bias, gate, scale, shift, global_scale, eps, packed, scales,
                                      residual_out, weight, norm_bias, modulate_index, nvfp4_4over6_code,
                                      memory=False))


@torch.library.register_fake(f"{NAMESPACE}::resnorm_out")
def _resnorm_out_fake(residual, x, bias, gate, scale, shift, eps, y, residual_out, weight=None, norm_bias=None,
                      modulate_index=None):
    require(resnorm_out_problem(residual, x, bias, gate, scale, shift, eps, y, residual_out, weight, norm_bias,
                                modulate_index, memory=False))


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_quantize_out")
def _nvfp4_quantize_out_fake(y, global_scale, fast_math, packed, scales, nvfp4_4over6_code=0):
    require(quantize_out_problem(y, global_scale, packed, scales, nvfp4_4over6_code, memory=False))


@torch.library.register_fake(f"{NAMESPACE}::_rcp_approx")
def _rcp_approx_fake(x):
    return torch.empty_like(x)


@torch.library.register_fake(f"{NAMESPACE}::_e2m1_codes")
def _e2m1_codes_fake(x, toolkit):
    return torch.empty_like(x, dtype=torch.uint8)


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_dequantize_bf16")
def _nvfp4_dequantize_bf16_fake(packed, scales):
    return packed.new_empty((packed.shape[0], packed.shape[1] * 2), dtype=torch.bfloat16)


# CPU: the reference is the implementation, behind the typed wrappers' rules (validation.py: TypeError /
# ValueError naming the argument), so a raw torch.ops.qwen_fp4.* call on CPU refuses bad dtypes, shapes,
# devices and eps as the CUDA implementation does. Unlike the CUDA implementation it accepts non-contiguous
# and misaligned tensors (the reference reads any strides).
@torch.library.impl(f"{NAMESPACE}::resnorm_quant", "CPU", lib=_lib)
def _resnorm_quant_cpu(residual, x, bias, gate, scale, shift, global_scale, eps, fast_math,
                       weight=None, norm_bias=None, modulate_index=None, nvfp4_4over6_code=0):
    require(resnorm_quant_problem(residual, x, bias, gate, scale, shift, global_scale, eps, weight, norm_bias,
                                  modulate_index) or nvfp4_4over6_code_problem(nvfp4_4over6_code))
    return reference.resnorm_quant(residual, x, bias, gate, scale, shift, global_scale, eps, fast_math,
                                   weight, norm_bias, modulate_index, nvfp4_4over6_code=nvfp4_4over6_code)


@torch.library.impl(f"{NAMESPACE}::resnorm", "CPU", lib=_lib)
def _resnorm_cpu(residual, x, bias, gate, scale, shift, eps, weight=None, norm_bias=None, modulate_index=None):
    require(resnorm_problem(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index))
    return reference.resnorm(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index)


@torch.library.impl(f"{NAMESPACE}::nvfp4_quantize", "CPU", lib=_lib)
def _nvfp4_quantize_cpu(y, global_scale, fast_math, nvfp4_4over6_code=0):
    require(quantize_problem(y, global_scale) or nvfp4_4over6_code_problem(nvfp4_4over6_code))
    return reference.nvfp4_quantize(y, global_scale, fast_math, nvfp4_4over6_code=nvfp4_4over6_code)


def _write_quantized(packed: Tensor, scales: Tensor, result: Tuple[Tensor, Tensor]) -> None:
    """Copies a quantization's (packed, scales) bytes into the caller's outputs (scales may be float8_e4m3fn:
    its bytes, not a conversion)."""
    packed.copy_(result[0])
    scales.view(torch.uint8).copy_(result[1])


# The out-variants on CPU: the rules (the memory rules too: these tensors have data), the reference, then
# the copies into the outputs; the reference has read every input before the first copy, so residual_out
# may be residual.
@torch.library.impl(f"{NAMESPACE}::resnorm_quant_out", "CPU", lib=_lib)
def _resnorm_quant_out_cpu(residual, x, bias, gate, scale, shift, global_scale, eps, fast_math, packed, scales,
                           residual_out, weight=None, norm_bias=None, modulate_index=None, nvfp4_4over6_code=0):
    require(resnorm_quant_out_problem(residual, x, bias, gate, scale, shift, global_scale, eps, packed, scales,
                                      residual_out, weight, norm_bias, modulate_index, nvfp4_4over6_code,
                                      memory=True))
    *quantized, r = reference.resnorm_quant(residual, x, bias, gate, scale, shift, global_scale, eps, fast_math,
                                            weight, norm_bias, modulate_index, nvfp4_4over6_code=nvfp4_4over6_code)
    _write_quantized(packed, scales, quantized)
    residual_out.copy_(r)


@torch.library.impl(f"{NAMESPACE}::resnorm_out", "CPU", lib=_lib)
def _resnorm_out_cpu(residual, x, bias, gate, scale, shift, eps, y, residual_out, weight=None, norm_bias=None,
                     modulate_index=None):
    require(resnorm_out_problem(residual, x, bias, gate, scale, shift, eps, y, residual_out, weight, norm_bias,
                                modulate_index, memory=True))
    y_ref, r = reference.resnorm(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index)
    y.copy_(y_ref)
    residual_out.copy_(r)


@torch.library.impl(f"{NAMESPACE}::nvfp4_quantize_out", "CPU", lib=_lib)
def _nvfp4_quantize_out_cpu(y, global_scale, fast_math, packed, scales, nvfp4_4over6_code=0):
    require(quantize_out_problem(y, global_scale, packed, scales, nvfp4_4over6_code, memory=True))
    _write_quantized(packed, scales, reference.nvfp4_quantize(y, global_scale, fast_math,
                                                           nvfp4_4over6_code=nvfp4_4over6_code))


@torch.library.impl(f"{NAMESPACE}::nvfp4_dequantize_bf16", "CPU", lib=_lib)
def _nvfp4_dequantize_bf16_cpu(packed, scales):
    from .gemm import check_dequantize_args, dequantize_to_bf16_reference

    check_dequantize_args(packed, scales)
    return dequantize_to_bf16_reference(packed, scales)


def gpu_rcp(x: Tensor) -> Tensor:
    """The GPU's approximate reciprocal (rcp.approx.ftz.f32) of an fp32 CUDA tensor."""
    return torch.ops.qwen_fp4._rcp_approx(x.float().contiguous())


def reference_rcp_for(device: torch.device) -> Optional[callable]:
    """The reciprocal that makes the reference's fast mode byte-exact on ``device`` (None: IEEE 1/x)."""
    return gpu_rcp if torch.device(device).type == "cuda" else None
