"""Typed, checked entry points over ``torch.ops.qwen_fp4``.

Every call checks its arguments first (the rules of :mod:`qwen_resnorm_fp4.validation`), raising TypeError
(wrong type or dtype) or ValueError (wrong shape, device or value) naming the argument, then calls the op
once; an error of the op itself reaches the caller as it is. Inputs are never modified (except residual
by an out-variant given ``residual_out=residual``). Non-contiguous or misaligned inputs are copied
(contiguous, 16-byte aligned) so that the kernels can use vector loads, except gate, scale and shift where
the op reads them in place (stride 1 in the last dimension, 16-byte aligned rows: e.g.
``temb.chunk(6, dim=-1)`` views, :func:`~qwen_resnorm_fp4.validation.modulation_layout_problem`); the
outputs an out-variant is given are never copied, so they must fit as they are (validation.py's out-variant
rules).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import reference
from .env import resolve_fast_math
from .layout import round_up
from .validation import dequantize_problem, has_data, modulation_in_place, quantize_out_problem, quantize_problem
from .validation import require, resnorm_out_problem, resnorm_problem, resnorm_quant_out_problem
from .validation import resnorm_quant_problem
from .recipe import UNSET, resolve_nvfp4_4over6
from .validation import MAX_COLS, WIDTH_RULE, is_supported_width  # noqa: F401 - also importable from here
from .validation import ROW_COLS_MULTIPLE

Tensor = torch.Tensor

# The ops' overloads, looked up once (ops.py defined the schemas before this module is imported); calling
# an overload skips the OpOverloadPacket's own dispatch.
_RESNORM_QUANT = torch.ops.qwen_fp4.resnorm_quant.default
_RESNORM = torch.ops.qwen_fp4.resnorm.default
_NVFP4_QUANTIZE = torch.ops.qwen_fp4.nvfp4_quantize.default
_RESNORM_QUANT_OUT = torch.ops.qwen_fp4.resnorm_quant_out.default
_RESNORM_OUT = torch.ops.qwen_fp4.resnorm_out.default
_NVFP4_QUANTIZE_OUT = torch.ops.qwen_fp4.nvfp4_quantize_out.default

# Tensors that hold real data whenever they are not being traced (a Parameter made under FakeTensorMode has
# type FakeTensor, not Parameter).
_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def _aligned(t: Tensor) -> Tensor:
    """Contiguous and 16-byte aligned (a copy only when needed). Tensors without data (meta, fake) are only
    made contiguous: the CUDA op refuses a misaligned tensor at run time itself."""
    if not t.is_contiguous():
        t = t.contiguous()
    if type(t) in _PLAIN_TENSOR_TYPES or has_data(t):  # the common case first: a plain tensor has data
        return t.clone() if t.data_ptr() & 15 else t
    return t


def _contiguous(t: Tensor) -> Tensor:
    """While tracing (torch.compile) alignment is unknowable: only contiguity."""
    return t.contiguous()


def _operand():
    """How tensor operands are prepared for the op: :func:`_aligned`, or :func:`_contiguous` while tracing."""
    return _contiguous if torch.compiler.is_compiling() else _aligned


def _modulation_operand(t: Tensor, op) -> Tensor:
    """gate, scale or shift as it is where the op reads it in place (strided rows included), else ``op(t)``."""
    if op is _aligned and type(t) in _PLAIN_TENSOR_TYPES and t.is_contiguous() and not t.data_ptr() & 15:
        return t  # the common call (contiguous, aligned): what the layout rules would conclude, at less cost
    with_data = not torch.compiler.is_compiling() and (type(t) in _PLAIN_TENSOR_TYPES or has_data(t))
    return t if modulation_in_place(t, with_data) else op(t)


def _resnorm_operands(residual, x, bias, gate, scale, shift, middle: tuple, weight, norm_bias,
                      modulate_index) -> tuple:
    """The resnorm / resnorm_quant op's arguments, tensors prepared by :func:`_operand` (gate, scale and shift
    by :func:`_modulation_operand`), with ``middle`` (the op's arguments between shift and weight) in place."""
    op = _operand()
    mod = _modulation_operand
    return (op(residual), op(x), None if bias is None else op(bias), mod(gate, op), mod(scale, op), mod(shift, op),
            *middle,
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
        gate, scale, shift: bf16 or fp32, one shape: [D] (shared), [B, D] or [B, 1, D] (per batch: x's rows
            split into B equal groups, e.g. x of shape [B, S, D]), per token [B, S, D] with B * S = M (row m
            uses token m; [M, D] too), or [2B, D] with ``modulate_index``. Any row strides: views such as
            ``temb.chunk(6, dim=-1)`` with stride 1 in the last dimension and 16-byte aligned rows are read
            in place, other layouts are copied.
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

    y = bf16(fma(LayerNorm(r), 1 + scale, shift)). Arguments as in :func:`resnorm_quant`, except that D may be
    any positive multiple of 16 up to 16384 (as for the FP8 ops).
    """
    require(resnorm_problem(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index,
                            cols_multiple=ROW_COLS_MULTIPLE))
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


# ---------------------------------------------------------------------------------------------------
# Out-variants: the same ops writing into caller-provided outputs (static buffers, CUDA graphs, the
# in-place residual update)
# ---------------------------------------------------------------------------------------------------


def _memory_rules() -> Optional[bool]:
    """The out-variant rules' ``memory`` argument: off while tracing (no data pointers; the op's own
    implementation applies them when it runs), else wherever the tensors have data."""
    return False if torch.compiler.is_compiling() else None


def empty_quantize_outputs(like: Tensor, scale_dtype: torch.dtype = torch.uint8) -> Tuple[Tensor, Tensor]:
    """Uninitialised (packed uint8 [M, D/2], scales [round_up(M, 128), D/16] of ``scale_dtype``, uint8 or
    float8_e4m3fn) on ``like``'s device for ``like`` [..., D]: the outputs :func:`resnorm_quant_out` and
    :func:`nvfp4_quantize_out` take (the kernels write every byte, the scale padding rows too)."""
    d = like.shape[-1]
    rows = like.numel() // d if d else 0
    return (torch.empty((rows, d // 2), dtype=torch.uint8, device=like.device),
            torch.empty((round_up(rows, 128), d // 16), dtype=scale_dtype, device=like.device))


def empty_resnorm_quant_outputs(x: Tensor, scale_dtype: torch.dtype = torch.uint8) -> Tuple[Tensor, Tensor, Tensor]:
    """Uninitialised (packed, scales, residual_out) for :func:`resnorm_quant_out` with inputs like ``x``
    (:func:`empty_quantize_outputs`, and residual_out bf16 of x's shape). For the in-place residual update,
    pass the residual itself as residual_out instead of the third."""
    packed, scales = empty_quantize_outputs(x, scale_dtype)
    return packed, scales, torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)


def empty_resnorm_outputs(x: Tensor) -> Tuple[Tensor, Tensor]:
    """Uninitialised (y, residual_out), bf16 of x's shape on x's device, for :func:`resnorm_out`."""
    return (torch.empty(x.shape, dtype=torch.bfloat16, device=x.device),
            torch.empty(x.shape, dtype=torch.bfloat16, device=x.device))


def resnorm_quant_out(
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
    packed: Tensor,
    scales: Tensor,
    residual_out: Tensor,
    weight: Optional[Tensor] = None,
    norm_bias: Optional[Tensor] = None,
    modulate_index: Optional[Tensor] = None,
    nvfp4_4over6: object = UNSET,
) -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`resnorm_quant` writing into the given outputs: the same bytes, no allocation.

    Args:
        residual ... modulate_index, nvfp4_4over6: as in :func:`resnorm_quant`.
        packed: uint8 [M, D/2], contiguous, 16-byte aligned, on x's device.
        scales: uint8 or float8_e4m3fn [round_up(M, 128), D/16], contiguous, 16-byte aligned; every byte is
            written (the padding rows with zero).
        residual_out: bf16 of x's shape, contiguous, 16-byte aligned; may be ``residual`` itself (the same
            tensor, or a view of exactly its memory, shape and strides): the in-place residual update.

    No output may share memory with another output or with an input, apart from residual_out being
    residual. Broken rules raise TypeError / ValueError naming the argument, before anything is written.

    Returns:
        (packed, scales, residual_out), the given tensors.
    """
    fm = resolve_fast_math(fast_math)
    code = resolve_nvfp4_4over6(nvfp4_4over6)
    require(resnorm_quant_out_problem(residual, x, bias, gate, scale, shift, global_scale, eps, packed, scales,
                                      residual_out, weight, norm_bias, modulate_index, code, memory=_memory_rules()))
    _RESNORM_QUANT_OUT(*_resnorm_operands(residual, x, bias, gate, scale, shift,
                                          (global_scale, float(eps), fm, packed, scales, residual_out), weight,
                                          norm_bias, modulate_index), code)
    return packed, scales, residual_out


def resnorm_out(
    residual: Tensor,
    x: Tensor,
    bias: Optional[Tensor],
    gate: Tensor,
    scale: Tensor,
    shift: Tensor,
    eps: float = 1e-6,
    *,
    y: Tensor,
    residual_out: Tensor,
    weight: Optional[Tensor] = None,
    norm_bias: Optional[Tensor] = None,
    modulate_index: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """:func:`resnorm` writing into the given outputs: y and residual_out bf16 of x's shape, contiguous,
    16-byte aligned, on x's device; residual_out may be ``residual`` itself, as in :func:`resnorm_quant_out`,
    whose rules apply. Returns (y, residual_out), the given tensors."""
    require(resnorm_out_problem(residual, x, bias, gate, scale, shift, eps, y, residual_out, weight, norm_bias,
                                modulate_index, memory=_memory_rules()))
    _RESNORM_OUT(*_resnorm_operands(residual, x, bias, gate, scale, shift, (float(eps), y, residual_out), weight,
                                    norm_bias, modulate_index))
    return y, residual_out


def nvfp4_quantize_out(y: Tensor, global_scale: Tensor, fast_math: Optional[bool] = None, *, packed: Tensor,
                       scales: Tensor, nvfp4_4over6: object = UNSET) -> Tuple[Tensor, Tensor]:
    """:func:`nvfp4_quantize` writing into the given packed and scales (as in :func:`resnorm_quant_out`);
    neither may share memory with y, global_scale or the other. ``nvfp4_4over6`` as in :func:`resnorm_quant`.
    Returns (packed, scales), the given tensors."""
    fm = resolve_fast_math(fast_math)
    code = resolve_nvfp4_4over6(nvfp4_4over6)
    require(quantize_out_problem(y, global_scale, packed, scales, code, memory=_memory_rules()))
    _NVFP4_QUANTIZE_OUT(_operand()(y), global_scale, fm, packed, scales, code)
    return packed, scales


# ---------------------------------------------------------------------------------------------------
# FP8 (E4M3) output and the no-residual ops (docs/numerics.md, "FP8 (E4M3) output")
# ---------------------------------------------------------------------------------------------------

from .validation import fp8_quantize_out_problem, fp8_quantize_problem, input_scale_value_problem  # noqa: E402
from .validation import norm_modulate_problem, norm_modulate_quant_fp8_out_problem  # noqa: E402
from .validation import norm_modulate_quant_fp8_problem, resnorm_quant_fp8_out_problem  # noqa: E402
from .validation import input_scale_problem, resnorm_quant_fp8_problem  # noqa: E402

_RESNORM_QUANT_FP8 = torch.ops.qwen_fp4.resnorm_quant_fp8.default
_RESNORM_QUANT_FP8_OUT = torch.ops.qwen_fp4.resnorm_quant_fp8_out.default
_FP8_QUANTIZE = torch.ops.qwen_fp4.fp8_quantize.default
_FP8_QUANTIZE_OUT = torch.ops.qwen_fp4.fp8_quantize_out.default
_NORM_MODULATE_QUANT = torch.ops.qwen_fp4.norm_modulate_quant.default
_NORM_MODULATE_QUANT_FP8 = torch.ops.qwen_fp4.norm_modulate_quant_fp8.default
_NORM_MODULATE_QUANT_FP8_OUT = torch.ops.qwen_fp4.norm_modulate_quant_fp8_out.default


def check_fp8_input_scale(input_scale: Tensor) -> None:
    """Raise TypeError / ValueError naming input_scale unless it is a one-element float32 tensor holding a
    positive, normal, finite value: the value rule the FP8 ops' CPU implementation applies on every call. It
    reads the value, so on CUDA it synchronizes: call it once where the scale is made or loaded, not per
    forward. On CUDA the kernels apply the rule on the device instead: a refused scale makes every output
    byte 0x7F (E4M3 NaN)."""
    device = input_scale.device if isinstance(input_scale, Tensor) else None
    require(input_scale_problem(input_scale, device) or input_scale_value_problem(input_scale))


def resnorm_quant_fp8(
    residual: Tensor,
    x: Tensor,
    bias: Optional[Tensor],
    gate: Tensor,
    scale: Tensor,
    shift: Tensor,
    input_scale: Tensor,
    eps: float = 1e-6,
    *,
    weight: Optional[Tensor] = None,
    norm_bias: Optional[Tensor] = None,
    modulate_index: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Gated residual update + LayerNorm + adaLN modulation + static FP8 (E4M3) quantization, in one kernel.

    Args:
        residual ... shift, eps, weight, norm_bias, modulate_index: as in :func:`resnorm_quant`, except that D
            may be any positive multiple of 16 up to 16384.
        input_scale: ModelOpt's static FP8 input scale (amax / 448), a float32 one-element tensor on x's
            device. Its value is not read on the host (no sync): on CUDA a scale that is not a positive,
            normal, finite fp32 makes every byte of y 0x7F (E4M3 NaN); on CPU it raises ValueError. See
            :func:`check_fp8_input_scale`.

    Returns:
        y: float8_e4m3fn like x, e4m3_rn_satfinite(fminf(fmaxf(y_bf16 * inv, -448), 448)) of resnorm's y,
            inv = div.full.f32(1, input_scale) (SGLang's rule; docs/numerics.md);
        residual_out: bf16 like x, the updated residual stream (resnorm's, bit for bit).

    Bytes are identical to ``fp8_quantize(resnorm(...)[0], input_scale)``.
    """
    require(resnorm_quant_fp8_problem(residual, x, bias, gate, scale, shift, input_scale, eps, weight, norm_bias,
                                      modulate_index))
    return _RESNORM_QUANT_FP8(*_resnorm_operands(residual, x, bias, gate, scale, shift, (input_scale, float(eps)),
                                                 weight, norm_bias, modulate_index))


def empty_resnorm_quant_fp8_outputs(x: Tensor) -> Tuple[Tensor, Tensor]:
    """Uninitialised (y float8_e4m3fn, residual_out bf16), of x's shape on x's device, for
    :func:`resnorm_quant_fp8_out` (or pass the residual itself as residual_out)."""
    return (torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device),
            torch.empty(x.shape, dtype=torch.bfloat16, device=x.device))


def resnorm_quant_fp8_out(
    residual: Tensor,
    x: Tensor,
    bias: Optional[Tensor],
    gate: Tensor,
    scale: Tensor,
    shift: Tensor,
    input_scale: Tensor,
    eps: float = 1e-6,
    *,
    y: Tensor,
    residual_out: Tensor,
    weight: Optional[Tensor] = None,
    norm_bias: Optional[Tensor] = None,
    modulate_index: Optional[Tensor] = None,
    y_bf16: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """:func:`resnorm_quant_fp8` writing into the given outputs: y float8_e4m3fn and residual_out bf16 of x's
    shape, contiguous, 16-byte aligned, on x's device; residual_out may be ``residual`` itself (the in-place
    update, as in :func:`resnorm_quant_out`). ``y_bf16`` (optional, bf16 like x) also receives resnorm's bf16
    y in the same launch (SGLang's normalized output). Returns (y, residual_out), the given tensors."""
    require(resnorm_quant_fp8_out_problem(residual, x, bias, gate, scale, shift, input_scale, eps, y, residual_out,
                                          weight, norm_bias, modulate_index, y_bf16, memory=_memory_rules()))
    _RESNORM_QUANT_FP8_OUT(*_resnorm_operands(residual, x, bias, gate, scale, shift,
                                              (input_scale, float(eps), y, residual_out), weight, norm_bias,
                                              modulate_index), y_bf16)
    return y, residual_out


def fp8_quantize(y: Tensor, input_scale: Tensor) -> Tensor:
    """Static FP8 (E4M3) quantization of bf16 ``y`` of any shape, element by element, with the rule of
    :func:`resnorm_quant_fp8` (input_scale likewise). Returns float8_e4m3fn of y's shape."""
    require(fp8_quantize_problem(y, input_scale))
    return _FP8_QUANTIZE(_operand()(y), input_scale)


def fp8_quantize_out(y: Tensor, input_scale: Tensor, *, out: Tensor) -> Tensor:
    """:func:`fp8_quantize` into ``out`` (float8_e4m3fn of y's shape, contiguous, 16-byte aligned, sharing no
    memory with y or input_scale). Returns out."""
    require(fp8_quantize_out_problem(y, input_scale, out, memory=_memory_rules()))
    _FP8_QUANTIZE_OUT(_operand()(y), input_scale, out)
    return out


def _norm_modulate_operands(x, scale, shift, middle: tuple, weight, norm_bias, modulate_index) -> tuple:
    """The no-residual ops' arguments prepared as :func:`_resnorm_operands` prepares resnorm's."""
    op = _operand()
    return (op(x), _modulation_operand(scale, op), _modulation_operand(shift, op), *middle,
            None if weight is None else op(weight), None if norm_bias is None else op(norm_bias),
            None if modulate_index is None else op(modulate_index))


def norm_modulate_quant(
    x: Tensor,
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
) -> Tuple[Tensor, Tensor]:
    """LayerNorm + adaLN modulation + NVFP4 of ``x`` itself, with no residual update (a block's first norm):
    steps 3-8 of :func:`resnorm_quant` on r = x (x's -0 read as +0), in one kernel. Arguments as in
    :func:`resnorm_quant` (D a multiple of 64); returns (packed, scales) as it does."""
    fm = resolve_fast_math(fast_math)
    code = resolve_nvfp4_4over6(nvfp4_4over6)
    require(norm_modulate_problem(x, scale, shift, eps, weight, norm_bias, modulate_index, global_scale))
    return _NORM_MODULATE_QUANT(*_norm_modulate_operands(x, scale, shift, (global_scale, float(eps), fm), weight,
                                                         norm_bias, modulate_index), code)


def norm_modulate_quant_fp8(
    x: Tensor,
    scale: Tensor,
    shift: Tensor,
    input_scale: Tensor,
    eps: float = 1e-6,
    *,
    weight: Optional[Tensor] = None,
    norm_bias: Optional[Tensor] = None,
    modulate_index: Optional[Tensor] = None,
) -> Tensor:
    """LayerNorm + adaLN modulation + FP8 (E4M3) of ``x`` itself, no residual update, in one kernel: the
    bytes of ``fp8_quantize(y, input_scale)`` for y the bf16 LayerNorm + modulation of x (steps 3-7 on r = x,
    -0 read as +0). Arguments as in :func:`resnorm_quant_fp8`; returns float8_e4m3fn like x."""
    require(norm_modulate_quant_fp8_problem(x, scale, shift, input_scale, eps, weight, norm_bias, modulate_index))
    return _NORM_MODULATE_QUANT_FP8(*_norm_modulate_operands(x, scale, shift, (input_scale, float(eps)), weight,
                                                             norm_bias, modulate_index))


def norm_modulate_quant_fp8_out(
    x: Tensor,
    scale: Tensor,
    shift: Tensor,
    input_scale: Tensor,
    eps: float = 1e-6,
    *,
    y: Tensor,
    weight: Optional[Tensor] = None,
    norm_bias: Optional[Tensor] = None,
    modulate_index: Optional[Tensor] = None,
    y_bf16: Optional[Tensor] = None,
) -> Tensor:
    """:func:`norm_modulate_quant_fp8` into ``y`` (float8_e4m3fn like x, contiguous, 16-byte aligned);
    ``y_bf16`` (optional, bf16 like x) also receives the bf16 y. Returns y."""
    require(norm_modulate_quant_fp8_out_problem(x, scale, shift, input_scale, eps, y, weight, norm_bias,
                                                modulate_index, y_bf16, memory=_memory_rules()))
    _NORM_MODULATE_QUANT_FP8_OUT(*_norm_modulate_operands(x, scale, shift, (input_scale, float(eps), y), weight,
                                                          norm_bias, modulate_index), y_bf16)
    return y
