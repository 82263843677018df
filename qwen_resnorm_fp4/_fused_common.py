"""What the fused paths (fused_path.py: NVFP4 FC1; fused_path_fp8.py: the FP8 gates) share: the decline
record, the device rule, the norm's settings and the activation rules.

A gate's checks return a :class:`Decline` (the reason and its text) instead of recording it anywhere: the
internal ``serve_*`` entries return either the result or that Decline, so a call site (a converted block)
keeps the reason of its own call. The public ``try_fused_*`` functions turn a Decline into ``None`` and, in
eager mode, keep it for :func:`last_decline_reason` (a compiled graph records nothing: writing Python state
from traced code would make the graph guard on it).

Where the last decline is kept: in the current ``contextvars`` context (:data:`_DECLINE_LOG`, a
``ContextVar`` holding an immutable :class:`_DeclineLog`), not in a module-level object. Each thread has its
own context (one that inherits a copy of its creator's, Python 3.14's ``thread_inherit_context``, starts from
its creator's record), and so does each asyncio task (it starts from a copy of its creator's), so a serving
process's threads and tasks each read their own last decline with no lock, and nothing in this module changes
after import. The reasons already logged (each is logged once, at DEBUG level) are kept in the same record, so
"once" is once per thread (per task) until :func:`reset_decline_log`.

Every function here reads only static properties (types, dtypes, shapes, devices, the environment), so it is
traced away by ``torch.compile(fullgraph=True)`` and does nothing on the device during graph capture.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, FrozenSet, Optional, Tuple, TypeVar, Union

import torch

from . import _library
from .device import kernel_serves_cuda_device
from .env import DISABLE_VAR, flag_enabled
from .validation import DeclineReason, Problem

Tensor = torch.Tensor
R = DeclineReason
T = TypeVar("T")

logger = logging.getLogger("qwen_resnorm_fp4")


@dataclass(frozen=True)
class Decline:
    """Why a fused path did not serve a call: the reason (a :class:`DeclineReason`) and the specific text
    (e.g. which argument had which dtype; under torch.compile the template with ``?`` for runtime values)."""

    reason: DeclineReason
    detail: str


@dataclass(frozen=True)
class _DeclineLog:
    """One context's record of its eager gate calls: the last decline (None after a success) and the reasons
    already logged. Immutable: an update sets a new record in the context."""

    last: Optional[Decline] = None
    logged: FrozenSet[DeclineReason] = frozenset()


#: A context's record before its first gate call (immutable).
_NO_DECLINES = _DeclineLog()
#: The current context's decline record (a handle, not state: the values live in each thread's / task's
#: ``contextvars`` context).
_DECLINE_LOG: contextvars.ContextVar[_DeclineLog] = contextvars.ContextVar("qwen_resnorm_fp4_decline_log")


def last_decline_reason() -> Optional[DeclineReason]:
    """The reason of this thread's (asyncio task's) last fused-path decline in eager mode; ``None`` after a
    success (or before any call). Calls inside a torch.compile graph do not update it (see
    ``fused_path_stats`` for a converted model's compiled segments)."""
    last = _DECLINE_LOG.get(_NO_DECLINES).last
    return None if last is None else last.reason


def last_decline_detail() -> Optional[str]:
    """The specific text of this thread's (asyncio task's) last decline (e.g. which argument had which dtype);
    ``None`` after a success."""
    last = _DECLINE_LOG.get(_NO_DECLINES).last
    return None if last is None else last.detail


def reset_decline_log() -> None:
    """Forget this thread's (asyncio task's) last decline and which reasons it logged (so that each is logged
    once again)."""
    _DECLINE_LOG.set(_NO_DECLINES)


def decline(reason: DeclineReason, template: str, *args: Any) -> Decline:
    """The Decline for ``reason``; its detail is ``template`` formatted with ``args`` (static text while
    torch.compile traces: formatting runtime values is not traceable)."""
    if torch.compiler.is_compiling():
        return Decline(reason, template.replace("{!r}", "?").replace("{}", "?"))
    return Decline(reason, template.format(*args) if args else template)


def decline_for(problem: Problem, reason: Optional[DeclineReason] = None) -> Decline:
    """The Decline for a broken rule, with its own reason unless ``reason`` is given."""
    return decline(reason or problem.reason, problem.template, *problem.args)


def public_result(outcome: Union[T, Decline]) -> Optional[T]:
    """What a public ``try_fused_*`` returns for a ``serve_*`` outcome: the result, or None for a Decline. In
    eager mode it also keeps the outcome for :func:`last_decline_reason` (in the current context: this
    thread's, or this asyncio task's) and logs each reason once (per context) at DEBUG level. While dynamo
    traces, it records nothing."""
    declined = isinstance(outcome, Decline)
    if not torch.compiler.is_compiling():
        log = _DECLINE_LOG.get(_NO_DECLINES)
        if not declined:
            if log.last is not None:
                _DECLINE_LOG.set(_DeclineLog(None, log.logged))
        elif outcome.reason in log.logged:
            _DECLINE_LOG.set(_DeclineLog(outcome, log.logged))
        else:
            _DECLINE_LOG.set(_DeclineLog(outcome, log.logged | {outcome.reason}))
            logger.debug("fused path declined: %s: %s (%s)", outcome.reason.value, outcome.detail,
                         outcome.reason.description)
    return None if declined else outcome


def public_gate(serve: Callable[..., Any]) -> Callable[..., Any]:
    """The public ``try_fused_*`` form of a ``serve_fused_*`` gate: the same arguments and docstring, the
    result or None (:func:`public_result`)."""
    @functools.wraps(serve)
    def gate(*args: Any, **kwargs: Any) -> Any:
        return public_result(serve(*args, **kwargs))

    gate.__name__ = gate.__qualname__ = serve.__name__.replace("serve_fused_", "try_fused_")
    signature = inspect.signature(serve)
    returns = signature.return_annotation
    # the result type without Decline (the annotations are strings under `from __future__ import annotations`)
    result = (returns.replace("Union[", "Optional[", 1).replace(", Decline]", "]") if isinstance(returns, str)
              else Optional[Any])
    gate.__signature__ = signature.replace(return_annotation=result)
    gate.__annotations__ = {**serve.__annotations__, "return": result}
    gate.__doc__ = (serve.__doc__ or "") + (
        "\n\n    (The ``try_fused_*`` form: the result or None, the reason kept for :func:`last_decline_reason`; the "
        "``serve_fused_*`` form returns the :class:`Decline` instead of None.)")
    del gate.__wrapped__
    return gate


def device_declined(x: Tensor, allow_cpu: bool) -> Optional[Decline]:
    """A Decline unless x is on a CUDA GPU the compiled library serves, or on the CPU with ``allow_cpu``."""
    dev = x.device
    kind = dev.type
    if kind == "cuda":
        if not kernel_serves_cuda_device(dev.index or 0):
            where = "see python -m qwen_resnorm_fp4 info" if torch.compiler.is_compiling() else _library.status()
            return decline(R.NO_KERNEL_FOR_DEVICE, "no kernel for {} ({})", dev, where)
        return None
    if kind == "cpu":
        if not allow_cpu:
            return decline(R.CPU_TENSORS, "x is on the CPU: pass allow_cpu=True to run the CPU reference")
        return None
    return decline(R.UNSUPPORTED_DEVICE, "x is on {}", kind)


def gate_declined(tensors: Mapping[str, Any], allow_cpu: bool) -> Optional[Decline]:
    """The checks the FP8 gates start with (the NVFP4 gate resolves its recipe between them): the switch
    (``QWEN_FP4_DISABLE``), that each named argument is a tensor, then :func:`device_declined` on the first.
    A Decline where one fails."""
    if flag_enabled(DISABLE_VAR):
        return decline(R.DISABLED_BY_ENV, "{}=1", DISABLE_VAR)
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            return decline(R.UNSUPPORTED_DTYPE, "{} must be a tensor, got {}", name, type(t).__name__)
    return device_declined(next(iter(tensors.values())), allow_cpu)


def _norm_field(norm: Any, name: str, default: Any) -> Any:
    if isinstance(norm, Mapping):
        return norm.get(name, default)
    return getattr(norm, name, default)


NormSettings = Tuple[Optional[Tensor], Optional[Tensor], Any, Optional[tuple]]


def norm_settings(norm: Any, eps: float) -> Union[NormSettings, Decline]:
    """(weight, norm_bias, eps, normalized_shape) of a LayerNorm given as the fused paths take it (None: no
    affine parameters and ``eps``; a ``torch.nn.LayerNorm``; a mapping or namespace with ``type``
    "layernorm", ``elementwise_affine``, ``weight``, ``bias``, ``eps``), or a Decline for any other norm."""
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


def activations_declined(x: Tensor, residual: Tensor, normalized_shape: Optional[tuple]) -> Optional[Decline]:
    """The fused paths' own rules for arguments that passed the op's: at least one row, x and residual
    contiguous (no hidden copy of the activations), a LayerNorm over D. A Decline where one is broken."""
    cols = x.shape[-1]
    if x.numel() == 0:
        return decline(R.UNSUPPORTED_SHAPE, "x has 0 rows")
    if not x.is_contiguous() or not residual.is_contiguous():
        return decline(R.NON_CONTIGUOUS, "x contiguous: {}, residual contiguous: {}", x.is_contiguous(),
                       residual.is_contiguous())
    if normalized_shape is not None and tuple(normalized_shape) != (cols,):
        return decline(R.UNSUPPORTED_NORM, "LayerNorm normalizes over {}, not ({},)", tuple(normalized_shape),
                       cols)
    return None


def norm_and_inputs_served(x: Tensor, residual: Tensor, norm: Any, eps: float,
                           op_rules: Callable[[Any, Optional[Tensor], Optional[Tensor]], Optional[Problem]]
                           ) -> Union[Tuple[Optional[Tensor], Optional[Tensor], Any], Decline]:
    """(weight, norm_bias, eps) of the norm where the fused path serves the call's norm and inputs, else a
    Decline: :func:`norm_settings`, then the op's rules (``op_rules(eps, weight, norm_bias)``, the other
    arguments bound by the caller), then :func:`activations_declined`."""
    settings = norm_settings(norm, eps)
    if isinstance(settings, Decline):
        return settings
    weight, norm_bias, norm_eps, normalized_shape = settings
    problem = op_rules(norm_eps, weight, norm_bias)
    if problem is not None:
        return decline_for(problem)
    declined = activations_declined(x, residual, normalized_shape)
    if declined is not None:
        return declined
    return weight, norm_bias, norm_eps
