"""A converted model's ``load_state_dict`` hooks: refuse what it cannot serve before anything is copied, and
re-derive what the conversion decided from the loaded values.

Job: the model's pre-hook (:func:`check_model_state_dict`: every converted block's check before any block
loads), each block's pre-hook (:func:`check_block_state_dict`) and post-hook (:func:`rederive_block`).

Rules:

- A refused load changes nothing: the checks run before any value is copied and raise ValueError naming the
  key (an input scale that is not one positive, normal, finite fp32; two layers that read one quantized
  activation with different input scales).
- Values on the meta device (a model being materialized) are not checked.
- After a load, each block re-derives its ``"<stream>.attn"`` segments (q/k/v share one quantization only
  while their input scales are equal) and updates the conversion record by its own change
  (``input_amax`` of its layers, ``segments_per_forward``): no walk of the model per block.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from ..validation import input_scale_value_problem
from ._options import input_scale_attr, options_of_layer
from ._selection import attn_shares_input
from ._state import MODEL_ATTR, STATE_ATTR, BlockState, StreamStats

Tensor = torch.Tensor

logger = logging.getLogger("qwen_resnorm_fp4")


def _incoming(state_dict: Mapping[str, Any], key: str, current: Tensor) -> Tensor:
    """The value ``key`` will hold after the load: the state dict's, else the current one (a partial load)."""
    value = state_dict.get(key)
    return value if isinstance(value, Tensor) else current


def check_block_state_dict(block: torch.nn.Module, state_dict: Mapping[str, Any], prefix: str,
                           *_args: Any) -> None:
    """A converted block's load_state_dict pre-hook (before anything is copied): every quantized layer's input
    scale one positive, normal, finite fp32, and the layers that read one quantized activation (a SwiGLU's proj
    and gate_layer) one input scale. ValueError naming the key otherwise. Values on the meta device (a model
    being materialized) are not checked."""
    state = getattr(block, STATE_ATTR, None)
    if state is None:
        return
    for rel, layer in block.named_modules():
        attr = input_scale_attr(layer)
        if attr is None:
            continue
        key = f"{prefix}{rel}.{attr}"
        raw = _incoming(state_dict, key, getattr(layer, attr))
        if raw.device.type == "meta":  # no value yet (a model being materialized)
            continue
        value = raw.detach().float().reshape(-1)
        if value.numel() != 1 or input_scale_value_problem(value) is not None:  # the ops' rule of a scale value
            raise ValueError(f"{key} must be one positive, normal, finite fp32 value (an activation scale), got "
                             f"{value.tolist()}: the load is refused, nothing was copied into this block")
    for stream in state.spec.streams if state.stats else ():
        names = stream.input_linears()
        if len(names) < 2:
            continue
        layers = [block.get_submodule(n) for n in names]
        attrs = [input_scale_attr(m) for m in layers]
        if None in attrs:
            continue
        keys = [f"{prefix}{n}.{a}" for n, a in zip(names, attrs)]
        raws = [_incoming(state_dict, k, getattr(m, a)) for k, m, a in zip(keys, layers, attrs)]
        if any(r.device.type == "meta" for r in raws):
            continue
        values = [r.detach().float().reshape(-1).cpu() for r in raws]
        if not all(torch.equal(values[0], v) for v in values[1:]):
            raise ValueError(f"{keys[1]} ({values[1].tolist()}) differs from {keys[0]} ({values[0].tolist()}): "
                             "the two layers read one quantized activation, so they need one input scale; the "
                             "load is refused, nothing was copied into this block")


def check_model_state_dict(model: torch.nn.Module, state_dict: Mapping[str, Any], prefix: str,
                           *_args: Any) -> None:
    """The converted model's load_state_dict pre-hook: every converted block's check
    (:func:`check_block_state_dict`) before any block is loaded, so a refused load changes nothing."""
    for name, block in model.named_modules():
        if isinstance(getattr(block, STATE_ATTR, None), BlockState):
            check_block_state_dict(block, state_dict, f"{prefix}{name}.")


def rederive_block(block: torch.nn.Module, _incompatible_keys: Any, *, model: torch.nn.Module) -> None:
    """A converted block's load_state_dict post-hook: re-derive what the conversion decided from loaded values
    (the ``"<stream>.attn"`` segments: q/k/v share one quantization only while their input scales are equal)
    and bring the conversion record up to date (``input_amax``, ``segments_per_forward``)."""
    state = getattr(block, STATE_ATTR, None)
    record = getattr(model, MODEL_ATTR, None)
    if state is None or record is None:
        return
    if any(t.device.type == "meta" for m in block.modules() if options_of_layer(m) is not None for t in m.parameters()):
        return  # no values yet (a model being materialized)
    layers = dict(block.named_modules())
    segments_before = len(state.stats)
    for stream in state.spec.streams if state.stats else ():
        key = f"{stream.name}.attn"
        shares = attn_shares_input(block, stream, layers)
        if shares and key not in state.stats:
            state.stats[key] = StreamStats()
        elif not shares and key in state.stats:
            del state.stats[key]
            logger.info("%s: %s's q/k/v input scales differ after the load: each keeps its own quantization",
                        state.name, stream.name)
    for full in record.input_amax:
        if full.startswith(state.name + "."):
            layer = model.get_submodule(full)
            if options_of_layer(layer) is not None:
                record.input_amax[full] = layer.input_amax()
    record.segments_per_forward += len(state.stats) - segments_before
