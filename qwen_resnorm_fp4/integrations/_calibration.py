"""The input amax of every layer a conversion quantizes: measured by a calibration pass, or given.

Job: :func:`calibrate_input_amax` (run calibration inputs through the unconverted model and take each
selected layer's max |input|) and :func:`resolve_input_amax` (the amax of every selected layer from
``input_amax`` or ``calibration_inputs``, checked).

Rules:

- Calibration runs the original model under ``torch.no_grad()`` with forward pre-hooks that it removes
  whatever happens; a converted model is refused.
- Every value is one finite, positive number; layers that read one quantized activation (a SwiGLU's proj
  and gate_layer) get one value. Errors name the layer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterable, Optional

import torch

from ..constants import FLT_MAX
from ._options import FormatOptions
from ._selection import linear_names, shared_input_groups
from ._spec import ModelSpec, is_model
from ._state import MODEL_ATTR

Tensor = torch.Tensor


def _run_calibration(model: torch.nn.Module, calibration_inputs: Any) -> None:
    if callable(calibration_inputs) and not isinstance(calibration_inputs, Mapping):
        calibration_inputs(model)
        return
    if isinstance(calibration_inputs, Mapping):
        calibration_inputs = [calibration_inputs]
    if not isinstance(calibration_inputs, Iterable) or isinstance(calibration_inputs, (str, bytes, torch.Tensor)):
        raise TypeError("calibration_inputs must be a dict of model.forward keyword arguments, a list of such "
                        f"dicts, or a callable taking the model; got {type(calibration_inputs).__name__}")
    n = 0
    for i, kwargs in enumerate(calibration_inputs):
        if not isinstance(kwargs, Mapping):
            raise TypeError(f"calibration_inputs[{i}] must be a dict of model.forward keyword arguments, got "
                            f"{type(kwargs).__name__}")
        model(**kwargs)
        n += 1
    if n == 0:
        raise ValueError("calibration_inputs is empty")


def calibrate_input_amax(model: torch.nn.Module, spec: ModelSpec, calibration_inputs: Any, linears: Any,
                         fmt: FormatOptions) -> Dict[str, float]:
    """Run ``calibration_inputs`` through the (unconverted) model under ``torch.no_grad()`` and return, for
    every layer the conversion quantizes, the max |input| seen: {module name: amax}."""
    if not is_model(model, spec):
        raise TypeError(f"model must be a diffusers {spec.model_class}, got {type(model).__name__}")
    if hasattr(model, MODEL_ATTR):
        raise ValueError("the model is converted: calibrate the original model (restore it first)")
    names = linear_names(model, spec, linears, fmt)
    modules = dict(model.named_modules())
    amax: Dict[str, Optional[Tensor]] = {n: None for n in names}
    handles = []

    def make_hook(n: str) -> Callable:
        def hook(_module, args, kwargs):
            x = args[0] if args else kwargs.get("input")
            a = x.detach().abs().amax().float()
            # NaN-free max: a NaN activation would poison the scale
            a = torch.nan_to_num(a, nan=0.0, posinf=FLT_MAX)
            amax[n] = a if amax[n] is None else torch.maximum(amax[n], a)
        return hook

    try:
        for n in names:
            handles.append(modules[n].register_forward_pre_hook(make_hook(n), with_kwargs=True))
        with torch.no_grad():
            _run_calibration(model, calibration_inputs)
    finally:
        for h in handles:
            h.remove()
    missing = [n for n, a in amax.items() if a is None]
    if missing:
        raise ValueError(f"calibration never reached {len(missing)} layer(s) to convert, e.g. {missing[0]}")
    return {n: float(a.item()) for n, a in amax.items()}


def resolve_input_amax(model: torch.nn.Module, spec: ModelSpec, input_amax: Any, calibration_inputs: Any,
                       linears: Any, fmt: FormatOptions) -> Dict[str, float]:
    """{module name: amax} for every layer the conversion quantizes, from ``input_amax`` (one number, or a
    dict over :func:`~._selection.linear_names`) or from a calibration pass over ``calibration_inputs`` (one
    of the two). ValueError / TypeError naming the layer for a missing, unknown or invalid value."""
    names = linear_names(model, spec, linears, fmt)
    if input_amax is not None and calibration_inputs is not None:
        raise ValueError("pass either input_amax or calibration_inputs, not both")
    if input_amax is None:
        if calibration_inputs is None:
            raise ValueError("the input scales need either calibration_inputs (inputs to run through "
                             "the model; each converted layer's input amax is taken) or input_amax (a float for "
                             "every layer, or a dict {module name: amax}, see linear_names(model, linears))")
        values = calibrate_input_amax(model, spec, calibration_inputs, linears, fmt)
    elif isinstance(input_amax, Mapping):
        unknown = sorted(set(input_amax) - set(names))
        if unknown:
            raise ValueError(f"input_amax has keys that are not FC1 layers (with other linears: converted Linear "
                             f"layers) of this model: {unknown[:3]} (expected names like {names[0]!r}; see "
                             "linear_names(model, linears))")
        missing = [n for n in names if n not in input_amax]
        if missing:
            raise ValueError(f"input_amax has no value for {len(missing)} layer(s), e.g. {missing[0]!r}")
        values = {n: input_amax[n] for n in names}
    else:
        values = {n: input_amax for n in names}
    out = {}
    for n, v in values.items():
        if isinstance(v, torch.Tensor):
            if v.numel() != 1:
                raise ValueError(f"input_amax for {n} must be one number, got {v.numel()} elements")
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"input_amax for {n} must be a number, got {type(v).__name__}")
        v = float(v)
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"input_amax for {n} must be finite and positive, got {v} (a layer whose calibration "
                             "inputs were all zero: calibrate with real inputs or pass input_amax)")
        out[n] = v
    for group in shared_input_groups(model, spec):
        if len({out[n] for n in group}) > 1:
            raise ValueError(f"{' and '.join(group)} read one quantized activation, so they need one input amax; "
                             f"got {[out[n] for n in group]}")
    return out
