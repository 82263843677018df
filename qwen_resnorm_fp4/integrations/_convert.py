"""Convert a model, restore it, switch its mode, report its statistics.

Job: :func:`convert` (check the model, resolve the input amax, quantize the selected layers, then install
the layers, the block forwards, the block states, the load hooks and the conversion record),
:func:`restore`, :func:`set_mode` and :func:`fused_path_stats`.

Rules:

- Everything is checked before anything is installed: the options were checked when they were made
  (:class:`~._options.ConversionOptions`), the model and its blocks here, and every layer is quantized
  before the first one is put in place, so an error leaves the model as it was.
- A conversion keeps what it accumulates on objects it owns: the blocks' :class:`~._state.BlockState` (with
  one :class:`~._state.FallbackLog` for all of them), the record :class:`~._state.DiTConversion` (with its
  :class:`~._compiled_paths.CompiledPaths`, which joins the family's ``ModelSpec.live``).
- A converted block's forward is ``functools.partial(spec.block_forward, block)`` (picklable; one code object
  for every block, so regional compilation compiles one block for all of them).
- Hooks are remembered by id, so that a copy of the model removes its own.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Dict, Optional

import torch

from ._calibration import resolve_input_amax
from ._compiled_paths import CompiledPaths
from ._load_hooks import check_block_state_dict, check_model_state_dict, rederive_block
from ._options import ConversionOptions, check_mode
from ._selection import block_linear_names, check_block_structure, extra_segments
from ._spec import ModelSpec, blocks, is_model, linear_only_blocks
from ._state import MODEL_ATTR, STATE_ATTR, BlockState, DiTConversion, FallbackLog, StreamStats, converted_blocks


def _set_submodule(root: torch.nn.Module, dotted: str, module: torch.nn.Module) -> None:
    parent_name, _, leaf = dotted.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, leaf, module)


def _check_convertible(model: torch.nn.Module, spec: ModelSpec, options: ConversionOptions) -> None:
    """ValueError / TypeError unless the model is an unconverted model of the family, without diffusers
    parallelism, whose blocks have the supported structure and no forward of their own."""
    if not is_model(model, spec):
        raise TypeError(f"model must be a diffusers {spec.model_class}, got {type(model).__name__}")
    if hasattr(model, MODEL_ATTR):
        raise ValueError("the model is already converted (restore_transformer first, or set_mode to switch modes)")
    if getattr(model, "_parallel_config", None) is not None:
        raise ValueError("the model already runs under diffusers parallelism (model.enable_parallelism or "
                         "from_pretrained(..., parallel_config=...)): its hooks wrap the block forwards that the "
                         "conversion replaces. Convert first, then enable parallelism: convert_transformer(model, "
                         "...) and then model.enable_parallelism(config=...) (reload the model to start over)")
    found = blocks(model, spec)
    if not found:
        raise ValueError(f"the model has no {spec.block_class}")
    for name, block in found:
        check_block_structure(name, block, spec, options.format)
        if "forward" in vars(block):
            raise ValueError(f"{name} already has its own forward (a hook: offloading, caching, context parallelism, "
                             "or another conversion); convert before registering hooks on the blocks")


def convert(model: torch.nn.Module, spec: ModelSpec, options: ConversionOptions, *, input_amax: Any,
            calibration_inputs: Any, version: str) -> torch.nn.Module:
    """The conversion itself (the public wrappers build ``options`` and check the diffusers version first).
    Nothing is installed unless every layer quantized without error. Returns the model."""
    if not isinstance(options, ConversionOptions):
        raise TypeError(f"options must be a ConversionOptions, got {type(options).__name__}")
    _check_convertible(model, spec, options)
    fmt, linears = options.format, options.linears
    amax = resolve_input_amax(model, spec, input_amax, calibration_inputs, linears, fmt)
    selected = set(amax)
    preset = linears if isinstance(linears, str) else "all"

    found = blocks(model, spec)
    fallbacks = FallbackLog()
    converted = []
    segment_blocks = {id(b) for _, b in found}
    for name, block in found + linear_only_blocks(model, spec, linears):
        segment = id(block) in segment_blocks
        originals: Dict[str, Optional[torch.nn.Linear]] = {}
        new_layers: Dict[str, torch.nn.Module] = {}
        for rel in block_linear_names(block, spec, preset, fmt, segment):
            if f"{name}.{rel}" not in selected:
                continue
            layer = block.get_submodule(rel)
            with torch.no_grad():
                new_layers[rel] = fmt.quantize(layer, amax[f"{name}.{rel}"])
            originals[rel] = layer if options.keep_original else None
        if not segment and not new_layers:  # a list of names that has none of this block's layers
            continue
        state = BlockState(name, spec, options.mode, options.allow_cpu, originals, fallbacks)
        if not segment:
            state.stats = {}
        else:
            state.stats.update({key: StreamStats() for key in extra_segments(block, spec, new_layers)})
        converted.append((name, block, state, new_layers, segment))

    record = DiTConversion(
        mode=options.mode, allow_cpu=options.allow_cpu, input_amax=dict(amax), diffusers_version=version,
        block_names=[n for n, _ in found], kept_original=options.keep_original, model_type=spec.model_class,
        linears=linears, format_options=fmt,
        segments_per_forward=sum(len(state.stats) for _, _, state, _, _ in converted), compiled=CompiledPaths(spec),
        hook_id=None)
    for _name, block, state, new_layers, segment in converted:
        for rel, layer in new_layers.items():
            _set_submodule(block, rel, layer)
        setattr(block, STATE_ATTR, state)
        if segment:
            state.forward = functools.partial(spec.block_forward, block)
            block.forward = state.forward
        state.hook_ids = (block.register_load_state_dict_pre_hook(check_block_state_dict).id,
                          block.register_load_state_dict_post_hook(functools.partial(rederive_block, model=model)).id)
    record.hook_id = model.register_load_state_dict_pre_hook(check_model_state_dict).id
    setattr(model, MODEL_ATTR, record)
    return model


def restore(model: torch.nn.Module) -> torch.nn.Module:
    """Undo a conversion: the original ``nn.Linear`` layers and the library's block ``forward`` come back
    (the same objects, so outputs are exactly the original model's). Returns the model."""
    info: Optional[DiTConversion] = getattr(model, MODEL_ATTR, None)
    if info is None:
        raise ValueError("the model is not converted (convert_transformer)")
    if not info.kept_original:
        raise ValueError("the model was converted with keep_original=False: the BF16 layers are gone; reload "
                         "the model instead")
    found = converted_blocks(model)
    for name, block, state in found:
        if vars(block).get("forward") is not state.forward and state.forward is not None:
            raise ValueError(f"{name}.forward was replaced after the conversion (a hook?): remove that first")
        for rel in state.originals:
            layer = block.get_submodule(rel)
            if "forward" in vars(layer) or layer._forward_pre_hooks or layer._forward_hooks:
                raise ValueError(f"{name}.{rel} has hooks (offloading, e.g. enable_sequential_cpu_offload?), which "
                                 "its BF16 original would not have: remove them (pipe.remove_all_hooks()) first")
    model._load_state_dict_pre_hooks.pop(info.hook_id, None)
    for _, block, state in found:
        block._load_state_dict_pre_hooks.pop(state.hook_ids[0], None)
        block._load_state_dict_post_hooks.pop(state.hook_ids[1], None)
        for rel, original in state.originals.items():
            # follow a model.to(device) made after the conversion: the quantized layer's tensors moved with it
            # (not onto the meta device of a model being materialized: the original keeps its weights)
            device = next(block.get_submodule(rel).parameters()).device
            if device.type != "meta":
                original.to(device)
            _set_submodule(block, rel, original)
        if state.forward is not None:
            del block.forward
        delattr(block, STATE_ATTR)
    delattr(model, MODEL_ATTR)
    return model


def set_mode(model: torch.nn.Module, mode: str) -> None:
    """Switch a converted model between "fused" and "unfused" (same quantized weights, nothing re-quantized)."""
    check_mode(mode)
    for _, _, state in converted_blocks(model):
        state.mode = mode
    getattr(model, MODEL_ATTR).mode = mode


def fused_path_stats(model: torch.nn.Module, *, per_block: bool = False, reset: bool = False) -> Dict[str, Any]:
    """How the converted blocks' segments ran: {"fused": n, "unfused": n, "fallback": n, "decline_reasons":
    {reason: n}}, eager calls since the conversion (or the last reset) summed over blocks and segments;
    "compiled": {segment: [paths]}, the paths ("fused", "unfused" or a decline reason) each segment takes in
    the graphs torch.compile traced (noted when a graph is traced: compiled calls are not counted, since a
    compiled forward mutates no Python state); plus "blocks": {name: {segment: StreamStats}} with
    ``per_block=True`` (segments: each stream's name, and with FP8 "<stream>.attn" / "<stream>.gelu").
    ``reset=True`` zeroes the eager counters (after reading them); the compiled paths stay, as the graphs do."""
    total: Dict[str, Any] = {"fused": 0, "unfused": 0, "fallback": 0, "decline_reasons": collections.Counter()}
    per: Dict[str, Dict[str, StreamStats]] = {}
    for name, _, state in converted_blocks(model):
        if not state.stats:  # a block converted for linears="all" only, without the segment
            continue
        for s in state.stats.values():
            total["fused"] += s.fused
            total["unfused"] += s.unfused
            total["fallback"] += s.fallback
            total["decline_reasons"].update(s.decline_reasons)
        if per_block:
            per[name] = {k: StreamStats(v.fused, v.unfused, v.fallback, collections.Counter(v.decline_reasons))
                         for k, v in state.stats.items()}
        if reset:
            for s in state.stats.values():
                s.reset()
    total["decline_reasons"] = dict(total["decline_reasons"])
    total["compiled"] = getattr(model, MODEL_ATTR).compiled.snapshot()
    if per_block:
        total["blocks"] = per
    return total

