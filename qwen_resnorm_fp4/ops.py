"""The ``qwen_fp4`` op table: one entry per op, from which everything about the op is driven.

An entry (:class:`OpEntry`) holds the op's schema, its rules (a validation.py rule function over the op's
own arguments), the shapes of its outputs and its reference (reference.py). From the table this module:

- defines each schema in the ``qwen_fp4`` namespace;
- registers each fake: the static rules (an out-variant's without the memory rules: fake tensors have no
  data), then outputs of the right shapes (an out-variant returns nothing);
- registers each Python implementation for CPU tensors, and for CUDA tensors where the compiled library
  does not serve them (a source tree that was never built): every rule (the memory rules, and the value of
  ``input_scale`` where the op has one), then the reference. An out-variant's implementation is its
  functional op's reference, copied into the given outputs once every input has been read (so
  residual_out may be residual);
- gives api.py each op's entry: a wrapper whose call the CUDA op refuses raises the entry's rule for it,
  naming the argument (api.py's ``_call``).

The compiled library (_library.py, loaded below once the schemas exist) registers the CUDA kernels
(csrc/registration.cpp), whose own checks hold for raw calls. Adding an op: an entry here, its reference,
its kernel with its host wrapper and registration line, its typed wrapper in api.py, its tests.

Three private ops of the namespace have no kernel and are not in the table: Python functions that traced code
must call as one opaque op, defined with ``torch.library.custom_op`` beside their callers
(``_bf16_gemm_fp32_accumulate_scaled`` in gemm.py, ``_fp8_scaled_mm`` in linear_fp8.py, ``_gelu_tanh_eager`` in
integrations/_segments.py).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Callable, Mapping, Optional, Sequence, Tuple

import torch

from . import _library, reference
from .constants import FP8_DTYPE
from .layout import packed_shape, scales_shape
from .validation import Problem, dequantize_bf16_problem, input_scale_value_problem, quantize_out_problem
from .validation import quantize_problem, require, resnorm_out_problem, resnorm_problem
from .validation import resnorm_quant_out_problem, resnorm_quant_problem
from .validation import fp8_quantize_out_problem, fp8_quantize_problem
from .validation import norm_modulate_quant_fp8_out_problem, norm_modulate_quant_fp8_problem
from .validation import norm_modulate_quant_problem, resnorm_quant_fp8_out_problem, resnorm_quant_fp8_problem

Tensor = torch.Tensor

NAMESPACE = "qwen_fp4"

Rules = Callable[..., Optional[Problem]]


class OpEntry:
    """One op of the table.

    Attributes:
        name: the op's name in the ``qwen_fp4`` namespace.
        schema: its arguments and returns, as torch.library takes them after the name.
        rules: the validation.py rule function over the op's arguments in schema order (an out-variant's
            takes ``memory=``: whether the memory rules apply).
        outputs: a functional op's fake outputs from its arguments (None for an out-variant).
        reference: a functional op's Python implementation after the rules (reference.py); an out-variant's,
            the function that writes its outputs from its arguments (None: :func:`_write_functional`).
        functional: an out-variant's functional op (whose reference computes what it writes).
        fusion, format: what a functional op computes and in which output format ("nvfp4", "fp8", "bf16"): the
            unified wrappers (api.py) find the op of a (fusion, format) pair here (:data:`FUSIONS`).
        argument_names: the schema's argument names, in order.
        reads_scale: the position of ``input_scale``, whose value the Python implementation checks too.
    """

    __slots__ = ("name", "schema", "rules", "outputs", "reference", "functional", "fusion", "format",
                 "argument_names", "reads_scale")

    def __init__(self, name: str, schema: str, rules: Optional[Rules], *, outputs: Optional[Callable] = None,
                 reference: Optional[Callable] = None, functional: Optional[str] = None,
                 fusion: Optional[str] = None, format: Optional[str] = None) -> None:
        self.name, self.schema, self.rules = name, schema, rules
        self.outputs, self.reference, self.functional = outputs, reference, functional
        self.fusion, self.format = fusion, format
        parsed = torch._C.parse_schema(f"{NAMESPACE}::{name}{schema}")
        self.argument_names = tuple(a.name for a in parsed.arguments)
        #: Position of input_scale, whose value the Python implementation also checks (the CUDA kernels check
        #: it on the device instead: every output byte 0x7F).
        self.reads_scale = self.argument_names.index("input_scale") if "input_scale" in self.argument_names \
            else None

    @property
    def is_out_variant(self) -> bool:
        return self.functional is not None

    def problem(self, args: Sequence, memory: Optional[bool] = None) -> Optional[Problem]:
        """The op's static rules on ``args`` (an out-variant's memory rules when ``memory``; None: when its
        outputs have data)."""
        return self.rules(*args, memory=memory) if self.is_out_variant else self.rules(*args)

    def __repr__(self) -> str:
        return f"OpEntry({self.name!r})"


# ---------------------------------------------------------------------------------------------------
# Output shapes of the functional ops (their fakes)
# ---------------------------------------------------------------------------------------------------


def _quantized(like: Tensor) -> Tuple[Tensor, Tensor]:
    """packed uint8 [M, D/2] and scales uint8 [round_up(M, 128), D/16] for ``like`` [..., D]."""
    d = like.shape[-1]
    rows = like.numel() // d
    return (like.new_empty(packed_shape(rows, d), dtype=torch.uint8),
            like.new_empty(scales_shape(rows, d), dtype=torch.uint8))


def _like(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fp8_like(t: Tensor) -> Tensor:
    return torch.empty(t.shape, dtype=FP8_DTYPE, device=t.device)


def _dequantized(packed: Tensor, scales: Tensor) -> Tensor:
    return packed.new_empty((packed.shape[0], packed.shape[1] * 2), dtype=torch.bfloat16)


# ---------------------------------------------------------------------------------------------------
# The out-variants' writes
# ---------------------------------------------------------------------------------------------------


def _write(out: Tensor, value: Tensor) -> None:
    """``value``'s bytes into ``out`` (scales may be float8_e4m3fn where the reference gives uint8: the bytes,
    not a conversion)."""
    (out.view(value.dtype) if out.dtype != value.dtype else out).copy_(value.reshape(out.shape))


def _fp8_rows_into(residual, x, bias, gate, scale, shift, input_scale, eps, y, residual_out, weight=None,
                   norm_bias=None, modulate_index=None, y_bf16=None) -> None:
    """The FP8 row op's out-variant: its y, its residual_out and (optional) the bf16 y it quantized."""
    y_ref, r = reference.resnorm(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index)
    _write(y, reference.fp8_quantize(y_ref, input_scale))
    _write(residual_out, r)
    if y_bf16 is not None:
        _write(y_bf16, y_ref)


def _fp8_norm_into(x, scale, shift, input_scale, eps, y, weight=None, norm_bias=None, modulate_index=None,
                   y_bf16=None) -> None:
    """The FP8 no-residual op's out-variant: its y and (optional) the bf16 y it quantized."""
    y_ref = reference.norm_modulate(x, scale, shift, eps, weight, norm_bias, modulate_index)
    _write(y, reference.fp8_quantize(y_ref, input_scale))
    if y_bf16 is not None:
        _write(y_bf16, y_ref)


# ---------------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------------

_ROW_INPUTS = "Tensor residual, Tensor x, Tensor? bias, Tensor gate, Tensor scale, Tensor shift"
_NORM_PARAMS = "Tensor? weight=None, Tensor? norm_bias=None, Tensor? modulate_index=None"

_TABLE = (
    # Gated residual update + LayerNorm + modulation + NVFP4 (numerics: docs/numerics.md, steps 1-8).
    # nvfp4_4over6_code: 0 (standard) or FlashInfer's packing of NVFP44Over6Config (recipe.py).
    OpEntry("resnorm_quant",
            f"({_ROW_INPUTS}, Tensor global_scale, float eps, bool fast_math, {_NORM_PARAMS}, "
            "int nvfp4_4over6_code=0) -> (Tensor packed, Tensor scales, Tensor residual_out)",
            resnorm_quant_problem, outputs=lambda residual, x, *_: (*_quantized(x), _like(x)),
            reference=reference.resnorm_quant, fusion="residual_norm", format="nvfp4"),
    # Its bf16 half: y and residual_out (steps 1-7).
    OpEntry("resnorm", f"({_ROW_INPUTS}, float eps, {_NORM_PARAMS}) -> (Tensor y, Tensor residual_out)",
            resnorm_problem, outputs=lambda residual, x, *_: (_like(x), _like(x)), reference=reference.resnorm,
            fusion="residual_norm", format="bf16"),
    # The standalone NVFP4 quantizer (step 8), the production recipe.
    OpEntry("nvfp4_quantize",
            "(Tensor y, Tensor global_scale, bool fast_math, int nvfp4_4over6_code=0) "
            "-> (Tensor packed, Tensor scales)",
            quantize_problem, outputs=lambda y, *_: _quantized(y), reference=reference.nvfp4_quantize,
            fusion="quantize", format="nvfp4"),
    # The out-variants: the functional op's outputs, in order, after its required arguments; residual_out may
    # be residual itself.
    OpEntry("resnorm_quant_out",
            f"({_ROW_INPUTS}, Tensor global_scale, float eps, bool fast_math, Tensor(a!) packed, Tensor(b!) scales, "
            f"Tensor(c!) residual_out, {_NORM_PARAMS}, int nvfp4_4over6_code=0) -> ()",
            resnorm_quant_out_problem, functional="resnorm_quant"),
    OpEntry("resnorm_out",
            f"({_ROW_INPUTS}, float eps, Tensor(a!) y, Tensor(b!) residual_out, {_NORM_PARAMS}) -> ()",
            resnorm_out_problem, functional="resnorm"),
    OpEntry("nvfp4_quantize_out",
            "(Tensor y, Tensor global_scale, bool fast_math, Tensor(a!) packed, Tensor(b!) scales, "
            "int nvfp4_4over6_code=0) -> ()",
            quantize_out_problem, functional="nvfp4_quantize"),
    # NVFP4 -> bf16 e2m1 * e4m3 block scale (no global scale): exact, the tensor-core GEMM's operand.
    OpEntry("nvfp4_dequantize_bf16", "(Tensor packed, Tensor scales) -> Tensor", dequantize_bf16_problem,
            outputs=_dequantized, reference=reference.nvfp4_dequantize_bf16),
    # FP8 (E4M3) output (docs/numerics.md, "FP8 (E4M3) output"). input_scale: ModelOpt's static scale
    # (amax / 448), one fp32 element on x's device. The out-variants' optional y_bf16 also receives the bf16 y.
    OpEntry("resnorm_quant_fp8",
            f"({_ROW_INPUTS}, Tensor input_scale, float eps, {_NORM_PARAMS}) -> (Tensor y, Tensor residual_out)",
            resnorm_quant_fp8_problem, outputs=lambda residual, x, *_: (_fp8_like(x), _like(x)),
            reference=reference.resnorm_quant_fp8, fusion="residual_norm", format="fp8"),
    OpEntry("resnorm_quant_fp8_out",
            f"({_ROW_INPUTS}, Tensor input_scale, float eps, Tensor(a!) y, Tensor(b!) residual_out, "
            f"{_NORM_PARAMS}, Tensor(c!)? y_bf16=None) -> ()",
            resnorm_quant_fp8_out_problem, reference=_fp8_rows_into, functional="resnorm_quant_fp8"),
    # Element-wise, any shape: the FP8 input of a Linear that no norm produces (attention output).
    OpEntry("fp8_quantize", "(Tensor y, Tensor input_scale) -> Tensor", fp8_quantize_problem,
            outputs=lambda y, _: _fp8_like(y), reference=reference.fp8_quantize, fusion="quantize", format="fp8"),
    OpEntry("fp8_quantize_out", "(Tensor y, Tensor input_scale, Tensor(a!) out) -> ()", fp8_quantize_out_problem,
            functional="fp8_quantize"),
    # The same of GELU(tanh)(y) rounded to bf16 (PyTorch's CUDA GELU bit for bit): the FFN's second Linear input.
    OpEntry("gelu_tanh_fp8_quantize", "(Tensor y, Tensor input_scale) -> Tensor", fp8_quantize_problem,
            outputs=lambda y, _: _fp8_like(y), reference=reference.gelu_tanh_fp8_quantize, fusion="gelu_tanh",
            format="fp8"),
    OpEntry("gelu_tanh_fp8_quantize_out", "(Tensor y, Tensor input_scale, Tensor(a!) out) -> ()",
            fp8_quantize_out_problem, functional="gelu_tanh_fp8_quantize"),
    # No residual update (a block's first norm): LayerNorm + modulation of x, then NVFP4 / FP8.
    OpEntry("norm_modulate_quant",
            f"(Tensor x, Tensor scale, Tensor shift, Tensor global_scale, float eps, bool fast_math, {_NORM_PARAMS}, "
            "int nvfp4_4over6_code=0) -> (Tensor packed, Tensor scales)",
            norm_modulate_quant_problem, outputs=lambda x, *_: _quantized(x), reference=reference.norm_modulate_quant,
            fusion="norm", format="nvfp4"),
    OpEntry("norm_modulate_quant_fp8",
            f"(Tensor x, Tensor scale, Tensor shift, Tensor input_scale, float eps, {_NORM_PARAMS}) -> Tensor",
            norm_modulate_quant_fp8_problem, outputs=lambda x, *_: _fp8_like(x),
            reference=reference.norm_modulate_quant_fp8, fusion="norm", format="fp8"),
    OpEntry("norm_modulate_quant_fp8_out",
            f"(Tensor x, Tensor scale, Tensor shift, Tensor input_scale, float eps, Tensor(a!) y, {_NORM_PARAMS}, "
            "Tensor(b!)? y_bf16=None) -> ()",
            norm_modulate_quant_fp8_out_problem, reference=_fp8_norm_into, functional="norm_modulate_quant_fp8"),
    # The compiled kernels' launch switches (kernel path: 0 auto, 1 portable, 2 blackwell; PDL), set by
    # qwen_resnorm_fp4.launch only: implemented by the compiled library alone.
    OpEntry("_set_launch_options", "(int kernel_path, bool pdl) -> ()", None),
)

#: Every op by name (read-only).
OPS: Mapping[str, OpEntry] = MappingProxyType({entry.name: entry for entry in _TABLE})
#: Every op's full schema by name.
SCHEMAS: Mapping[str, str] = MappingProxyType({e.name: f"{e.name}{e.schema}" for e in _TABLE})
#: The functional op of each (fusion, output format): "residual_norm" (gated residual update + LayerNorm +
#: modulation), "norm" (LayerNorm + modulation, no residual), "quantize", "gelu_tanh" (GELU, then quantize).
FUSIONS: Mapping[Tuple[str, str], str] = MappingProxyType(
    {(e.fusion, e.format): e.name for e in _TABLE if e.fusion is not None})


# ---------------------------------------------------------------------------------------------------
# Registration, driven by the table
# ---------------------------------------------------------------------------------------------------


def _fake(entry: OpEntry) -> Callable:
    def fake(*args):
        require(entry.problem(args, memory=False))
        return None if entry.is_out_variant else entry.outputs(*args)
    fake.__name__ = f"{entry.name}_fake"
    return fake


def _write_functional(entry: OpEntry) -> Callable:
    """An out-variant's writes: its functional op's reference on the functional op's arguments (by name),
    each result into the out-variant's argument of the same name as that result (``out`` for an unnamed one)."""
    functional = OPS[entry.functional]
    parsed = torch._C.parse_schema(SCHEMAS[functional.name])
    outputs = tuple(r.name or "out" for r in parsed.returns)

    def write(*args):
        named = dict(zip(entry.argument_names, args))
        results = functional.reference(*(named[n] for n in functional.argument_names if n in named))
        results = results if isinstance(results, tuple) else (results,)
        for name, value in zip(outputs, results):
            _write(named[name], value)
    return write


def _implementation(entry: OpEntry) -> Callable:
    body = entry.reference or _write_functional(entry)
    scale_at = entry.reads_scale

    def implementation(*args):
        problem = entry.problem(args, memory=True)
        if problem is None and scale_at is not None:
            problem = input_scale_value_problem(args[scale_at])
        require(problem)
        return body(*args)
    implementation.__name__ = f"{entry.name}_python"
    return implementation


_lib = torch.library.Library(NAMESPACE, "DEF")
for _entry in _TABLE:
    _lib.define(SCHEMAS[_entry.name])
    if _entry.rules is not None:
        torch.library.register_fake(f"{NAMESPACE}::{_entry.name}", _fake(_entry), lib=_lib)

_library.load()
for _entry in _TABLE:
    if _entry.rules is None:
        continue
    _impl = _implementation(_entry)
    _lib.impl(_entry.name, _impl, "CPU")
    if not _library.has_kernel(_entry.name, "cuda"):  # no compiled library: the reference serves CUDA tensors too
        _lib.impl(_entry.name, _impl, "CUDA")

__all__ = ["NAMESPACE", "OpEntry", "OPS", "SCHEMAS", "FUSIONS"]
