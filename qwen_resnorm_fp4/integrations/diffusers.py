"""diffusers' DiT transformers with NVFP4 or FP8 layers and the fused residual/norm/modulation/quantize path.

:func:`convert_transformer` recognises the model; or call the model's own converter:

=================================  ==========================================  ===============================
model                              converter                                   segment (per block)
=================================  ==========================================  ===============================
``QwenImageTransformer2DModel``    :func:`convert_qwen_image_transformer`      image and text stream
``QwenImage21Transformer2DModel``  :func:`convert_qwen_image21_transformer`    one stream, SwiGLU (2 inputs)
``FluxTransformer2DModel``         :func:`convert_flux_transformer`            both streams of every double-
                                                                               stream block
``WanTransformer3DModel``          :func:`convert_wan_transformer`             the FFN after cross-attention
=================================  ==========================================  ===============================

Each converter, in every block of the model:

- replaces the FFN input layer(s) (``linears="fc1"``; with ``linears="all"`` every ``nn.Linear`` of the
  blocks whose in_features is a multiple of 64, as a ModelOpt NVFP4 deployment does) by an
  :class:`~qwen_resnorm_fp4.NVFP4Linear`, whose input global scale comes from a calibration pass (the
  caller's inputs; each converted layer's input amax is taken) or from amax values the caller gives
  (``format="fp8"``: an :class:`~qwen_resnorm_fp4.FP8Linear` instead, E4M3 with ModelOpt's per-tensor
  scales; ``linears="modelopt"`` or a list of names choose the layers);
- binds a new ``forward`` to the block: a copy of the library's block forward (of the supported versions,
  :data:`SUPPORTED_DIFFUSERS`) in which the segment ``residual + gate * x -> norm -> * (1 + scale) + shift ->
  FFN`` of each stream is one call: ``try_fused_resnorm_quant`` / ``try_fused_resnorm_quant_fp8``
  (``mode="fused"``) or the bf16 row op + the quantizer (``mode="unfused"``, the baseline, also the fallback when
  the fused path declines), then the FFN on the quantized activations with the same code in both modes
  (with FP8 layers, also GELU -> FC2 and Qwen-Image's norm1 -> q/k/v: :mod:`._segments`). Everything else is
  diffusers' own code.

Both modes compute the library's numerics contract (docs/numerics.md) for the segment; diffusers computes it
with torch's ops (separate roundings), so the converted model differs from the original BF16 model by that
and, mostly, by NVFP4. Between the two modes nothing differs: the outputs of ``mode="fused"`` and
``mode="unfused"`` are byte-identical (same device).

:func:`restore_transformer` undoes the conversion; :func:`set_mode` switches modes without re-quantizing;
:func:`conversion_info` reports what was done; :func:`fused_path_stats` how often the fused path ran or fell
back (and why).

The keywords of a conversion become one :class:`ConversionOptions` (mode, linears, allow_cpu, keep_original)
holding the format's options, :class:`NVFP4Options` (fast_math, gemm_backend) or :class:`FP8Options`
(use_fast_accum); ``format=`` takes a name or one of those objects. Each checks its own fields (errors name
the argument), and a setting of the other format is refused by type.

Inference only: the NVFP4 path has no autograd (run under ``torch.no_grad()`` / ``torch.inference_mode()``,
as diffusers' pipelines do). Activations must be bfloat16 (load the model with ``torch_dtype=torch.bfloat16``).
Convert before registering forward hooks on the blocks (group offloading, caching, context parallelism):
a block whose ``forward`` is already overridden is refused.
"""

from __future__ import annotations

import functools
import inspect
import re
import types
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from . import _calibration, _convert, _flux, _qwen_image, _qwen_image21, _selection, _wan
from ._options import FORMATS, LINEARS, MODES, ConversionOptions, FormatOptions, FP8Options, NVFP4Options
from ._options import format_options
from ._spec import ModelSpec, is_model
from ._state import MODEL_ATTR, DiTConversion, StreamStats

Tensor = torch.Tensor


#: The diffusers releases whose ``QwenImageTransformerBlock.forward`` the converted forward copies.
SUPPORTED_DIFFUSERS = ">=0.42.1,<0.43"
_SUPPORTED_MIN = (0, 42, 1)
_SUPPORTED_BELOW = (0, 43, 0)
#: The diffusers versions the conversion was tested with (tests/integrations/test_diffusers_integration.py).
TESTED_DIFFUSERS_VERSIONS = ("0.42.1",)

#: The model families, by diffusers class name (read-only).
SPECS: Mapping[str, ModelSpec] = types.MappingProxyType(
    {s.model_class: s for s in (_qwen_image.SPEC, _qwen_image21.SPEC, _flux.SPEC, _wan.SPEC)})


# ------------------------------------------------------------------------------------------------------------
# diffusers: version, and a flashinfer that does not import
# ------------------------------------------------------------------------------------------------------------


def _parse_version(v: str) -> Optional[Tuple[int, int, int]]:
    m = re.match(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?", str(v))
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def diffusers_version() -> Optional[str]:
    """The installed diffusers version, or None when it is not installed (read from the package metadata,
    without importing diffusers)."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - Python >= 3.8 has it
        return None
    try:
        return version("diffusers")
    except PackageNotFoundError:
        return None


def check_diffusers_version(version: Optional[str] = None, *, allow_untested_version: bool = False) -> str:
    """Raise ValueError unless ``version`` (default: the installed diffusers) is in :data:`SUPPORTED_DIFFUSERS`.

    ``allow_untested_version=True`` turns the error into a warning (the converted forward copies diffusers'
    block forward of the supported releases; another release may compute something else)."""
    if version is None:
        version = diffusers_version()
        if version is None:
            raise ImportError('diffusers is not installed: pip install "qwen_resnorm_fp4[diffusers]"')
    parsed = _parse_version(version)
    ok = parsed is not None and _SUPPORTED_MIN <= parsed < _SUPPORTED_BELOW
    if not ok:
        msg = (f"diffusers {version} is not supported by the diffusers integration: supported "
               f"diffusers{SUPPORTED_DIFFUSERS} (tested: {', '.join(TESTED_DIFFUSERS_VERSIONS)}). The converted block "
               "forward is a copy of diffusers' block forwards of those releases; pass allow_untested_version=True "
               "to convert anyway (then compare the converted model's output with the original's before relying on "
               "it)")
        if not allow_untested_version:
            raise ValueError(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return version


# ------------------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------------------


def _spec_of(model: Any, expected: Optional[str] = None) -> ModelSpec:
    for spec in SPECS.values():
        if is_model(model, spec) and (expected is None or spec.model_class == expected):
            return spec
    wanted = expected or " / ".join(SPECS)
    raise TypeError(f"model must be a diffusers {wanted}, got {type(model).__name__}")


def _convert_checked(model: torch.nn.Module, expected: Optional[str], *, input_amax: Any, calibration_inputs: Any,
                     allow_untested_version: bool, **options: Any) -> torch.nn.Module:
    """The one implementation of every converter: the options (``options``: convert_transformer's other
    keywords) checked once, then the diffusers version, then the conversion."""
    conversion = ConversionOptions.from_keywords(**options)
    version = check_diffusers_version(allow_untested_version=allow_untested_version)
    return _convert.convert(model, _spec_of(model, expected), conversion, input_amax=input_amax,
                            calibration_inputs=calibration_inputs, version=version)


def convert_transformer(
    model: torch.nn.Module,
    *,
    mode: str = ConversionOptions.mode,
    format: Union[str, FormatOptions] = "nvfp4",
    linears: Union[str, Sequence[str]] = ConversionOptions.linears,
    input_amax: Union[None, float, Tensor, Mapping] = None,
    calibration_inputs: Any = None,
    fast_math: Optional[bool] = NVFP4Options.fast_math,
    allow_cpu: bool = ConversionOptions.allow_cpu,
    keep_original: bool = ConversionOptions.keep_original,
    gemm_backend: str = NVFP4Options.gemm_backend,
    use_fast_accum: bool = FP8Options.use_fast_accum,
    allow_untested_version: bool = False,
) -> torch.nn.Module:
    """Convert a diffusers ``QwenImageTransformer2DModel``, ``QwenImage21Transformer2DModel``,
    ``FluxTransformer2DModel`` or ``WanTransformer3DModel`` in place: NVFP4 or FP8 layers and the fused (or
    unfused) residual + norm + modulation + quantization segment in every block. Returns the model.

    The keywords other than ``input_amax``, ``calibration_inputs`` and ``allow_untested_version`` become one
    :class:`ConversionOptions` (checked once, before any work; each error names the argument): ``mode``,
    ``linears``, ``allow_cpu``, ``keep_original`` and the format's options, :class:`NVFP4Options`
    (``fast_math``, ``gemm_backend``) or :class:`FP8Options` (``use_fast_accum``).

    Args:
        model: the transformer (bfloat16; on the device it will run on: the weights are quantized there).
        mode: "fused" (``try_fused_resnorm_quant`` / ``try_fused_resnorm_quant_fp8``; where it declines, the
            unfused chain runs and the decline is counted, see :func:`fused_path_stats`) or "unfused"
            (the bf16 row op, then the FFN input layer's own quantizer: the byte-identical baseline).
        format: "nvfp4" (:class:`~qwen_resnorm_fp4.NVFP4Linear`; FP4 tensor cores on Blackwell) or "fp8"
            (:class:`~qwen_resnorm_fp4.FP8Linear`: E4M3 weights and activations, per-tensor scales as
            ModelOpt's FP8 recipe, torch._scaled_mm; Hopper and Blackwell); or the format's options object,
            e.g. ``format=FP8Options(use_fast_accum=False)`` (then its settings are not passed as keywords).
            With "fp8" the fused segment writes FC1's E4M3 input directly (the fused FP8 row op), GELU writes
            FC2's (GELU + FP8 in one op) where FC2 is FP8, Qwen-Image's norm1 writes the one input of FP8
            q/k/v with one input scale (the no-residual FP8 op), and every other FP8 layer quantizes its
            BF16 input itself (``FP8Linear.quantize_input``: the attention output into to_out).
        linears: which block Linears are quantized (the rest stay BF16):
            "fc1": the FFN input layers (FC1; both SwiGLU inputs in Qwen-Image 2.1);
            "all": every ``nn.Linear`` of the blocks the format supports (NVFP4: in_features a multiple of 64;
            FP8: in_features and out_features multiples of 16): attention q/k/v/out, the added (text)
            projections, FC1, FC2, the modulation layers; FLUX.1's single-stream blocks too;
            "modelopt": "all" less what ModelOpt's diffusion FP8 deployments keep in BF16: the blocks'
            modulation Linears and the FFN's output Linear (FC2) (Qwen-Image: img_mod / txt_mod and
            img_mlp / txt_mlp.net.2, as SGLang's Qwen-Image FP8 checkpoint; outside the blocks nothing is
            converted anyway: img_in, txt_in, the timestep embedder, norm_out, proj_out stay BF16);
            or a list of module names (full, as :func:`linear_names` gives them, or block-relative such as
            ``"attn.to_q"`` for that layer in every block), which must include every FFN input layer.
        input_amax: the max |input| each converted layer's input scale is made from (NVFP4: global scale
            448 * 6 / amax; FP8: input_scale = amax / 448): one number for all, or a dict {module name: amax}
            covering every converted layer (:func:`linear_names`). Layers that read one activation (SwiGLU's
            proj and gate_layer) need one value.
        calibration_inputs: instead of ``input_amax``: a dict of ``model.forward`` keyword arguments, a list of
            them, or a callable that runs the model (e.g. a pipeline call); the unconverted model runs them
            under ``torch.no_grad()`` and each converted layer's input amax is taken
            (:func:`calibrate_input_amax`).
        fast_math: NVFP4 only (:class:`NVFP4Options`): the NVFP4 quantizer's fast mode, for the weights now
            and the activations later (None: the environment, FLASHINFER_/TRTLLM_DISABLE_FP4_QUANT_FAST_MATH,
            at each call). Both modes use it.
        allow_cpu: let the fused path run on CPU tensors (the pure-PyTorch reference); otherwise the fused path
            declines on CPU ("cpu_tensors") and the unfused chain runs.
        keep_original: keep the BF16 layers (outside the module tree) so that :func:`restore_transformer` can
            put them back; False frees them (restore then refuses).
        gemm_backend: NVFP4 only (:class:`NVFP4Options`): :class:`~qwen_resnorm_fp4.NVFP4Linear`'s GEMM
            backend ("auto": FlashInfer's FP4 GEMM on Blackwell where FlashInfer imports, the tensor-core path
            on other CUDA GPUs, the fp32 reference on CPU; see
            :func:`~qwen_resnorm_fp4.apply_nvfp4_gemm_prequantized`).
        use_fast_accum: FP8 only (:class:`FP8Options`): :class:`~qwen_resnorm_fp4.FP8Linear`'s torch._scaled_mm
            option (True, as SGLang and vLLM run FP8 GEMMs).
        allow_untested_version: convert even when the installed diffusers is outside :data:`SUPPORTED_DIFFUSERS`
            (a warning instead of the ValueError).

    A setting of the other format at other than its default (``fast_math`` or ``gemm_backend`` with
    format="fp8", ``use_fast_accum=False`` with format="nvfp4") is a ValueError naming the argument, as is a
    format setting passed beside a ``format=`` options object.
    """
    keywords = dict(locals())  # the parameters: nothing else is defined yet
    return _convert_checked(keywords.pop("model"), None, **keywords)


def _model_converter(name: str, model_class: str, label: str) -> Callable[..., torch.nn.Module]:
    """The converter of one model class: :func:`convert_transformer`'s signature (the keywords bound to it:
    an unknown keyword is a TypeError, defaults as there), and a TypeError for any other model."""
    signature = inspect.signature(convert_transformer)

    @functools.wraps(convert_transformer)
    def converter(model: torch.nn.Module, **keywords: Any) -> torch.nn.Module:
        arguments = signature.bind(model, **keywords)
        arguments.apply_defaults()
        return _convert_checked(model, model_class, **{k: v for k, v in arguments.arguments.items() if k != "model"})

    converter.__name__ = converter.__qualname__ = name
    converter.__doc__ = (f":func:`convert_transformer` for a diffusers ``{model_class}`` ({label}) only: the same "
                         "arguments; any other model is a TypeError.")
    return converter


convert_qwen_image_transformer = _model_converter("convert_qwen_image_transformer", "QwenImageTransformer2DModel",
                                                  "Qwen-Image, Qwen-Image-Edit")
convert_qwen_image21_transformer = _model_converter("convert_qwen_image21_transformer",
                                                    "QwenImage21Transformer2DModel", "Qwen-Image 2.1")
convert_flux_transformer = _model_converter("convert_flux_transformer", "FluxTransformer2DModel", "FLUX.1")
convert_wan_transformer = _model_converter("convert_wan_transformer", "WanTransformer3DModel", "Wan 2.1, Wan 2.2")


def restore_transformer(model: torch.nn.Module) -> torch.nn.Module:
    """Undo a conversion: the original ``nn.Linear`` layers and diffusers' block ``forward`` come back (the same
    objects, so outputs are exactly the original model's). Returns the model."""
    return _convert.restore(model)


def set_mode(model: torch.nn.Module, mode: str) -> None:
    """Switch a converted model between "fused" and "unfused" (same quantized weights, nothing re-quantized)."""
    _convert.set_mode(model, mode)


def conversion_info(model: torch.nn.Module) -> Optional[DiTConversion]:
    """What the conversion did to ``model``, or None when it is not converted."""
    return getattr(model, MODEL_ATTR, None)


def fused_path_stats(model: torch.nn.Module, *, per_block: bool = False, reset: bool = False) -> Dict[str, Any]:
    """How the converted blocks' streams ran since the conversion (or the last reset): {"fused": n, "unfused":
    n, "fallback": n, "decline_reasons": {reason: n}} summed over blocks and streams, plus "blocks": {name:
    {segment: StreamStats}} with ``per_block=True`` (segments "img", and "txt" for the two-stream models: the
    norm2 + FFN segment; with ``format="fp8"`` also "img.gelu" / "txt.gelu" where GELU feeds an FP8 Linear,
    and "img.attn" / "txt.attn" where norm1 feeds FP8 q/k/v projections with one input scale, Qwen-Image);
    "compiled": {segment: [paths]}, the paths the segments take in the graphs torch.compile traced.
    ``conversion_info(model).segments_per_forward`` is how many one forward runs. ``reset=True`` zeroes the
    counters (after reading them)."""
    return _convert.fused_path_stats(model, per_block=per_block, reset=reset)


def linear_names(model: torch.nn.Module, linears: Union[str, Sequence[str]] = "fc1",
                 format: Union[str, FormatOptions] = "nvfp4") -> List[str]:
    """The module names of the layers a conversion with ``linears`` and ``format`` (a name or an options
    object) quantizes, e.g. ``transformer_blocks.0.img_mlp.net.0.proj`` (the keys of an ``input_amax`` dict)."""
    return _selection.linear_names(model, _spec_of(model), linears, format_options(format))


def calibrate_input_amax(model: torch.nn.Module, calibration_inputs: Any,
                         linears: Union[str, Sequence[str]] = "fc1",
                         format: Union[str, FormatOptions] = "nvfp4") -> Dict[str, float]:
    """Run ``calibration_inputs`` through the (unconverted) model and return, for every layer a conversion with
    ``linears`` and ``format`` (a name or an options object) quantizes, the max |input| seen: {module name:
    amax}.

    ``calibration_inputs``: a dict of ``model.forward`` keyword arguments, a list of such dicts, or a callable
    that takes the model and runs it (e.g. a whole pipeline call). Runs under ``torch.no_grad()``."""
    return _calibration.calibrate_input_amax(model, _spec_of(model), calibration_inputs, linears,
                                             format_options(format))


__all__ = ["convert_transformer", "convert_qwen_image_transformer", "convert_qwen_image21_transformer",
           "convert_flux_transformer", "convert_wan_transformer", "restore_transformer", "set_mode",
           "conversion_info", "fused_path_stats", "linear_names", "calibrate_input_amax",
           "check_diffusers_version", "diffusers_version", "DiTConversion", "ConversionOptions", "NVFP4Options",
           "FP8Options", "StreamStats", "SPECS", "SUPPORTED_DIFFUSERS", "TESTED_DIFFUSERS_VERSIONS", "MODES",
           "LINEARS", "FORMATS"]
