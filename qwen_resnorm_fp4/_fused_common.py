"""What the fused paths (fused_path.py: NVFP4 FC1; fused_path_fp8.py: the FP8 gates) share: the decline
record, the device rule, the norm's settings and the activation rules. One gate's decline is the other's
``last_decline_reason``: a model calls one of them per block.

Every function here reads only static properties (types, dtypes, shapes, devices, the environment), so it is
traced away by ``torch.compile(fullgraph=True)`` and does nothing on the device during graph capture.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Callable, Optional, Tuple

import torch

from . import _library
from .device import kernel_serves_cuda_device
from .env import DISABLE_VAR, flag_enabled
from .validation import DeclineReason, Problem

Tensor = torch.Tensor
R = DeclineReason

logger = logging.getLogger("qwen_resnorm_fp4")

_last_reason: Optional[DeclineReason] = None
_last_detail: Optional[str] = None
_logged: set = set()


def last_decline_reason() -> Optional[DeclineReason]:
    """The reason of the last fused-path decline; ``None`` after a success (or before any call)."""
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


def decline(reason: DeclineReason, template: str, *args: Any) -> None:
    """Record (and, in eager mode, log once) a decline. Returns None for ``return decline(...)``."""
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


def decline_for(problem: Problem, reason: Optional[DeclineReason] = None) -> None:
    """Decline for a broken rule, with its own reason unless ``reason`` is given."""
    return decline(reason or problem.reason, problem.template, *problem.args)


def succeed() -> None:
    """Record a call the fused path served."""
    global _last_reason, _last_detail
    _last_reason = None
    _last_detail = None


def device_declined(x: Tensor, allow_cpu: bool) -> bool:
    """Declines (and returns True) unless x is on a CUDA GPU the compiled library serves, or on the CPU with
    ``allow_cpu``."""
    dev = x.device
    kind = dev.type
    if kind == "cuda":
        if not kernel_serves_cuda_device(dev.index or 0):
            where = "see python -m qwen_resnorm_fp4 info" if torch.compiler.is_compiling() else _library.status()
            decline(R.NO_KERNEL_FOR_DEVICE, "no kernel for {} ({})", dev, where)
            return True
        return False
    if kind == "cpu":
        if not allow_cpu:
            decline(R.CPU_TENSORS, "x is on the CPU: pass allow_cpu=True to run the CPU reference")
            return True
        return False
    decline(R.UNSUPPORTED_DEVICE, "x is on {}", kind)
    return True


def gate_declined(tensors: Mapping[str, Any], allow_cpu: bool) -> bool:
    """The checks the FP8 gates start with (the NVFP4 gate resolves its recipe between them): the switch
    (``QWEN_FP4_DISABLE``), that each named argument is a tensor, then :func:`device_declined` on the first. Declines and returns True where
    one fails."""
    if flag_enabled(DISABLE_VAR):
        decline(R.DISABLED_BY_ENV, "{}=1", DISABLE_VAR)
        return True
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            decline(R.UNSUPPORTED_DTYPE, "{} must be a tensor, got {}", name, type(t).__name__)
            return True
    return device_declined(next(iter(tensors.values())), allow_cpu)


def _norm_field(norm: Any, name: str, default: Any) -> Any:
    if isinstance(norm, Mapping):
        return norm.get(name, default)
    return getattr(norm, name, default)


NormSettings = Tuple[Optional[Tensor], Optional[Tensor], Any, Optional[tuple]]


def norm_settings(norm: Any, eps: float) -> Optional[NormSettings]:
    """(weight, norm_bias, eps, normalized_shape) of a LayerNorm given as the fused paths take it (None: no
    affine parameters and ``eps``; a ``torch.nn.LayerNorm``; a mapping or namespace with ``type``
    "layernorm", ``elementwise_affine``, ``weight``, ``bias``, ``eps``), or a decline (None) for any other
    norm."""
    if norm is None:
        return None, None, eps, None
    if isinstance(norm, torch.nn.LayerNorm):
        return norm.weight, norm.bias, norm.eps, norm.normalized_shape
    if isinstance(norm, torch.nn.Module):
        return decline(R.UNSUPPORTED_NORM, "norm is a {}, not a LayerNorm", type(norm).__name__)
    kind = _norm_field(norm, "type", "layernorm")
    if not isinstance(kind, str) or kind.lower().replace("_", "").replace("-", "") != "layernorm":
        return decline(R.UNSUPPORTED_NORM, "norm type {!r}, not 'layernorm'", kind)
    norm_eps = _norm_field(norm, "eps", None)
    weight = _norm_field(norm, "weight", None)
    norm_bias = _norm_field(norm, "bias", None)
    if not _norm_field(norm, "elementwise_affine", weight is not None or norm_bias is not None):
        weight = norm_bias = None
    return weight, norm_bias, eps if norm_eps is None else norm_eps, None


def activations_declined(x: Tensor, residual: Tensor, normalized_shape: Optional[tuple]) -> bool:
    """The fused paths' own rules for arguments that passed the op's: at least one row, x and residual
    contiguous (no hidden copy of the activations), a LayerNorm over D. Declines and returns True where one
    is broken."""
    cols = x.shape[-1]
    if x.numel() == 0:
        decline(R.UNSUPPORTED_SHAPE, "x has 0 rows")
        return True
    if not x.is_contiguous() or not residual.is_contiguous():
        decline(R.NON_CONTIGUOUS, "x contiguous: {}, residual contiguous: {}", x.is_contiguous(),
                residual.is_contiguous())
        return True
    if normalized_shape is not None and tuple(normalized_shape) != (cols,):
        decline(R.UNSUPPORTED_NORM, "LayerNorm normalizes over {}, not ({},)", tuple(normalized_shape), cols)
        return True
    return False


def norm_and_inputs_served(x: Tensor, residual: Tensor, norm: Any, eps: float,
                           op_rules: Callable[[Any, Optional[Tensor], Optional[Tensor]], Optional[Problem]]
                           ) -> Optional[Tuple[Optional[Tensor], Optional[Tensor], Any]]:
    """(weight, norm_bias, eps) of the norm where the fused path serves the call's norm and inputs, else a
    decline (None): :func:`norm_settings`, then the op's rules (``op_rules(eps, weight, norm_bias)``, the
    other arguments bound by the caller), then :func:`activations_declined`."""
    settings = norm_settings(norm, eps)
    if settings is None:
        return None
    weight, norm_bias, norm_eps, normalized_shape = settings
    problem = op_rules(norm_eps, weight, norm_bias)
    if problem is not None:
        return decline_for(problem)
    if activations_declined(x, residual, normalized_shape):
        return None
    return weight, norm_bias, norm_eps
