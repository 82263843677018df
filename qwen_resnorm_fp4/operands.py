"""How the typed wrappers hand their arguments to a ``qwen_fp4`` op, read from the op's schema (ops.py).

Tensor inputs go contiguous and 16-byte aligned, so that the kernels can use vector loads (a copy only when
needed; while torch.compile traces, alignment is unknowable: contiguity only). gate, scale and shift go as
they are where the CUDA op reads them in place (stride 1 in the last dimension, 16-byte aligned rows:
:func:`~qwen_resnorm_fp4.validation.modulation_layout_problem`). global_scale and input_scale (each read with
one scalar load) and the outputs an out-variant is given go as they are; modulate_index (read element by
element) goes contiguous, at any alignment; eps goes as a float.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .validation import eps_problem, has_data, modulation_in_place, require

Tensor = torch.Tensor

# Tensors that hold real data whenever they are not being traced (a Parameter made under FakeTensorMode has
# type FakeTensor, not Parameter).
PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
#: The arguments read in place where their layout allows it.
MODULATION_ARGUMENTS = ("gate", "scale", "shift")
#: The arguments that always go as they are (besides an out-variant's outputs).
AS_GIVEN_ARGUMENTS = ("global_scale", "input_scale")
#: The arguments the kernels read element by element: contiguous, never copied for alignment.
ELEMENT_ARGUMENTS = ("modulate_index",)


def aligned(t: Tensor) -> Tensor:
    """Contiguous and 16-byte aligned (a copy only when needed). Tensors without data (meta, fake) are only
    made contiguous: the CUDA op refuses a misaligned tensor at run time itself."""
    if not t.is_contiguous():
        t = t.contiguous()
    if type(t) in PLAIN_TENSOR_TYPES or has_data(t):  # the common case first: a plain tensor has data
        return t.clone() if t.data_ptr() & 15 else t
    return t


def contiguous(t: Tensor) -> Tensor:
    """While tracing (torch.compile) alignment is unknowable: only contiguity."""
    return t.contiguous()


def tensor_operand() -> Callable[[Tensor], Tensor]:
    """How tensor inputs are prepared now: :func:`aligned`, or :func:`contiguous` while tracing."""
    return contiguous if torch.compiler.is_compiling() else aligned


def modulation_operand(t: Tensor, prepare: Callable[[Tensor], Tensor]) -> Tensor:
    """gate, scale or shift as it is where the op reads it in place (strided rows included), else ``prepare(t)``."""
    if prepare is aligned and type(t) in PLAIN_TENSOR_TYPES and t.is_contiguous() and not t.data_ptr() & 15:
        return t  # the common call (contiguous, aligned): what the layout rules would conclude, at less cost
    with_data = not torch.compiler.is_compiling() and (type(t) in PLAIN_TENSOR_TYPES or has_data(t))
    return t if modulation_in_place(t, with_data) else prepare(t)


class OpArguments:
    """Where each kind of argument of one op sits, from its schema: the tensor inputs to prepare (required and
    optional), the modulation parameters, the floats, and the tensors the dispatcher routes by."""

    def __init__(self, op: torch._ops.OpOverload) -> None:
        self.op = op
        inputs, optional, modulation, floats, required_tensors, elements = [], [], [], [], [], []
        for i, a in enumerate(op._schema.arguments):
            kind = str(a.type)
            written = a.alias_info is not None and a.alias_info.is_write
            if kind == "float":
                floats.append(i)
            elif kind not in ("Tensor", "Optional[Tensor]"):
                continue
            elif kind == "Tensor":
                required_tensors.append(i)
            if kind == "float" or written or a.name in AS_GIVEN_ARGUMENTS:
                continue
            if a.name in MODULATION_ARGUMENTS:
                modulation.append(i)
            elif a.name in ELEMENT_ARGUMENTS:
                elements.append(i)
            elif kind == "Tensor":
                inputs.append(i)
            else:
                optional.append(i)
        self.inputs, self.optional, self.modulation = tuple(inputs), tuple(optional), tuple(modulation)
        self.elements = tuple(elements)
        self.floats, self.required_tensors = tuple(floats), tuple(required_tensors)
        self.optional_tensors = tuple(i for i, a in enumerate(op._schema.arguments)
                                      if str(a.type) == "Optional[Tensor]")

    def prepared(self, args: Sequence) -> list:
        """``args`` (the op's, in schema order) with each one as the op takes it; eps_problem's error for an eps
        that is not a float and not a finite, non-negative real number."""
        out = list(args)
        prepare = tensor_operand()
        for i in self.inputs:
            out[i] = prepare(out[i])
        for i in self.optional:
            if out[i] is not None:
                out[i] = prepare(out[i])
        for i in self.modulation:
            out[i] = modulation_operand(out[i], prepare)
        for i in self.elements:
            if out[i] is not None:
                out[i] = out[i].contiguous()
        for i in self.floats:  # eps, the schemas' one float: a real number goes as a float, eps_problem's rule
            value = out[i]
            if type(value) is not float:
                require(eps_problem(value))
                out[i] = float(value)
        return out

    def all_on_cpu(self, args: Sequence) -> bool:
        """Whether the dispatcher takes ``args`` to the CPU implementation as they are: every tensor argument
        a CPU tensor (optional ones may be None), every float a float."""
        for i in self.required_tensors:
            t = args[i]
            if not (isinstance(t, Tensor) and t.is_cpu):
                return False
        for i in self.optional_tensors:
            t = args[i]
            if t is not None and not (isinstance(t, Tensor) and t.is_cpu):
                return False
        for i in self.floats:
            if type(args[i]) is not float:
                return False
        return True


__all__ = ["aligned", "contiguous", "tensor_operand", "modulation_operand", "OpArguments", "PLAIN_TENSOR_TYPES"]
