"""The ``qwen_fp4`` op library: the schemas (defined once, here), their fake implementations, their Python
implementations, and the compiled CUDA kernels.

Every op's Python implementation is its rules (validation.py: TypeError / ValueError naming the argument,
nothing written on bad input), then the reference (reference.py, which reads any strides). It serves CPU
tensors, and CUDA tensors too where the compiled library does not (a source tree that was never built), so
every op runs on every device and no caller chooses between a kernel and the reference. The fakes apply the
same static rules, so torch.compile refuses bad arguments when it traces. The compiled library
(_library.py, loaded below once the schemas exist) registers the CUDA kernels, whose own checks
(csrc/ops.cpp) hold for raw calls.
"""

from __future__ import annotations

from typing import Tuple

import torch

from . import _library, reference
from .layout import round_up
from .validation import dequantize_bf16_problem, quantize_out_problem, quantize_problem, require
from .validation import resnorm_out_problem, resnorm_problem, resnorm_quant_out_problem, resnorm_quant_problem
from .validation import fp8_quantize_out_problem, fp8_quantize_problem, input_scale_value_problem
from .validation import norm_modulate_quant_fp8_out_problem, norm_modulate_quant_fp8_problem
from .validation import norm_modulate_quant_problem, resnorm_quant_fp8_out_problem, resnorm_quant_fp8_problem

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
    # The same quantization of GELU(tanh)(y) rounded to bf16 (PyTorch's CUDA GELU bit for bit): the FFN's
    # second Linear input from its first Linear's bf16 output, one pass.
    "gelu_tanh_fp8_quantize": "gelu_tanh_fp8_quantize(Tensor y, Tensor input_scale) -> Tensor",
    "gelu_tanh_fp8_quantize_out": "gelu_tanh_fp8_quantize_out(Tensor y, Tensor input_scale, Tensor(a!) out) -> ()",
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
    # The compiled kernels' launch switches (kernel path: 0 auto, 1 portable, 2 blackwell; PDL), set by
    # qwen_resnorm_fp4.launch only: implemented by the compiled library alone.
    "_set_launch_options": "_set_launch_options(int kernel_path, bool pdl) -> ()",
}

_lib = torch.library.Library(NAMESPACE, "DEF")
for _schema in SCHEMAS.values():
    _lib.define(_schema)


# ---------------------------------------------------------------------------------------------------
# Fakes: the static rules, then outputs of the right shapes (the out-variants write nothing, return nothing)
# ---------------------------------------------------------------------------------------------------


def _quant_shapes(like: Tensor) -> Tuple[Tensor, Tensor]:
    d = like.shape[-1]
    rows = like.numel() // d
    packed = like.new_empty((rows, d // 2), dtype=torch.uint8)
    scales = like.new_empty((round_up(rows, 128), d // 16), dtype=torch.uint8)
    return packed, scales


def _like_x(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fp8_like(t: Tensor) -> Tensor:
    return torch.empty(t.shape, dtype=torch.float8_e4m3fn, device=t.device)


@torch.library.register_fake(f"{NAMESPACE}::resnorm_quant")
def _resnorm_quant_fake(residual, x, *rest):
    require(resnorm_quant_problem(residual, x, *rest))
    return (*_quant_shapes(x), _like_x(x))


@torch.library.register_fake(f"{NAMESPACE}::resnorm")
def _resnorm_fake(residual, x, *rest):
    require(resnorm_problem(residual, x, *rest))
    return _like_x(x), _like_x(x)


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_quantize")
def _nvfp4_quantize_fake(y, *rest):
    require(quantize_problem(y, *rest))
    return _quant_shapes(y)


@torch.library.register_fake(f"{NAMESPACE}::resnorm_quant_fp8")
def _resnorm_quant_fp8_fake(residual, x, *rest):
    require(resnorm_quant_fp8_problem(residual, x, *rest))
    return _fp8_like(x), _like_x(x)


def _elementwise_fp8_fake(y, input_scale):
    require(fp8_quantize_problem(y, input_scale))
    return _fp8_like(y)


for _name in ("fp8_quantize", "gelu_tanh_fp8_quantize"):  # element-wise: the same rules and output
    torch.library.register_fake(f"{NAMESPACE}::{_name}")(_elementwise_fp8_fake)


@torch.library.register_fake(f"{NAMESPACE}::norm_modulate_quant")
def _norm_modulate_quant_fake(x, *rest):
    require(norm_modulate_quant_problem(x, *rest))
    return _quant_shapes(x)


@torch.library.register_fake(f"{NAMESPACE}::norm_modulate_quant_fp8")
def _norm_modulate_quant_fp8_fake(x, *rest):
    require(norm_modulate_quant_fp8_problem(x, *rest))
    return _fp8_like(x)


# The out-variants' fakes: their rules without the memory ones (fake tensors have no data), nothing written.
OUT_VARIANT_RULES = {
    "resnorm_quant_out": resnorm_quant_out_problem,
    "resnorm_out": resnorm_out_problem,
    "nvfp4_quantize_out": quantize_out_problem,
    "resnorm_quant_fp8_out": resnorm_quant_fp8_out_problem,
    "fp8_quantize_out": fp8_quantize_out_problem,
    "gelu_tanh_fp8_quantize_out": fp8_quantize_out_problem,
    "norm_modulate_quant_fp8_out": norm_modulate_quant_fp8_out_problem,
}


def _out_variant_fake(rules):
    def fake(*args):
        require(rules(*args, memory=False))
    return fake


for _name, _rules in OUT_VARIANT_RULES.items():
    torch.library.register_fake(f"{NAMESPACE}::{_name}")(_out_variant_fake(_rules))


@torch.library.register_fake(f"{NAMESPACE}::nvfp4_dequantize_bf16")
def _nvfp4_dequantize_bf16_fake(packed, scales):
    require(dequantize_bf16_problem(packed, scales))
    return packed.new_empty((packed.shape[0], packed.shape[1] * 2), dtype=torch.bfloat16)


# ---------------------------------------------------------------------------------------------------
# The Python implementations: the rules (the memory rules too: these tensors have data), then the reference.
# An out-variant's reference has read every input before the first copy, so residual_out may be residual.
# ---------------------------------------------------------------------------------------------------


def _resnorm_quant(*args):
    require(resnorm_quant_problem(*args))
    return reference.resnorm_quant(*args)


def _resnorm(*args):
    require(resnorm_problem(*args))
    return reference.resnorm(*args)


def _nvfp4_quantize(*args):
    require(quantize_problem(*args))
    return reference.nvfp4_quantize(*args)


def _write_quantized(packed: Tensor, scales: Tensor, result: Tuple[Tensor, Tensor]) -> None:
    """Copies a quantization's (packed, scales) bytes into the caller's outputs (scales may be float8_e4m3fn:
    its bytes, not a conversion)."""
    packed.copy_(result[0])
    scales.view(torch.uint8).copy_(result[1])


def _resnorm_quant_out(residual, x, bias, gate, scale, shift, global_scale, eps, fast_math, packed, scales,
                       residual_out, weight=None, norm_bias=None, modulate_index=None, nvfp4_4over6_code=0):
    require(resnorm_quant_out_problem(residual, x, bias, gate, scale, shift, global_scale, eps, fast_math, packed,
                                      scales, residual_out, weight, norm_bias, modulate_index, nvfp4_4over6_code,
                                      memory=True))
    *quantized, r = reference.resnorm_quant(residual, x, bias, gate, scale, shift, global_scale, eps, fast_math,
                                            weight, norm_bias, modulate_index, nvfp4_4over6_code)
    _write_quantized(packed, scales, quantized)
    residual_out.copy_(r)


def _resnorm_out(residual, x, bias, gate, scale, shift, eps, y, residual_out, weight=None, norm_bias=None,
                 modulate_index=None):
    require(resnorm_out_problem(residual, x, bias, gate, scale, shift, eps, y, residual_out, weight, norm_bias,
                                modulate_index, memory=True))
    y_ref, r = reference.resnorm(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index)
    y.copy_(y_ref)
    residual_out.copy_(r)


def _nvfp4_quantize_out(y, global_scale, fast_math, packed, scales, nvfp4_4over6_code=0):
    require(quantize_out_problem(y, global_scale, fast_math, packed, scales, nvfp4_4over6_code, memory=True))
    _write_quantized(packed, scales, reference.nvfp4_quantize(y, global_scale, fast_math, nvfp4_4over6_code))


def _nvfp4_dequantize_bf16(packed, scales):
    require(dequantize_bf16_problem(packed, scales))
    return reference.nvfp4_dequantize_bf16(packed, scales)


# The FP8 ops' Python implementations also apply input_scale's value rule (it reads the value: the CUDA
# kernels apply it on the device instead, every output byte 0x7F).


def _resnorm_quant_fp8(residual, x, bias, gate, scale, shift, input_scale, *rest):
    require(resnorm_quant_fp8_problem(residual, x, bias, gate, scale, shift, input_scale, *rest)
            or input_scale_value_problem(input_scale))
    return reference.resnorm_quant_fp8(residual, x, bias, gate, scale, shift, input_scale, *rest)


def _resnorm_quant_fp8_out(residual, x, bias, gate, scale, shift, input_scale, eps, y, residual_out, weight=None,
                           norm_bias=None, modulate_index=None, y_bf16=None):
    require(resnorm_quant_fp8_out_problem(residual, x, bias, gate, scale, shift, input_scale, eps, y, residual_out,
                                          weight, norm_bias, modulate_index, y_bf16, memory=True)
            or input_scale_value_problem(input_scale))
    y_ref, r = reference.resnorm(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index)
    y.copy_(reference.fp8_quantize(y_ref, input_scale))
    residual_out.copy_(r)
    if y_bf16 is not None:
        y_bf16.copy_(y_ref)


def _elementwise_fp8(numerics):
    """The Python implementations (functional, out-variant) of an element-wise FP8 op whose bytes are
    ``numerics(y, input_scale)``: fp8_quantize's rules, then the reference."""
    def functional(y, input_scale):
        require(fp8_quantize_problem(y, input_scale) or input_scale_value_problem(input_scale))
        return numerics(y, input_scale)

    def out_variant(y, input_scale, out):
        require(fp8_quantize_out_problem(y, input_scale, out, memory=True) or input_scale_value_problem(input_scale))
        out.copy_(numerics(y, input_scale))

    return functional, out_variant


_fp8_quantize, _fp8_quantize_out = _elementwise_fp8(reference.fp8_quantize)
_gelu_tanh_fp8_quantize, _gelu_tanh_fp8_quantize_out = _elementwise_fp8(reference.gelu_tanh_fp8_quantize)


def _norm_modulate_quant(*args):
    require(norm_modulate_quant_problem(*args))
    return reference.norm_modulate_quant(*args)


def _norm_modulate_quant_fp8(x, scale, shift, input_scale, *rest):
    require(norm_modulate_quant_fp8_problem(x, scale, shift, input_scale, *rest)
            or input_scale_value_problem(input_scale))
    return reference.norm_modulate_quant_fp8(x, scale, shift, input_scale, *rest)


def _norm_modulate_quant_fp8_out(x, scale, shift, input_scale, eps, y, weight=None, norm_bias=None,
                                 modulate_index=None, y_bf16=None):
    require(norm_modulate_quant_fp8_out_problem(x, scale, shift, input_scale, eps, y, weight, norm_bias,
                                                modulate_index, y_bf16, memory=True)
            or input_scale_value_problem(input_scale))
    y_ref = reference.norm_modulate(x, scale, shift, eps, weight, norm_bias, modulate_index)
    y.copy_(reference.fp8_quantize(y_ref, input_scale))
    if y_bf16 is not None:
        y_bf16.copy_(y_ref)


PYTHON_IMPLEMENTATIONS = {
    "resnorm_quant": _resnorm_quant,
    "resnorm": _resnorm,
    "nvfp4_quantize": _nvfp4_quantize,
    "resnorm_quant_out": _resnorm_quant_out,
    "resnorm_out": _resnorm_out,
    "nvfp4_quantize_out": _nvfp4_quantize_out,
    "nvfp4_dequantize_bf16": _nvfp4_dequantize_bf16,
    "resnorm_quant_fp8": _resnorm_quant_fp8,
    "resnorm_quant_fp8_out": _resnorm_quant_fp8_out,
    "fp8_quantize": _fp8_quantize,
    "fp8_quantize_out": _fp8_quantize_out,
    "gelu_tanh_fp8_quantize": _gelu_tanh_fp8_quantize,
    "gelu_tanh_fp8_quantize_out": _gelu_tanh_fp8_quantize_out,
    "norm_modulate_quant": _norm_modulate_quant,
    "norm_modulate_quant_fp8": _norm_modulate_quant_fp8,
    "norm_modulate_quant_fp8_out": _norm_modulate_quant_fp8_out,
}

_library.load()
for _name, _impl in PYTHON_IMPLEMENTATIONS.items():
    _lib.impl(_name, _impl, "CPU")
    if not _library.has_kernel(_name, "cuda"):  # no compiled library: the reference serves CUDA tensors too
        _lib.impl(_name, _impl, "CUDA")
