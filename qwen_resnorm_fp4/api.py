"""Typed, checked entry points over ``torch.ops.qwen_fp4``.

Every check raises TypeError (wrong type or dtype) or ValueError (wrong shape, device or value) naming
the argument, before anything runs; inputs are never modified. Non-contiguous inputs are made contiguous
(a copy) so that the kernels can use 16-byte vector loads.

On plain CUDA tensors (the hot path) the op is called first: its C++ checks refuse everything the Python
checks refuse, before any launch, and only a refusal runs the Python checks, which then raise their typed
error (_run_or_explain). Elsewhere (CPU, meta and fake tensors, tracing) the Python checks run first.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch

from . import reference
from .env import resolve_fast_math
from .layout import round_up

Tensor = torch.Tensor

MAX_COLS = 16384
ACTIVATION_DTYPES = (torch.bfloat16,)
PARAM_DTYPES = (torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64, torch.bool)

# The ops' overloads, looked up once (ops.py defined the schemas before this module is imported); calling
# an overload skips the OpOverloadPacket's own dispatch.
_RESNORM_QUANT = torch.ops.qwen_fp4.resnorm_quant.default
_RESNORM = torch.ops.qwen_fp4.resnorm.default
_NVFP4_QUANTIZE = torch.ops.qwen_fp4.nvfp4_quantize.default


def _dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def _check_tensor(name: str, t: object, dtypes: Sequence[torch.dtype], device: Optional[torch.device],
                  like: str = "x") -> Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must be {_dtype_names(dtypes)}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but {like} is on {device}: all tensors must be on one device")
    return t


WIDTH_RULE = f"a positive multiple of 64, at most {MAX_COLS}"


def is_supported_width(cols: int) -> bool:
    """The one width rule of the kernels: D (the last dimension) a positive multiple of 64, at most MAX_COLS."""
    return 0 < cols <= MAX_COLS and cols % 64 == 0


def _check_cols(name: str, cols: int) -> None:
    """is_supported_width(cols), or a ValueError that says which half of the rule `cols` breaks."""
    if is_supported_width(cols):
        return
    if cols > MAX_COLS and cols % 64 == 0:
        raise ValueError(f"{name}.shape[-1] (D) must be at most {MAX_COLS}, got {cols}")
    raise ValueError(f"{name}.shape[-1] (D) must be a positive multiple of 64, got {cols}")


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


# Tensors that hold real data whenever they are not being traced (a Parameter made under FakeTensorMode has
# type FakeTensor, not Parameter).
_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def _plain_aligned(t: Tensor) -> Tensor:
    """A plain tensor with real data made contiguous and 16-byte aligned (a copy only when needed)."""
    if not t.is_contiguous():
        t = t.contiguous()
    return t.clone() if t.data_ptr() & 15 else t


def _aligned(t: Tensor) -> Tensor:
    """Contiguous and 16-byte aligned (a copy only when needed). While tracing (torch.compile, make_fx,
    FakeTensorMode) alignment is unknowable and not checked: the CUDA op itself refuses a misaligned
    tensor at run time with a clear error."""
    if torch.compiler.is_compiling():
        return t.contiguous()
    if type(t) in _PLAIN_TENSOR_TYPES:  # the common case, kept cheap: fakes and functional tensors are other types
        return _plain_aligned(t)
    t = t.contiguous()
    if _has_data(t) and t.data_ptr() % 16 != 0:
        t = t.clone()
    return t


class _NotFast(Exception):
    """An argument the unchecked fast path does not take (see _kernel_operand): the checked path takes the call."""


def _kernel_operand(t: object, vector_access: bool = True) -> Tensor:
    """A plain CUDA tensor as the kernels read it: contiguous and, for vector access, 16-byte aligned (a copy
    only when needed). Anything else (None, a CPU, meta or fake tensor, a subclass, not a tensor) raises
    _NotFast."""
    if type(t) not in _PLAIN_TENSOR_TYPES or not t.is_cuda:
        raise _NotFast
    return _plain_aligned(t) if vector_access else t


def _resnorm_operands(residual, x, bias, gate, scale, shift, middle: tuple, weight, norm_bias, modulate_index, *,
                      operand=_kernel_operand, copy_activations: bool = True) -> tuple:
    """The arguments of the resnorm / resnorm_quant op, with ``middle`` (the op's arguments between shift and
    weight) in place and each tensor passed through ``operand``: _kernel_operand on the fast path (plain
    CUDA tensors made contiguous and aligned where they are not; raises _NotFast for anything else), _aligned
    on the checked path (any tensor). copy_activations=False: x and residual as given, for the gate, which
    declines rather than copies them."""
    if copy_activations:
        residual, x = operand(residual), operand(x)
    return (residual, x, None if bias is None else operand(bias), operand(gate), operand(scale), operand(shift),
            *middle, None if weight is None else operand(weight), None if norm_bias is None else operand(norm_bias),
            None if modulate_index is None else operand(modulate_index))


def _resnorm_quant_operands(residual, x, bias, gate, scale, shift, global_scale, eps: float, fast_math: bool,
                            weight, norm_bias, modulate_index, *, copy_activations: bool = True) -> tuple:
    """_resnorm_operands for the resnorm_quant op (global_scale, eps, fast_math in the middle)."""
    middle = (_kernel_operand(global_scale, False), eps, fast_math)
    return _resnorm_operands(residual, x, bias, gate, scale, shift, middle, weight, norm_bias, modulate_index,
                             copy_activations=copy_activations)


def _fast_operands(build, *args, **kwargs) -> Optional[tuple]:
    """``build(*args, **kwargs)``: the op's operands on the fast path (plain CUDA tensors), or None while
    tracing or when an argument is something else (_NotFast): the caller then takes its checked path."""
    if torch.compiler.is_compiling():
        return None
    try:
        return build(*args, **kwargs)
    except _NotFast:
        return None


def _quantize_operands(y, global_scale, fast_math: bool) -> tuple:
    """The nvfp4_quantize op's operands on the fast path (raises _NotFast like _kernel_operand)."""
    return _kernel_operand(y), _kernel_operand(global_scale, False), fast_math


def _run_or_explain(op, args: tuple, check, check_args: tuple):
    """The fast path of the typed wrappers on plain CUDA tensors: the op first, since its own checks
    (csrc/ops.cpp) refuse everything the Python checks refuse, before any launch. Only when it raises do
    the Python checks run, to raise their TypeError / ValueError naming the argument; when they pass, the
    op's own error stands. Saves the checks' 3-5 us on every good call."""
    try:
        return op(*args)
    except Exception as exc:  # noqa: BLE001 - re-raised below unless a check explains it
        error = exc
    check(*check_args)
    raise error


def _check_global_scale(global_scale: object, device: torch.device, like: str = "x") -> Tensor:
    _check_tensor("global_scale", global_scale, (torch.float32,), device, like)
    if global_scale.numel() != 1:
        raise ValueError(f"global_scale must have exactly one element, got shape {tuple(global_scale.shape)}")
    return global_scale


def _check_resnorm_args(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index):
    _check_tensor("x", x, ACTIVATION_DTYPES, None)
    dev = x.device
    _check_tensor("residual", residual, ACTIVATION_DTYPES, dev)
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension ([..., D])")
    if residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} must equal x shape {tuple(x.shape)}")
    cols = x.shape[-1]
    _check_cols("x", cols)
    rows = x.numel() // cols

    for name, t in (("bias", bias), ("weight", weight), ("norm_bias", norm_bias)):
        if t is not None:
            _check_tensor(name, t, PARAM_DTYPES, dev)
            if tuple(t.shape) != (cols,):
                raise ValueError(f"{name} must have shape ({cols},) like x's last dim, got {tuple(t.shape)}")

    for name, t in (("gate", gate), ("scale", scale), ("shift", shift)):
        _check_tensor(name, t, PARAM_DTYPES, dev)
        if t.dim() not in (1, 2) or t.shape[-1] != cols:
            raise ValueError(f"{name} must be [D] or [B, D] with D={cols}, got shape {tuple(t.shape)}")
    if not (gate.shape == scale.shape == shift.shape):
        raise ValueError(
            f"gate, scale and shift must have one shape, got {tuple(gate.shape)}, {tuple(scale.shape)}, {tuple(shift.shape)}")

    if modulate_index is not None:
        _check_tensor("modulate_index", modulate_index, INDEX_DTYPES, dev)
        if modulate_index.dim() != 2:
            raise ValueError(f"modulate_index must be [B, S], got shape {tuple(modulate_index.shape)}")
        b, s = modulate_index.shape
        if gate.dim() != 2 or gate.shape[0] != 2 * b:
            raise ValueError(
                f"with modulate_index of shape {tuple(modulate_index.shape)}, gate/scale/shift must be [2B, D] = "
                f"[{2 * b}, {cols}], got {tuple(gate.shape)}")
        if b * s != rows:
            raise ValueError(f"modulate_index has {b}x{s} = {b * s} entries but x has {rows} rows")
    elif gate.dim() == 2:
        b = gate.shape[0]
        if b == 0 or rows % b != 0:
            raise ValueError(f"x has {rows} rows, which does not split into gate.shape[0] = {b} batches")

    if isinstance(eps, bool) or not isinstance(eps, (float, int)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be finite and >= 0, got {eps}")


def _check_resnorm_quant_args(residual, x, bias, gate, scale, shift, global_scale, eps, weight, norm_bias,
                              modulate_index) -> None:
    """All checks of resnorm_quant (also run by the op's CPU implementation, see ops.py)."""
    _check_resnorm_args(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index)
    _check_global_scale(global_scale, x.device)


def _check_quantize_args(y, global_scale) -> None:
    """All checks of nvfp4_quantize (also run by the op's CPU implementation, see ops.py)."""
    _check_tensor("y", y, ACTIVATION_DTYPES, None)
    if y.dim() < 1:
        raise ValueError("y must have at least one dimension ([..., D])")
    _check_cols("y", y.shape[-1])
    _check_global_scale(global_scale, y.device, like="y")


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

    Returns:
        packed: uint8 [M, D/2], two E2M1 codes a byte (even element in the low nibble);
        scales: uint8 [round_up(M, 128), D/16], E4M3 block scales in the 128x4 swizzled layout;
        residual_out: bf16 like x, the updated residual stream r = bf16(fma(a, gate, residual)).

    Bytes are identical to ``nvfp4_quantize(*resnorm(...))``.
    """
    fm = resolve_fast_math(fast_math)
    args = _fast_operands(_resnorm_quant_operands, residual, x, bias, gate, scale, shift, global_scale, eps, fm,
                          weight, norm_bias, modulate_index) if type(eps) is float else None
    if args is not None:
        return _run_or_explain(_RESNORM_QUANT, args, _check_resnorm_quant_args,
                               (residual, x, bias, gate, scale, shift, global_scale, eps, weight, norm_bias,
                                modulate_index))
    _check_resnorm_quant_args(residual, x, bias, gate, scale, shift, global_scale, eps, weight, norm_bias,
                              modulate_index)
    return _resnorm_quant_aligned(residual, x, bias, gate, scale, shift, global_scale, eps, fm, weight, norm_bias,
                                  modulate_index)


def _resnorm_quant_op(residual, x, bias, gate, scale, shift, global_scale, eps: float, fast_math: bool, weight,
                      norm_bias, modulate_index) -> Tuple[Tensor, Tensor, Tensor]:
    """The op call for arguments already validated (by the gate's own checks): inputs made contiguous and
    16-byte aligned, nothing checked twice on the hot path."""
    args = _fast_operands(_resnorm_quant_operands, residual, x, bias, gate, scale, shift, global_scale, float(eps),
                          fast_math, weight, norm_bias, modulate_index)
    if args is not None:
        return _RESNORM_QUANT(*args)
    return _resnorm_quant_aligned(residual, x, bias, gate, scale, shift, global_scale, eps, fast_math, weight,
                                  norm_bias, modulate_index)


def _resnorm_quant_aligned(residual, x, bias, gate, scale, shift, global_scale, eps: float, fast_math: bool, weight,
                           norm_bias, modulate_index) -> Tuple[Tensor, Tensor, Tensor]:
    """The checked path's op call (any tensors, tracing included): every tensor operand through _aligned."""
    return torch.ops.qwen_fp4.resnorm_quant(*_resnorm_operands(
        residual, x, bias, gate, scale, shift, (global_scale, float(eps), fast_math), weight, norm_bias,
        modulate_index, operand=_aligned))


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
    args = _fast_operands(_resnorm_operands, residual, x, bias, gate, scale, shift, (eps,), weight, norm_bias,
                          modulate_index) if type(eps) is float else None
    if args is not None:
        return _run_or_explain(_RESNORM, args, _check_resnorm_args,
                               (residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index))
    _check_resnorm_args(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index)
    return torch.ops.qwen_fp4.resnorm(*_resnorm_operands(residual, x, bias, gate, scale, shift, (float(eps),), weight,
                                                         norm_bias, modulate_index, operand=_aligned))


def nvfp4_quantize(y: Tensor, global_scale: Tensor, fast_math: Optional[bool] = None) -> Tuple[Tensor, Tensor]:
    """NVFP4-quantize bf16 ``y`` [..., D] with the production recipe (FlashInfer / TensorRT-LLM fp4_quantize,
    128x4 swizzled E4M3 scales). Returns (packed uint8 [M, D/2], scales uint8 [round_up(M, 128), D/16])."""
    fm = resolve_fast_math(fast_math)
    args = _fast_operands(_quantize_operands, y, global_scale, fm)
    if args is not None:
        return _run_or_explain(_NVFP4_QUANTIZE, args, _check_quantize_args, (y, global_scale))
    _check_quantize_args(y, global_scale)
    return torch.ops.qwen_fp4.nvfp4_quantize(_aligned(y), global_scale, fm)


def dequantize_nvfp4(packed: Tensor, scales: Tensor, global_scale: Tensor, rows: Optional[int] = None) -> Tensor:
    """Back to fp32 [rows, D]: e2m1 * float(e4m3 scale) / global_scale. ``rows`` defaults to packed's rows."""
    _check_tensor("packed", packed, (torch.uint8,), None)
    _check_tensor("scales", scales, (torch.uint8,), packed.device, like="packed")
    _check_global_scale(global_scale, packed.device, like="packed")
    if packed.dim() != 2:
        raise ValueError(f"packed must be [M, D/2], got shape {tuple(packed.shape)}")
    m, half = packed.shape
    rows = m if rows is None else int(rows)
    if not 0 <= rows <= m:
        raise ValueError(f"rows must be in [0, {m}], got {rows}")
    cols = half * 2
    _check_cols("packed (2 * last dim)", cols)
    need = round_up(rows, 128) * (cols // 16)
    if scales.numel() < need:
        raise ValueError(f"scales has {scales.numel()} bytes, {need} needed for {rows} rows of {cols}")
    return reference.dequantize_nvfp4(packed.contiguous(), scales.contiguous(), global_scale, rows)
