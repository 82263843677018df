"""What the graphs torch.compile traced run: the path of each segment, noted while dynamo traces.

Job: :class:`CompiledPaths` (one per conversion: segment key -> the paths, "fused", "unfused" or a decline
reason, that the traced graphs take), :class:`LiveConversions` (one per model family, held by its
``ModelSpec.live``: the CompiledPaths of the family's live conversions) and :func:`note_compiled`, the
trace-time call that writes them.

Rules:

- A compiled call mutates no Python state: :func:`note_compiled` is a
  ``torch.compiler.assume_constant_result`` function, so dynamo runs it once while it traces a forward and
  the graph keeps only its constant result. Eager calls are counted elsewhere (the blocks' ``StreamStats``).
- Its arguments are equal in every block and every conversion of a family (the family's spec, the segment
  key, the path): a trace guards on nothing that differs between blocks or conversions, so diffusers'
  regional compilation compiles one block for all of them and a second conversion of the family reuses the
  compiled blocks.
- Dynamo keeps one cache per code object, so a block forward traced for one conversion serves every
  conversion of the family: a trace is noted in every live conversion of it. That set is as process-wide as
  dynamo's cache, and the family's (``ModelSpec.live`` of its module's ``SPEC``, weak references: a conversion
  that is garbage leaves it); this module holds none.
- Thread-safe: each object guards its own containers with its own lock.
"""

from __future__ import annotations

import importlib
import threading
import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set, Tuple

import torch

if TYPE_CHECKING:  # pragma: no cover
    from ._spec import ModelSpec


class LiveConversions:
    """The live conversions of one model family, by their :class:`CompiledPaths` (weakly: a conversion
    leaves when it is garbage). Held by the family's ``ModelSpec.live``; a copy of it is a new, empty
    registry (a spec copied by value is another family)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: weakref.WeakSet[CompiledPaths] = weakref.WeakSet()

    def __reduce__(self) -> Tuple[Any, ...]:
        return LiveConversions, ()

    def join(self, paths: CompiledPaths) -> None:
        """Add a conversion's CompiledPaths (its traces from now on are noted there)."""
        with self._lock:
            self._members.add(paths)

    def note(self, segment: str, path: str) -> None:
        """Note ``path`` for ``segment`` in every live conversion of the family."""
        with self._lock:
            members = list(self._members)
        for paths in members:
            paths.add(segment, path)


class CompiledPaths:
    """The paths the segments take in the graphs torch.compile traced, per segment key ("img", "txt.attn",
    ...): a set of "fused", "unfused" or a decline reason's value. Written while a graph is traced (once per
    trace, whatever the number of blocks it serves), never by a compiled call.

    Made by a conversion for its family (``spec``), which it joins; a copy (deepcopy, pickle: a copied
    converted model) joins the family too, with the paths noted so far."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self._lock = threading.Lock()
        self._paths: Dict[str, Set[str]] = {}
        spec.live.join(self)

    def __getstate__(self) -> Dict[str, Any]:
        return {"spec": self.spec, "paths": self.snapshot()}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.spec = state["spec"]  # the family's spec (ModelSpec pickles by reference)
        self._lock = threading.Lock()
        self._paths = {k: set(v) for k, v in state["paths"].items()}
        self.spec.live.join(self)

    def add(self, segment: str, path: str) -> None:
        """Note that ``segment`` takes ``path`` in a traced graph."""
        with self._lock:
            self._paths.setdefault(segment, set()).add(path)

    def snapshot(self) -> Dict[str, List[str]]:
        """{segment: sorted paths}, sorted by segment."""
        with self._lock:
            return {k: sorted(v) for k, v in sorted(self._paths.items())}


def family_spec(module: str) -> Optional[ModelSpec]:
    """The ``SPEC`` that the model file ``module`` (a module name) defines; None for a module without one."""
    return getattr(importlib.import_module(module), "SPEC", None)


@torch.compiler.assume_constant_result
def note_compiled(family: str, segment: str, path: str) -> bool:
    """Called by a segment while dynamo traces a converted forward (its result is a constant of the graph,
    so a compiled call never runs it): notes the segment's path in every live conversion of the family whose
    spec the model file ``family`` (a module name) defines (its ``SPEC.live``). Returns True. The arguments are
    strings: dynamo converts every torch version's constants of that kind."""
    spec = family_spec(family)
    if spec is not None:  # a spec defined outside a model file keeps no registry to note in
        spec.live.note(segment, path)
    return True
