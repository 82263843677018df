"""The NVFP4 GEMM on already-quantized activations.

:func:`apply_nvfp4_gemm_prequantized` computes ``out = x @ W.T (+ bias)`` from E2M1-packed activations and
their 128x4-swizzled E4M3 block scales (what the fused NVFP4 ops, the library's standalone quantizer and
the production ``fp4_quantize`` write) and an NVFP4 layer's
weights (:class:`~qwen_resnorm_fp4.linear.NVFP4Linear`).

Three paths (``backend``):

- **FlashInfer** (``mm_fp4``) on CUDA GPUs of compute capability 10.x, 11.x or 12.x (Blackwell) when
  ``flashinfer`` imports. The GEMM takes ``a`` = packed [M, K/2], ``b`` = the weight's column-major view
  [K/2, N], ``a_descale`` = the activation scales [round_up(M, 128), K/16] and ``b_descale`` = the weight
  scales' transposed view [K/16, round_up(N, 128)], both uint8, ``alpha`` and a bf16/fp16 output.
  FlashInfer's CUTLASS kernel needs K and N to be multiples of 32: K is a multiple of 64 here (the
  quantizer's own rule), N is zero-padded to a multiple of 32 (a copy of the packed weight, made once and
  cached on the layer; the scale tensor already has round_up(N, 128) rows), and the output is sliced back to
  ``out_features`` columns. M needs no padding: the scale tensor carries round_up(M, 128) rows. The
  ``"trtllm"`` backend is refused: it needs weights prepared with ``do_shuffle=True``, which these are not.
- **tensor_core** (the default on other CUDA GPUs, e.g. Hopper): both operands become their exact bf16 values
  without the global scale, ``e2m1 * e4m3`` (:func:`~qwen_resnorm_fp4.api.dequantize_to_bf16`, a CUDA kernel; at
  most 6 significant bits in [2^-10, 2688], so exact in bf16), and one bf16 tensor-core GEMM with fp32 accumulation
  computes ``round_to_out_dtype(acc * alpha (+ bias))``: alpha (fp32) applied once to the fp32 accumulator, bias
  added in fp32, one rounding. That is what a Blackwell block-scaled FP4 MMA computes, up to the order of the fp32
  accumulation. cuBLAS does it in its epilogue (``addmm`` with ``alpha``), with reduced-precision split-K reductions
  turned off for the call (``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction``, restored
  afterwards); for a float32 bias or a float16/float32 output the fp32 product is written and one elementwise pass
  applies alpha, bias and the cast. The weight operand is dequantized on every call (N * K * 2 bytes written and
  read again) unless the layer has ``cache_dequantized_weight=True``, which keeps it.
- **reference** everywhere, the default on CPU: both operands
  are dequantized exactly as the format defines them (``e2m1 * e4m3 / global_scale``, fp32, see
  :func:`~qwen_resnorm_fp4.dequantize_nvfp4`), multiplied in fp32 (``torch.matmul``; TF32 only if the caller
  enabled ``torch.backends.cuda.matmul.allow_tf32``) and cast once to ``out_dtype``. A correctness path.

On the FlashInfer path the GEMM output has already been rounded to ``out_dtype``, so a bias rounds a second
time; on the other two the bias is added in fp32 before the one rounding. Either way
:meth:`NVFP4Linear.forward` on a BF16 tensor is "quantize, then this function", so it is bit-identical to this
function on the same packed activations (same device, same backend).

Nothing here synchronises with the host on the hot path, so every path can be captured in a CUDA graph
(FlashInfer's autotuner aside: call once before capturing). The tensor-core path reads ``alpha`` as a host
number, kept in the layer's :class:`GemmCache` when first used (one synchronisation then, and again only
after the tensor changes): call the layer once eagerly before capturing it after a ``load_state_dict``.

The functions here are stateless: what they keep between calls (the host alpha, the N-padded weight, the
bf16 weight operand) goes into the ``gemm_cache`` the layer owns (:class:`GemmCache`;
:class:`~qwen_resnorm_fp4.linear.NVFP4Linear` makes one and empties it when its tensors change). A layer
without one keeps nothing: its alpha is read to the host at every tensor-core call.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator, Optional, Tuple, Union

import torch

from . import reference
from .api import call_nvfp4_dequantize_bf16
from .device import capability_major
from .layout import round_up, scales_bytes, scales_shape

Tensor = torch.Tensor

#: Backends accepted by :func:`apply_nvfp4_gemm_prequantized`. "auto" picks FlashInfer where it can serve
#: (and then lets FlashInfer choose among its own backends), else the tensor-core path on CUDA, else the
#: reference.
FLASHINFER_BACKENDS = ("auto", "cudnn", "cutlass", "cute-dsl", "cutedsl_low_latency", "b12x")
TENSOR_CORE = "tensor_core"
REFERENCE = "reference"
BACKENDS = FLASHINFER_BACKENDS + (TENSOR_CORE, REFERENCE)


def check_gemm_backend(gemm_backend: Any, name: str = "gemm_backend") -> str:
    """``gemm_backend``, or a TypeError / ValueError naming the argument unless it is one of :data:`BACKENDS`."""
    if not isinstance(gemm_backend, str):
        raise TypeError(f"{name} must be a str, got {type(gemm_backend).__name__}")
    if gemm_backend not in BACKENDS:
        hint = " (it needs weights prepared with do_shuffle=True)" if gemm_backend == "trtllm" else ""
        raise ValueError(f"{name} must be one of {BACKENDS}, got {gemm_backend!r}{hint}")
    return gemm_backend


#: The capability majors whose NVFP4 tensor cores FlashInfer's mm_fp4 drives.
BLACKWELL_MAJORS = (10, 11, 12)
#: FlashInfer's CUTLASS FP4 GEMM checks k % 32 == 0 and n % 32 == 0.
N_ALIGNMENT = 32
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class GemmCache:
    """What the GEMM keeps between calls of one layer, each entry ``(key, value)`` or None; the key says which
    tensor contents the value was made from. Owned by the layer (``layer.gemm_cache``), which empties it
    (:meth:`clear`) when its tensors are replaced."""

    def __init__(self) -> None:
        self.host_alpha: Optional[Tuple[tuple, float]] = None
        self.padded_weight: Optional[Tuple[tuple, Tensor]] = None
        self.weight_bf16: Optional[Tuple[tuple, Tensor]] = None

    def clear(self) -> None:
        """Forget every entry."""
        self.host_alpha = self.padded_weight = self.weight_bf16 = None


def _cache_of(layer: Any) -> GemmCache:
    """The layer's cache, or an empty one that is dropped after the call (a layer without ``gemm_cache``)."""
    cache = getattr(layer, "gemm_cache", None)
    return cache if cache is not None else GemmCache()


@functools.cache
def flashinfer_mm_fp4() -> Optional[Any]:
    """FlashInfer's ``mm_fp4``, or None when ``flashinfer`` does not import (not installed, or a missing
    dependency)."""
    try:
        from flashinfer import mm_fp4  # type: ignore
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return mm_fp4


@torch.compiler.assume_constant_result
def _flashinfer_serves_index(index: int) -> bool:
    """A constant for torch.compile: CUDA device ``index`` (-1: the current one) is a Blackwell GPU and
    FlashInfer imports."""
    return capability_major(index) in BLACKWELL_MAJORS and flashinfer_mm_fp4() is not None


def flashinfer_serves(device: torch.device) -> bool:
    """True when the FlashInfer path would run on ``device``: a Blackwell GPU and an importable FlashInfer."""
    device = torch.device(device)
    if device.type != "cuda":
        return False
    return _flashinfer_serves_index(-1 if device.index is None else device.index)


def resolve_backend(backend: str, device: torch.device) -> str:
    """The path ``backend`` takes on ``device``: "flashinfer", "tensor_core" or "reference" (ValueError for a
    FlashInfer backend name where FlashInfer does not serve, or an unknown name)."""
    check_gemm_backend(backend, "backend")
    if backend == REFERENCE:
        return REFERENCE
    if backend == TENSOR_CORE:
        return TENSOR_CORE
    device = torch.device(device)
    if flashinfer_serves(device):
        return "flashinfer"
    if backend != "auto":
        raise ValueError(f"backend {backend!r} needs FlashInfer on a Blackwell GPU (compute capability 10.x-12.x); "
                         f"use 'auto', 'tensor_core' or 'reference' on {device}")
    return TENSOR_CORE if device.type == "cuda" else REFERENCE


# ----------------------------------------------------------------------------------------------------
# The exact bf16 operand
# ----------------------------------------------------------------------------------------------------


def _dequantize_bf16(packed: Tensor, scales: Tensor) -> Tensor:
    """The exact bf16 operand (:func:`~qwen_resnorm_fp4.api.dequantize_to_bf16`) of arguments the GEMM has
    checked (its _check, the layer's own tensors): aligned copies where needed, contiguity alone while
    tracing."""
    return call_nvfp4_dequantize_bf16(packed, scales)


# ----------------------------------------------------------------------------------------------------
# The tensor-core GEMM
# ----------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _fp32_reductions() -> Iterator[None]:
    """cuBLAS keeps every reduction of a bf16 GEMM in fp32 inside this block (no reduced-precision split-K);
    the caller's setting comes back afterwards."""
    matmul = torch.backends.cuda.matmul
    if not matmul.allow_bf16_reduced_precision_reduction:
        yield
        return
    try:
        split_k = matmul.allow_bf16_reduced_precision_reduction_split_k  # torch >= 2.10: a second flag
    except AttributeError:
        split_k = None
    matmul.allow_bf16_reduced_precision_reduction = False if split_k is None else (False, split_k)
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction = True if split_k is None else (True, split_k)


@functools.cache
def _mm_has_fp32_out(device: torch.device) -> bool:
    """Whether this torch's ``torch.mm(bf16, bf16, out_dtype=torch.float32)`` runs on ``device``, asked once on
    a 1 x 1 product (never around a real call, whose errors must propagate)."""
    one = torch.ones((1, 1), dtype=torch.bfloat16, device=device)
    try:
        torch.mm(one, one, out_dtype=torch.float32)
    except (TypeError, NotImplementedError, RuntimeError):
        return False
    return True


def _mm_fp32_out(a: Tensor, b: Tensor) -> Tensor:
    """fp32 a @ b of exact bf16 operands with fp32 accumulation."""
    if a.is_cuda and _mm_has_fp32_out(a.device):
        return torch.mm(a, b, out_dtype=torch.float32)
    # fp32 (or TF32: 10 mantissa bits) holds these operands exactly, so this is the same product
    return torch.mm(a.float(), b.float())


def _scale_bias_cast(acc: Tensor, alpha: Union[float, Tensor], bias: Optional[Tensor],
                     out_dtype: torch.dtype) -> Tensor:
    """round_to_out_dtype(acc * alpha (+ bias)), in fp32 until the one cast (alpha a float or an fp32 tensor)."""
    out = acc * alpha
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def _bf16_gemm_fp32_accumulate_eager(a: Tensor, w: Tensor, alpha: float, bias: Optional[Tensor],
                                     out_dtype: torch.dtype) -> Tensor:
    """round_to_out_dtype(fp32 acc(a @ w.T) * alpha (+ bias)) for exact bf16 operands a [M, K], w [N, K]."""
    if not a.is_cuda:
        return _scale_bias_cast(torch.mm(a.float(), w.float().t()), alpha, bias, out_dtype)
    with _fp32_reductions():
        if out_dtype == torch.bfloat16 and (bias is None or bias.dtype == torch.bfloat16):
            # cuBLAS's epilogue: alpha * fp32 acc (+ bias), rounded once to bf16
            if bias is None:
                out = torch.empty((a.shape[0], w.shape[0]), dtype=torch.bfloat16, device=a.device)
                return out.addmm_(a, w.t(), beta=0, alpha=alpha)
            return torch.addmm(bias, a, w.t(), beta=1, alpha=alpha)
        acc = _mm_fp32_out(a, w.t())
    return _scale_bias_cast(acc, alpha, bias, out_dtype)


@torch.library.custom_op("qwen_fp4::_bf16_gemm_fp32_accumulate_scaled", mutates_args=(),
                         schema="(Tensor a, Tensor w, Tensor alpha, Tensor? bias, ScalarType out_dtype) -> Tensor")
def _bf16_gemm_fp32_accumulate_scaled(a: Tensor, w: Tensor, alpha: Tensor, bias: Optional[Tensor],
                                      out_dtype: torch.dtype) -> Tensor:
    """round_to_out_dtype(fp32(acc * alpha) (+ bias)) with alpha the layer's fp32 [1] tensor on the device: the
    form torch.compile traces (a host float would be a per-layer constant, so every layer would need its own
    graph). The eager form (cuBLAS's epilogue, bf16 out) computes the same formula; where cuBLAS picks another
    summation order for an fp32 output, the two can differ in the last bit of the sum."""
    with _fp32_reductions():
        acc = _mm_fp32_out(a, w.t())
    return _scale_bias_cast(acc, alpha.float(), bias, out_dtype)


@_bf16_gemm_fp32_accumulate_scaled.register_fake
def _bf16_gemm_fp32_accumulate_scaled_fake(a, w, alpha, bias, out_dtype):
    return a.new_empty((a.shape[0], w.shape[0]), dtype=out_dtype)


def tensor_version(t: Tensor) -> Optional[int]:
    """The in-place version counter of a layer tensor, the key of the caches below, or None for an inference
    tensor (made under torch.inference_mode), which has none: such a tensor can only change in place inside
    inference mode, where a cache keyed on its address alone may go stale."""
    return None if t.is_inference() else t._version


def host_alpha(layer: Any, cache: GemmCache) -> float:
    """``layer.alpha`` as a Python float (exact: an fp32 value), kept in ``cache`` and re-read only when the
    tensor changes (one host synchronisation then). Inside CUDA-graph capture a stale cache is an error. Eager
    calls only: a traced GEMM takes the alpha tensor (:func:`_bf16_gemm_fp32_accumulate_scaled`)."""
    alpha = layer.alpha
    cached = cache.host_alpha
    key = (alpha.device, alpha.data_ptr(), tensor_version(alpha))
    if cached is not None and cached[0] == key:
        return cached[1]
    if alpha.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("layer.alpha changed since the layer last ran eagerly: call it once outside the CUDA "
                           "graph capture (reading alpha to the host needs a synchronisation)")
    value = float(alpha.reshape(-1)[0].item())
    cache.host_alpha = (key, value)
    return value


def weight_operand(layer: Any, cache: GemmCache) -> Tensor:
    """The layer's weight as the exact bf16 operand [N, K] (:func:`_dequantize_bf16`): made on every call,
    or kept in ``cache`` when the layer's ``cache_dequantized_weight`` is true (refreshed when the weight
    tensors change; never cached from inside a CUDA-graph capture; used as it is while torch.compile traces)."""
    n = _out_features(layer)
    packed, scales = layer.weight_packed, layer.weight_scales
    if not getattr(layer, "cache_dequantized_weight", False):
        return _dequantize_bf16(packed[:n], scales)
    cached = cache.weight_bf16
    if torch.compiler.is_compiling():
        return cached[1] if cached is not None else _dequantize_bf16(packed[:n], scales)
    key = (packed.device, packed.data_ptr(), tensor_version(packed), scales.data_ptr(), tensor_version(scales), n)
    if cached is not None and cached[0] == key:
        return cached[1]
    w = _dequantize_bf16(packed[:n], scales)
    if w.is_cuda and torch.cuda.is_current_stream_capturing():
        return w  # made inside a graph: only written on replay, never cache it
    cache.weight_bf16 = (key, w)
    return w


def _tensor_core(layer: Any, x_fp4: Tensor, x_scales: Tensor, out_dtype: torch.dtype,
                 bias: Optional[Tensor]) -> Tensor:
    a = _dequantize_bf16(x_fp4, x_scales)  # checked by apply_nvfp4_gemm_prequantized's _check
    cache = _cache_of(layer)
    if torch.compiler.is_compiling():  # alpha stays a tensor: one graph serves layers of different alphas
        return _bf16_gemm_fp32_accumulate_scaled(a, weight_operand(layer, cache), layer.alpha, bias, out_dtype)
    return _bf16_gemm_fp32_accumulate_eager(a, weight_operand(layer, cache), host_alpha(layer, cache), bias,
                                            out_dtype)


# ----------------------------------------------------------------------------------------------------
# FlashInfer and the reference
# ----------------------------------------------------------------------------------------------------


def _padded_weight(layer: Any, n_pad: int) -> Tensor:
    """The packed weight with rows zero-padded to ``n_pad`` (kept in the layer's cache, refreshed if the
    tensor changes)."""
    w = layer.weight_packed
    if w.shape[0] == n_pad:
        return w.contiguous()
    key = (w.data_ptr(), tensor_version(w), tuple(w.shape), n_pad)
    cache = _cache_of(layer)
    cached = cache.padded_weight
    if cached is not None and cached[0] == key:
        return cached[1]
    padded = torch.zeros((n_pad, w.shape[1]), dtype=w.dtype, device=w.device)
    padded[: w.shape[0]].copy_(w)
    if w.is_cuda and torch.cuda.is_current_stream_capturing():
        return padded  # a copy made inside a graph is only written on replay: never cache it
    cache.padded_weight = (key, padded)
    return padded


def _add_bias(out: Tensor, bias: Optional[Tensor], out_dtype: torch.dtype) -> Tensor:
    if bias is None:
        return out.to(out_dtype)
    return (out.float() + bias.float()).to(out_dtype)


def _check(layer: Any, x_fp4: Tensor, x_scales: Tensor, out_dtype: torch.dtype) -> int:
    for name in ("weight_packed", "weight_scales", "weight_global_scale", "input_global_scale", "alpha"):
        if not isinstance(getattr(layer, name, None), torch.Tensor):
            raise TypeError(f"layer must be an NVFP4 layer with a tensor {name!r} (e.g. NVFP4Linear)")
    if not isinstance(x_fp4, torch.Tensor) or x_fp4.dtype != torch.uint8 or x_fp4.dim() != 2:
        raise TypeError("x_fp4 must be a uint8 tensor [M, K/2] of packed E2M1 pairs")
    if not isinstance(x_scales, torch.Tensor) or x_scales.dtype not in (torch.uint8, torch.float8_e4m3fn):
        raise TypeError("x_scales must be a uint8 or float8_e4m3fn tensor of 128x4-swizzled block scales")
    k = layer.weight_packed.shape[1] * 2
    if x_fp4.shape[1] * 2 != k:
        raise ValueError(f"x_fp4 holds K = {x_fp4.shape[1] * 2} per row but the layer's in_features is {k}")
    m = x_fp4.shape[0]
    need = scales_bytes(m, k)
    if x_scales.numel() < need:
        raise ValueError(f"x_scales has {x_scales.numel()} bytes, {need} needed for {m} rows of K = {k}")
    if x_scales.device != x_fp4.device or layer.weight_packed.device != x_fp4.device:
        raise ValueError(f"x_fp4 ({x_fp4.device}), x_scales ({x_scales.device}) and the layer "
                         f"({layer.weight_packed.device}) must be on one device")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
    return k


def _out_features(layer: Any) -> int:
    n = getattr(layer, "out_features", None)
    return int(n) if n is not None else layer.weight_packed.shape[0]


def _dequantize(packed: Tensor, scales: Tensor, global_scale: Tensor, rows: int) -> Tensor:
    """fp32 [rows, K]: e2m1 * float(e4m3) / global_scale (``reference.dequantize_nvfp4``, which makes no
    host-to-device copies, so this can be captured in a CUDA graph)."""
    return reference.dequantize_nvfp4(packed, scales, global_scale, rows)


def _reference(layer: Any, x_fp4: Tensor, x_scales: Tensor, out_dtype: torch.dtype,
               bias: Optional[Tensor]) -> Tensor:
    m = x_fp4.shape[0]
    n = _out_features(layer)
    a = _dequantize(x_fp4, x_scales, layer.input_global_scale, m)
    w = _dequantize(layer.weight_packed, layer.weight_scales, layer.weight_global_scale, n)
    out = torch.matmul(a, w.t())  # fp32 [M, N]
    return _add_bias(out, bias, out_dtype)


def _flashinfer(layer: Any, x_fp4: Tensor, x_scales: Tensor, k: int, out_dtype: torch.dtype,
                bias: Optional[Tensor], backend: str) -> Tensor:
    mm_fp4 = flashinfer_mm_fp4()
    m = x_fp4.shape[0]
    n = _out_features(layer)
    n_pad = round_up(n, N_ALIGNMENT)
    w = _padded_weight(layer, n_pad)  # [n_pad, K/2]
    w_scales = layer.weight_scales.view(torch.uint8).reshape(-1, k // 16)  # [round_up(N, 128), K/16]
    a_scales = x_scales.view(torch.uint8).reshape(-1, k // 16)[: scales_shape(m, k)[0]]
    gemm_dtype = out_dtype if out_dtype != torch.float32 else torch.bfloat16  # mm_fp4 writes bf16/fp16 only
    out = mm_fp4(x_fp4.contiguous(), w.t(), a_scales, w_scales.t(), layer.alpha, gemm_dtype, None,
                 block_size=16, use_8x4_sf_layout=False, backend=backend, use_nvfp4=True)
    if n_pad != n:
        out = out[:, :n]
    return _add_bias(out, bias, out_dtype)


def apply_nvfp4_gemm_prequantized(
    layer: Any,
    x_fp4: Tensor,
    x_scales: Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: Optional[Tensor] = None,
    backend: str = "auto",
) -> Tensor:
    """``x @ W.T + bias`` for NVFP4 activations that are already quantized. Returns ``out_dtype`` [M, N].

    Args:
        layer: an :class:`~qwen_resnorm_fp4.linear.NVFP4Linear` (or any object with its tensors:
            weight_packed, weight_scales, weight_global_scale, input_global_scale, alpha, out_features; and
            optionally cache_dequantized_weight and a :class:`GemmCache` ``gemm_cache``).
        x_fp4: uint8 [M, K/2], two E2M1 codes a byte, quantized with ``layer.input_global_scale``.
        x_scales: uint8 (or float8_e4m3fn) block scales in the 128x4 layout, [round_up(M, 128), K/16] (any
            shape with that many bytes).
        out_dtype: bfloat16 (default), float16 or float32 (FlashInfer computes bf16, then it is widened).
        bias: optional [N] added in fp32 (see the module docstring for where it rounds). ``None``: the
            layer's own ``bias`` attribute, if it has one.
        backend: "auto" (FlashInfer on Blackwell with its own automatic choice, "tensor_core" on other CUDA
            GPUs, "reference" on CPU), a FlashInfer backend name ("cudnn", "cutlass", "cute-dsl",
            "cutedsl_low_latency", "b12x"; only on Blackwell with FlashInfer, else ValueError), "tensor_core"
            (exact bf16 operands, one bf16 GEMM with fp32 accumulation; any device, CUDA is the fast one) or
            "reference" (dequantize + fp32 matmul anywhere).
    """
    k = _check(layer, x_fp4, x_scales, out_dtype)
    path = resolve_backend(backend, x_fp4.device)
    if bias is None:
        bias = getattr(layer, "bias", None)
    if path == REFERENCE:
        return _reference(layer, x_fp4, x_scales, out_dtype, bias)
    if path == TENSOR_CORE:
        return _tensor_core(layer, x_fp4, x_scales, out_dtype, bias)
    return _flashinfer(layer, x_fp4, x_scales, k, out_dtype, bias, backend)


__all__ = ["apply_nvfp4_gemm_prequantized", "resolve_backend", "flashinfer_serves", "flashinfer_mm_fp4", "BACKENDS",
           "TENSOR_CORE", "REFERENCE", "GemmCache"]
