"""Where the segment is in each model family, and which modules of a model are its blocks.

Job: the model-family description (:class:`ModelSpec`, :class:`StreamSpec`) that each model file
(``_qwen_image.py``, ``_qwen_image21.py``, ``_flux.py``, ``_wan.py``) gives, and the discovery of a model's
blocks by diffusers class name (:func:`is_model`, :func:`blocks`, :func:`linear_only_blocks`).

Rules:

- A spec is a description, equal in every conversion of its family: a converted forward reads it (its
  streams, its label), so one compiled block serves every block and every conversion of the family.
- A spec is one object per family. Its only non-descriptive field, :attr:`ModelSpec.live`, is the family's
  registry of live conversions for the compiled-path notes (:mod:`._compiled_paths`): dynamo's code cache is
  per code object, so a block forward traced for one conversion serves every conversion of the family, and
  the note of a trace has to reach all of them. A copy or a pickle of a spec (a deep-copied or pickled
  converted model) is therefore the family's spec itself, not a second one (:meth:`ModelSpec.__reduce__`).
- Classes are recognised by name and module (``diffusers.*``), so nothing here imports diffusers.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, fields
from typing import Any, Callable, List, Optional, Tuple, Union

import torch

from ._compiled_paths import LiveConversions, family_spec


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
    #: output (block-relative names): served by ``_segments.attention_input`` in FP8 conversions; () for none.
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
    #: The family's live conversions, for the notes of traced graphs (:mod:`._compiled_paths`). Not part of
    #: the description: excluded from equality, hash and repr.
    live: LiveConversions = field(default_factory=LiveConversions, init=False, compare=False, repr=False,
                                  hash=False)

    def stream(self, name: str) -> StreamSpec:
        """The stream called ``name``."""
        return next(s for s in self.streams if s.name == name)

    def __reduce__(self) -> Union[str, Tuple[Any, ...]]:
        """Copies and pickles resolve to the family's spec: the ``SPEC`` of the module that defines
        ``block_forward`` (where every model file keeps its spec). A spec defined anywhere else is copied by
        value, with a registry of its own."""
        module = self.block_forward.__module__
        if family_spec(module) is self:
            return _family_spec, (module,)
        return ModelSpec, tuple(getattr(self, f.name) for f in fields(self) if f.init)


def _family_spec(module: str) -> ModelSpec:
    """The ``SPEC`` of a model file (what a pickled spec refers to)."""
    return importlib.import_module(module).SPEC


def _is_diffusers_class(obj: Any, class_name: str) -> bool:
    return any(c.__name__ == class_name and c.__module__.startswith("diffusers.") for c in type(obj).__mro__)


def is_model(model: Any, spec: ModelSpec) -> bool:
    """Whether ``model`` is (a subclass of) the family's diffusers model class."""
    return _is_diffusers_class(model, spec.model_class)


def blocks(model: torch.nn.Module, spec: ModelSpec) -> List[Tuple[str, torch.nn.Module]]:
    """The model's blocks that have the segment: (module name, block), in model order."""
    return [(name, m) for name, m in model.named_modules() if _is_diffusers_class(m, spec.block_class)]


def linear_only_blocks(model: torch.nn.Module, spec: ModelSpec, linears: Any) -> List[Tuple[str, torch.nn.Module]]:
    """The blocks without the segment whose Linears a ``linears`` other than "fc1" converts (FLUX.1's
    single-stream blocks): (module name, block), in model order."""
    if linears == "fc1":
        return []
    return [(name, m) for name, m in model.named_modules()
            if any(_is_diffusers_class(m, c) for c in spec.linear_only_blocks)]
