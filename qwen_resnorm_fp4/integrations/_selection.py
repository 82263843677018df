"""Which layers a conversion quantizes and which segments a converted block serves.

Job: the layer selection (:func:`block_linear_names`, :func:`linear_names`, :func:`shared_input_groups`),
the structure check of a block against its family's spec (:func:`check_block_structure`), and the FP8-only
segments a block's layers allow (:func:`attn_shares_input`, :func:`extra_segments`).

Rules:

- Pure functions of the model, the spec and the options: they read modules and (for the FP8 segments) the
  layers' input-scale values, and change nothing.
- The format's facts come from its options (``fmt.supports(layer)``, ``fmt.shape_rule``); no format name is
  compared here.
- A list of names is checked against what the format can quantize, and must include every block's FFN input
  layers (the segment feeds them); errors name the entry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, List, Tuple

import torch

from .. import FP8Linear
from ._options import QUANTIZED_LINEARS, FormatOptions, check_linears
from ._spec import ModelSpec, StreamSpec, blocks, linear_only_blocks


def block_linear_names(block: torch.nn.Module, spec: ModelSpec, linears: str, fmt: FormatOptions,
                       segment: bool = True) -> List[str]:
    """Block-relative names of the layers a preset converts: the FFN input layers (``segment``: a block with
    the segment), plus with ``linears="all"`` every other nn.Linear of the block the format supports
    (``fmt.supports``), and with ``"modelopt"`` those of them that ``spec.modelopt_bf16`` does not keep in
    BF16."""
    names = [n for s in spec.streams for n in s.input_linears()] if segment else []
    if linears in ("all", "modelopt"):
        # the quantized layers too: the same names before and after a conversion
        names += [n for n, m in block.named_modules() if isinstance(m, (torch.nn.Linear,) + QUANTIZED_LINEARS)
                  and fmt.supports(m) and n not in names
                  and not (linears == "modelopt" and any(re.fullmatch(p, n) for p in spec.modelopt_bf16))]
    return names


def linear_names(model: torch.nn.Module, spec: ModelSpec, linears: Any, fmt: FormatOptions) -> List[str]:
    """Module names of the layers a conversion quantizes (the keys of an ``input_amax`` dict), in model order.

    ``linears`` a list: each entry is a full module name (as ``linear_names(model, "all")`` lists them) or a
    block-relative one (``"attn.to_q"``: that layer in every block that has it); every block's FFN input
    layers must be among them (the segment feeds them)."""
    linears = check_linears(linears)
    preset = linears if isinstance(linears, str) else "all"
    found = blocks(model, spec)
    names = ([f"{b}.{n}" for b, block in found for n in block_linear_names(block, spec, preset, fmt)]
             + [f"{b}.{n}" for b, block in linear_only_blocks(model, spec, preset)
                for n in block_linear_names(block, spec, preset, fmt, segment=False)])
    if isinstance(linears, str):
        return names
    prefixes = {b for b, _ in found} | {b for b, _ in linear_only_blocks(model, spec, "all")}
    wanted = set()
    for entry in linears:
        hits = [n for n in names if n == entry or (n.endswith("." + entry) and n[:-len(entry) - 1] in prefixes)]
        if not hits:
            raise ValueError(f"linears names {entry!r}, which is not a block Linear this format can quantize "
                             f"({fmt.shape_rule}); e.g. {names[0]!r} (see linear_names(model, 'all'))")
        wanted.update(hits)
    missing = [f"{b}.{n}" for b, _ in found for s in spec.streams for n in s.input_linears()
               if f"{b}.{n}" not in wanted]
    if missing:
        raise ValueError(f"linears must include every block's FFN input layers (the fused segment feeds them); "
                         f"it lacks {missing[0]!r}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    return [n for n in names if n in wanted]


def shared_input_groups(model: torch.nn.Module, spec: ModelSpec) -> List[Tuple[str, ...]]:
    """Layers that read one packed activation (a SwiGLU's proj and gate_layer): one input global scale."""
    return [tuple(f"{b}.{n}" for n in s.input_linears()) for b, _ in blocks(model, spec) for s in spec.streams
            if len(s.input_linears()) > 1]


def check_block_structure(name: str, block: torch.nn.Module, spec: ModelSpec, fmt: FormatOptions) -> None:
    """The block must look like the supported releases' block of this model: ValueError naming every
    difference otherwise."""
    problems = [f"no attribute {a!r}" for a in spec.block_attrs if not hasattr(block, a)]
    for s in spec.streams:
        norm = getattr(block, s.norm, None)
        if not isinstance(norm, torch.nn.LayerNorm) or len(norm.normalized_shape) != 1:
            problems.append(f"{s.norm} is a {type(norm).__name__}, not a LayerNorm over the last dimension")
        ffn = getattr(block, s.ffn, None)
        if s.ffn_kind == "gelu":
            net = getattr(ffn, "net", None)
            if net is None or len(net) < 3:
                problems.append(f"{s.ffn} is not a diffusers FeedForward (act, dropout, Linear)")
                continue
            if not (hasattr(net[0], "proj") and callable(getattr(net[0], "gelu", None))):
                problems.append(f"{s.ffn}.net[0] is a {type(net[0]).__name__}, not diffusers' GELU (proj + gelu)")
                continue
        elif not all(hasattr(ffn, a) for a in ("proj", "gate_layer", "out", "activation_fn")):
            problems.append(f"{s.ffn} is not a SwiGLU FFN (proj, gate_layer, out, activation_fn)")
            continue
        for rel in s.input_linears():
            layer = block.get_submodule(rel)
            if not isinstance(layer, torch.nn.Linear):
                problems.append(f"{rel} is a {type(layer).__name__}, not a torch.nn.Linear")
            elif not fmt.supports(layer):
                problems.append(f"{rel} is [{layer.out_features}, {layer.in_features}]: the {fmt.name} layer "
                                f"needs {fmt.shape_rule}")
    if problems:
        raise ValueError(f"{name} does not have the structure of the supported {spec.block_class}: "
                         + "; ".join(problems))


def attn_shares_input(block: torch.nn.Module, stream: StreamSpec, layers: Mapping[str, Any]) -> bool:
    """Whether the stream's q/k/v (``attn_inputs``) can read one E4M3 activation: its ``attn_norm`` is a
    LayerNorm, each of them is an FP8Linear, and their input scales are equal (a checkpoint's differing input
    scales keep each Linear's own quantization). Reads the scales' values (a synchronisation: conversion and
    load only)."""
    attn = stream.attn_inputs
    if not attn or not isinstance(getattr(block, stream.attn_norm, None), torch.nn.LayerNorm):
        return False
    if not all(isinstance(layers.get(n), FP8Linear) for n in attn):
        return False
    first = layers[attn[0]].input_scale
    return all(torch.equal(layers[n].input_scale.to(first.device), first) for n in attn[1:])


def extra_segments(block: torch.nn.Module, spec: ModelSpec, new_layers: Mapping[str, torch.nn.Module]) -> List[str]:
    """The segments a converted block serves besides its FFN segments, which FP8 layers allow:
    ``"<stream>.attn"`` where :func:`attn_shares_input`, ``"<stream>.gelu"`` where a tanh-GELU FeedForward's
    second Linear is FP8. None for NVFP4 layers."""
    keys = []
    for s in spec.streams:
        if attn_shares_input(block, s, new_layers):
            keys.append(f"{s.name}.attn")
        fc2 = s.output_linear()
        if fc2 is not None and isinstance(new_layers.get(fc2), FP8Linear) and \
                getattr(getattr(block, s.ffn).net[0], "approximate", None) == "tanh":
            keys.append(f"{s.name}.gelu")
    return keys
