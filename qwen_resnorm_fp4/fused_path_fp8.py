"""The fused path of a DiT block into an FP8 (E4M3) FC1: :func:`try_fused_resnorm_quant_fp8`.

The FP8 counterpart of :func:`~qwen_resnorm_fp4.try_fused_resnorm_quant`: it takes the block's tensors and
FC1's static ``input_scale`` (ModelOpt's amax / 448) and either returns ``(y_e4m3, residual_out)`` from one
call of :func:`~qwen_resnorm_fp4.resnorm_quant_fp8`, or returns ``None`` so that the caller runs its
unfused code (the bf16 row op + :func:`~qwen_resnorm_fp4.fp8_quantize`, the same bytes). It never raises for a
condition the fused path cannot serve; the reason is kept where the NVFP4 path keeps its own
(:func:`~qwen_resnorm_fp4.last_decline_reason`, :func:`~qwen_resnorm_fp4.last_decline_detail`, per thread, eager
calls). Each ``try_fused_*`` has a ``serve_fused_*`` twin that returns the
:class:`~qwen_resnorm_fp4._fused_common.Decline` instead of None (for call sites that keep their own reasons).

The decision uses only static properties (dtypes, shapes, devices, the environment), so it is traced away by
``torch.compile(fullgraph=True)`` and does nothing on the device while a CUDA graph is captured. The value
of ``input_scale`` is not read here (that would synchronise): the layer that owns it checked it when it was
made (:class:`~qwen_resnorm_fp4.FP8Linear`).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch

from ._fused_common import Decline, decline, decline_for, gate_declined, norm_and_inputs_served, public_gate
from .api import call_resnorm_quant_fp8, call_resnorm_quant_fp8_out, empty_resnorm_quant_fp8_outputs
from .api import call_gelu_tanh_fp8_quantize, call_norm_modulate_quant_fp8
from .validation import DeclineReason, fp8_quantize_problem, norm_modulate_quant_fp8_problem
from .validation import resnorm_quant_fp8_problem

Tensor = torch.Tensor


def serve_fused_resnorm_quant_fp8(
    residual: Tensor,
    x: Tensor,
    gate: Tensor,
    scale: Tensor,
    shift: Tensor,
    input_scale: Tensor,
    *,
    bias: Optional[Tensor] = None,
    eps: float = 1e-6,
    norm: Any = None,
    modulate_index: Optional[Tensor] = None,
    allow_cpu: bool = False,
    with_bf16: bool = False,
) -> Union[Tuple[Tensor, ...], Decline]:
    """The fused ``residual + gate * (x + bias) -> LayerNorm -> (1 + scale), shift -> E4M3`` for an FP8 FC1,
    or None.

    Replaces, in a DiT block::

        residual = residual + gate * x                      # gated residual update (x: attention output)
        y = norm2(residual) * (1 + scale) + shift           # LayerNorm + adaLN modulation
        h = fc1(y)                                          # FP8 GEMM (quantizes y inside)

    with ``q, residual = result`` and ``h = fc1(q)`` (an :class:`~qwen_resnorm_fp4.FP8Linear`).

    Args:
        residual, x: bf16 [..., D], contiguous, one shape.
        gate, scale, shift: as for :func:`~qwen_resnorm_fp4.try_fused_resnorm_quant` ([D], [B, D], [B, 1, D],
            per token, or [2B, D] with ``modulate_index``).
        input_scale: FC1's ``input_scale``, a float32 one-element tensor on x's device (amax / 448).
        bias, eps, norm, modulate_index, allow_cpu: as for :func:`~qwen_resnorm_fp4.try_fused_resnorm_quant`.
        with_bf16: also return the BF16 y the E4M3 bytes are made from (written by the same launch:
            ``resnorm_quant_fp8_out``'s ``y_bf16``).

    Returns:
        ``(y, residual_out)``: y float8_e4m3fn like x (E4M3(clamp(y_bf16 * (1 / input_scale), -448, 448))),
        residual_out bf16 like x; with ``with_bf16``, ``(y, residual_out, y_bf16)``; or ``None`` (see
        :func:`~qwen_resnorm_fp4.last_decline_reason`); ``serve_fused_resnorm_quant_fp8`` returns the Decline
        instead of None.
    """
    declined = gate_declined({"x": x, "residual": residual}, allow_cpu)
    if declined is not None:
        return declined
    served = norm_and_inputs_served(x, residual, norm, eps, lambda e, w, nb: resnorm_quant_fp8_problem(
        residual, x, bias, gate, scale, shift, input_scale, e, w, nb, modulate_index))
    if isinstance(served, Decline):
        return served
    weight, norm_bias, norm_eps = served

    # The op on arguments that passed its rules (operands prepared, no second check).
    if with_bf16:
        y, residual_out = empty_resnorm_quant_fp8_outputs(x)
        y_bf16 = torch.empty_like(x)
        call_resnorm_quant_fp8_out(residual, x, bias, gate, scale, shift, input_scale, float(norm_eps), y,
                                   residual_out, weight, norm_bias, modulate_index, y_bf16)
        return y, residual_out, y_bf16
    y, residual_out = call_resnorm_quant_fp8(residual, x, bias, gate, scale, shift, input_scale, float(norm_eps),
                                             weight, norm_bias, modulate_index)
    return y, residual_out


def serve_fused_norm_modulate_quant_fp8(
    x: Tensor,
    scale: Tensor,
    shift: Tensor,
    input_scale: Tensor,
    *,
    eps: float = 1e-6,
    norm: Any = None,
    modulate_index: Optional[Tensor] = None,
    allow_cpu: bool = False,
) -> Union[Tensor, Decline]:
    """The fused ``LayerNorm -> (1 + scale), shift -> E4M3`` of a block's first norm (no residual update) for
    the FP8 Linears that read it (e.g. to_q, to_k and to_v, one shared ``input_scale``), or None.

    Replaces ``y = norm1(x) * (1 + scale) + shift`` followed by each Linear's own quantization of y with one
    call of :func:`~qwen_resnorm_fp4.norm_modulate_quant_fp8`; the bytes equal ``fp8_quantize`` of the bf16
    y of the bf16 row op on (x, zeros, no bias, gate zeros, scale, shift) (the unfused chain). Arguments as for
    :func:`try_fused_resnorm_quant_fp8` without residual, gate and bias. Returns float8_e4m3fn like x, or
    ``None`` (``try_fused_*``, see :func:`~qwen_resnorm_fp4.last_decline_reason`) or the Decline
    (``serve_fused_*``)."""
    declined = gate_declined({"x": x}, allow_cpu)
    if declined is not None:
        return declined
    served = norm_and_inputs_served(x, x, norm, eps, lambda e, w, nb: norm_modulate_quant_fp8_problem(
        x, scale, shift, input_scale, e, w, nb, modulate_index))
    if isinstance(served, Decline):
        return served
    weight, norm_bias, norm_eps = served
    y = call_norm_modulate_quant_fp8(x, scale, shift, input_scale, float(norm_eps), weight, norm_bias, modulate_index)
    return y


def serve_fused_gelu_tanh_fp8_quantize(h: Tensor, input_scale: Tensor, *,
                                       allow_cpu: bool = False) -> Union[Tensor, Decline]:
    """The fused ``GELU(tanh) -> E4M3`` between a GELU FeedForward's two Linears when the second is an
    :class:`~qwen_resnorm_fp4.FP8Linear`, or None: :func:`~qwen_resnorm_fp4.gelu_tanh_fp8_quantize` of the
    first Linear's bf16 output ``h`` with the second's ``input_scale`` (the bytes of
    ``fc2.quantize_input(F.gelu(h, approximate="tanh"))`` on the GPU). Returns float8_e4m3fn like h, or
    ``None`` (``try_fused_*``, see :func:`~qwen_resnorm_fp4.last_decline_reason`) or the Decline
    (``serve_fused_*``)."""
    declined = gate_declined({"h": h}, allow_cpu)
    if declined is not None:
        return declined
    problem = fp8_quantize_problem(h, input_scale)
    if problem is not None:
        return decline_for(problem)
    if not h.is_contiguous():
        return decline(DeclineReason.NON_CONTIGUOUS, "h is not contiguous")
    q = call_gelu_tanh_fp8_quantize(h, input_scale)
    return q


try_fused_resnorm_quant_fp8 = public_gate(serve_fused_resnorm_quant_fp8)
try_fused_norm_modulate_quant_fp8 = public_gate(serve_fused_norm_modulate_quant_fp8)
try_fused_gelu_tanh_fp8_quantize = public_gate(serve_fused_gelu_tanh_fp8_quantize)

__all__ = ["try_fused_resnorm_quant_fp8", "try_fused_norm_modulate_quant_fp8", "try_fused_gelu_tanh_fp8_quantize",
           "serve_fused_resnorm_quant_fp8", "serve_fused_norm_modulate_quant_fp8",
           "serve_fused_gelu_tanh_fp8_quantize"]
