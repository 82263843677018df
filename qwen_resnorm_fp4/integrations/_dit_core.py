"""The conversion core shared by every DiT integration: NVFP4 or FP8 layers in the blocks, the fused (or
unfused) residual + norm + modulation + quantization segment in front of each FFN, calibration, restore,
statistics.

A model integration (``_qwen_image.py``, ``_qwen_image21.py``, ``_flux.py``, ``_wan.py``) gives a
:class:`ModelSpec`: which class is the model and which its block, where each stream's norm and FFN are, and
a copy of the block's ``forward`` in which the segment::

    residual = residual + gate * x          # gated (or ungated: gate of ones) residual update
    y = norm(residual) * (1 + scale) + shift
    h = ffn(y)

is one call of :func:`ffn_segment`. Everything else in the forward is the model library's own code.

With ``format="fp8"`` two more places run fused where the layers allow it (each counted in the statistics
as its own segment, ``"<stream>.attn"`` and ``"<stream>.gelu"``):

- the block's first norm (``StreamSpec.attn_norm``: LayerNorm + modulation, no residual update) into the
  FP8 Linears that read it (``attn_inputs``, e.g. to_q, to_k, to_v, one shared input_scale): one
  ``norm_modulate_quant_fp8`` for all of them (:func:`attention_input`), instead of the norm, the modulation
  and one quantization per Linear;
- a GELU(tanh) FeedForward's activation into its FP8 second Linear: one ``gelu_tanh_fp8_quantize``.

Their unfused modes (``resnorm`` of (x, 0, gate 0) then ``fp8_quantize``; ``F.gelu`` then the Linear's own
quantization) write the same bytes.

Both modes compute the library's numerics contract for the segment: ``mode="fused"`` through
``serve_fused_resnorm_quant`` (``format="nvfp4"``) or ``serve_fused_resnorm_quant_fp8`` (``format="fp8"``; where
either declines, the unfused chain runs and the decline is counted), and ``mode="unfused"`` through
``resnorm`` + the FFN input layer's quantizer (``nvfp4_quantize`` / ``fp8_quantize``). They write the same
bytes.

torch.compile: a converted forward mutates no Python state. Eager calls count each segment's path in the
block's :class:`StreamStats`; while torch.compile traces a forward, each segment's path is noted once per
trace in the :class:`CompiledPaths` of every live conversion of the model class (a trace-time call,
:func:`_note_compiled`), so compiled calls run no Python bookkeeping and guard on nothing that changes from
call to call. The blocks' forwards read only values that are equal in every block and every conversion of a
class (mode, allow_cpu, the spec, the segment keys), so diffusers' regional compilation compiles one block
for all of them.

Loaded state: each converted block re-derives, after ``load_state_dict``, what the conversion decided from
values a checkpoint can change (whether q/k/v share one quantization), and refuses, before anything is
copied, values it cannot serve (two Linears that read one quantized activation with different input scales,
an input scale that is not a positive normal fp32), naming the key.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import re
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch

from .. import FP8Linear, NVFP4Linear, resnorm
from .._fused_common import Decline
from ..fused_path import serve_fused_resnorm_quant
from ..fused_path_fp8 import serve_fused_gelu_tanh_fp8_quantize, serve_fused_norm_modulate_quant_fp8
from ..fused_path_fp8 import serve_fused_resnorm_quant_fp8
from ..recipe import global_scale_numerator
from ..linear_fp8 import FP8_ALIGNMENT, is_fp8_linear_shape
from ..reference import E4M3_MAX
from ..env import resolve_fast_math
from ..gemm import BACKENDS
from ..validation import WIDTH_RULE, input_scale_value_problem, is_supported_width

Tensor = torch.Tensor

logger = logging.getLogger("qwen_resnorm_fp4")

MODES = ("fused", "unfused")
#: The quantized formats: NVFP4 (NVFP4Linear) or FP8 E4M3 (FP8Linear).
FORMATS = ("nvfp4", "fp8")
#: The presets of ``linears`` (it may also be a list of module names): "fc1": the FFN input layers only;
#: "all": every block Linear the format supports; "modelopt": "all" less the layers ModelOpt's diffusion
#: recipes keep in BF16 (each ModelSpec's ``modelopt_bf16``: the modulation Linears and the FFN output).
LINEARS = ("fc1", "all", "modelopt")
#: The layer types of a conversion (their names stay the same before and after it).
QUANTIZED_LINEARS = (NVFP4Linear, FP8Linear)
#: The block attribute that holds the conversion state.
STATE_ATTR = "_qwen_fp4"
#: The model attribute that holds the model-level conversion record.
MODEL_ATTR = "_qwen_fp4_conversion"
FFN_KINDS = ("gelu", "swiglu")


# ------------------------------------------------------------------------------------------------------------
# Specs
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamSpec:
    """One stream's segment in a block: ``norm`` and ``ffn`` are block attribute names.

    ffn_kind "gelu": diffusers' ``FeedForward`` (``net[0].proj`` is FC1, then ``net[0].gelu`` and ``net[1:]``);
    "swiglu": ``ffn.proj`` and ``ffn.gate_layer`` both read the modulated activation, then
    ``ffn.out(ffn.activation_fn(gate_layer) * proj)``.
    """

    name: str
    norm: str
    ffn: str
    ffn_kind: str = "gelu"
    #: The stream's first norm (LayerNorm + modulation, no residual update) and the Linears that read its
    #: output (block-relative names): served by :func:`attention_input` in FP8 conversions; () for none.
    attn_norm: Optional[str] = None
    attn_inputs: Tuple[str, ...] = ()

    def input_linears(self) -> Tuple[str, ...]:
        """The FFN layers that read the modulated activation (names relative to the block)."""
        if self.ffn_kind == "gelu":
            return (f"{self.ffn}.net.0.proj",)
        return (f"{self.ffn}.proj", f"{self.ffn}.gate_layer")

    def output_linear(self) -> Optional[str]:
        """A GELU FeedForward's second Linear (``net.2``), which reads the GELU output; None for SwiGLU."""
        return f"{self.ffn}.net.2" if self.ffn_kind == "gelu" else None


@dataclass(frozen=True)
class ModelSpec:
    """Where the segment is in one model family. ``block_forward`` is the copied forward, bound to each
    converted block; ``block_attrs`` are the attributes it uses (checked before converting)."""

    label: str
    model_class: str
    block_class: str
    streams: Tuple[StreamSpec, ...]
    block_forward: Callable
    block_attrs: Tuple[str, ...] = ()
    #: Other block classes whose Linears ``linears="all"`` converts (their forward stays the library's).
    linear_only_blocks: Tuple[str, ...] = ()
    #: Block-relative module names (regular expressions, matched in full) that ``linears="modelopt"``
    #: keeps in BF16.
    modelopt_bf16: Tuple[str, ...] = ()


def _is_diffusers_class(obj: Any, class_name: str) -> bool:
    return any(c.__name__ == class_name and c.__module__.startswith("diffusers.") for c in type(obj).__mro__)


def is_model(model: Any, spec: ModelSpec) -> bool:
    return _is_diffusers_class(model, spec.model_class)


def blocks(model: torch.nn.Module, spec: ModelSpec) -> List[Tuple[str, torch.nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if _is_diffusers_class(m, spec.block_class)]


def _linear_only_blocks(model: torch.nn.Module, spec: ModelSpec, linears: Any) -> List[Tuple[str, torch.nn.Module]]:
    if linears == "fc1":
        return []
    return [(name, m) for name, m in model.named_modules()
            if any(_is_diffusers_class(m, c) for c in spec.linear_only_blocks)]


# ------------------------------------------------------------------------------------------------------------
# State
# ------------------------------------------------------------------------------------------------------------


@dataclass
class StreamStats:
    """How one stream of one block ran: the fused kernel, the unfused chain because the mode says so, or the
    unfused chain because the fused path declined (``fallback``, with the reasons counted)."""

    fused: int = 0
    unfused: int = 0
    fallback: int = 0
    decline_reasons: collections.Counter = field(default_factory=collections.Counter)

    def reset(self) -> None:
        self.fused = self.unfused = self.fallback = 0
        self.decline_reasons.clear()


#: The live conversions' CompiledPaths by model class, for the trace-time notes (which can pass constants
#: only), and the lock of both.
_COMPILED_PATHS: Dict[str, "weakref.WeakSet[CompiledPaths]"] = {}
_COMPILED_LOCK = threading.Lock()


class CompiledPaths:
    """The paths the segments take in the graphs torch.compile traced, per segment key ("img", "txt.attn",
    ...): a set of "fused", "unfused" or a decline reason's value. Written while a graph is traced (once per
    trace, whatever the number of blocks it serves), never by a compiled call. Dynamo keeps one cache per
    code object, so a block forward traced for one conversion of a model class serves every conversion of
    that class whose blocks read the same values: a trace is noted in every live conversion of the class."""

    def __init__(self, model_class: str) -> None:
        self.model_class = model_class
        self._paths: Dict[str, set] = {}
        self._join()

    def _join(self) -> None:
        with _COMPILED_LOCK:
            _COMPILED_PATHS.setdefault(self.model_class, weakref.WeakSet()).add(self)

    def __getstate__(self) -> Dict[str, Any]:
        return {"model_class": self.model_class, "_paths": {k: set(v) for k, v in self._paths.items()}}

    def __setstate__(self, state: Dict[str, Any]) -> None:  # a copy (deepcopy, pickle) is a live conversion too
        self.__dict__.update(state)
        self._join()

    def note(self, segment: str, path: str) -> None:
        self._paths.setdefault(segment, set()).add(path)

    def snapshot(self) -> Dict[str, List[str]]:
        with _COMPILED_LOCK:
            return {k: sorted(v) for k, v in sorted(self._paths.items())}


@torch.compiler.assume_constant_result
def _note_compiled(model_class: str, segment: str, path: str) -> bool:
    """Called by dynamo while it traces a converted forward (its result is a constant of the graph, so a
    compiled call never runs it): notes the segment's path for ``fused_path_stats`` in every live conversion
    of ``model_class``. Its arguments are equal in every block and conversion of a class (no guard of the
    traced forward can differ between them)."""
    with _COMPILED_LOCK:
        for record in list(_COMPILED_PATHS.get(model_class, ())):
            record.note(segment, path)
    return True


class BlockState:
    """Per block: the spec, the mode, the original Linear layers (for restore) and the statistics. A plain
    object, not a module: the original layers stay out of ``state_dict`` and ``.to()``. What a converted
    forward reads of it (``spec``, ``mode``, ``allow_cpu``, the keys of ``stats``) is equal in every block of
    one conversion, so one compiled block serves all of them."""

    def __init__(self, name: str, spec: ModelSpec, mode: str, allow_cpu: bool,
                 originals: Dict[str, Optional[torch.nn.Linear]]):
        self.name = name
        self.spec = spec
        self.mode = mode
        self.allow_cpu = allow_cpu
        self.originals = originals  # block-relative module name -> the nn.Linear it replaced (None: freed)
        self.stats = {s.name: StreamStats() for s in spec.streams}
        self.forward = None  # the forward installed on the block: partial(spec.block_forward, block), picklable
        #: The ids of its load_state_dict hooks, (pre, post): removed by restore (ids, not handles, so that a
        #: copy of the model removes its own).
        self.hook_ids: Tuple[Optional[int], Optional[int]] = (None, None)


@dataclass
class DiTConversion:
    """What a conversion did (``conversion_info(model)``).

    model_type: the diffusers model class; mode: "fused" or "unfused"; format: "nvfp4" or "fp8";
    linears: "fc1", "all", "modelopt" or the tuple of module names given; fast_math: as passed (None: the
    environment at each call; NVFP4 only); allow_cpu;
    input_amax: converted Linear module name -> the amax its input scale was made from (NVFP4: global scale
    448 * 6 / amax; FP8: input_scale amax / 448);
    diffusers_version; block_names: the converted blocks' module names; kept_original: whether restore works;
    segments_per_forward: how many fused-path segments one forward runs (what ``fused_path_stats`` counts:
    each block's FFN segments, plus with FP8 its ``"<stream>.attn"`` and ``"<stream>.gelu"`` segments);
    compiled: the paths of the segments in the graphs torch.compile traced (``fused_path_stats``); hook_id:
    the id of the model's load_state_dict pre-hook. Every field is set by the conversion (no defaults: a
    record always names its model).
    """

    mode: str
    fast_math: Optional[bool]
    allow_cpu: bool
    input_amax: Dict[str, float]
    diffusers_version: str
    block_names: List[str]
    kept_original: bool
    model_type: str
    linears: Union[str, Tuple[str, ...]]
    format: str
    segments_per_forward: int
    compiled: CompiledPaths = field(compare=False, repr=False)
    hook_id: Optional[int] = field(compare=False, repr=False)


# ------------------------------------------------------------------------------------------------------------
# Which layers
# ------------------------------------------------------------------------------------------------------------


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def check_format(format: str) -> str:
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    return format


def check_gemm_backend(gemm_backend: str) -> str:
    """TypeError / ValueError naming ``gemm_backend`` unless it is one of :data:`~qwen_resnorm_fp4.gemm.BACKENDS`."""
    if not isinstance(gemm_backend, str):
        raise TypeError(f"gemm_backend must be a str, got {type(gemm_backend).__name__}")
    if gemm_backend not in BACKENDS:
        raise ValueError(f"gemm_backend must be one of {BACKENDS}, got {gemm_backend!r}")
    return gemm_backend


def check_linears(linears: Any) -> Union[str, Tuple[str, ...]]:
    """A preset of :data:`LINEARS`, or a list / tuple of module names (returned as a tuple)."""
    if isinstance(linears, str):
        if linears not in LINEARS:
            raise ValueError(f"linears must be one of {LINEARS} or a list of module names, got {linears!r}")
        return linears
    if not isinstance(linears, (list, tuple)) or not linears or not all(isinstance(n, str) for n in linears):
        raise TypeError(f"linears must be one of {LINEARS} or a non-empty list of module names (str), got "
                        f"{linears!r}")
    return tuple(linears)


def layer_supported(layer: torch.nn.Module, format: str) -> bool:
    """Whether the format's layer can replace ``layer``: NVFP4Linear needs in_features a multiple of 64 (at
    most 16384), FP8Linear in_features and out_features multiples of 16 (torch._scaled_mm)."""
    if format == "fp8":
        return is_fp8_linear_shape(layer.in_features, layer.out_features)
    return is_supported_width(layer.in_features)


def _format_rule(format: str) -> str:
    if format == "fp8":
        return f"in_features and out_features multiples of {FP8_ALIGNMENT}"
    return f"in_features {WIDTH_RULE}"


def _block_linear_names(block: torch.nn.Module, spec: ModelSpec, linears: str, segment: bool = True,
                        format: str = "nvfp4") -> List[str]:
    """Block-relative names of the layers a preset converts: the FFN input layers (``segment``: a block with
    the segment), plus with ``linears="all"`` every other nn.Linear of the block the format supports
    (:func:`layer_supported`), and with ``"modelopt"`` those of them that ``spec.modelopt_bf16`` does not
    keep in BF16."""
    names = [n for s in spec.streams for n in s.input_linears()] if segment else []
    if linears in ("all", "modelopt"):
        # the quantized layers too: the same names before and after a conversion
        names += [n for n, m in block.named_modules() if isinstance(m, (torch.nn.Linear,) + QUANTIZED_LINEARS)
                  and layer_supported(m, format) and n not in names
                  and not (linears == "modelopt" and any(re.fullmatch(p, n) for p in spec.modelopt_bf16))]
    return names


def linear_names(model: torch.nn.Module, spec: ModelSpec, linears: Any = "fc1", format: str = "nvfp4") -> List[str]:
    """Module names of the layers a conversion quantizes (the keys of an ``input_amax`` dict), in model order.

    ``linears`` a list: each entry is a full module name (as ``linear_names(model, "all")`` lists them) or a
    block-relative one (``"attn.to_q"``: that layer in every block that has it); every block's FFN input
    layers must be among them (the segment feeds them)."""
    linears = check_linears(linears)
    check_format(format)
    preset = linears if isinstance(linears, str) else "all"
    found = blocks(model, spec)
    names = ([f"{b}.{n}" for b, block in found for n in _block_linear_names(block, spec, preset, format=format)]
             + [f"{b}.{n}" for b, block in _linear_only_blocks(model, spec, preset)
                for n in _block_linear_names(block, spec, preset, segment=False, format=format)])
    if isinstance(linears, str):
        return names
    prefixes = {b for b, _ in found} | {b for b, _ in _linear_only_blocks(model, spec, "all")}
    wanted = set()
    for entry in linears:
        hits = [n for n in names if n == entry or (n.endswith("." + entry) and n[:-len(entry) - 1] in prefixes)]
        if not hits:
            raise ValueError(f"linears names {entry!r}, which is not a block Linear this format can quantize "
                             f"({_format_rule(format)}); e.g. {names[0]!r} (see linear_names(model, 'all'))")
        wanted.update(hits)
    missing = [f"{b}.{n}" for b, _ in found for s in spec.streams for n in s.input_linears()
               if f"{b}.{n}" not in wanted]
    if missing:
        raise ValueError(f"linears must include every block's FFN input layers (the fused segment feeds them); "
                         f"it lacks {missing[0]!r}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    return [n for n in names if n in wanted]


def _shared_input_groups(model: torch.nn.Module, spec: ModelSpec) -> List[Tuple[str, ...]]:
    """Layers that read one packed activation (a SwiGLU's proj and gate_layer): one input global scale."""
    return [tuple(f"{b}.{n}" for n in s.input_linears()) for b, _ in blocks(model, spec) for s in spec.streams
            if len(s.input_linears()) > 1]


def check_block_structure(name: str, block: torch.nn.Module, spec: ModelSpec, format: str = "nvfp4") -> None:
    """The block must look like the supported releases' block of this model."""
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
            elif not layer_supported(layer, format):
                problems.append(f"{rel} is [{layer.out_features}, {layer.in_features}]: the {format} layer needs "
                                f"{_format_rule(format)}")
    if problems:
        raise ValueError(f"{name} does not have the structure of the supported {spec.block_class}: "
                         + "; ".join(problems))


# ------------------------------------------------------------------------------------------------------------
# Calibration
# ------------------------------------------------------------------------------------------------------------


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


def calibrate_input_amax(model: torch.nn.Module, spec: ModelSpec, calibration_inputs: Any,
                         linears: Any = "fc1", format: str = "nvfp4") -> Dict[str, float]:
    """Run ``calibration_inputs`` through the (unconverted) model under ``torch.no_grad()`` and return, for
    every layer the conversion quantizes, the max |input| seen: {module name: amax}."""
    if not is_model(model, spec):
        raise TypeError(f"model must be a diffusers {spec.model_class}, got {type(model).__name__}")
    if hasattr(model, MODEL_ATTR):
        raise ValueError("the model is converted: calibrate the original model (restore it first)")
    names = linear_names(model, spec, linears, format)
    modules = dict(model.named_modules())
    amax: Dict[str, Optional[Tensor]] = {n: None for n in names}
    handles = []

    def make_hook(n: str) -> Callable:
        def hook(_module, args, kwargs):
            x = args[0] if args else kwargs.get("input")
            a = x.detach().abs().amax().float()
            # NaN-free max: a NaN activation would poison the scale
            a = torch.nan_to_num(a, nan=0.0, posinf=float(torch.finfo(torch.float32).max))
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
                       linears: Any, format: str = "nvfp4") -> Dict[str, float]:
    names = linear_names(model, spec, linears, format)
    if input_amax is not None and calibration_inputs is not None:
        raise ValueError("pass either input_amax or calibration_inputs, not both")
    if input_amax is None:
        if calibration_inputs is None:
            raise ValueError("the input scales need either calibration_inputs (inputs to run through "
                             "the model; each converted layer's input amax is taken) or input_amax (a float for "
                             "every layer, or a dict {module name: amax}, see linear_names(model, linears))")
        values = calibrate_input_amax(model, spec, calibration_inputs, linears, format)
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
    for group in _shared_input_groups(model, spec):
        if len({out[n] for n in group}) > 1:
            raise ValueError(f"{' and '.join(group)} read one quantized activation, so they need one input amax; "
                             f"got {[out[n] for n in group]}")
    return out


# ------------------------------------------------------------------------------------------------------------
# The segment
# ------------------------------------------------------------------------------------------------------------


def _unfused(residual: Tensor, x: Tensor, bias: Optional[Tensor], gate: Tensor, scale: Tensor, shift: Tensor,
             norm: torch.nn.LayerNorm, fc1: Union[NVFP4Linear, FP8Linear],
             index: Optional[Tensor]) -> Tuple[Any, Tensor]:
    """The baseline: ``resnorm`` (residual update, LayerNorm, modulation -> BF16 y), then FC1's own quantizer
    (what the layer does to a BF16 input): NVFP4 with its input global scale and fast-math mode, or E4M3 with
    its input_scale."""
    y, residual_out = resnorm(residual, x, bias, gate, scale, shift, float(norm.eps), weight=norm.weight,
                              norm_bias=norm.bias, modulate_index=index)
    return fc1.quantize_input(y), residual_out


_logged_fallbacks: set = set()


def _served(state: BlockState, segment: str, stats: StreamStats, outcome: Any) -> Any:
    """The result of one segment's call: a fused gate's outcome (its result, or None for a Decline), or None
    for the unfused mode (``outcome`` None). Counted in ``stats`` in eager mode (a decline's reason logged
    once); while torch.compile traces, noted once for the trace (:func:`_note_compiled`) instead."""
    declined = isinstance(outcome, Decline)
    path = "unfused" if outcome is None else outcome.reason.value if declined else "fused"
    if torch.compiler.is_compiling():
        _note_compiled(state.spec.model_class, segment, path)
    elif outcome is None:
        stats.unfused += 1
    elif not declined:
        stats.fused += 1
    else:
        stats.fallback += 1
        stats.decline_reasons[path] += 1
        if path not in _logged_fallbacks:
            _logged_fallbacks.add(path)
            logger.info("%s block %s (%s): the fused path declined (%s: %s); running the unfused chain (same "
                        "bytes). See fused_path_stats(model).", state.spec.label, state.name, segment, path,
                        outcome.detail)
    return None if declined else outcome


def attention_input(block: torch.nn.Module, stream: str, x: Tensor, scale: Tensor, shift: Tensor, *,
                    index: Optional[Tensor] = None) -> Optional[Tensor]:
    """The E4M3 input of a stream's attention projections (``StreamSpec.attn_inputs``, one shared
    input_scale) from its first norm: ``norm(x) * (1 + scale) + shift`` quantized once, fused
    (``norm_modulate_quant_fp8``) or unfused (``resnorm`` of (x, 0, gate 0), then ``fp8_quantize``), the same
    bytes. None where the conversion did not set this segment up (NVFP4, other layers, differing input
    scales): the caller runs the model's own norm and modulation. scale/shift as for :func:`ffn_segment`."""
    state: BlockState = getattr(block, STATE_ATTR)
    key = f"{stream}.attn"
    stats = state.stats.get(key)
    if stats is None:
        return None
    spec = next(s for s in state.spec.streams if s.name == stream)
    norm = getattr(block, spec.attn_norm)
    first = block.get_submodule(spec.attn_inputs[0])
    if x.dtype != torch.bfloat16:
        raise TypeError(f"the converted {state.spec.label} block needs bfloat16 activations, got {x.dtype}")
    if not x.is_contiguous():
        x = x.contiguous()
    outcome = None
    if state.mode == "fused":
        outcome = serve_fused_norm_modulate_quant_fp8(x, scale, shift, first.input_scale, norm=norm,
                                                      modulate_index=index, allow_cpu=state.allow_cpu)
    result = _served(state, key, stats, outcome)
    if result is None:
        zero_gate = torch.zeros(scale.shape, dtype=scale.dtype, device=scale.device)
        y, _ = resnorm(x, torch.zeros_like(x), None, zero_gate, scale, shift, float(norm.eps), weight=norm.weight,
                       norm_bias=norm.bias, modulate_index=index)
        result = first.quantize_input(y)
    return result


def _gelu_tanh(h: Tensor) -> Tensor:
    """PyTorch's own GELU(tanh) kernel: what ``gelu_tanh_fp8_quantize`` equals bit for bit."""
    return torch.nn.functional.gelu(h, approximate="tanh")


#: :func:`_gelu_tanh` as one opaque op, for traced code: inductor would generate its own GELU, whose last bit
#: can differ from PyTorch's kernel.
_gelu_tanh_eager = torch.library.custom_op("qwen_fp4::_gelu_tanh_eager", _gelu_tanh, mutates_args=())


@_gelu_tanh_eager.register_fake
def _gelu_tanh_eager_fake(h: Tensor) -> Tensor:
    return torch.empty_like(h)


def _gelu_ffn(block: torch.nn.Module, state: BlockState, spec: StreamSpec, ffn: torch.nn.Module,
              h: Tensor) -> Tensor:
    """A GELU FeedForward after its first Linear (``h``: its bf16 output): the model's own modules, or, for a
    ``"<stream>.gelu"`` segment, GELU + the second Linear's quantization in one pass (fused) or PyTorch's GELU
    kernel then the Linear's own quantization (unfused or declined), the same bytes, compiled too."""
    key = f"{spec.name}.gelu"
    stats = state.stats.get(key)
    net = ffn.net
    if stats is not None and not net[1].training:  # net[1]: Dropout, the identity in eval
        fc2 = net[2]
        outcome = None
        if state.mode == "fused":
            outcome = serve_fused_gelu_tanh_fp8_quantize(h, fc2.input_scale, allow_cpu=state.allow_cpu)
        q = _served(state, key, stats, outcome)
        if q is None:  # PyTorch's GELU kernel; as one op when traced, so that inductor does not regenerate it
            q = _gelu_tanh_eager(h) if torch.compiler.is_compiling() else _gelu_tanh(h)
        hidden = fc2(q)
        for module in net[3:]:
            hidden = module(hidden)
        return hidden
    hidden = net[0].gelu(h)
    for module in net[1:]:
        hidden = module(hidden)
    return hidden


def ffn_segment(block: torch.nn.Module, stream: str, residual: Tensor, x: Tensor, gate: Tensor, scale: Tensor,
                shift: Tensor, *, index: Optional[Tensor] = None,
                bias: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """``residual + gate * (x + bias) -> norm -> * (1 + scale) + shift -> FFN`` of one stream of a converted
    block. Returns ``(residual_out, ffn_output)``; the caller does the post-FFN update as the model does.

    gate/scale/shift: [B, D], [B, 1, D], [2B, D] with ``index`` ([B, S]: row b where 0, B + b elsewhere), or
    per token [B, S, D] (strided views read in place; both modes serve every form)."""
    state: BlockState = getattr(block, STATE_ATTR)
    spec = next(s for s in state.spec.streams if s.name == stream)
    if residual.dtype != torch.bfloat16 or x.dtype != torch.bfloat16:
        raise TypeError(f"the converted {state.spec.label} block needs bfloat16 activations, got {residual.dtype} "
                        f"and {x.dtype} (load the model with torch_dtype=torch.bfloat16)")
    # Under context parallelism a block's input is a sequence shard (diffusers chunks [B, S, D] along S: not
    # contiguous for B > 1). The fused path declines strided activations and resnorm copies them: copy here.
    if not residual.is_contiguous():
        residual = residual.contiguous()
    if not x.is_contiguous():
        x = x.contiguous()
    norm = getattr(block, spec.norm)
    ffn = getattr(block, spec.ffn)
    fc1 = block.get_submodule(spec.input_linears()[0])
    stats = state.stats[stream]

    fp8 = isinstance(fc1, FP8Linear)
    outcome = None
    if state.mode == "fused":
        if fp8:
            outcome = serve_fused_resnorm_quant_fp8(residual, x, gate, scale, shift, fc1.input_scale, bias=bias,
                                                    norm=norm, modulate_index=index, allow_cpu=state.allow_cpu)
        else:
            outcome = serve_fused_resnorm_quant(residual, x, gate, scale, shift, fc1, bias=bias, norm=norm,
                                                modulate_index=index, allow_cpu=state.allow_cpu)
    result = _served(state, stream, stats, outcome)
    if result is not None:
        quantized, residual_out = result[0], result[1]
    else:
        quantized, residual_out = _unfused(residual, x, bias, gate, scale, shift, norm, fc1, index)

    # Shared by both modes from here on: the FFN on the quantized activations, as the model library writes it.
    lead = x.shape[:-1]
    if fp8:  # E4M3 [..., D], x's shape: the layers keep the leading dimensions themselves
        feed = lambda layer: layer(quantized)  # noqa: E731
    else:  # (packed [M, D/2], scales): the layers are told the leading dimensions
        feed = lambda layer: layer(quantized, out_shape=lead)  # noqa: E731
    if spec.ffn_kind == "gelu":
        hidden = _gelu_ffn(block, state, spec, ffn, feed(fc1))
    else:
        hidden = ffn.out(ffn.activation_fn(feed(ffn.gate_layer)) * feed(ffn.proj))
    return residual_out, hidden


def clip_fp16(t: Tensor) -> Tensor:
    """diffusers' end of a block: float16 activations clipped to the finite range, other dtypes as they are."""
    return t.clip(-65504, 65504) if t.dtype == torch.float16 else t


def ones_gate(like: Tensor) -> Tensor:
    """The gate of an ungated residual update (``residual + x``): fma(x, 1, residual) is that sum. One [D] row
    of ones broadcast to ``like``'s shape (stride 0: per-token modulation allocates no [B, S, D] of ones)."""
    return torch.ones(like.shape[-1:], dtype=like.dtype, device=like.device).expand(like.shape)


# ------------------------------------------------------------------------------------------------------------
# Convert, restore, mode, statistics
# ------------------------------------------------------------------------------------------------------------


def convert(model: torch.nn.Module, spec: ModelSpec, *, mode: str, linears: Any, input_amax: Any,
            calibration_inputs: Any, fast_math: Optional[bool], allow_cpu: bool, keep_original: bool,
            gemm_backend: str, version: str, format: str = "nvfp4", use_fast_accum: bool = True) -> torch.nn.Module:
    """The conversion itself (the public wrappers check the diffusers version first). Nothing is installed
    unless every layer quantized without error. ``fast_math`` and ``gemm_backend`` are NVFP4 settings,
    ``use_fast_accum`` an FP8 one (FP8Linear's)."""
    check_mode(mode)
    linears = check_linears(linears)
    check_format(format)
    if not isinstance(allow_cpu, bool) or not isinstance(keep_original, bool) or not isinstance(use_fast_accum, bool):
        raise TypeError("allow_cpu, keep_original and use_fast_accum must be bools")
    if fast_math is not None:
        resolve_fast_math(fast_math)  # type check
    check_gemm_backend(gemm_backend)  # refused before the calibration pass, not after it
    if format == "fp8" and fast_math is not None:
        raise ValueError("fast_math is a setting of the NVFP4 quantizer; format='fp8' has none (pass None)")
    if format == "fp8" and gemm_backend != "auto":
        raise ValueError(f"gemm_backend is a setting of NVFP4Linear; format='fp8' runs torch._scaled_mm (pass "
                         f"'auto'), got {gemm_backend!r}")
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
        check_block_structure(name, block, spec, format)
        if "forward" in vars(block):
            raise ValueError(f"{name} already has its own forward (a hook: offloading, caching, context parallelism, "
                             "or another conversion); convert before registering hooks on the blocks")

    amax = resolve_input_amax(model, spec, input_amax, calibration_inputs, linears, format)
    selected = set(amax)

    converted = []
    others = _linear_only_blocks(model, spec, linears)
    for name, block in found + others:
        segment = any(block is b for _, b in found)
        originals: Dict[str, Optional[torch.nn.Linear]] = {}
        new_layers: Dict[str, NVFP4Linear] = {}
        preset = linears if isinstance(linears, str) else "all"
        for rel in _block_linear_names(block, spec, preset, segment, format):
            if f"{name}.{rel}" not in selected:
                continue
            layer = block.get_submodule(rel)
            with torch.no_grad():
                if format == "fp8":
                    new_layers[rel] = FP8Linear.from_linear(layer, amax[f"{name}.{rel}"],
                                                            use_fast_accum=use_fast_accum)
                else:
                    new_layers[rel] = NVFP4Linear.from_linear(layer, amax[f"{name}.{rel}"], fast_math=fast_math,
                                                              gemm_backend=gemm_backend)
            originals[rel] = layer if keep_original else None
        if not segment and not new_layers:  # a list of names that has none of this block's layers
            continue
        state = BlockState(name, spec, mode, allow_cpu, originals)
        if not segment:
            state.stats = {}
        elif format == "fp8":
            state.stats.update({key: StreamStats() for key in _fp8_segments(block, spec, new_layers)})
        converted.append((name, block, state, new_layers, segment))

    record = DiTConversion(
        mode=mode, fast_math=fast_math, allow_cpu=allow_cpu, input_amax=dict(amax), diffusers_version=version,
        block_names=[n for n, _ in found], kept_original=keep_original, model_type=spec.model_class,
        linears=linears, format=format,
        segments_per_forward=sum(len(state.stats) for _, _, state, _, _ in converted),
        compiled=CompiledPaths(spec.model_class), hook_id=None)
    for name, block, state, new_layers, segment in converted:
        for rel, layer in new_layers.items():
            _set_submodule(block, rel, layer)
        setattr(block, STATE_ATTR, state)
        if segment:
            state.forward = functools.partial(spec.block_forward, block)
            block.forward = state.forward
        state.hook_ids = (block.register_load_state_dict_pre_hook(_check_block_state_dict).id,
                          block.register_load_state_dict_post_hook(functools.partial(_rederive_block, model=model)).id)
    record.hook_id = model.register_load_state_dict_pre_hook(_check_model_state_dict).id
    setattr(model, MODEL_ATTR, record)
    return model


def _attn_shares_input(block: torch.nn.Module, stream: StreamSpec, layers: Mapping[str, Any]) -> bool:
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


def _fp8_segments(block: torch.nn.Module, spec: ModelSpec, new_layers: Mapping[str, torch.nn.Module]) -> List[str]:
    """The FP8-only segments of a converted block: ``"<stream>.attn"`` where :func:`_attn_shares_input`,
    ``"<stream>.gelu"`` where a tanh-GELU FeedForward's second Linear is FP8."""
    keys = []
    for s in spec.streams:
        if _attn_shares_input(block, s, new_layers):
            keys.append(f"{s.name}.attn")
        fc2 = s.output_linear()
        if fc2 is not None and isinstance(new_layers.get(fc2), FP8Linear) and \
                getattr(getattr(block, s.ffn).net[0], "approximate", None) == "tanh":
            keys.append(f"{s.name}.gelu")
    return keys


# ------------------------------------------------------------------------------------------------------------
# Loaded state
# ------------------------------------------------------------------------------------------------------------

#: The input-scale buffer of each quantized layer type (the value its activations are quantized with).
_INPUT_SCALE = {NVFP4Linear: "input_global_scale", FP8Linear: "input_scale"}


def _incoming(state_dict: Mapping[str, Any], key: str, current: Tensor) -> Tensor:
    """The value ``key`` will hold after the load: the state dict's, else the current one (a partial load)."""
    value = state_dict.get(key)
    return value if isinstance(value, Tensor) else current


def _check_block_state_dict(block: torch.nn.Module, state_dict: Mapping[str, Any], prefix: str,
                            *_args: Any) -> None:
    """A converted block's load_state_dict pre-hook (before anything is copied): every quantized layer's input
    scale one positive, normal, finite fp32, and the layers that read one quantized activation (a SwiGLU's proj
    and gate_layer) one input scale. ValueError naming the key otherwise. Values on the meta device (a model
    being materialized) are not checked."""
    state = getattr(block, STATE_ATTR, None)
    if state is None:
        return
    for rel, layer in block.named_modules():
        buffer = _INPUT_SCALE.get(type(layer))
        if buffer is None:
            continue
        key = f"{prefix}{rel}.{buffer}"
        raw = _incoming(state_dict, key, getattr(layer, buffer))
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
        if not all(type(m) in _INPUT_SCALE for m in layers):
            continue
        keys = [f"{prefix}{n}.{_INPUT_SCALE[type(m)]}" for n, m in zip(names, layers)]
        raws = [_incoming(state_dict, k, getattr(m, _INPUT_SCALE[type(m)])) for k, m in zip(keys, layers)]
        if any(r.device.type == "meta" for r in raws):
            continue
        values = [r.detach().float().reshape(-1).cpu() for r in raws]
        if not all(torch.equal(values[0], v) for v in values[1:]):
            raise ValueError(f"{keys[1]} ({values[1].tolist()}) differs from {keys[0]} ({values[0].tolist()}): "
                             "the two layers read one quantized activation, so they need one input scale; the "
                             "load is refused, nothing was copied into this block")


def _check_model_state_dict(model: torch.nn.Module, state_dict: Mapping[str, Any], prefix: str,
                            *_args: Any) -> None:
    """The converted model's load_state_dict pre-hook: every converted block's check
    (:func:`_check_block_state_dict`) before any block is loaded, so a refused load changes nothing."""
    for name, block in model.named_modules():
        if isinstance(getattr(block, STATE_ATTR, None), BlockState):
            _check_block_state_dict(block, state_dict, f"{prefix}{name}.")


def _rederive_block(block: torch.nn.Module, _incompatible_keys: Any, *, model: torch.nn.Module) -> None:
    """A converted block's load_state_dict post-hook: re-derive what the conversion decided from loaded values
    (the ``"<stream>.attn"`` segments: q/k/v share one quantization only while their input scales are equal)
    and bring the conversion record up to date (``input_amax``, ``segments_per_forward``)."""
    state = getattr(block, STATE_ATTR, None)
    record = getattr(model, MODEL_ATTR, None)
    if state is None or record is None or any(t.device.type == "meta" for t in block.buffers()):
        return
    layers = dict(block.named_modules())
    segments_before = len(state.stats)
    for stream in state.spec.streams if state.stats else ():
        key = f"{stream.name}.attn"
        shares = _attn_shares_input(block, stream, layers)
        if shares and key not in state.stats:
            state.stats[key] = StreamStats()
        elif not shares and key in state.stats:
            del state.stats[key]
            logger.info("%s: %s's q/k/v input scales differ after the load: each keeps its own quantization",
                        state.name, stream.name)
    for full in record.input_amax:
        if full.startswith(state.name + "."):
            layer = model.get_submodule(full)
            if isinstance(layer, FP8Linear):
                record.input_amax[full] = float(layer.input_scale.float().item()) * E4M3_MAX
            elif isinstance(layer, NVFP4Linear):
                record.input_amax[full] = (global_scale_numerator(layer.nvfp4_4over6_code)
                                           / float(layer.input_global_scale.float().item()))
    record.segments_per_forward += len(state.stats) - segments_before


def _set_submodule(root: torch.nn.Module, dotted: str, module: torch.nn.Module) -> None:
    parent_name, _, leaf = dotted.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, leaf, module)


def converted_blocks(model: torch.nn.Module) -> List[Tuple[str, torch.nn.Module, BlockState]]:
    if not hasattr(model, MODEL_ATTR):
        raise ValueError("the model is not converted (convert_transformer)")
    return [(name, m, getattr(m, STATE_ATTR)) for name, m in model.named_modules()
            if isinstance(getattr(m, STATE_ATTR, None), BlockState)]


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
    model._load_state_dict_pre_hooks.pop(info.hook_id, None)
    for _, block, state in found:
        block._load_state_dict_pre_hooks.pop(state.hook_ids[0], None)
        block._load_state_dict_post_hooks.pop(state.hook_ids[1], None)
        for rel, original in state.originals.items():
            current = block.get_submodule(rel)
            if isinstance(current, NVFP4Linear):  # follow a model.to(device) made after the conversion
                original.to(current.weight_packed.device)
            elif isinstance(current, FP8Linear):
                original.to(current.weight.device)
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
    total = {"fused": 0, "unfused": 0, "fallback": 0, "decline_reasons": collections.Counter()}
    per = {}
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

