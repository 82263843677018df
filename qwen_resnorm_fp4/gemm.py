"""The NVFP4 GEMM on already-quantized activations.

:func:`apply_nvfp4_gemm_prequantized` computes ``out = x @ W.T (+ bias)`` from E2M1-packed activations and
their 128x4-swizzled E4M3 block scales (what :func:`~qwen_resnorm_fp4.resnorm_quant`,
:func:`~qwen_resnorm_fp4.nvfp4_quantize` and the production ``fp4_quantize`` write) and an NVFP4 layer's
weights (:class:`~qwen_resnorm_fp4.linear.NVFP4Linear`).

Two paths:

- **FlashInfer** (``mm_fp4``) on CUDA GPUs of compute capability 10.x, 11.x or 12.x (Blackwell) when
  ``flashinfer`` imports. The GEMM takes ``a`` = packed [M, K/2], ``b`` = the weight's column-major view
  [K/2, N], ``a_descale`` = the activation scales [round_up(M, 128), K/16] and ``b_descale`` = the weight
  scales' transposed view [K/16, round_up(N, 128)], both uint8, ``alpha = 1 / (input_global_scale *
  weight_global_scale)`` and a bf16/fp16 output. FlashInfer's CUTLASS kernel needs K and N to be
  multiples of 32: K is a multiple of 64 here (the quantizer's own rule), N is zero-padded to a multiple
  of 32 (a copy of the packed weight, made once and cached on the layer; the scale tensor already has
  round_up(N, 128) rows), and the output is sliced back to ``out_features`` columns. M needs no padding:
  the scale tensor carries round_up(M, 128) rows. The ``"trtllm"`` backend is refused: it needs weights
  prepared with ``do_shuffle=True``, which these are not.
- **portable** everywhere else (CPU, Hopper, no FlashInfer), or with ``backend="portable"``: both operands
  are dequantized exactly as the format defines them (``e2m1 * e4m3 / global_scale``, fp32, see
  :func:`~qwen_resnorm_fp4.dequantize_nvfp4`), multiplied in fp32 (``torch.matmul``; TF32 only if the
  caller enabled ``torch.backends.cuda.matmul.allow_tf32``) and cast once to ``out_dtype``. It dequantizes the whole weight on every call: a correctness path, not a fast one.

Bias is added after the GEMM in fp32 and the sum cast once to ``out_dtype``. On the portable path that is
the only rounding; on the FlashInfer path the GEMM output has already been rounded to ``out_dtype``, so a
bias rounds a second time. Either way :meth:`NVFP4Linear.forward` on a BF16 tensor is "quantize, then this
function", so it is bit-identical to this function on the same packed activations (same device, same
backend).

Nothing here synchronises with the host, so both paths can be captured in a CUDA graph (FlashInfer's
autotuner aside: call once before capturing).
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from . import reference
from .device import capability_major
from .layout import round_up

Tensor = torch.Tensor

#: Backends accepted by :func:`apply_nvfp4_gemm_prequantized`. "auto" picks FlashInfer where it can serve
#: (and then lets FlashInfer choose among its own backends), else the portable path.
FLASHINFER_BACKENDS = ("auto", "cudnn", "cutlass", "cute-dsl", "cutedsl_low_latency", "b12x")
BACKENDS = FLASHINFER_BACKENDS + ("portable",)
#: The capability majors whose NVFP4 tensor cores FlashInfer's mm_fp4 drives.
BLACKWELL_MAJORS = (10, 11, 12)
#: FlashInfer's CUTLASS FP4 GEMM checks k % 32 == 0 and n % 32 == 0.
N_ALIGNMENT = 32
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@functools.lru_cache(maxsize=None)
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


def _padded_weight(layer: Any, n_pad: int) -> Tensor:
    """The packed weight with rows zero-padded to ``n_pad`` (cached on the layer, refreshed if the buffer
    changes)."""
    w = layer.weight_packed
    if w.shape[0] == n_pad:
        return w.contiguous()
    key = (w.data_ptr(), w._version, tuple(w.shape), n_pad)
    cached = getattr(layer, "_qwen_fp4_padded_weight", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    padded = torch.zeros((n_pad, w.shape[1]), dtype=w.dtype, device=w.device)
    padded[: w.shape[0]].copy_(w)
    if w.is_cuda and torch.cuda.is_current_stream_capturing():
        return padded  # a copy made inside a graph is only written on replay: never cache it
    object.__setattr__(layer, "_qwen_fp4_padded_weight", (key, padded))  # not a buffer: no state_dict entry
    return padded


def _add_bias(out: Tensor, bias: Optional[Tensor], out_dtype: torch.dtype) -> Tensor:
    if bias is None:
        return out.to(out_dtype)
    return (out.float() + bias.float()).to(out_dtype)


def _check(layer: Any, x_fp4: Tensor, x_scales: Tensor, out_dtype: torch.dtype, backend: str) -> int:
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
    need = round_up(m, 128) * (k // 16)
    if x_scales.numel() < need:
        raise ValueError(f"x_scales has {x_scales.numel()} bytes, {need} needed for {m} rows of K = {k}")
    if x_scales.device != x_fp4.device or layer.weight_packed.device != x_fp4.device:
        raise ValueError(f"x_fp4 ({x_fp4.device}), x_scales ({x_scales.device}) and the layer "
                         f"({layer.weight_packed.device}) must be on one device")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
    if backend not in BACKENDS:
        hint = " (it needs weights prepared with do_shuffle=True)" if backend == "trtllm" else ""
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}{hint}")
    return k


def _out_features(layer: Any) -> int:
    n = getattr(layer, "out_features", None)
    return int(n) if n is not None else layer.weight_packed.shape[0]


def _dequantize(packed: Tensor, scales: Tensor, global_scale: Tensor, rows: int) -> Tensor:
    """fp32 [rows, K]: e2m1 * float(e4m3) / global_scale (``reference.dequantize_nvfp4``, which makes no
    host-to-device copies, so this can be captured in a CUDA graph)."""
    return reference.dequantize_nvfp4(packed, scales, global_scale, rows)


def _portable(layer: Any, x_fp4: Tensor, x_scales: Tensor, k: int, out_dtype: torch.dtype,
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
    a_scales = x_scales.view(torch.uint8).reshape(-1, k // 16)[: round_up(m, 128)]
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
        layer: an :class:`~qwen_resnorm_fp4.linear.NVFP4Linear` (or any object with its buffers:
            weight_packed, weight_scales, weight_global_scale, input_global_scale, alpha, out_features).
        x_fp4: uint8 [M, K/2], two E2M1 codes a byte, quantized with ``layer.input_global_scale``.
        x_scales: uint8 (or float8_e4m3fn) block scales in the 128x4 layout, [round_up(M, 128), K/16] (any
            shape with that many bytes).
        out_dtype: bfloat16 (default), float16 or float32 (FlashInfer computes bf16, then it is widened).
        bias: optional [N] added after the GEMM in fp32 (then one cast). ``None``: the layer's own ``bias``
            attribute, if it has one.
        backend: "auto" (FlashInfer on Blackwell with its own automatic choice, portable elsewhere), a
            FlashInfer backend name ("cudnn", "cutlass", "cute-dsl", "cutedsl_low_latency", "b12x"; only on
            Blackwell with FlashInfer, else ValueError), or "portable" (dequantize + fp32 matmul anywhere).
    """
    k = _check(layer, x_fp4, x_scales, out_dtype, backend)
    if bias is None:
        bias = getattr(layer, "bias", None)
    if backend == "portable":
        return _portable(layer, x_fp4, x_scales, k, out_dtype, bias)
    if flashinfer_serves(x_fp4.device):
        return _flashinfer(layer, x_fp4, x_scales, k, out_dtype, bias, backend)
    if backend != "auto":
        raise ValueError(f"backend {backend!r} needs FlashInfer on a Blackwell GPU (compute capability 10.x-12.x); "
                         f"use 'auto' or 'portable' on {x_fp4.device}")
    return _portable(layer, x_fp4, x_scales, k, out_dtype, bias)


__all__ = ["apply_nvfp4_gemm_prequantized", "flashinfer_serves", "flashinfer_mm_fp4", "BACKENDS"]
