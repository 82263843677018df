"""The options of a conversion, typed: what ``convert_transformer``'s keywords become.

Job: :class:`NVFP4Options` and :class:`FP8Options` (one frozen dataclass per format: its own settings, and
the format's facts: its layer type, which ``nn.Linear`` shapes it replaces, its input-scale tensor, how a
layer is made), :class:`ConversionOptions` (the format-independent settings and the format's options), and
:func:`format_options`, which turns a format name and the format-specific keywords of a call into the format's
options.

Rules:

- Each options type validates its own fields in ``__post_init__``; every error names the argument.
- A setting belongs to one format: it is a field of that format's options type and of no other, so a
  keyword that the chosen format does not have is refused by :func:`format_options` (a ValueError naming
  the keyword and whose setting it is), never cross-checked by hand.
- The rest of the conversion asks the format's options (``options.format.supports(layer)``,
  ``.quantize(...)``, ``.shape_rule``) and never compares format names.
- Only immutable values at module level (tuples, frozen dataclasses, functions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Optional, Tuple, Type, Union

import torch

from .. import FP8Linear, NVFP4Linear
from ..env import resolve_fast_math
from .._linear_common import check_bool
from ..gemm import check_gemm_backend
from ..linear_fp8 import FP8_ALIGNMENT, is_fp8_linear_shape
from ..validation import WIDTH_RULE, is_supported_width


#: The modes: the fused gates (declines fall back to the unfused chain, counted) or the unfused chain.
MODES = ("fused", "unfused")
#: The presets of ``linears`` (it may also be a list of module names): "fc1": the FFN input layers only;
#: "all": every block Linear the format supports; "modelopt": "all" less the layers ModelOpt's diffusion
#: recipes keep in BF16 (each ModelSpec's ``modelopt_bf16``: the modulation Linears and the FFN output).
LINEARS = ("fc1", "all", "modelopt")

#: The metadata key of a format setting: whose setting it is (for the error when another format is chosen).
_SETTING_OF = "setting_of"


def check_mode(mode: Any) -> str:
    """``mode``, or a ValueError naming it unless it is one of :data:`MODES`."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


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


@dataclass(frozen=True)
class NVFP4Options:
    """``format="nvfp4"``: :class:`~qwen_resnorm_fp4.NVFP4Linear` layers (E2M1 values, E4M3 block scales of
    16, a global scale per tensor).

    Args:
        fast_math: the NVFP4 quantizer's fast mode, for the weights now and the activations later (None: the
            environment, FLASHINFER_/TRTLLM_DISABLE_FP4_QUANT_FAST_MATH, at each call). TypeError unless a
            bool or None.
        gemm_backend: NVFP4Linear's GEMM backend, one of :data:`~qwen_resnorm_fp4.gemm.BACKENDS` ("auto":
            FlashInfer's FP4 GEMM on Blackwell where FlashInfer imports, the tensor-core path on other CUDA
            GPUs, the fp32 reference on CPU). TypeError / ValueError otherwise.
    """

    fast_math: Optional[bool] = field(default=None, metadata={_SETTING_OF: "the NVFP4 quantizer"})
    gemm_backend: str = field(default="auto", metadata={_SETTING_OF: "NVFP4Linear"})

    #: The format's name (``convert_transformer(format=...)``, ``conversion_info(model).format``).
    name: ClassVar[str] = "nvfp4"
    #: The layer a conversion puts in place of an ``nn.Linear``.
    layer_type: ClassVar[type] = NVFP4Linear
    #: The layer's tensor that holds its activations' scale (the value a load checks).
    input_scale_attr: ClassVar[str] = "input_global_scale"
    #: Which ``nn.Linear`` shapes the layer replaces, in words.
    shape_rule: ClassVar[str] = f"in_features {WIDTH_RULE}"

    def __post_init__(self) -> None:
        if self.fast_math is not None:
            resolve_fast_math(self.fast_math)  # the rule's one home: TypeError naming fast_math
        check_gemm_backend(self.gemm_backend)

    @staticmethod
    def supports(layer: torch.nn.Module) -> bool:
        """Whether an NVFP4Linear can replace ``layer``: in_features a multiple of 64, at most 16384."""
        return is_supported_width(layer.in_features)

    def quantize(self, linear: torch.nn.Linear, input_amax: float) -> NVFP4Linear:
        """The NVFP4Linear of ``linear`` with input global scale 448 * 6 / ``input_amax``."""
        return NVFP4Linear.from_linear(linear, input_amax, fast_math=self.fast_math, gemm_backend=self.gemm_backend)


@dataclass(frozen=True)
class FP8Options:
    """``format="fp8"``: :class:`~qwen_resnorm_fp4.FP8Linear` layers (E4M3 weights and activations, per-tensor
    scales as ModelOpt's FP8 recipe, torch._scaled_mm).

    Args:
        use_fast_accum: FP8Linear's torch._scaled_mm option (True, as SGLang and vLLM run FP8 GEMMs).
            TypeError unless a bool.
    """

    use_fast_accum: bool = field(default=True, metadata={_SETTING_OF: "FP8Linear (torch._scaled_mm)"})

    name: ClassVar[str] = "fp8"
    layer_type: ClassVar[type] = FP8Linear
    input_scale_attr: ClassVar[str] = "input_scale"
    shape_rule: ClassVar[str] = f"in_features and out_features multiples of {FP8_ALIGNMENT}"

    def __post_init__(self) -> None:
        check_bool("use_fast_accum", self.use_fast_accum)

    @staticmethod
    def supports(layer: torch.nn.Module) -> bool:
        """Whether an FP8Linear can replace ``layer``: in_features and out_features multiples of 16."""
        return is_fp8_linear_shape(layer.in_features, layer.out_features)

    def quantize(self, linear: torch.nn.Linear, input_amax: float) -> FP8Linear:
        """The FP8Linear of ``linear`` with input_scale ``input_amax`` / 448."""
        return FP8Linear.from_linear(linear, input_amax, use_fast_accum=self.use_fast_accum)


#: A format's options.
FormatOptions = Union[NVFP4Options, FP8Options]
#: The formats' options types, in the order of :data:`FORMATS`.
FORMAT_OPTIONS: Tuple[Type[Any], ...] = (NVFP4Options, FP8Options)
#: The quantized formats: NVFP4 (NVFP4Linear) or FP8 E4M3 (FP8Linear).
FORMATS = tuple(cls.name for cls in FORMAT_OPTIONS)
#: The layer types of a conversion (their names stay the same before and after it).
QUANTIZED_LINEARS = tuple(cls.layer_type for cls in FORMAT_OPTIONS)


def options_of_layer(layer: Any) -> Optional[Type[Any]]:
    """The options type of the format whose layer ``layer`` is (exactly), or None for any other module."""
    return next((cls for cls in FORMAT_OPTIONS if type(layer) is cls.layer_type), None)


def input_scale_attr(layer: Any) -> Optional[str]:
    """The name of a quantized layer's activation-scale tensor (its format's ``input_scale_attr``), None for
    any other module."""
    options = options_of_layer(layer)
    return None if options is None else options.input_scale_attr


def _is_default(value: Any, default: Any) -> bool:
    return value is default or (type(value) is type(default) and value == default)


def format_options(format: Any, keywords: Optional[Mapping] = None) -> FormatOptions:
    """The options of ``format``: a name of :data:`FORMATS` with the format-specific ``keywords`` of a call
    ({name: value} of ``fast_math``, ``gemm_backend``, ``use_fast_accum``; one at its default is not given),
    or an :class:`NVFP4Options` / :class:`FP8Options` as it is (then no keyword may be given).

    ValueError for an unknown format, for a keyword the format does not have (naming the keyword and whose
    setting it is) and for a keyword given beside an options object; the options type's own errors for
    its values. TypeError for a name that no format has."""
    keywords = dict(keywords or {})
    owners = {f.name: (cls, f) for cls in FORMAT_OPTIONS for f in fields(cls)}
    unknown = sorted(set(keywords) - set(owners))
    if unknown:
        raise TypeError(f"no format has a setting called {unknown[0]!r} (settings: {sorted(owners)})")
    given = {k: v for k, v in keywords.items() if not _is_default(v, owners[k][1].default)}
    if isinstance(format, FORMAT_OPTIONS):
        if given:
            name = next(iter(given))
            raise ValueError(f"format is given as {format!r}: set {name} there (or pass format="
                             f"{format.name!r} and {name}=...), not both")
        return format
    if not isinstance(format, str) or format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS} or an options object "
                         f"({', '.join(cls.__name__ for cls in FORMAT_OPTIONS)}), got {format!r}")
    chosen = FORMAT_OPTIONS[FORMATS.index(format)]
    for name, value in given.items():
        owner, f = owners[name]
        if owner is not chosen:
            raise ValueError(f"{name} is a setting of {f.metadata[_SETTING_OF]} (format={owner.name!r}); "
                             f"format={format!r} has none (leave it at {f.default!r}), got {value!r}")
    return chosen(**given)


@dataclass(frozen=True)
class ConversionOptions:
    """What a conversion does, apart from its inputs (the input amax or calibration inputs): the settings
    that ``convert_transformer``'s keywords give, checked once.

    Args:
        mode: "fused" or "unfused" (:data:`MODES`); ValueError otherwise.
        format: the format's options (:class:`NVFP4Options` or :class:`FP8Options`); TypeError otherwise
            (:meth:`from_keywords` takes a format name too).
        linears: a preset of :data:`LINEARS` or a non-empty list / tuple of module names (kept as a tuple);
            ValueError / TypeError otherwise.
        allow_cpu: let the fused path run on CPU tensors (the pure-PyTorch reference); TypeError unless a
            bool.
        keep_original: keep the BF16 layers so that a restore works; TypeError unless a bool.
    """

    mode: str = "fused"
    format: FormatOptions = field(default_factory=NVFP4Options)
    linears: Union[str, Tuple[str, ...]] = "fc1"
    allow_cpu: bool = False
    keep_original: bool = True

    def __post_init__(self) -> None:
        check_mode(self.mode)
        if not isinstance(self.format, FORMAT_OPTIONS):
            raise TypeError(f"format must be an options object ({', '.join(c.__name__ for c in FORMAT_OPTIONS)}), "
                            f"got {self.format!r}")
        object.__setattr__(self, "linears", check_linears(self.linears))
        check_bool("allow_cpu", self.allow_cpu)
        check_bool("keep_original", self.keep_original)

    @classmethod
    def from_keywords(cls, *, format: Any = "nvfp4", **keywords: Any) -> ConversionOptions:
        """The options of ``convert_transformer``'s keywords: this type's fields (``mode``, ``linears``,
        ``allow_cpu``, ``keep_original``) and the format's (:func:`format_options`: ``format`` a name or an
        options object, ``fast_math``, ``gemm_backend``, ``use_fast_accum``)."""
        own = {f.name for f in fields(cls)} - {"format"}
        return cls(format=format_options(format, {k: v for k, v in keywords.items() if k not in own}),
                   **{k: v for k, v in keywords.items() if k in own})
