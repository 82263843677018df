"""The gate: use the fused kernel where it can serve, and say why not where it cannot.

:func:`try_fused_resnorm_quant` is the model-side entry point. It takes a DiT block's tensors (the residual
stream, the attention output, the adaLN gate/scale/shift), the norm's settings and the FC1 layer, and either
returns what the FC1 NVFP4 GEMM consumes (packed activations and swizzled block scales) plus the updated
residual stream, or returns ``None`` so that the caller runs its unfused code. It never raises for a
condition the fused path cannot serve; the reason for the last decline is kept
(:func:`last_decline_reason`, :func:`last_decline_detail`) and each distinct reason is logged once at
DEBUG level on the ``qwen_resnorm_fp4`` logger.

The decision uses only static properties (dtypes, shapes, device types, ``isinstance``, environment
variables), so it is traced away by ``torch.compile(fullgraph=True)`` and does nothing on the device while
a CUDA graph is captured (no host synchronisation, no ``.item()``).

In eager mode the common call (plain CUDA tensors, norm ``None`` or a ``torch.nn.LayerNorm``, an FC1 of
width D) goes to the op before the decline checks, whose C++ checks refuse what those checks would decline
for; anything refused, and every other call, goes through the checks, so the outcome (served bytes, decline
reason, error) is the same either way, only cheaper on the host (docs/performance.md).

Under ``torch.compile`` the environment variables are read when the function is traced: changing them later
takes effect only after a recompilation (``torch._dynamo.reset()``). The decline reason is still recorded
for every call of the compiled function, but nothing is logged from compiled code.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Mapping
from typing import Any, Dict, Optional, Tuple

import torch

from . import _library
from .api import (_PLAIN_TENSOR_TYPES, _RESNORM_QUANT, ACTIVATION_DTYPES, INDEX_DTYPES, PARAM_DTYPES, WIDTH_RULE,
                  _fast_operands, _resnorm_quant_op, _resnorm_quant_operands, is_supported_width)
from .env import DISABLE_VAR, FOUR_OVER_SIX_VAR, flag_enabled, resolve_fast_math
from .linear import NVFP4Linear

Tensor = torch.Tensor

logger = logging.getLogger("qwen_resnorm_fp4")

#: Rows the CUDA kernels accept at most (their row index is a 32-bit int).
MAX_ROWS = (1 << 31) - 128
#: The oldest GPU the compiled code serves (sm_90).
MIN_CAPABILITY = (9, 0)


class DeclineReason(str, enum.Enum):
    """Why :func:`try_fused_resnorm_quant` returned ``None``. The value is a stable identifier (compare with
    the member or with the string); :attr:`description` is a human sentence."""

    DISABLED_BY_ENV = "disabled_by_env"
    FOUR_OVER_SIX_RECIPE = "4over6_recipe"
    UNSUPPORTED_DEVICE = "unsupported_device"
    CPU_TENSORS = "cpu_tensors"
    DEVICE_MISMATCH = "device_mismatch"
    NO_KERNEL_FOR_DEVICE = "no_kernel_for_device"
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    UNSUPPORTED_SHAPE = "unsupported_shape"
    UNSUPPORTED_WIDTH = "unsupported_width"
    NON_CONTIGUOUS = "non_contiguous"
    UNSUPPORTED_MODULATION = "unsupported_modulation"
    UNSUPPORTED_NORM = "unsupported_norm"
    FC1_NOT_NVFP4 = "fc1_not_nvfp4"
    FC1_WIDTH_MISMATCH = "fc1_width_mismatch"

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]

    def __str__(self) -> str:  # "cpu_tensors", not "DeclineReason.CPU_TENSORS"
        return self.value


_DESCRIPTIONS: Dict[DeclineReason, str] = {
    DeclineReason.DISABLED_BY_ENV: f"{DISABLE_VAR}=1 turns the fused path off",
    DeclineReason.FOUR_OVER_SIX_RECIPE: (
        f"{FOUR_OVER_SIX_VAR}=1: the production quantizer uses the 4over6 recipe, which the fused kernel "
        "does not implement, so its bytes would differ"),
    DeclineReason.UNSUPPORTED_DEVICE: "the tensors are on a device other than CUDA or CPU",
    DeclineReason.CPU_TENSORS: "the tensors are on the CPU (pass allow_cpu=True to run the reference there)",
    DeclineReason.DEVICE_MISMATCH: "the tensors (or FC1's input global scale) are not all on one device",
    DeclineReason.NO_KERNEL_FOR_DEVICE: (
        "no compiled code serves this GPU: the CUDA library is not built or not loaded, or the GPU's "
        "compute capability is below 9.0"),
    DeclineReason.UNSUPPORTED_DTYPE: (
        "x and residual must be bfloat16; gate, scale, shift, bias and the norm's parameters bfloat16 or "
        "float32; modulate_index int32, int64 or bool"),
    DeclineReason.UNSUPPORTED_SHAPE: "residual and x must have one shape [..., D] with 1 to 2**31-128 rows",
    DeclineReason.UNSUPPORTED_WIDTH: f"D (x.shape[-1]) must be {WIDTH_RULE}",
    DeclineReason.NON_CONTIGUOUS: (
        "x or residual is not contiguous; the fused path declines rather than copy the activations"),
    DeclineReason.UNSUPPORTED_MODULATION: (
        "gate, scale and shift must share one shape: [D], [B, D] or [B, 1, D] (x's rows split into B equal "
        "groups), or [2B, D] with modulate_index [B, S]"),
    DeclineReason.UNSUPPORTED_NORM: (
        "the norm is not a LayerNorm over the last dimension (e.g. RMSNorm), or its parameters or eps are "
        "unusable"),
    DeclineReason.FC1_NOT_NVFP4: (
        "FC1 is not an NVFP4 layer: not an NVFP4Linear and without in_features and a float32 one-element "
        "input_global_scale on x's device"),
    DeclineReason.FC1_WIDTH_MISMATCH: "FC1's in_features differs from D",
}

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


def _succeed() -> None:
    global _last_reason, _last_detail
    _last_reason = None
    _last_detail = None


_kernel_cache: Dict[int, bool] = {}


@torch.compiler.assume_constant_result
def _kernel_serves_cuda_device(index: int) -> bool:
    """True when the compiled library is loaded, registers CUDA kernels, and the GPU is sm_90 or newer.
    A constant for torch.compile (evaluated once per device at trace time)."""
    hit = _kernel_cache.get(index)
    if hit is not None:
        return hit
    ok = False
    try:
        if _library.cuda_available() and torch.cuda.is_available():
            has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key("qwen_fp4::resnorm_quant", "CUDA")
            ok = bool(has_kernel) and tuple(torch.cuda.get_device_capability(index)) >= MIN_CAPABILITY
    except Exception:  # noqa: BLE001 - a broken CUDA setup means "no kernel", never an exception
        ok = False
    _kernel_cache[index] = ok
    return ok


def _norm_field(norm: Any, name: str, default: Any) -> Any:
    if isinstance(norm, Mapping):
        return norm.get(name, default)
    return getattr(norm, name, default)


def _is_tensor(t: Any) -> bool:
    return isinstance(t, torch.Tensor)


def _serve_common_call(residual, x, gate, scale, shift, fc1, bias, eps, norm, modulate_index, fast_math):
    """The common eager call, served without the decline checks below (most of the gate's host time):
    plain CUDA tensors, x bf16 and contiguous, residual contiguous, a GPU the kernels serve, norm None or a
    torch.nn.LayerNorm over D, an fc1 with an int in_features equal to D, eps a float. What else the
    checks decline for (dtypes, shapes, widths, devices, eps values, the modulation forms, fc1's global
    scale) the op's C++ checks refuse before any launch. Returns the op's outputs, or None: the checked
    path then decides as if this function did not exist (decline, serve through an aligned copy, or
    raise); tests/test_gate.py compares the two on CUDA case by case."""
    if type(x) not in _PLAIN_TENSOR_TYPES or type(residual) not in _PLAIN_TENSOR_TYPES or not x.is_cuda:
        return None
    if x.dtype is not torch.bfloat16 or x.dim() < 1 or x.numel() == 0 or not x.is_contiguous() \
            or not residual.is_contiguous():
        return None
    cols = x.shape[-1]
    if not _kernel_serves_cuda_device(x.get_device()):
        return None
    if norm is None:
        weight = norm_bias = None
        norm_eps = eps
    elif type(norm) is torch.nn.LayerNorm and tuple(norm.normalized_shape) == (cols,):
        weight, norm_bias, norm_eps = norm.weight, norm.bias, norm.eps
    else:
        return None
    in_features = getattr(fc1, "in_features", None)
    if type(norm_eps) is not float or type(in_features) is not int or in_features != cols:
        return None
    if fast_math is None:
        fast_math = getattr(fc1, "fast_math", None)
    if fast_math is not None and type(fast_math) is not bool:
        return None  # the checked path raises the TypeError
    if type(gate) in _PLAIN_TENSOR_TYPES and gate.dim() == 3:  # [B, 1, D]: the checked path's squeeze
        if gate.shape[1] != 1 or type(scale) not in _PLAIN_TENSOR_TYPES or type(shift) not in _PLAIN_TENSOR_TYPES \
                or not gate.shape == scale.shape == shift.shape:
            return None
        gate, scale, shift = gate.squeeze(1), scale.squeeze(1), shift.squeeze(1)
    args = _fast_operands(_resnorm_quant_operands, residual, x, bias, gate, scale, shift,
                          getattr(fc1, "input_global_scale", None), norm_eps, resolve_fast_math(fast_math), weight,
                          norm_bias, modulate_index, copy_activations=False)
    if args is None:
        return None
    try:
        return _RESNORM_QUANT(*args)
    except Exception:  # noqa: BLE001 - refused: the checked path finds the reason (or raises the error itself)
        return None


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
) -> Optional[Tuple[Tuple[Tensor, Tensor], Tensor, Optional[Tensor]]]:
    """The fused ``residual + gate * (x + bias) -> LayerNorm -> (1 + scale), shift -> NVFP4`` for FC1, or None.

    Replaces, in a DiT block::

        residual = residual + gate * x                      # gated residual update (x: attention output)
        y = norm2(residual) * (1 + scale) + shift           # LayerNorm + adaLN modulation
        h = fc1(y)                                          # NVFP4 GEMM (quantizes y inside)

    with ``(packed, scales), residual, gate_out = result`` and ``h = fc1((packed, scales), out_shape=...)``.

    Args:
        residual, x: bf16 [..., D], contiguous, one shape (typically [B, S, D]).
        gate, scale, shift: bf16 or fp32, one shape: [D], [B, D], [B, 1, D], or [2B, D] with ``modulate_index``.
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

    Returns:
        ``((packed, scales), residual_out, gate_out)`` where packed is uint8 [M, D/2], scales uint8
        [round_up(M, 128), D/16] (128x4 swizzled E4M3) quantized with ``fc1.input_global_scale``, and
        residual_out is bf16 like x; or ``None`` (see :func:`last_decline_reason`).

    Non-contiguous x or residual decline (no hidden copy of the activations); the small modulation and norm
    parameters may be strided (they are copied). A non-bool ``fast_math`` raises TypeError: that is a bug
    in the caller, not a condition to serve around.
    """
    R = DeclineReason
    # 1. Switches.
    if flag_enabled(DISABLE_VAR):
        return _decline(R.DISABLED_BY_ENV, "{}=1", DISABLE_VAR)
    if flag_enabled(FOUR_OVER_SIX_VAR):
        return _decline(R.FOUR_OVER_SIX_RECIPE, "{}=1", FOUR_OVER_SIX_VAR)
    if not torch.compiler.is_compiling():  # eager: the common call first (traced, the checks below are free)
        served = _serve_common_call(residual, x, gate, scale, shift, fc1, bias, eps, norm, modulate_index, fast_math)
        if served is not None:
            _succeed()
            packed, scales, residual_out = served
            return (packed, scales), residual_out, gate_out

    # 2. Where the tensors live.
    if not (_is_tensor(x) and _is_tensor(residual)):
        return _decline(R.UNSUPPORTED_DTYPE, "x and residual must be tensors")
    dev = x.device
    if dev.type == "cpu":
        if not allow_cpu:
            return _decline(R.CPU_TENSORS, "x is on the CPU and allow_cpu is False")
    elif dev.type != "cuda":
        return _decline(R.UNSUPPORTED_DEVICE, "x is on {}", dev.type)
    for name, t in (("residual", residual), ("gate", gate), ("scale", scale), ("shift", shift), ("bias", bias),
                    ("modulate_index", modulate_index)):
        if _is_tensor(t) and t.device != dev:
            return _decline(R.DEVICE_MISMATCH, "{} is on {} but x is on {}", name, t.device, dev)
    if dev.type == "cuda" and not _kernel_serves_cuda_device(0 if dev.index is None else dev.index):
        return _decline(R.NO_KERNEL_FOR_DEVICE, "no kernel for {} ({})", dev, _library.status())

    # 3. Activations: dtype, shape, width, layout.
    if x.dtype not in ACTIVATION_DTYPES or residual.dtype not in ACTIVATION_DTYPES:
        return _decline(R.UNSUPPORTED_DTYPE, "x is {} and residual is {}; both must be bfloat16", x.dtype,
                        residual.dtype)
    if x.dim() < 1 or residual.shape != x.shape:
        return _decline(R.UNSUPPORTED_SHAPE, "x is {} and residual is {}", tuple(x.shape), tuple(residual.shape))
    cols = x.shape[-1]
    if not is_supported_width(cols):
        return _decline(R.UNSUPPORTED_WIDTH, "D = {}", cols)
    rows = x.numel() // cols
    if rows < 1 or rows > MAX_ROWS:
        return _decline(R.UNSUPPORTED_SHAPE, "x has {} rows", rows)
    if not x.is_contiguous() or not residual.is_contiguous():
        return _decline(R.NON_CONTIGUOUS, "x contiguous: {}, residual contiguous: {}", x.is_contiguous(),
                        residual.is_contiguous())

    # 4. Modulation.
    if not (_is_tensor(gate) and _is_tensor(scale) and _is_tensor(shift)):
        return _decline(R.UNSUPPORTED_MODULATION, "gate, scale and shift must all be tensors")
    for name, t in (("gate", gate), ("scale", scale), ("shift", shift)):
        if t.dtype not in PARAM_DTYPES:
            return _decline(R.UNSUPPORTED_DTYPE, "{} is {}; bfloat16 or float32 needed", name, t.dtype)
    if not (gate.shape == scale.shape == shift.shape):
        return _decline(R.UNSUPPORTED_MODULATION, "gate {}, scale {}, shift {} differ", tuple(gate.shape),
                        tuple(scale.shape), tuple(shift.shape))
    if gate.dim() == 3 and gate.shape[1] == 1:  # [B, 1, D], the usual unsqueeze(1): a view, no copy
        gate, scale, shift = gate.squeeze(1), scale.squeeze(1), shift.squeeze(1)
    if gate.dim() not in (1, 2) or gate.shape[-1] != cols:
        return _decline(R.UNSUPPORTED_MODULATION, "gate has shape {} for D = {}", tuple(gate.shape), cols)
    if modulate_index is not None:
        if not _is_tensor(modulate_index) or modulate_index.dtype not in INDEX_DTYPES:
            return _decline(R.UNSUPPORTED_DTYPE, "modulate_index must be an int32, int64 or bool tensor")
        if modulate_index.dim() != 2 or gate.dim() != 2 or gate.shape[0] != 2 * modulate_index.shape[0] \
                or modulate_index.numel() != rows:
            return _decline(R.UNSUPPORTED_MODULATION, "modulate_index {} with gate {} and {} rows",
                            tuple(modulate_index.shape), tuple(gate.shape), rows)
    elif gate.dim() == 2 and (gate.shape[0] == 0 or rows % gate.shape[0] != 0):
        return _decline(R.UNSUPPORTED_MODULATION, "{} rows do not split into gate.shape[0] = {} batches", rows,
                        gate.shape[0])
    if bias is not None:
        if not _is_tensor(bias) or bias.dtype not in PARAM_DTYPES:
            return _decline(R.UNSUPPORTED_DTYPE, "bias must be a bfloat16 or float32 tensor")
        if tuple(bias.shape) != (cols,):
            return _decline(R.UNSUPPORTED_SHAPE, "bias has shape {}, ({},) needed", tuple(bias.shape), cols)

    # 5. The norm.
    weight = norm_bias = None
    if norm is None:
        norm_eps = eps
    elif isinstance(norm, torch.nn.LayerNorm):
        if tuple(norm.normalized_shape) != (cols,):
            return _decline(R.UNSUPPORTED_NORM, "LayerNorm normalizes over {}, not ({},)",
                            tuple(norm.normalized_shape), cols)
        weight, norm_bias, norm_eps = norm.weight, norm.bias, norm.eps
    elif isinstance(norm, torch.nn.Module):
        return _decline(R.UNSUPPORTED_NORM, "norm is a {}, not a LayerNorm", type(norm).__name__)
    else:
        kind = _norm_field(norm, "type", "layernorm")
        if not isinstance(kind, str) or kind.lower().replace("_", "").replace("-", "") != "layernorm":
            return _decline(R.UNSUPPORTED_NORM, "norm type {!r}, not 'layernorm'", kind)
        norm_eps = _norm_field(norm, "eps", None)
        if norm_eps is None:
            norm_eps = eps
        weight = _norm_field(norm, "weight", None)
        norm_bias = _norm_field(norm, "bias", None)
        if not _norm_field(norm, "elementwise_affine", weight is not None or norm_bias is not None):
            weight = norm_bias = None
    if isinstance(norm_eps, bool) or not isinstance(norm_eps, (int, float)) or not math.isfinite(norm_eps) \
            or norm_eps < 0:
        return _decline(R.UNSUPPORTED_NORM, "eps {!r} is not a finite float >= 0", norm_eps)
    for name, t in (("norm weight", weight), ("norm bias", norm_bias)):
        if t is not None:
            if not _is_tensor(t) or t.dtype not in PARAM_DTYPES:
                return _decline(R.UNSUPPORTED_DTYPE, "{} must be a bfloat16 or float32 tensor", name)
            if tuple(t.shape) != (cols,):
                return _decline(R.UNSUPPORTED_NORM, "{} has shape {}, ({},) needed", name, tuple(t.shape), cols)
            if t.device != dev:
                return _decline(R.DEVICE_MISMATCH, "{} is on {} but x is on {}", name, t.device, dev)

    # 6. FC1.
    if not isinstance(fc1, NVFP4Linear) and not (hasattr(fc1, "input_global_scale") and hasattr(fc1, "in_features")):
        return _decline(R.FC1_NOT_NVFP4, "fc1 is a {}", type(fc1).__name__)
    g = fc1.input_global_scale
    if not _is_tensor(g) or g.dtype != torch.float32 or g.numel() != 1:
        return _decline(R.FC1_NOT_NVFP4, "fc1.input_global_scale must be a float32 one-element tensor")
    if g.device != dev:
        return _decline(R.DEVICE_MISMATCH, "fc1.input_global_scale is on {} but x is on {}", g.device, dev)
    in_features = fc1.in_features
    if isinstance(in_features, bool) or not isinstance(in_features, int):
        return _decline(R.FC1_NOT_NVFP4, "fc1.in_features is not an int")
    if in_features != cols:
        return _decline(R.FC1_WIDTH_MISMATCH, "fc1.in_features = {} but D = {}", in_features, cols)

    if fast_math is None:
        fast_math = getattr(fc1, "fast_math", None)
    fm = resolve_fast_math(fast_math)
    # Everything the typed wrapper would check was checked above (as declines): call the op directly.
    packed, scales, residual_out = _resnorm_quant_op(
        residual, x, bias, gate, scale, shift, g, float(norm_eps), fm, weight, norm_bias, modulate_index)
    _succeed()
    return (packed, scales), residual_out, gate_out


__all__ = ["DeclineReason", "try_fused_resnorm_quant", "last_decline_reason", "last_decline_detail",
           "reset_decline_log"]
