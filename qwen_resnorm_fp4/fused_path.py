"""The fused path of a DiT block: the fused kernel where it can serve, and why not where it cannot.

:func:`try_fused_resnorm_quant` is the model-side entry point. It takes a DiT block's tensors (the residual
stream, the attention output, the adaLN gate/scale/shift), the norm's settings and the FC1 layer, and either
returns what the FC1 NVFP4 GEMM consumes (packed activations and swizzled block scales) plus the updated
residual stream, or returns ``None`` so that the caller runs its unfused code. It never raises for a
condition the fused path cannot serve; the reason for this thread's last decline is kept
(:func:`last_decline_reason`, :func:`last_decline_detail`) and each distinct reason is logged once at
DEBUG level on the ``qwen_resnorm_fp4`` logger. :func:`serve_fused_resnorm_quant` is the same gate returning
the :class:`~qwen_resnorm_fp4._fused_common.Decline` instead of None, for call sites that keep their own
reasons (the converted models).

The decision applies the ops' own rules (:mod:`qwen_resnorm_fp4.validation`) as declines, plus the fused
path's: the switches, a device with a kernel, x and residual contiguous (no hidden copy of the
activations), at least one row, a LayerNorm, an NVFP4 FC1 of width D. Then the op is called once; an error
of the op itself reaches the caller. The decision uses only static properties (dtypes, shapes, device
types, ``isinstance``, environment variables), so it is traced away by ``torch.compile(fullgraph=True)``
and does nothing on the device while a CUDA graph is captured (no host synchronisation, no ``.item()``).

Under ``torch.compile`` the environment variables are read when the function is traced: changing them later
takes effect only after a recompilation (``torch._dynamo.reset()``). Compiled code records no decline
(``last_decline_reason`` is for eager calls) and logs nothing.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch

from ._fused_common import Decline, decline, decline_for, device_declined, norm_and_inputs_served, public_gate
from ._fused_common import last_decline_detail, last_decline_reason, reset_decline_log
from .api import call_resnorm_quant
from .env import DISABLE_VAR, flag_enabled, resolve_fast_math
from .recipe import UNSET, resolve_nvfp4_4over6
from .validation import COLS_MULTIPLE, DeclineReason, global_scale_problem, resnorm_inputs_problem

Tensor = torch.Tensor


def serve_fused_resnorm_quant(
    residual: Tensor,
    x: Tensor,
    gate: Tensor,
    scale: Tensor,
    shift: Tensor,
    fc1: Any,
    *,
    bias: Optional[Tensor] = None,
    eps: float = 1e-6,
    norm: Any = None,
    modulate_index: Optional[Tensor] = None,
    gate_out: Optional[Tensor] = None,
    allow_cpu: bool = False,
    fast_math: Optional[bool] = None,
    nvfp4_4over6: Any = UNSET,
) -> Union[Tuple[Tuple[Tensor, Tensor], Tensor, Optional[Tensor]], Decline]:
    """The fused ``residual + gate * (x + bias) -> LayerNorm -> (1 + scale), shift -> NVFP4`` for FC1, or None.

    Replaces, in a DiT block::

        residual = residual + gate * x                      # gated residual update (x: attention output)
        y = norm2(residual) * (1 + scale) + shift           # LayerNorm + adaLN modulation
        h = fc1(y)                                          # NVFP4 GEMM (quantizes y inside)

    with ``(packed, scales), residual, gate_out = result`` and ``h = fc1((packed, scales), out_shape=...)``.

    Args:
        residual, x: bf16 [..., D], contiguous, one shape (typically [B, S, D]).
        gate, scale, shift: bf16 or fp32, one shape: [D], [B, D], [B, 1, D], per token [B, S, D] (B * S = x's
            rows, e.g. ``temb.chunk(6, dim=-1)`` views) or [M, D], or [2B, D] with ``modulate_index``.
        fc1: the FC1 layer, an :class:`~qwen_resnorm_fp4.linear.NVFP4Linear` (or any object with an int
            ``in_features`` and a float32 one-element ``input_global_scale`` tensor on x's device).
        bias: optional [D], added to x before the gate.
        eps: the LayerNorm epsilon, used when ``norm`` does not carry one.
        norm: the norm's settings. ``None``: LayerNorm without affine parameters, epsilon ``eps``.
            A ``torch.nn.LayerNorm`` over the last dimension (its weight/bias/eps are used). Or a mapping /
            namespace with ``type`` ("layernorm"; anything else, e.g. "rmsnorm", declines),
            ``elementwise_affine``, ``weight``, ``bias``, ``eps``. Any other module declines.
        modulate_index: optional [B, S] (int32, int64 or bool), diffusers' zero_cond_t convention.
        gate_out: the gate of the post-MLP residual update; passed through untouched.
        allow_cpu: run on CPU tensors (the pure-PyTorch reference); otherwise CPU tensors decline.
        fast_math: the quantizer's fast mode. ``None``: ``fc1.fast_math`` when the layer pins one, else the
            environment (FLASHINFER_/TRTLLM_DISABLE_FP4_QUANT_FAST_MATH), as the production quantizer.
        nvfp4_4over6: the block-scale recipe (qwen_resnorm_fp4.recipe): None, the standard one; a config, that
            4over6 recipe. Omitted: ``fc1.nvfp4_4over6`` when the layer has one (an NVFP4Linear pins its
            recipe), else the FLASHINFER_NVFP4_4OVER6* environment, as FlashInfer's fp4_quantize reads it.

    Returns:
        ``((packed, scales), residual_out, gate_out)`` where packed is uint8 [M, D/2], scales uint8
        [round_up(M, 128), D/16] (128x4 swizzled E4M3) quantized with ``fc1.input_global_scale``, and
        residual_out is bf16 like x; or ``None`` (see :func:`last_decline_reason`).
        (``serve_fused_resnorm_quant`` returns the Decline, the reason and its text, instead of None.)

    Non-contiguous x or residual decline (no hidden copy of the activations). gate, scale and shift are read
    in place where their last dimension has stride 1 and their rows start at 16-byte boundaries (per-token
    chunk views of a contiguous temb do), and copied otherwise; the norm parameters may be strided (copied).
    A non-bool ``fast_math`` or a malformed ``nvfp4_4over6`` raises TypeError / ValueError: that is a bug in
    the caller, not a condition to serve around; an environment that names no valid recipe declines
    ("unsupported_recipe").
    """
    R = DeclineReason
    # 1. Switches (the fast-math ones are read at the end, and only when neither fast_math nor fc1 pins it).
    if flag_enabled(DISABLE_VAR):
        return decline(R.DISABLED_BY_ENV, "{}=1", DISABLE_VAR)
    if nvfp4_4over6 is UNSET:
        nvfp4_4over6 = getattr(fc1, "nvfp4_4over6", UNSET)
    if nvfp4_4over6 is UNSET:
        try:
            recipe_code = resolve_nvfp4_4over6()
        except ValueError as e:  # the environment's, not the caller's
            return decline(R.UNSUPPORTED_RECIPE, "{}", e)
    else:
        recipe_code = resolve_nvfp4_4over6(nvfp4_4over6)

    # 2. Where the tensors live: a device with a kernel.
    if not (isinstance(x, Tensor) and isinstance(residual, Tensor)):
        return decline(R.UNSUPPORTED_DTYPE, "x and residual must be tensors")
    declined = device_declined(x, allow_cpu)
    if declined is not None:
        return declined
    dev = x.device

    # 3-5. The norm (a LayerNorm's parameters and eps), the ops' rules (resnorm_quant's: D a multiple of
    # COLS_MULTIPLE), the fused path's own rules for the activations.
    served = norm_and_inputs_served(x, residual, norm, eps, lambda e, w, nb: resnorm_inputs_problem(
        residual, x, bias, gate, scale, shift, e, w, nb, modulate_index, COLS_MULTIPLE))
    if isinstance(served, Decline):
        return served
    weight, norm_bias, norm_eps = served
    cols = x.shape[-1]

    # 6. FC1: an NVFP4 layer of width D.
    g = getattr(fc1, "input_global_scale", None)
    in_features = getattr(fc1, "in_features", None)
    if g is None or in_features is None:
        return decline(R.FC1_NOT_NVFP4, "fc1 is a {} without in_features and input_global_scale", type(fc1).__name__)
    problem = global_scale_problem(g, dev, name="fc1.input_global_scale")
    if problem is not None:
        return decline_for(problem, None if problem.reason is R.DEVICE_MISMATCH else R.FC1_NOT_NVFP4)
    if isinstance(in_features, bool) or not isinstance(in_features, int):
        return decline(R.FC1_NOT_NVFP4, "fc1.in_features is a {}, not an int", type(in_features).__name__)
    if in_features != cols:
        return decline(R.FC1_WIDTH_MISMATCH, "fc1.in_features = {} but D = {}", in_features, cols)

    fm = resolve_fast_math(getattr(fc1, "fast_math", None) if fast_math is None else fast_math)
    packed, scales, residual_out = call_resnorm_quant(
        residual, x, bias, gate, scale, shift, g, float(norm_eps), fm, weight, norm_bias, modulate_index, recipe_code)
    return (packed, scales), residual_out, gate_out


try_fused_resnorm_quant = public_gate(serve_fused_resnorm_quant)

__all__ = ["DeclineReason", "try_fused_resnorm_quant", "serve_fused_resnorm_quant", "last_decline_reason",
           "last_decline_detail",
           "reset_decline_log"]
