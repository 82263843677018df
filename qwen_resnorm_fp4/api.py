"""Typed, checked entry points over ``torch.ops.qwen_fp4``.

Every call checks its arguments first (the rules of :mod:`qwen_resnorm_fp4.validation`), raising TypeError
(wrong type or dtype) or ValueError (wrong shape, device or value) naming the argument, then calls the op
once; an error of the op itself reaches the caller as it is. Inputs are never modified. Non-contiguous or
misaligned inputs are copied (contiguous, 16-byte aligned) so that the kernels can use vector loads.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import reference
from .env import resolve_fast_math
from .recipe import UNSET, resolve_nvfp4_4over6
from .validation import dequantize_problem, quantize_problem, require, resnorm_problem, resnorm_quant_problem
from .validation import MAX_COLS, WIDTH_RULE, is_supported_width  # noqa: F401 - also importable from here

Tensor = torch.Tensor

# The ops' overloads, looked up once (ops.py defined the schemas before this module is imported); calling
# an overload skips the OpOverloadPacket's own dispatch.
_RESNORM_QUANT = torch.ops.qwen_fp4.resnorm_quant.default
_RESNORM = torch.ops.qwen_fp4.resnorm.default
_NVFP4_QUANTIZE = torch.ops.qwen_fp4.nvfp4_quantize.default

# Tensors that hold real data whenever they are not being traced (a Parameter made under FakeTensorMode has
# type FakeTensor, not Parameter).
_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def _has_data(t: Tensor) -> bool:
    """False for tensors without real memory (meta, FakeTensor, FunctionalTensor over a fake one), whose
    data_ptr() must not be read (torch warns, or raises under make_fx / FakeTensorMode)."""
    if t.device.type == "meta":
        return False
    try:
        from torch._subclasses.fake_tensor import is_fake
    except ImportError:  # pragma: no cover - torch without fake tensors
        return True
    return not is_fake(t)


def _aligned(t: Tensor) -> Tensor:
    """Contiguous and 16-byte aligned (a copy only when needed). Tensors without data (meta, fake) are only
    made contiguous: the CUDA op refuses a misaligned tensor at run time itself."""
    if not t.is_contiguous():
        t = t.contiguous()
    if type(t) in _PLAIN_TENSOR_TYPES or _has_data(t):  # the common case first: a plain tensor has data
        return t.clone() if t.data_ptr() & 15 else t
    return t


def _contiguous(t: Tensor) -> Tensor:
    """While tracing (torch.compile) alignment is unknowable: only contiguity."""
    return t.contiguous()


def _operand():
    """How tensor operands are prepared for the op: :func:`_aligned`, or :func:`_contiguous` while tracing."""
    return _contiguous if torch.compiler.is_compiling() else _aligned


def _resnorm_operands(residual, x, bias, gate, scale, shift, middle: tuple, weight, norm_bias,
                      modulate_index) -> tuple:
    """The resnorm / resnorm_quant op's arguments, tensors prepared by :func:`_operand`, with ``middle``
    (the op's arguments between shift and weight) in place."""
    op = _operand()
    return (op(residual), op(x), None if bias is None else op(bias), op(gate), op(scale), op(shift), *middle,
            None if weight is None else op(weight), None if norm_bias is None else op(norm_bias),
            None if modulate_index is None else op(modulate_index))


def _resnorm_quant_op(residual, x, bias, gate, scale, shift, global_scale, eps: float, fast_math: bool, weight,
                      norm_bias, modulate_index, nvfp4_4over6_code: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """The resnorm_quant op on arguments that passed the rules: operands prepared, the op called once."""
    return _RESNORM_QUANT(*_resnorm_operands(residual, x, bias, gate, scale, shift, (global_scale, eps, fast_math),
                                             weight, norm_bias, modulate_index), nvfp4_4over6_code)


def resnorm_quant(
    residual: Tensor,
    x: Tensor,
    bias: Optional[Tensor],
    gate: Tensor,
    scale: Tensor,
    shift: Tensor,
    global_scale: Tensor,
    eps: float = 1e-6,
    fast_math: Optional[bool] = None,
    *,
    weight: Optional[Tensor] = None,
    norm_bias: Optional[Tensor] = None,
    modulate_index: Optional[Tensor] = None,
    nvfp4_4over6: object = UNSET,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Gated residual update + LayerNorm + adaLN modulation + NVFP4 quantization, in one kernel.

    Args:
        residual, x: bf16 [..., D], D a multiple of 64 (at most 16384). M = x.numel() / D rows.
        gate, scale, shift: bf16 or fp32, [D] (shared), [B, D] (per batch: x's rows split into B equal
            groups, e.g. x of shape [B, S, D]) or [2B, D] with ``modulate_index``.
        global_scale: fp32 one-element tensor on x's device (the FC1 input global scale, 448*6/amax).
        bias: optional [D], added to x before the gate (a = bf16(x + bias)).
        eps: LayerNorm epsilon.
        fast_math: the production quantizer's fast mode; None follows FLASHINFER_/TRTLLM_DISABLE_FP4_QUANT_FAST_MATH.
        weight, norm_bias: optional affine LayerNorm parameters, [D].
        modulate_index: optional [B, S] (int32, int64 or bool); token (b, s) uses modulation row b where the
            index is 0 and row B + b elsewhere (diffusers' zero_cond_t).
        nvfp4_4over6: the block-scale recipe, as FlashInfer's fp4_quantize takes it: omitted, the
            FLASHINFER_NVFP4_4OVER6* environment; None, the standard recipe; an NVFP44Over6Config
            (qwen_resnorm_fp4.recipe's or FlashInfer's), that 4over6 recipe.

    Returns:
        packed: uint8 [M, D/2], two E2M1 codes a byte (even element in the low nibble);
        scales: uint8 [round_up(M, 128), D/16], E4M3 block scales in the 128x4 swizzled layout;
        residual_out: bf16 like x, the updated residual stream r = bf16(fma(a, gate, residual)).

    Bytes are identical to ``nvfp4_quantize(*resnorm(...))``.
    """
    fm = resolve_fast_math(fast_math)
    code = resolve_nvfp4_4over6(nvfp4_4over6)
    require(resnorm_quant_problem(residual, x, bias, gate, scale, shift, global_scale, eps, weight, norm_bias,
                                  modulate_index))
    return _resnorm_quant_op(residual, x, bias, gate, scale, shift, global_scale, float(eps), fm, weight, norm_bias,
                             modulate_index, code)


def resnorm(
    residual: Tensor,
    x: Tensor,
    bias: Optional[Tensor],
    gate: Tensor,
    scale: Tensor,
    shift: Tensor,
    eps: float = 1e-6,
    *,
    weight: Optional[Tensor] = None,
    norm_bias: Optional[Tensor] = None,
    modulate_index: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """The BF16 half of :func:`resnorm_quant`, same numerics: returns (y, residual_out), both bf16 like x.

    y = bf16(fma(LayerNorm(r), 1 + scale, shift)). Arguments as in :func:`resnorm_quant`.
    """
    require(resnorm_problem(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index))
    return _RESNORM(*_resnorm_operands(residual, x, bias, gate, scale, shift, (float(eps),), weight, norm_bias,
                                       modulate_index))


def nvfp4_quantize(y: Tensor, global_scale: Tensor, fast_math: Optional[bool] = None, *,
                   nvfp4_4over6: object = UNSET) -> Tuple[Tensor, Tensor]:
    """NVFP4-quantize bf16 ``y`` [..., D] with the production recipe (FlashInfer / TensorRT-LLM fp4_quantize,
    128x4 swizzled E4M3 scales). Returns (packed uint8 [M, D/2], scales uint8 [round_up(M, 128), D/16]).
    ``nvfp4_4over6`` as in :func:`resnorm_quant`."""
    fm = resolve_fast_math(fast_math)
    code = resolve_nvfp4_4over6(nvfp4_4over6)
    require(quantize_problem(y, global_scale))
    return _NVFP4_QUANTIZE(_operand()(y), global_scale, fm, code)


def dequantize_nvfp4(packed: Tensor, scales: Tensor, global_scale: Tensor, rows: Optional[int] = None) -> Tensor:
    """Back to fp32 [rows, D]: e2m1 * float(e4m3 scale) / global_scale. ``rows`` defaults to packed's rows."""
    problem, rows, _ = dequantize_problem(packed, scales, global_scale, rows)
    require(problem)
    return reference.dequantize_nvfp4(packed.contiguous(), scales.contiguous(), global_scale, rows)
