"""Typed, checked entry points over ``torch.ops.qwen_fp4``.

Each wrapper resolves its defaults once (``fast_math=None`` from the environment, ``nvfp4_4over6`` omitted
from the environment, :mod:`qwen_resnorm_fp4.recipe`), then calls the op once with the op's own arguments.
The op enforces its rules once per call (its Python implementation on CPU tensors, its C++ checks on CUDA
ones, its fake while tracing); a refused call raises the op table's rule for it (ops.py,
:mod:`qwen_resnorm_fp4.validation`): TypeError (wrong type or dtype) or ValueError (wrong shape, device or
value) naming the argument, with nothing written. Inputs are never modified (except residual by an out-variant
given ``residual_out=residual``). Non-contiguous or misaligned inputs are copied for the CUDA kernels
(:mod:`qwen_resnorm_fp4.operands`), except gate, scale and shift where the op reads them in place (e.g.
``temb.chunk(6, dim=-1)`` views); the outputs an out-variant is given are never copied, so they must fit as they
are (validation.py's out-variant rules).
"""

from __future__ import annotations

from typing import Any, Callable, NoReturn, Optional, Tuple

import torch

from . import ops, reference
from .constants import FP8_DTYPE
from .env import resolve_fast_math
from .layout import packed_shape, scales_shape
from .operands import OpArguments
from .recipe import UNSET, resolve_nvfp4_4over6
from .validation import dequantize_problem, input_scale_problem, input_scale_value_problem, require

Tensor = torch.Tensor

_qwen_fp4 = getattr(torch.ops, ops.NAMESPACE)
#: Each op of the table with its overload, looked up once (calling an overload skips the OpOverloadPacket's
#: own dispatch), and where its arguments sit.
_BOUND = {name: (entry, OpArguments(getattr(_qwen_fp4, name).default))
          for name, entry in ops.OPS.items() if entry.rules is not None}


def _call(name: str, args: tuple, memory: Optional[bool] = None):
    """The op ``name`` on its arguments (schema order, defaults resolved). Its rules are enforced once, by the
    op itself: by its Python implementation when every tensor is on the CPU, else by the CUDA op's own checks
    (csrc/op_checks.h, before any launch) on the prepared operands, or by its fake while torch.compile traces.
    Where the operands replace an input of an out-variant with a copy (an aligned or contiguous one), its rules
    are applied here first, on the caller's tensors (``memory``: its memory rules; None: where its outputs have
    data): the replaced input could overlap an output unseen by the op. When the op refuses the call, the
    table's rules name the argument: the error raised is the rules' TypeError / ValueError, chained to the op's
    own; an error the rules do not explain (e.g. out of memory) is raised as it is."""
    entry, arguments = _BOUND[name]
    if arguments.all_on_cpu(args):
        return arguments.op(*args)
    try:
        prepared = arguments.prepared(args)
    except Exception as error:
        _raise_explained(entry, args, memory, error)
    if entry.is_out_variant and any(p is not a for p, a in zip(prepared, args) if isinstance(a, Tensor)):
        require(entry.problem(args, memory))
    try:
        return arguments.op(*prepared)
    except Exception as error:
        _raise_explained(entry, args, memory, error)


def _raise_explained(entry: ops.OpEntry, args: tuple, memory: Optional[bool], error: Exception) -> NoReturn:
    """Raise the rules' error naming the argument of a refused call (chained to ``error``), or ``error`` itself
    where the rules find nothing wrong (e.g. out of memory)."""
    problem = entry.problem(args, memory)
    if problem is None:
        raise error
    raise problem.exception() from error


def _prepared_call(name: str) -> Callable[..., Any]:
    """The op ``name`` on arguments that already satisfy its rules (a fused path applied them as declines):
    operands prepared, the op called once, no second check."""
    arguments = _BOUND[name][1]

    def call(*args):
        return arguments.op(*arguments.prepared(args))
    call.__name__ = f"call_{name}"
    call.__doc__ = f"``torch.ops.qwen_fp4.{name}`` on arguments (schema order) that already satisfy its rules."
    return call


call_resnorm_quant = _prepared_call("resnorm_quant")
call_resnorm_quant_fp8 = _prepared_call("resnorm_quant_fp8")
call_resnorm_quant_fp8_out = _prepared_call("resnorm_quant_fp8_out")
call_norm_modulate_quant_fp8 = _prepared_call("norm_modulate_quant_fp8")
call_gelu_tanh_fp8_quantize = _prepared_call("gelu_tanh_fp8_quantize")
call_nvfp4_dequantize_bf16 = _prepared_call("nvfp4_dequantize_bf16")


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
    return _call("resnorm_quant", (residual, x, bias, gate, scale, shift, global_scale, eps,
                                   resolve_fast_math(fast_math), weight, norm_bias, modulate_index,
                                   resolve_nvfp4_4over6(nvfp4_4over6)))


def resnorm(residual: Tensor, x: Tensor, bias: Optional[Tensor], gate: Tensor, scale: Tensor, shift: Tensor,
            eps: float = 1e-6, *, weight: Optional[Tensor] = None, norm_bias: Optional[Tensor] = None,
            modulate_index: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """The BF16 half of :func:`resnorm_quant`, same numerics: returns (y, residual_out), both bf16 like x.

    y = bf16(fma(LayerNorm(r), 1 + scale, shift)). Arguments as in :func:`resnorm_quant`, except that D may be
    any positive multiple of 16 up to 16384 (as for the FP8 ops).
    """
    return _call("resnorm", (residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index))


def nvfp4_quantize(y: Tensor, global_scale: Tensor, fast_math: Optional[bool] = None, *,
                   nvfp4_4over6: object = UNSET) -> Tuple[Tensor, Tensor]:
    """NVFP4-quantize bf16 ``y`` [..., D] with the production recipe (FlashInfer / TensorRT-LLM fp4_quantize,
    128x4 swizzled E4M3 scales). Returns (packed uint8 [M, D/2], scales uint8 [round_up(M, 128), D/16]).
    ``nvfp4_4over6`` as in :func:`resnorm_quant`."""
    return _call("nvfp4_quantize", (y, global_scale, resolve_fast_math(fast_math),
                                    resolve_nvfp4_4over6(nvfp4_4over6)))


def dequantize_nvfp4(packed: Tensor, scales: Tensor, global_scale: Tensor, rows: Optional[int] = None) -> Tensor:
    """Back to fp32 [rows, D]: e2m1 * float(e4m3 scale) / global_scale. ``rows`` defaults to packed's rows."""
    problem, rows, _ = dequantize_problem(packed, scales, global_scale, rows)
    require(problem)
    return reference.dequantize_nvfp4(packed.contiguous(), scales.contiguous(), global_scale, rows)


def dequantize_to_bf16(packed: Tensor, scales: Tensor) -> Tensor:
    """bf16 [rows, K]: ``e2m1 * float(e4m3 block scale)`` of every element of an NVFP4 tensor, without its
    global scale (``packed`` uint8 [rows, K/2], even element in the low nibble; ``scales`` the 128x4-swizzled
    E4M3 bytes, uint8 or float8_e4m3fn): ``torch.ops.qwen_fp4.nvfp4_dequantize_bf16``. Exact: these values
    have at most 6 significant bits and lie in [2^-10, 2688] or are zero; the CUDA kernel and the reference
    write the same bytes."""
    return _call("nvfp4_dequantize_bf16", (packed, scales))


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
    return (torch.empty(packed_shape(rows, d), dtype=torch.uint8, device=like.device),
            torch.empty(scales_shape(rows, d), dtype=scale_dtype, device=like.device))


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


def resnorm_quant_out(residual: Tensor, x: Tensor, bias: Optional[Tensor], gate: Tensor, scale: Tensor, shift: Tensor,
                      global_scale: Tensor, eps: float = 1e-6, fast_math: Optional[bool] = None, *, packed: Tensor,
                      scales: Tensor, residual_out: Tensor, weight: Optional[Tensor] = None,
                      norm_bias: Optional[Tensor] = None, modulate_index: Optional[Tensor] = None,
                      nvfp4_4over6: object = UNSET) -> Tuple[Tensor, Tensor, Tensor]:
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
    _call("resnorm_quant_out", (residual, x, bias, gate, scale, shift, global_scale, eps,
                                resolve_fast_math(fast_math), packed, scales, residual_out, weight, norm_bias,
                                modulate_index, resolve_nvfp4_4over6(nvfp4_4over6)), _memory_rules())
    return packed, scales, residual_out


def resnorm_out(residual: Tensor, x: Tensor, bias: Optional[Tensor], gate: Tensor, scale: Tensor, shift: Tensor,
                eps: float = 1e-6, *, y: Tensor, residual_out: Tensor, weight: Optional[Tensor] = None,
                norm_bias: Optional[Tensor] = None, modulate_index: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """:func:`resnorm` writing into the given outputs: y and residual_out bf16 of x's shape, contiguous,
    16-byte aligned, on x's device; residual_out may be ``residual`` itself, as in :func:`resnorm_quant_out`,
    whose rules apply. Returns (y, residual_out), the given tensors."""
    _call("resnorm_out", (residual, x, bias, gate, scale, shift, eps, y, residual_out, weight, norm_bias,
                          modulate_index), _memory_rules())
    return y, residual_out


def nvfp4_quantize_out(y: Tensor, global_scale: Tensor, fast_math: Optional[bool] = None, *, packed: Tensor,
                       scales: Tensor, nvfp4_4over6: object = UNSET) -> Tuple[Tensor, Tensor]:
    """:func:`nvfp4_quantize` writing into the given packed and scales (as in :func:`resnorm_quant_out`);
    neither may share memory with y, global_scale or the other. ``nvfp4_4over6`` as in :func:`resnorm_quant`.
    Returns (packed, scales), the given tensors."""
    _call("nvfp4_quantize_out", (y, global_scale, resolve_fast_math(fast_math), packed, scales,
                                 resolve_nvfp4_4over6(nvfp4_4over6)), _memory_rules())
    return packed, scales


# ---------------------------------------------------------------------------------------------------
# FP8 (E4M3) output and the no-residual ops (docs/numerics.md, "FP8 (E4M3) output")
# ---------------------------------------------------------------------------------------------------


def check_fp8_input_scale(input_scale: Tensor) -> None:
    """Raise TypeError / ValueError naming input_scale unless it is a one-element float32 tensor holding a
    positive, normal, finite value: the value rule the FP8 ops' Python implementation applies on every call.
    It reads the value, so on CUDA it synchronizes: call it once where the scale is made or loaded, not per
    forward. On CUDA the kernels apply the rule on the device instead: a refused scale makes every output
    byte 0x7F (E4M3 NaN)."""
    device = input_scale.device if isinstance(input_scale, Tensor) else None
    require(input_scale_problem(input_scale, device) or input_scale_value_problem(input_scale))


def resnorm_quant_fp8(residual: Tensor, x: Tensor, bias: Optional[Tensor], gate: Tensor, scale: Tensor,
                      shift: Tensor, input_scale: Tensor, eps: float = 1e-6, *, weight: Optional[Tensor] = None,
                      norm_bias: Optional[Tensor] = None,
                      modulate_index: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Gated residual update + LayerNorm + adaLN modulation + static FP8 (E4M3) quantization, in one kernel.

    Args:
        residual ... shift, eps, weight, norm_bias, modulate_index: as in :func:`resnorm_quant`, except that D
            may be any positive multiple of 16 up to 16384.
        input_scale: ModelOpt's static FP8 input scale (amax / 448), a float32 one-element tensor on x's
            device. Its value is not read on the host for CUDA tensors (no sync): there a scale that is not a
            positive, normal, finite fp32 makes every byte of y 0x7F (E4M3 NaN); on CPU it raises ValueError.
            See :func:`check_fp8_input_scale`.

    Returns:
        y: float8_e4m3fn like x, e4m3_rn_satfinite(fminf(fmaxf(y_bf16 * inv, -448), 448)) of resnorm's y,
            inv = div.full.f32(1, input_scale) (SGLang's rule; docs/numerics.md);
        residual_out: bf16 like x, the updated residual stream (resnorm's, bit for bit).

    Bytes are identical to ``fp8_quantize(resnorm(...)[0], input_scale)``.
    """
    return _call("resnorm_quant_fp8", (residual, x, bias, gate, scale, shift, input_scale, eps, weight, norm_bias,
                                       modulate_index))


def empty_resnorm_quant_fp8_outputs(x: Tensor) -> Tuple[Tensor, Tensor]:
    """Uninitialised (y float8_e4m3fn, residual_out bf16), of x's shape on x's device, for
    :func:`resnorm_quant_fp8_out` (or pass the residual itself as residual_out)."""
    return (torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device),
            torch.empty(x.shape, dtype=torch.bfloat16, device=x.device))


def resnorm_quant_fp8_out(residual: Tensor, x: Tensor, bias: Optional[Tensor], gate: Tensor, scale: Tensor,
                          shift: Tensor, input_scale: Tensor, eps: float = 1e-6, *, y: Tensor,
                          residual_out: Tensor, weight: Optional[Tensor] = None,
                          norm_bias: Optional[Tensor] = None, modulate_index: Optional[Tensor] = None,
                          y_bf16: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """:func:`resnorm_quant_fp8` writing into the given outputs: y float8_e4m3fn and residual_out bf16 of x's
    shape, contiguous, 16-byte aligned, on x's device; residual_out may be ``residual`` itself (the in-place
    update, as in :func:`resnorm_quant_out`). ``y_bf16`` (optional, bf16 like x) also receives resnorm's bf16
    y in the same launch (SGLang's normalized output). Returns (y, residual_out), the given tensors."""
    _call("resnorm_quant_fp8_out", (residual, x, bias, gate, scale, shift, input_scale, eps, y, residual_out, weight,
                                    norm_bias, modulate_index, y_bf16), _memory_rules())
    return y, residual_out


def fp8_quantize(y: Tensor, input_scale: Tensor) -> Tensor:
    """Static FP8 (E4M3) quantization of bf16 ``y`` of any shape, element by element, with the rule of
    :func:`resnorm_quant_fp8` (input_scale likewise). Returns float8_e4m3fn of y's shape."""
    return _call("fp8_quantize", (y, input_scale))


def fp8_quantize_out(y: Tensor, input_scale: Tensor, *, out: Tensor) -> Tensor:
    """:func:`fp8_quantize` into ``out`` (float8_e4m3fn of y's shape, contiguous, 16-byte aligned, sharing no
    memory with y or input_scale). Returns out."""
    _call("fp8_quantize_out", (y, input_scale, out), _memory_rules())
    return out


def gelu_tanh_fp8_quantize(y: Tensor, input_scale: Tensor) -> Tensor:
    """GELU(tanh) and static FP8 (E4M3) quantization of bf16 ``y`` of any shape, in one pass: the bytes of
    ``fp8_quantize(torch.nn.functional.gelu(y, approximate="tanh"), input_scale)`` with PyTorch's CUDA GELU
    (fp32 opmath, tanhf, rounded to bf16; the CPU implementation reads that GELU from a table of all 65536
    bf16 inputs, so it gives the same bytes). For the second Linear of a GELU FeedForward: ``y`` is the first
    Linear's bf16 output, ``input_scale`` the second's. Returns float8_e4m3fn of y's shape."""
    return _call("gelu_tanh_fp8_quantize", (y, input_scale))


def gelu_tanh_fp8_quantize_out(y: Tensor, input_scale: Tensor, *, out: Tensor) -> Tensor:
    """:func:`gelu_tanh_fp8_quantize` into ``out`` (as :func:`fp8_quantize_out`). Returns out."""
    _call("gelu_tanh_fp8_quantize_out", (y, input_scale, out), _memory_rules())
    return out


def norm_modulate_quant(x: Tensor, scale: Tensor, shift: Tensor, global_scale: Tensor, eps: float = 1e-6,
                        fast_math: Optional[bool] = None, *, weight: Optional[Tensor] = None,
                        norm_bias: Optional[Tensor] = None, modulate_index: Optional[Tensor] = None,
                        nvfp4_4over6: object = UNSET) -> Tuple[Tensor, Tensor]:
    """LayerNorm + adaLN modulation + NVFP4 of ``x`` itself, with no residual update (a block's first norm):
    steps 3-8 of :func:`resnorm_quant` on r = x (x's -0 read as +0), in one kernel. Arguments as in
    :func:`resnorm_quant` (D a multiple of 64); returns (packed, scales) as it does."""
    return _call("norm_modulate_quant", (x, scale, shift, global_scale, eps, resolve_fast_math(fast_math), weight,
                                         norm_bias, modulate_index, resolve_nvfp4_4over6(nvfp4_4over6)))


def norm_modulate_quant_fp8(x: Tensor, scale: Tensor, shift: Tensor, input_scale: Tensor, eps: float = 1e-6, *,
                            weight: Optional[Tensor] = None, norm_bias: Optional[Tensor] = None,
                            modulate_index: Optional[Tensor] = None) -> Tensor:
    """LayerNorm + adaLN modulation + FP8 (E4M3) of ``x`` itself, no residual update, in one kernel: the
    bytes of ``fp8_quantize(y, input_scale)`` for y the bf16 LayerNorm + modulation of x (steps 3-7 on r = x,
    -0 read as +0). Arguments as in :func:`resnorm_quant_fp8`; returns float8_e4m3fn like x."""
    return _call("norm_modulate_quant_fp8", (x, scale, shift, input_scale, eps, weight, norm_bias, modulate_index))


def norm_modulate_quant_fp8_out(x: Tensor, scale: Tensor, shift: Tensor, input_scale: Tensor, eps: float = 1e-6, *,
                                y: Tensor, weight: Optional[Tensor] = None, norm_bias: Optional[Tensor] = None,
                                modulate_index: Optional[Tensor] = None, y_bf16: Optional[Tensor] = None) -> Tensor:
    """:func:`norm_modulate_quant_fp8` into ``y`` (float8_e4m3fn like x, contiguous, 16-byte aligned);
    ``y_bf16`` (optional, bf16 like x) also receives the bf16 y. Returns y."""
    _call("norm_modulate_quant_fp8_out", (x, scale, shift, input_scale, eps, y, weight, norm_bias, modulate_index,
                                          y_bf16), _memory_rules())
    return y


# ---------------------------------------------------------------------------------------------------
# The unified entries: one function per fusion, the output format an argument (the op table's FUSIONS)
# ---------------------------------------------------------------------------------------------------


def _by_format(fusion: str, format: str, values: dict, fast_math: Optional[bool] = None,
               nvfp4_4over6: object = UNSET):
    """The (fusion, format) op of the table on ``values`` (every argument by name: the quantization scale under
    both of its names, global_scale and input_scale). ``fast_math`` and ``nvfp4_4over6`` are the NVFP4
    quantizer's settings: refused, naming the argument, where the chosen op has none."""
    name = ops.FUSIONS.get((fusion, format))
    if name is None:
        formats = sorted(f for fu, f in ops.FUSIONS if fu == fusion)
        raise ValueError(f"format must be one of {formats} here, got {format!r}")
    names = ops.OPS[name].argument_names
    nvfp4 = "nvfp4_4over6_code" in names
    for setting, given in (("fast_math", fast_math is not None), ("nvfp4_4over6", nvfp4_4over6 is not UNSET)):
        if given and not nvfp4:
            raise ValueError(f"{setting} is a setting of the NVFP4 quantizer; format={format!r} has none (omit it)")
    quant_scale = values.pop("quant_scale")
    if "global_scale" not in names and "input_scale" not in names:
        if quant_scale is not None:
            raise ValueError(f"quant_scale must be None with format={format!r} (no quantization)")
    elif quant_scale is None:
        kind = "global" if nvfp4 else "input"
        raise ValueError(f"quant_scale is required with format={format!r} (the {kind} scale)")
    values.update(global_scale=quant_scale, input_scale=quant_scale)
    if nvfp4:
        values.update(fast_math=resolve_fast_math(fast_math), nvfp4_4over6_code=resolve_nvfp4_4over6(nvfp4_4over6))
    return _call(name, tuple(values[n] for n in names))


def residual_norm(residual: Tensor, x: Tensor, bias: Optional[Tensor], gate: Tensor, scale: Tensor, shift: Tensor,
                  quant_scale: Optional[Tensor] = None, eps: float = 1e-6, *, format: str = "nvfp4",
                  fast_math: Optional[bool] = None, weight: Optional[Tensor] = None,
                  norm_bias: Optional[Tensor] = None, modulate_index: Optional[Tensor] = None,
                  nvfp4_4over6: object = UNSET) -> Tuple[Tensor, ...]:
    """Gated residual update + LayerNorm + adaLN modulation, in the output ``format``, in one kernel.

    format "nvfp4": :func:`resnorm_quant` (``quant_scale`` the global scale) -> (packed, scales, residual_out);
    "fp8": :func:`resnorm_quant_fp8` (``quant_scale`` the static input_scale) -> (y E4M3, residual_out);
    "bf16": :func:`resnorm` (``quant_scale`` None) -> (y, residual_out). The other arguments as there;
    ``fast_math`` and ``nvfp4_4over6`` are NVFP4 settings (a ValueError with another format). Bytes equal the
    format's own wrapper's.
    """
    values = dict(residual=residual, x=x, bias=bias, gate=gate, scale=scale, shift=shift, quant_scale=quant_scale,
                  eps=eps, weight=weight, norm_bias=norm_bias, modulate_index=modulate_index)
    return _by_format("residual_norm", format, values, fast_math, nvfp4_4over6)


def norm_modulate_quantize(x: Tensor, scale: Tensor, shift: Tensor, quant_scale: Tensor, eps: float = 1e-6, *,
                           format: str = "nvfp4", fast_math: Optional[bool] = None, weight: Optional[Tensor] = None,
                           norm_bias: Optional[Tensor] = None, modulate_index: Optional[Tensor] = None,
                           nvfp4_4over6: object = UNSET):
    """LayerNorm + adaLN modulation of ``x`` (no residual update) and quantization in the output ``format``:
    :func:`norm_modulate_quant` ("nvfp4" -> (packed, scales)) or :func:`norm_modulate_quant_fp8` ("fp8" -> y
    E4M3), arguments as there (``quant_scale`` the global or the input scale)."""
    values = dict(x=x, scale=scale, shift=shift, quant_scale=quant_scale, eps=eps, weight=weight,
                  norm_bias=norm_bias, modulate_index=modulate_index)
    return _by_format("norm", format, values, fast_math, nvfp4_4over6)


def quantize(y: Tensor, quant_scale: Tensor, *, format: str = "nvfp4", fast_math: Optional[bool] = None,
             nvfp4_4over6: object = UNSET):
    """bf16 ``y`` quantized in the output ``format``: :func:`nvfp4_quantize` ("nvfp4" -> (packed, scales),
    ``quant_scale`` the global scale) or :func:`fp8_quantize` ("fp8" -> E4M3 of y's shape, ``quant_scale`` the
    input scale)."""
    return _by_format("quantize", format, dict(y=y, quant_scale=quant_scale), fast_math, nvfp4_4over6)


def gelu_tanh_quantize(y: Tensor, quant_scale: Tensor, *, format: str = "fp8") -> Tensor:
    """GELU(tanh) of bf16 ``y`` quantized in the output ``format``: :func:`gelu_tanh_fp8_quantize` ("fp8", the
    only format it has: ``quant_scale`` the input scale) -> E4M3 of y's shape."""
    return _by_format("gelu_tanh", format, dict(y=y, quant_scale=quant_scale))


#: The unified entry of each fusion of the op table (ops.FUSIONS).
ENTRY_POINTS = {"residual_norm": residual_norm, "norm": norm_modulate_quantize, "quantize": quantize,
                "gelu_tanh": gelu_tanh_quantize}


#: The typed wrappers the package exports (``qwen_resnorm_fp4.<name>``).
__all__ = ["resnorm_quant", "resnorm", "nvfp4_quantize", "dequantize_nvfp4", "resnorm_quant_out", "resnorm_out",
           "nvfp4_quantize_out", "empty_quantize_outputs", "empty_resnorm_quant_outputs", "empty_resnorm_outputs",
           "check_fp8_input_scale", "resnorm_quant_fp8", "resnorm_quant_fp8_out", "empty_resnorm_quant_fp8_outputs",
           "fp8_quantize", "fp8_quantize_out", "gelu_tanh_fp8_quantize", "gelu_tanh_fp8_quantize_out",
           "norm_modulate_quant", "norm_modulate_quant_fp8", "norm_modulate_quant_fp8_out",
           # the unified entries (the output format an argument)
           "residual_norm", "norm_modulate_quantize", "quantize", "gelu_tanh_quantize"]
