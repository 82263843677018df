"""What a conversion leaves on the model: the per-block state, the statistics and the conversion record.

Job: :class:`StreamStats` (how one segment of one block ran), :class:`FallbackLog` (the decline reasons a
conversion has logged), :class:`BlockState` (per converted block: spec, mode, original layers, statistics,
hooks), :class:`DiTConversion` (the model-level record, ``conversion_info(model)``), where they are kept
(:data:`STATE_ATTR`, :data:`MODEL_ATTR`) and :func:`converted_blocks`.

Rules:

- Plain objects, not modules: the original layers stay out of ``state_dict`` and ``.to()``.
- What a converted forward reads of a BlockState (``spec``, ``mode``, ``allow_cpu``, the keys of ``stats``)
  is equal in every block of a conversion and every conversion of a family with the same settings, so one
  compiled block serves all of them. The rest (counters, the fallback log) is written by eager calls only.
- Everything a conversion accumulates lives on objects it owns (its blocks' states, its record); nothing
  here is module-level state.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from ._compiled_paths import CompiledPaths
from ._options import FormatOptions
from ._spec import ModelSpec

#: The block attribute that holds the conversion state.
STATE_ATTR = "_qwen_fp4"
#: The model attribute that holds the model-level conversion record.
MODEL_ATTR = "_qwen_fp4_conversion"


@dataclass
class StreamStats:
    """How one stream of one block ran: the fused kernel, the unfused chain because the mode says so, or the
    unfused chain because the fused path declined (``fallback``, with the reasons counted)."""

    fused: int = 0
    unfused: int = 0
    fallback: int = 0
    decline_reasons: collections.Counter = field(default_factory=collections.Counter)

    def reset(self) -> None:
        """Zero the counters."""
        self.fused = self.unfused = self.fallback = 0
        self.decline_reasons.clear()


class FallbackLog:
    """The decline reasons whose fallback a conversion has logged: each is logged once per conversion (at
    INFO, by the first block that falls back for it). Shared by the conversion's blocks; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._logged: set = set()

    def __getstate__(self) -> Dict[str, Any]:
        with self._lock:
            return {"logged": set(self._logged)}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self._lock = threading.Lock()
        self._logged = set(state["logged"])

    def first(self, reason: str) -> bool:
        """True the first time ``reason`` is given (then log it), False after."""
        with self._lock:
            if reason in self._logged:
                return False
            self._logged.add(reason)
            return True


class BlockState:
    """Per block: the spec, the mode, the original Linear layers (for restore) and the statistics. What a
    converted forward reads of it (``spec``, ``mode``, ``allow_cpu``, the keys of ``stats``) is equal in every
    block of one conversion, so one compiled block serves all of them."""

    def __init__(self, name: str, spec: ModelSpec, mode: str, allow_cpu: bool,
                 originals: Dict[str, Optional[torch.nn.Linear]], fallbacks: FallbackLog):
        self.name = name
        self.spec = spec
        self.mode = mode
        self.allow_cpu = allow_cpu
        self.originals = originals  # block-relative module name -> the nn.Linear it replaced (None: freed)
        self.stats: Dict[str, StreamStats] = {s.name: StreamStats() for s in spec.streams}
        #: The conversion's fallback log (one object for all its blocks).
        self.fallbacks = fallbacks
        self.forward = None  # the forward installed on the block: partial(spec.block_forward, block), picklable
        #: The ids of its load_state_dict hooks, (pre, post): removed by restore (ids, not handles, so that a
        #: copy of the model removes its own).
        self.hook_ids: Tuple[Optional[int], Optional[int]] = (None, None)


@dataclass
class DiTConversion:
    """What a conversion did (``conversion_info(model)``).

    model_type: the diffusers model class; mode: "fused" or "unfused"; format_options: the format's options
    (``NVFP4Options`` / ``FP8Options``: fast_math and gemm_backend, or use_fast_accum), from which the
    properties ``format`` ("nvfp4" or "fp8") and ``fast_math`` (NVFP4's as passed, None for FP8) are read;
    linears: "fc1", "all", "modelopt" or the tuple of module names given; allow_cpu;
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
    allow_cpu: bool
    input_amax: Dict[str, float]
    diffusers_version: str
    block_names: List[str]
    kept_original: bool
    model_type: str
    linears: Union[str, Tuple[str, ...]]
    format_options: FormatOptions
    segments_per_forward: int
    compiled: CompiledPaths = field(compare=False, repr=False)
    hook_id: Optional[int] = field(compare=False, repr=False)

    @property
    def format(self) -> str:
        """The format's name, from :attr:`format_options` (its one home)."""
        return self.format_options.name

    @property
    def fast_math(self) -> Optional[bool]:
        """NVFP4's fast_math as passed (None: the environment at each call); None for FP8."""
        return getattr(self.format_options, "fast_math", None)


def converted_blocks(model: torch.nn.Module) -> List[Tuple[str, torch.nn.Module, BlockState]]:
    """(name, block, state) of every converted block, in model order; ValueError if the model is not
    converted."""
    if not hasattr(model, MODEL_ATTR):
        raise ValueError("the model is not converted (convert_transformer)")
    return [(name, m, getattr(m, STATE_ATTR)) for name, m in model.named_modules()
            if isinstance(getattr(m, STATE_ATTR, None), BlockState)]
