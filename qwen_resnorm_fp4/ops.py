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
from .validation import ROW_COLS_MULTIPLE

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
    # ---- FP8 (E4M3) output and the no-residual ops (docs/numerics.md, "FP8 (E4M3) output") ----
    # input_scale: ModelOpt's static FP8 input scale (amax / 448), one fp32 element on x's device. y is
    # float8_e4m3fn like x. The out-variants' optional y_bf16 receives the bf16 y as well (SGLang's
    # normalized output).
    "resnorm_quant_fp8": (
        "resnorm_quant_fp8(Tensor residual, Tensor x, Tensor? bias, Tensor gate, Tensor scale, Tensor shift, "
        "Tensor input_scale, float eps, Tensor? weight=None, Tensor? norm_bias=None, Tensor? modulate_index=None) "
        "-> (Tensor y, Tensor residual_out)"
    ),
    "resnorm_quant_fp8_out": (
        "resnorm_quant_fp8_out(Tensor residual, Tensor x, Tensor? bias, Tensor gate, Tensor scale, Tensor shift, "
        "Tensor input_scale, float eps, Tensor(a!) y, Tensor(b!) residual_out, Tensor? weight=None, "
        "Tensor? norm_bias=None, Tensor? modulate_index=None, Tensor(c!)? y_bf16=None) -> ()"
    ),
    # Element-wise, any shape: the FP8 input of a Linear that no norm produces (attention output, GELU output).
    "fp8_quantize": "fp8_quantize(Tensor y, Tensor input_scale) -> Tensor",
    "fp8_quantize_out": "fp8_quantize_out(Tensor y, Tensor input_scale, Tensor(a!) out) -> ()",
    # No residual update (a block's first norm): LayerNorm + modulation of x, then NVFP4 / FP8.
    "norm_modulate_quant": (
        "norm_modulate_quant(Tensor x, Tensor scale, Tensor shift, Tensor global_scale, float eps, bool fast_math, "
        "Tensor? weight=None, Tensor? norm_bias=None, Tensor? modulate_index=None, int nvfp4_4over6_code=0) "
        "-> (Tensor packed, Tensor scales)"
    ),
    "norm_modulate_quant_fp8": (
        "norm_modulate_quant_fp8(Tensor x, Tensor scale, Tensor shift, Tensor input_scale, float eps, "
        "Tensor? weight=None, Tensor? norm_bias=None, Tensor? modulate_index=None) -> Tensor"
    ),
    "norm_modulate_quant_fp8_out": (
        "norm_modulate_quant_fp8_out(Tensor x, Tensor scale, Tensor shift, Tensor input_scale, float eps, "
        "Tensor(a!) y, Tensor? weight=None, Tensor? norm_bias=None, Tensor? modulate_index=None, "
        "Tensor(b!)? y_bf16=None) -> ()"
    ),
    # The GPU's div.full.f32(1, x), element-wise on fp32: the FP8 ops' inverse scale, for the div.full probe.
    "_div_full_rcp": "_div_full_rcp(Tensor x) -> Tensor",
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
    require(resnorm_problem(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index,
                            cols_multiple=ROW_COLS_MULTIPLE))
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


# ---------------------------------------------------------------------------------------------------
# FP8 (E4M3) output and the no-residual ops: fakes and CPU implementations (the reference). The CPU
# implementations also apply input_scale's value rule (validation.input_scale_value_problem); the CUDA
# kernels apply it on the device (every byte 0x7F), since reading the value would sync.
# ---------------------------------------------------------------------------------------------------

from .validation import fp8_quantize_out_problem, fp8_quantize_problem, input_scale_value_problem  # noqa: E402
from .validation import norm_modulate_problem, norm_modulate_quant_fp8_out_problem  # noqa: E402
from .validation import norm_modulate_quant_fp8_problem, resnorm_quant_fp8_out_problem  # noqa: E402
from .validation import resnorm_quant_fp8_problem  # noqa: E402


def _fp8_like(t: Tensor) -> Tensor:
    return torch.empty(t.shape, dtype=torch.float8_e4m3fn, device=t.device)


@torch.library.register_fake(f"{NAMESPACE}::resnorm_quant_fp8")
def _resnorm_quant_fp8_fake(residual, x, bias, gate, scale, shift, input_scale, eps, weight=None, norm_bias=None,
                            modulate_index=None):
    return _fp8_like(x), torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake(f"{NAMESPACE}::resnorm_quant_fp8_out")
def _resnorm_quant_fp8_out_fake(residual, x, bias, gate, scale, shift, input_scale, eps, y, residual_out,
                                weight=None, norm_bias=None, modulate_index=None, y_bf16=None):
    require(resnorm_quant_fp8_out_problem(residual, x, bias, gate, scale, shift, input_scale, eps, y, residual_out,
                                          weight, norm_bias, modulate_index, y_bf16, memory=False))


@torch.library.register_fake(f"{NAMESPACE}::fp8_quantize")
def _fp8_quantize_fake(y, input_scale):
    return _fp8_like(y)


@torch.library.register_fake(f"{NAMESPACE}::fp8_quantize_out")
def _fp8_quantize_out_fake(y, input_scale, out):
    require(fp8_quantize_out_problem(y, input_scale, out, memory=False))


@torch.library.register_fake(f"{NAMESPACE}::norm_modulate_quant")
def _norm_modulate_quant_fake(x, scale, shift, global_scale, eps, fast_math, weight=None, norm_bias=None,
                              modulate_index=None, nvfp4_4over6_code=0):
    return _quant_shapes(x)


@torch.library.register_fake(f"{NAMESPACE}::norm_modulate_quant_fp8")
def _norm_modulate_quant_fp8_fake(x, scale, shift, input_scale, eps, weight=None, norm_bias=None,
                                  modulate_index=None):
    return _fp8_like(x)


@torch.library.register_fake(f"{NAMESPACE}::norm_modulate_quant_fp8_out")
def _norm_modulate_quant_fp8_out_fake(x, scale, shift, input_scale, eps, y, weight=None, norm_bias=None,
                                      modulate_index=None, y_bf16=None):
    require(norm_modulate_quant_fp8_out_problem(x, scale, shift, input_scale, eps, y, weight, norm_bias,
                                                modulate_index, y_bf16, memory=False))


@torch.library.register_fake(f"{NAMESPACE}::_div_full_rcp")
def _div_full_rcp_fake(x):
    return torch.empty_like(x)


@torch.library.impl(f"{NAMESPACE}::resnorm_quant_fp8", "CPU", lib=_lib)
def _resnorm_quant_fp8_cpu(residual, x, bias, gate, scale, shift, input_scale, eps, weight=None, norm_bias=None,
                           modulate_index=None):
    require(resnorm_quant_fp8_problem(residual, x, bias, gate, scale, shift, input_scale, eps, weight, norm_bias,
                                      modulate_index) or input_scale_value_problem(input_scale))
    return reference.resnorm_quant_fp8(residual, x, bias, gate, scale, shift, input_scale, eps, weight, norm_bias,
                                       modulate_index)


@torch.library.impl(f"{NAMESPACE}::resnorm_quant_fp8_out", "CPU", lib=_lib)
def _resnorm_quant_fp8_out_cpu(residual, x, bias, gate, scale, shift, input_scale, eps, y, residual_out,
                               weight=None, norm_bias=None, modulate_index=None, y_bf16=None):
    require(resnorm_quant_fp8_out_problem(residual, x, bias, gate, scale, shift, input_scale, eps, y, residual_out,
                                          weight, norm_bias, modulate_index, y_bf16, memory=True)
            or input_scale_value_problem(input_scale))
    y_ref, r = reference.resnorm(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index)
    y.copy_(reference.fp8_quantize(y_ref, input_scale))  # every input read: residual_out may be residual
    residual_out.copy_(r)
    if y_bf16 is not None:
        y_bf16.copy_(y_ref)


@torch.library.impl(f"{NAMESPACE}::fp8_quantize", "CPU", lib=_lib)
def _fp8_quantize_cpu(y, input_scale):
    require(fp8_quantize_problem(y, input_scale) or input_scale_value_problem(input_scale))
    return reference.fp8_quantize(y, input_scale)


@torch.library.impl(f"{NAMESPACE}::fp8_quantize_out", "CPU", lib=_lib)
def _fp8_quantize_out_cpu(y, input_scale, out):
    require(fp8_quantize_out_problem(y, input_scale, out, memory=True) or input_scale_value_problem(input_scale))
    out.copy_(reference.fp8_quantize(y, input_scale))


@torch.library.impl(f"{NAMESPACE}::norm_modulate_quant", "CPU", lib=_lib)
def _norm_modulate_quant_cpu(x, scale, shift, global_scale, eps, fast_math, weight=None, norm_bias=None,
                             modulate_index=None, nvfp4_4over6_code=0):
    require(norm_modulate_problem(x, scale, shift, eps, weight, norm_bias, modulate_index, global_scale)
            or nvfp4_4over6_code_problem(nvfp4_4over6_code))
    return reference.norm_modulate_quant(x, scale, shift, global_scale, eps, fast_math, weight, norm_bias,
                                         modulate_index, nvfp4_4over6_code=nvfp4_4over6_code)


@torch.library.impl(f"{NAMESPACE}::norm_modulate_quant_fp8", "CPU", lib=_lib)
def _norm_modulate_quant_fp8_cpu(x, scale, shift, input_scale, eps, weight=None, norm_bias=None,
                                 modulate_index=None):
    require(norm_modulate_quant_fp8_problem(x, scale, shift, input_scale, eps, weight, norm_bias, modulate_index)
            or input_scale_value_problem(input_scale))
    return reference.norm_modulate_quant_fp8(x, scale, shift, input_scale, eps, weight, norm_bias, modulate_index)


@torch.library.impl(f"{NAMESPACE}::norm_modulate_quant_fp8_out", "CPU", lib=_lib)
def _norm_modulate_quant_fp8_out_cpu(x, scale, shift, input_scale, eps, y, weight=None, norm_bias=None,
                                     modulate_index=None, y_bf16=None):
    require(norm_modulate_quant_fp8_out_problem(x, scale, shift, input_scale, eps, y, weight, norm_bias,
                                                modulate_index, y_bf16, memory=True)
            or input_scale_value_problem(input_scale))
    y_ref = reference.norm_modulate(x, scale, shift, eps, weight, norm_bias, modulate_index)
    y.copy_(reference.fp8_quantize(y_ref, input_scale))
    if y_bf16 is not None:
        y_bf16.copy_(y_ref)


def gpu_div_full_rcp(x: Tensor) -> Tensor:
    """The GPU's div.full.f32(1, x) of an fp32 CUDA tensor: the FP8 ops' inverse scale."""
    return torch.ops.qwen_fp4._div_full_rcp(x.float().contiguous())
