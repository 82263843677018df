"""The fused path of a DiT block: the fused kernel where it can serve, and why not where it cannot.

:func:`try_fused_resnorm_quant` is the model-side entry point. It takes a DiT block's tensors (the residual
stream, the attention output, the adaLN gate/scale/shift), the norm's settings and the FC1 layer, and either
returns what the FC1 NVFP4 GEMM consumes (packed activations and swizzled block scales) plus the updated
residual stream, or returns ``None`` so that the caller runs its unfused code. It never raises for a
condition the fused path cannot serve; the reason for the last decline is kept
(:func:`last_decline_reason`, :func:`last_decline_detail`) and each distinct reason is logged once at
DEBUG level on the ``qwen_resnorm_fp4`` logger.

The decision applies the ops' own rules (:mod:`qwen_resnorm_fp4.validation`) as declines, plus the fused
path's: the switches, a device with a kernel, x and residual contiguous (no hidden copy of the
activations), at least one row, a LayerNorm, an NVFP4 FC1 of width D. Then the op is called once; an error
of the op itself reaches the caller. The decision uses only static properties (dtypes, shapes, device
types, ``isinstance``, environment variables), so it is traced away by ``torch.compile(fullgraph=True)``
and does nothing on the device while a CUDA graph is captured (no host synchronisation, no ``.item()``).

Under ``torch.compile`` the environment variables are read when the function is traced: changing them later
takes effect only after a recompilation (``torch._dynamo.reset()``). The decline reason is still recorded
for every call of the compiled function, but nothing is logged from compiled code.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Optional, Tuple

import torch

from . import _library
from .api import call_resnorm_quant
from .device import kernel_serves_cuda_device
from .env import DISABLE_VAR, flag_enabled, resolve_fast_math
from .recipe import UNSET, resolve_nvfp4_4over6
from .validation import DeclineReason, Problem, global_scale_problem, resnorm_problem

Tensor = torch.Tensor

logger = logging.getLogger("qwen_resnorm_fp4")

_last_reason: Optional[DeclineReason] = None
_last_detail: Optional[str] = None
_logged: set = set()


def last_decline_reason() -> Optional[DeclineReason]:
    """The reason of the last :func:`try_fused_resnorm_quant` decline; ``None`` after a success (or before
    any call)."""
    return _last_reason


def last_decline_detail() -> Optional[str]:
    """The specific text of the last decline (e.g. which argument had which dtype); ``None`` after a success."""
    return _last_detail


def reset_decline_log() -> None:
    """Forget the last reason and which reasons were logged (so that each is logged once again)."""
    global _last_reason, _last_detail
    _last_reason = None
    _last_detail = None
    _logged.clear()


def _decline(reason: DeclineReason, template: str, *args: Any) -> None:
    """Record (and, in eager mode, log once) a decline. Returns None for ``return _decline(...)``."""
    global _last_reason, _last_detail
    _last_reason = reason
    if torch.compiler.is_compiling():
        # Formatting runtime values is not traceable; keep the static text, and leave logging to eager mode.
        _last_detail = template.replace("{!r}", "?").replace("{}", "?")
        return None
    detail = template.format(*args) if args else template
    _last_detail = detail
    if reason not in _logged:
        _logged.add(reason)
        logger.debug("fused resnorm+quant declined: %s: %s (%s)", reason.value, detail, reason.description)
    return None


def _decline_for(problem: Problem, reason: Optional[DeclineReason] = None) -> None:
    """Decline for a broken rule, with its own reason unless ``reason`` is given."""
    return _decline(reason or problem.reason, problem.template, *problem.args)


def _succeed() -> None:
    global _last_reason, _last_detail
    _last_reason = None
    _last_detail = None


def _norm_field(norm: Any, name: str, default: Any) -> Any:
    if isinstance(norm, Mapping):
        return norm.get(name, default)
    return getattr(norm, name, default)


def try_fused_resnorm_quant(
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
) -> Optional[Tuple[Tuple[Tensor, Tensor], Tensor, Optional[Tensor]]]:
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
        return _decline(R.DISABLED_BY_ENV, "{}=1", DISABLE_VAR)
    if nvfp4_4over6 is UNSET:
        nvfp4_4over6 = getattr(fc1, "nvfp4_4over6", UNSET)
    if nvfp4_4over6 is UNSET:
        try:
            recipe_code = resolve_nvfp4_4over6()
        except ValueError as e:  # the environment's, not the caller's
            return _decline(R.UNSUPPORTED_RECIPE, "{}", e)
    else:
        recipe_code = resolve_nvfp4_4over6(nvfp4_4over6)

    # 2. Where the tensors live: a device with a kernel.
    if not (isinstance(x, Tensor) and isinstance(residual, Tensor)):
        return _decline(R.UNSUPPORTED_DTYPE, "x and residual must be tensors")
    dev = x.device
    kind = dev.type
    if kind == "cuda":
        if not kernel_serves_cuda_device(dev.index or 0):
            return _decline(R.NO_KERNEL_FOR_DEVICE, "no kernel for {} ({})", dev,
                            "see python -m qwen_resnorm_fp4 info" if torch.compiler.is_compiling() else _library.status())
    elif kind == "cpu":
        if not allow_cpu:
            return _decline(R.CPU_TENSORS, "x is on the CPU: pass allow_cpu=True to run the CPU reference")
    else:
        return _decline(R.UNSUPPORTED_DEVICE, "x is on {}", kind)

    # 3. The norm: a LayerNorm's parameters and eps.
    weight = norm_bias = normalized_shape = None
    if norm is None:
        norm_eps = eps
    elif isinstance(norm, torch.nn.LayerNorm):
        weight, norm_bias, norm_eps, normalized_shape = norm.weight, norm.bias, norm.eps, norm.normalized_shape
    elif isinstance(norm, torch.nn.Module):
        return _decline(R.UNSUPPORTED_NORM, "norm is a {}, not a LayerNorm", type(norm).__name__)
    else:
        norm_kind = _norm_field(norm, "type", "layernorm")
        if not isinstance(norm_kind, str) or norm_kind.lower().replace("_", "").replace("-", "") != "layernorm":
            return _decline(R.UNSUPPORTED_NORM, "norm type {!r}, not 'layernorm'", norm_kind)
        norm_eps = _norm_field(norm, "eps", None)
        if norm_eps is None:
            norm_eps = eps
        weight = _norm_field(norm, "weight", None)
        norm_bias = _norm_field(norm, "bias", None)
        if not _norm_field(norm, "elementwise_affine", weight is not None or norm_bias is not None):
            weight = norm_bias = None

    # 4. The ops' rules.
    problem = resnorm_problem(residual, x, bias, gate, scale, shift, norm_eps, weight, norm_bias, modulate_index)
    if problem is not None:
        return _decline_for(problem)

    # 5. The fused path's own rules for the activations and the norm.
    cols = x.shape[-1]
    if x.numel() == 0:
        return _decline(R.UNSUPPORTED_SHAPE, "x has 0 rows")
    if not x.is_contiguous() or not residual.is_contiguous():
        return _decline(R.NON_CONTIGUOUS, "x contiguous: {}, residual contiguous: {}", x.is_contiguous(),
                        residual.is_contiguous())
    if normalized_shape is not None and tuple(normalized_shape) != (cols,):
        return _decline(R.UNSUPPORTED_NORM, "LayerNorm normalizes over {}, not ({},)", tuple(normalized_shape), cols)

    # 6. FC1: an NVFP4 layer of width D.
    g = getattr(fc1, "input_global_scale", None)
    in_features = getattr(fc1, "in_features", None)
    if g is None or in_features is None:
        return _decline(R.FC1_NOT_NVFP4, "fc1 is a {} without in_features and input_global_scale", type(fc1).__name__)
    problem = global_scale_problem(g, dev, name="fc1.input_global_scale")
    if problem is not None:
        return _decline_for(problem, None if problem.reason is R.DEVICE_MISMATCH else R.FC1_NOT_NVFP4)
    if isinstance(in_features, bool) or not isinstance(in_features, int):
        return _decline(R.FC1_NOT_NVFP4, "fc1.in_features is a {}, not an int", type(in_features).__name__)
    if in_features != cols:
        return _decline(R.FC1_WIDTH_MISMATCH, "fc1.in_features = {} but D = {}", in_features, cols)

    fm = resolve_fast_math(getattr(fc1, "fast_math", None) if fast_math is None else fast_math)
    packed, scales, residual_out = call_resnorm_quant(
        residual, x, bias, gate, scale, shift, g, float(norm_eps), fm, weight, norm_bias, modulate_index, recipe_code)
    _succeed()
    return (packed, scales), residual_out, gate_out


__all__ = ["DeclineReason", "try_fused_resnorm_quant", "last_decline_reason", "last_decline_detail",
           "reset_decline_log"]
