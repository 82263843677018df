"""diffusers' Qwen-Image transformer with NVFP4 FC1 layers and the fused residual/norm/modulation/quantize path.

:func:`convert_qwen_image_transformer` takes a ``diffusers.QwenImageTransformer2DModel`` and, in every
``QwenImageTransformerBlock``:

- replaces the image and the text FC1 (``img_mlp.net[0].proj`` and ``txt_mlp.net[0].proj``, the first Linear
  of each FeedForward) by an :class:`~qwen_resnorm_fp4.linear.NVFP4Linear`, whose input global scale comes from
  a calibration pass (the caller's inputs; the FC1 inputs are hooked and their amax taken) or from amax values
  the caller gives;
- binds a new ``forward`` to the block: a copy of diffusers' ``QwenImageTransformerBlock.forward`` (of the
  supported versions, :data:`SUPPORTED_DIFFUSERS`) in which one segment per stream changes. diffusers does::

      hidden_states = hidden_states + img_gate1 * img_attn_output        # gated residual update
      img_normed2 = self.img_norm2(hidden_states)                        # LayerNorm
      img_modulated2, img_gate2 = self._modulate(img_normed2, img_mod2, modulate_index)
      img_mlp_output = self.img_mlp(img_modulated2)                      # FC1, GELU(tanh), FC2
      hidden_states = hidden_states + img_gate2 * img_mlp_output

  and the converted block does the first three lines and FC1's activation quantization in one call, either
  ``try_fused_resnorm_quant`` (``mode="fused"``) or ``resnorm`` + the quantizer (``mode="unfused"``, the
  baseline, also the fallback when the fused path declines), then FC1 as the NVFP4 GEMM on the packed
  activations, and then, with the same code in both modes, the activation, dropout, FC2 and the post-MLP
  gated residual update exactly as diffusers writes them. The text stream likewise (without
  ``modulate_index``). Everything else in the block and the model (attention, norm1, the modulation
  Linears, FC2, the output layers) is diffusers' own code, untouched.

Both modes compute the library's numerics contract (docs/numerics.md) for the residual update, norm2 and the
modulation; diffusers computes them with torch's bf16 ops (separate roundings), so the converted model differs
from the original BF16 model by that and, mostly, by the NVFP4 FC1. Between the two modes nothing differs: the
fused kernel writes the same residual, packed activations and block scales as ``resnorm`` followed by the
quantizer, and every other operation is the same code, so the outputs of ``mode="fused"`` and
``mode="unfused"`` are byte-identical (same device).

:func:`restore_qwen_image_transformer` undoes the conversion (the original ``nn.Linear`` FC1 layers and
diffusers' ``forward``). :func:`set_qwen_image_mode` switches a converted model between the modes without
re-quantizing; :func:`conversion_info` reports the mode, the calibrated amax values and how often the fused
path ran or fell back (and why).

Inference only: the NVFP4 path has no autograd (run under ``torch.no_grad()`` / ``torch.inference_mode()``,
as diffusers' pipelines do). Activations must be bfloat16 (load the model with ``torch_dtype=torch.bfloat16``).
Convert before registering forward hooks on the blocks (group offloading, caching, context parallelism):
a block whose ``forward`` is already overridden is refused.
"""

from __future__ import annotations

import collections
import importlib.util
import logging
import math
import re
import sys
import types
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import torch

from .. import _library, reference
from ..api import resnorm
from ..env import resolve_fast_math
from ..fused_path import last_decline_reason, try_fused_resnorm_quant
from ..linear import NVFP4Linear

Tensor = torch.Tensor

logger = logging.getLogger("qwen_resnorm_fp4")

#: The diffusers releases whose ``QwenImageTransformerBlock.forward`` the converted forward copies.
SUPPORTED_DIFFUSERS = ">=0.42.1,<0.43"
_SUPPORTED_MIN = (0, 42, 1)
_SUPPORTED_BELOW = (0, 43, 0)
#: The diffusers versions the conversion was tested with (tests/test_diffusers_integration.py).
TESTED_DIFFUSERS_VERSIONS = ("0.42.1",)

MODES = ("fused", "unfused")
#: The block attribute that holds the conversion state.
_STATE_ATTR = "_qwen_fp4"
#: The model attribute that holds the model-level conversion record.
_MODEL_ATTR = "_qwen_fp4_conversion"
#: FC1 of each stream: block.<mlp>.net[0].proj.
_STREAMS = (("img", "img_mlp", "img_norm2"), ("txt", "txt_mlp", "txt_norm2"))


# ------------------------------------------------------------------------------------------------------------
# diffusers: version and a broken flashinfer
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
            raise ImportError('diffusers is not installed: pip install "qwen-resnorm-fp4[diffusers]"')
    parsed = _parse_version(version)
    ok = parsed is not None and _SUPPORTED_MIN <= parsed < _SUPPORTED_BELOW
    if not ok:
        msg = (f"diffusers {version} is not supported by the Qwen-Image integration: supported diffusers{SUPPORTED_DIFFUSERS} "
               f"(tested: {', '.join(TESTED_DIFFUSERS_VERSIONS)}). The converted block forward is a copy of diffusers' "
               "QwenImageTransformerBlock.forward of those releases; pass allow_untested_version=True to convert anyway "
               "(then compare the converted model's output with the original's before relying on it)")
        if not allow_untested_version:
            raise ValueError(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return version


def _work_around_broken_flashinfer() -> bool:
    """diffusers imports ``flashinfer`` when the package is installed (its BFL quantizer, imported with every
    model). Installed without its dependencies (headers only, as this project's build installs it),
    ``import flashinfer`` fails and so would every diffusers model import. In that case only, and only before
    diffusers' quantizers are imported, tell diffusers that flashinfer is unavailable. Returns True when it
    did so. (This library's own FlashInfer GEMM path checks its import separately.)"""
    if importlib.util.find_spec("diffusers") is None or importlib.util.find_spec("flashinfer") is None:
        return False
    if "diffusers.quantizers.bfl.utils" in sys.modules or "flashinfer" in sys.modules:
        return False
    try:
        import flashinfer  # noqa: F401
        return False
    except Exception as e:  # noqa: BLE001 - any import failure means diffusers would fail the same way
        err = e
    try:
        import diffusers.utils.import_utils as iu
    except Exception:  # noqa: BLE001 - diffusers itself broken: nothing to work around
        return False
    if getattr(iu, "_flashinfer_available", False):
        iu._flashinfer_available = False
        logger.warning("flashinfer is installed but does not import (%s: %s); told diffusers it is unavailable so "
                       "that its models import", type(err).__name__, err)
        return True
    return False


_work_around_broken_flashinfer()


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


class _BlockState:
    """Per block: the mode, the original FC1 layers (for restore) and the statistics. A plain object, not a
    module: the original layers are kept out of ``state_dict`` and ``.to()``."""

    def __init__(self, name: str, mode: str, allow_cpu: bool, originals: Dict[str, Optional[torch.nn.Linear]]):
        self.name = name
        self.mode = mode
        self.allow_cpu = allow_cpu
        self.originals = originals
        self.stats = {"img": StreamStats(), "txt": StreamStats()}
        self.forward = None  # the bound method installed on the block


@dataclass
class QwenImageConversion:
    """What :func:`convert_qwen_image_transformer` did (``conversion_info(model)``).

    mode: "fused" or "unfused"; fast_math: as passed (None: the environment at each call); allow_cpu;
    input_amax: FC1 module name -> the amax its input global scale was made from (448 * 6 / amax);
    diffusers_version; block_names: the converted blocks' module names; kept_original: whether restore works.
    """

    mode: str
    fast_math: Optional[bool]
    allow_cpu: bool
    input_amax: Dict[str, float]
    diffusers_version: str
    block_names: List[str]
    kept_original: bool


# ------------------------------------------------------------------------------------------------------------
# Finding the blocks
# ------------------------------------------------------------------------------------------------------------


def _is_qwen_image_model(model: Any) -> bool:
    return any(c.__name__ == "QwenImageTransformer2DModel" and c.__module__.startswith("diffusers.")
               for c in type(model).__mro__)


def _is_qwen_image_block(module: Any) -> bool:
    return any(c.__name__ == "QwenImageTransformerBlock" and c.__module__.startswith("diffusers.")
               for c in type(module).__mro__)


def _blocks(model: torch.nn.Module) -> List[Tuple[str, torch.nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if _is_qwen_image_block(m)]


def _fc1_parent(block: torch.nn.Module, mlp_attr: str) -> torch.nn.Module:
    """The activation module (diffusers' GELU) that owns FC1 as ``.proj``."""
    return getattr(block, mlp_attr).net[0]


def fc1_names(model: torch.nn.Module) -> List[str]:
    """The module names of every block's image and text FC1, e.g.
    ``transformer_blocks.0.img_mlp.net.0.proj`` (the keys of an ``input_amax`` dict)."""
    return [f"{name}.{mlp}.net.0.proj" for name, _ in _blocks(model) for _, mlp, _ in _STREAMS]


def _check_block_structure(name: str, block: torch.nn.Module) -> None:
    """The block must look like the supported releases' QwenImageTransformerBlock."""
    problems = []
    for attr in ("img_mod", "txt_mod", "img_norm1", "txt_norm1", "attn", "img_norm2", "txt_norm2", "img_mlp",
                 "txt_mlp", "_modulate", "zero_cond_t"):
        if not hasattr(block, attr):
            problems.append(f"no attribute {attr!r}")
    if not problems:
        for _, mlp_attr, norm_attr in _STREAMS:
            norm = getattr(block, norm_attr)
            if not isinstance(norm, torch.nn.LayerNorm) or len(norm.normalized_shape) != 1:
                problems.append(f"{norm_attr} is a {type(norm).__name__}, not a LayerNorm over the last dimension")
            net = getattr(getattr(block, mlp_attr), "net", None)
            if net is None or len(net) < 3:
                problems.append(f"{mlp_attr} is not a diffusers FeedForward (act, dropout, Linear)")
                continue
            act = net[0]
            if not (hasattr(act, "proj") and callable(getattr(act, "gelu", None))):
                problems.append(f"{mlp_attr}.net[0] is a {type(act).__name__}, not diffusers' GELU (proj + gelu)")
            elif not isinstance(act.proj, (torch.nn.Linear, NVFP4Linear)):
                problems.append(f"{mlp_attr}.net[0].proj is a {type(act.proj).__name__}, not a Linear")
    if problems:
        raise ValueError(f"{name} does not have the structure of the supported QwenImageTransformerBlock "
                         f"(diffusers{SUPPORTED_DIFFUSERS}): " + "; ".join(problems))


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


def calibrate_fc1_input_amax(model: torch.nn.Module, calibration_inputs: Any) -> Dict[str, float]:
    """Run ``calibration_inputs`` through the (unconverted) model and return, for every FC1, the max |input|
    seen: {FC1 module name: amax}.

    ``calibration_inputs``: a dict of ``model.forward`` keyword arguments, a list of such dicts, or a callable
    that takes the model and runs it (e.g. a whole pipeline call). Runs under ``torch.no_grad()``."""
    if not _is_qwen_image_model(model):
        raise TypeError(f"model must be a diffusers QwenImageTransformer2DModel, got {type(model).__name__}")
    if hasattr(model, _MODEL_ATTR):
        raise ValueError("the model is converted: calibrate the original model (restore_qwen_image_transformer first)")
    names = fc1_names(model)
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
        raise ValueError(f"calibration never reached {len(missing)} FC1 layer(s), e.g. {missing[0]}")
    return {n: float(a.item()) for n, a in amax.items()}


def _resolve_input_amax(model: torch.nn.Module, input_amax: Any, calibration_inputs: Any) -> Dict[str, float]:
    names = fc1_names(model)
    if input_amax is not None and calibration_inputs is not None:
        raise ValueError("pass either input_amax or calibration_inputs, not both")
    if input_amax is None:
        if calibration_inputs is None:
            raise ValueError("the FC1 input global scales need either calibration_inputs (inputs to run through the "
                             "model; the FC1 inputs' amax is taken) or input_amax (a float for every FC1, or a dict "
                             "{FC1 module name: amax}, see fc1_names(model))")
        values = calibrate_fc1_input_amax(model, calibration_inputs)
    elif isinstance(input_amax, Mapping):
        unknown = sorted(set(input_amax) - set(names))
        if unknown:
            raise ValueError(f"input_amax has keys that are not FC1 layers of this model: {unknown[:3]} "
                             f"(expected names like {names[0]!r}; see fc1_names(model))")
        missing = [n for n in names if n not in input_amax]
        if missing:
            raise ValueError(f"input_amax has no value for {len(missing)} FC1 layer(s), e.g. {missing[0]!r}")
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
            raise ValueError(f"input_amax for {n} must be finite and positive, got {v} (an FC1 whose calibration "
                             "inputs were all zero: calibrate with real inputs or pass input_amax)")
        out[n] = v
    return out


# ------------------------------------------------------------------------------------------------------------
# The converted block forward
# ------------------------------------------------------------------------------------------------------------


def _gate_rows(gate: Tensor, index: Optional[Tensor]) -> Tensor:
    """The ``gate_result`` of diffusers' ``QwenImageTransformerBlock._modulate`` (same operations)."""
    if index is not None:
        actual_batch = gate.size(0) // 2
        gate_0, gate_1 = gate[:actual_batch], gate[actual_batch:]
        index_expanded = index.unsqueeze(-1)
        return torch.where(index_expanded == 0, gate_0.unsqueeze(1), gate_1.unsqueeze(1))
    return gate.unsqueeze(1)


def _unfused(residual: Tensor, x: Tensor, gate: Tensor, scale: Tensor, shift: Tensor, norm: torch.nn.LayerNorm,
             fc1: NVFP4Linear, index: Optional[Tensor]) -> Tuple[Tuple[Tensor, Tensor], Tensor]:
    """The baseline: ``resnorm`` (residual update, LayerNorm, modulation -> BF16 y), then the quantizer with
    FC1's input global scale and fast-math mode (what ``NVFP4Linear`` does to a BF16 input)."""
    kw = dict(weight=norm.weight, norm_bias=norm.bias, modulate_index=index)
    if _library.has_kernel("resnorm", x.device.type):
        y, residual_out = resnorm(residual, x, None, gate, scale, shift, float(norm.eps), **kw)
    else:  # e.g. CUDA tensors in a source tree without the compiled library
        y, residual_out = reference.resnorm(residual, x, None, gate, scale, shift, float(norm.eps), **kw)
    packed, scales = fc1.quantize_input(y)  # NVFP4Linear's own quantization of a BF16 input
    return (packed, scales), residual_out


_logged_fallbacks: set = set()


def _mlp_half(state: _BlockState, stream: str, norm: torch.nn.LayerNorm, mlp: torch.nn.Module,
              hidden_states: Tensor, attn_output: Tensor, mod1: Tensor, mod2: Tensor,
              index: Optional[Tensor]) -> Tensor:
    """One stream from the attention output to the end of the block:

    diffusers::

        hidden_states = hidden_states + gate1 * attn_output
        normed2 = norm2(hidden_states)
        modulated2, gate2 = self._modulate(normed2, mod2, index)
        mlp_output = mlp(modulated2)
        hidden_states = hidden_states + gate2 * mlp_output

    here: (packed, scales), hidden_states = fused or unfused(hidden_states, attn_output, gate1, scale2, shift2),
    then FC1 on (packed, scales) and the rest of the FeedForward and the update as diffusers does them.
    """
    if hidden_states.dtype != torch.bfloat16 or attn_output.dtype != torch.bfloat16:
        raise TypeError(f"the converted Qwen-Image block needs bfloat16 activations, got {hidden_states.dtype} "
                        "(load the model with torch_dtype=torch.bfloat16)")
    _shift1, _scale1, gate1 = mod1.chunk(3, dim=-1)
    shift2, scale2, gate2 = mod2.chunk(3, dim=-1)
    if index is not None and not isinstance(index, torch.Tensor):
        index = torch.as_tensor(index, device=hidden_states.device)
    act = mlp.net[0]
    fc1 = act.proj
    stats = state.stats[stream]

    result = None
    if state.mode == "fused":
        result = try_fused_resnorm_quant(hidden_states, attn_output, gate1, scale2, shift2, fc1, norm=norm,
                                         modulate_index=index, allow_cpu=state.allow_cpu)
        if result is None:
            reason = str(last_decline_reason())
            stats.fallback += 1
            stats.decline_reasons[reason] += 1
            if reason not in _logged_fallbacks and not torch.compiler.is_compiling():
                _logged_fallbacks.add(reason)
                logger.info("Qwen-Image block %s (%s stream): the fused path declined (%s); running the unfused "
                            "chain (same bytes). See fused_path_stats(model).", state.name, stream, reason)
        else:
            stats.fused += 1
    else:
        stats.unfused += 1
    if result is not None:
        (packed, scales), residual_out, _ = result
    else:
        (packed, scales), residual_out = _unfused(hidden_states, attn_output, gate1, scale2, shift2, norm, fc1, index)

    # Shared by both modes from here on: FC1 (NVFP4 GEMM on the packed activations), then diffusers'
    # FeedForward after its first Linear (GELU.gelu, dropout, FC2, ...) and the gated residual update.
    mlp_hidden = fc1((packed, scales), out_shape=attn_output.shape[:-1])
    mlp_hidden = act.gelu(mlp_hidden)
    for module in mlp.net[1:]:
        mlp_hidden = module(mlp_hidden)
    gate2_rows = _gate_rows(gate2, index)
    return residual_out + gate2_rows * mlp_hidden


def _converted_block_forward(
    self,
    hidden_states: Tensor,
    encoder_hidden_states: Tensor,
    encoder_hidden_states_mask: Tensor,
    temb: Tensor,
    image_rotary_emb: Optional[Tuple[Tensor, Tensor]] = None,
    joint_attention_kwargs: Optional[Dict[str, Any]] = None,
    modulate_index: Optional[List[int]] = None,
) -> Tuple[Tensor, Tensor]:
    """diffusers' QwenImageTransformerBlock.forward (diffusers>=0.42.1,<0.43), with the norm2 + FC1 segment of
    each stream replaced by :func:`_mlp_half`. Lines outside that segment are diffusers' own."""
    state: _BlockState = getattr(self, _STATE_ATTR)

    # Get modulation parameters for both streams
    img_mod_params = self.img_mod(temb)  # [B, 6*dim]

    if self.zero_cond_t:
        temb = torch.chunk(temb, 2, dim=0)[0]
    txt_mod_params = self.txt_mod(temb)  # [B, 6*dim]

    # Split modulation parameters for norm1 and norm2
    img_mod1, img_mod2 = img_mod_params.chunk(2, dim=-1)  # Each [B, 3*dim]
    txt_mod1, txt_mod2 = txt_mod_params.chunk(2, dim=-1)  # Each [B, 3*dim]

    # Process image stream - norm1 + modulation
    img_normed = self.img_norm1(hidden_states)
    img_modulated, img_gate1 = self._modulate(img_normed, img_mod1, modulate_index)

    # Process text stream - norm1 + modulation
    txt_normed = self.txt_norm1(encoder_hidden_states)
    txt_modulated, txt_gate1 = self._modulate(txt_normed, txt_mod1)

    joint_attention_kwargs = joint_attention_kwargs or {}
    attn_output = self.attn(
        hidden_states=img_modulated,  # Image stream (will be processed as "sample")
        encoder_hidden_states=txt_modulated,  # Text stream (will be processed as "context")
        encoder_hidden_states_mask=encoder_hidden_states_mask,
        image_rotary_emb=image_rotary_emb,
        **joint_attention_kwargs,
    )

    # QwenAttnProcessor2_0 returns (img_output, txt_output) when encoder_hidden_states is provided
    img_attn_output, txt_attn_output = attn_output

    # --- changed: attention gate + residual, norm2 + modulation, FC1 (NVFP4), GELU, FC2, gate + residual ---
    # (img_gate1 / txt_gate1 from _modulate are what diffusers multiplies here; the fused path takes the gate
    # chunk of img_mod1 / txt_mod1 with modulate_index instead, the same rows.)
    del img_gate1, txt_gate1
    hidden_states = _mlp_half(state, "img", self.img_norm2, self.img_mlp, hidden_states, img_attn_output,
                              img_mod1, img_mod2, modulate_index)
    encoder_hidden_states = _mlp_half(state, "txt", self.txt_norm2, self.txt_mlp, encoder_hidden_states,
                                      txt_attn_output, txt_mod1, txt_mod2, None)
    # --- end of the changed segment ---

    # Clip to prevent overflow for fp16
    if encoder_hidden_states.dtype == torch.float16:
        encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
    if hidden_states.dtype == torch.float16:
        hidden_states = hidden_states.clip(-65504, 65504)

    return encoder_hidden_states, hidden_states


# ------------------------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------------------------


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def convert_qwen_image_transformer(
    model: torch.nn.Module,
    *,
    mode: str = "fused",
    input_amax: Union[None, float, Tensor, Mapping] = None,
    calibration_inputs: Any = None,
    fast_math: Optional[bool] = None,
    allow_cpu: bool = False,
    keep_original: bool = True,
    gemm_backend: str = "auto",
    allow_untested_version: bool = False,
) -> torch.nn.Module:
    """Convert a diffusers ``QwenImageTransformer2DModel`` in place: NVFP4 FC1 layers and the fused (or
    unfused) residual + norm2 + modulation + quantization path in every block. Returns the model.

    Args:
        model: a ``diffusers.QwenImageTransformer2DModel`` (bfloat16; on the device it will run on: the FC1
            weights are quantized there).
        mode: "fused" (``try_fused_resnorm_quant``; where it declines, the unfused chain runs and the decline is
            counted, see :func:`fused_path_stats`) or "unfused" (``resnorm`` + ``nvfp4_quantize``, the
            byte-identical baseline).
        input_amax: the max |FC1 input| each FC1's input global scale is made from (448 * 6 / amax): one number
            for all, or a dict {FC1 module name: amax} covering every FC1 (:func:`fc1_names`).
        calibration_inputs: instead of ``input_amax``: a dict of ``model.forward`` keyword arguments, a list of
            them, or a callable that runs the model (e.g. a pipeline call); the unconverted model runs them
            under ``torch.no_grad()`` and each FC1's input amax is taken (:func:`calibrate_fc1_input_amax`).
        fast_math: the NVFP4 quantizer's fast mode, for the weights now and the activations later (None: the
            environment, FLASHINFER_/TRTLLM_DISABLE_FP4_QUANT_FAST_MATH, at each call). Both modes use it.
        allow_cpu: let the fused path run on CPU tensors (the pure-PyTorch reference); otherwise the fused path
            declines on CPU ("cpu_tensors") and the unfused chain runs.
        keep_original: keep the BF16 FC1 layers (outside the module tree) so that
            :func:`restore_qwen_image_transformer` can put them back; False frees them (restore then refuses).
        gemm_backend: :class:`~qwen_resnorm_fp4.NVFP4Linear`'s GEMM backend ("auto": FlashInfer on Blackwell,
            the portable dequantize + matmul elsewhere).
        allow_untested_version: convert even when the installed diffusers is outside :data:`SUPPORTED_DIFFUSERS`
            (a warning instead of the ValueError).
    """
    _check_mode(mode)
    if not isinstance(allow_cpu, bool) or not isinstance(keep_original, bool):
        raise TypeError("allow_cpu and keep_original must be bools")
    if fast_math is not None:
        resolve_fast_math(fast_math)  # type check
    version = check_diffusers_version(allow_untested_version=allow_untested_version)
    if not _is_qwen_image_model(model):
        raise TypeError(f"model must be a diffusers QwenImageTransformer2DModel, got {type(model).__name__}")
    if hasattr(model, _MODEL_ATTR):
        raise ValueError("the model is already converted (restore_qwen_image_transformer first, or "
                         "set_qwen_image_mode to switch modes)")
    blocks = _blocks(model)
    if not blocks:
        raise ValueError("the model has no QwenImageTransformerBlock")
    for name, block in blocks:
        _check_block_structure(name, block)
        if "forward" in vars(block):
            raise ValueError(f"{name} already has its own forward (a hook: offloading, caching, context parallelism, "
                             "or another conversion); convert before registering hooks on the blocks")
        for _, mlp_attr, _ in _STREAMS:
            proj = _fc1_parent(block, mlp_attr).proj
            if not isinstance(proj, torch.nn.Linear):
                raise ValueError(f"{name}.{mlp_attr}.net.0.proj is a {type(proj).__name__}, not a torch.nn.Linear")
            if proj.in_features % 64 != 0:
                raise ValueError(f"{name}.{mlp_attr}.net.0.proj has in_features {proj.in_features}: NVFP4 needs a "
                                 "multiple of 64 (the model width)")

    amax = _resolve_input_amax(model, input_amax, calibration_inputs)

    converted: List[Tuple[str, torch.nn.Module, _BlockState, Dict[str, NVFP4Linear]]] = []
    for name, block in blocks:
        originals: Dict[str, Optional[torch.nn.Linear]] = {}
        new_layers: Dict[str, NVFP4Linear] = {}
        for stream, mlp_attr, _ in _STREAMS:
            proj = _fc1_parent(block, mlp_attr).proj
            with torch.no_grad():
                new_layers[stream] = NVFP4Linear.from_linear(proj, amax[f"{name}.{mlp_attr}.net.0.proj"],
                                                             fast_math=fast_math, gemm_backend=gemm_backend)
            originals[stream] = proj if keep_original else None
        converted.append((name, block, _BlockState(name, mode, allow_cpu, originals), new_layers))

    # Everything quantized without error: install.
    for name, block, state, new_layers in converted:
        for stream, mlp_attr, _ in _STREAMS:
            _fc1_parent(block, mlp_attr).proj = new_layers[stream]
        setattr(block, _STATE_ATTR, state)
        state.forward = types.MethodType(_converted_block_forward, block)
        block.forward = state.forward
    setattr(model, _MODEL_ATTR, QwenImageConversion(
        mode=mode, fast_math=fast_math, allow_cpu=allow_cpu, input_amax=dict(amax), diffusers_version=version,
        block_names=[n for n, _ in blocks], kept_original=keep_original))
    return model


def _converted_blocks(model: torch.nn.Module) -> List[Tuple[str, torch.nn.Module, _BlockState]]:
    if not hasattr(model, _MODEL_ATTR):
        raise ValueError("the model is not converted (convert_qwen_image_transformer)")
    return [(name, block, getattr(block, _STATE_ATTR)) for name, block in _blocks(model)
            if isinstance(getattr(block, _STATE_ATTR, None), _BlockState)]


def restore_qwen_image_transformer(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`convert_qwen_image_transformer`: the original ``nn.Linear`` FC1 layers and diffusers' block
    ``forward`` come back (the same objects, so outputs are exactly the original model's). Returns the model."""
    info: QwenImageConversion = getattr(model, _MODEL_ATTR, None)
    if info is None:
        raise ValueError("the model is not converted (convert_qwen_image_transformer)")
    if not info.kept_original:
        raise ValueError("the model was converted with keep_original=False: the BF16 FC1 layers are gone; reload "
                         "the model instead")
    blocks = _converted_blocks(model)
    for name, block, state in blocks:
        if vars(block).get("forward") is not state.forward:
            raise ValueError(f"{name}.forward was replaced after the conversion (a hook?): remove that first")
    for name, block, state in blocks:
        for stream, mlp_attr, _ in _STREAMS:
            parent = _fc1_parent(block, mlp_attr)
            original = state.originals[stream]
            if isinstance(parent.proj, NVFP4Linear):  # follow a model.to(device) made after the conversion
                original.to(parent.proj.weight_packed.device)
            parent.proj = original
        del block.forward
        delattr(block, _STATE_ATTR)
    delattr(model, _MODEL_ATTR)
    return model


def set_qwen_image_mode(model: torch.nn.Module, mode: str) -> None:
    """Switch a converted model between "fused" and "unfused" (same NVFP4 weights, nothing re-quantized)."""
    _check_mode(mode)
    for _, _, state in _converted_blocks(model):
        state.mode = mode
    getattr(model, _MODEL_ATTR).mode = mode


def conversion_info(model: torch.nn.Module) -> Optional[QwenImageConversion]:
    """What :func:`convert_qwen_image_transformer` did to ``model``, or None when it is not converted."""
    return getattr(model, _MODEL_ATTR, None)


def fused_path_stats(model: torch.nn.Module, *, per_block: bool = False, reset: bool = False) -> Dict[str, Any]:
    """How the converted blocks' streams ran since the conversion (or the last reset): {"fused": n, "unfused":
    n, "fallback": n, "decline_reasons": {reason: n}} summed over blocks and streams, plus "blocks": {name:
    {"img": StreamStats, "txt": StreamStats}} with ``per_block=True``. ``reset=True`` zeroes the counters
    (after reading them)."""
    total = {"fused": 0, "unfused": 0, "fallback": 0, "decline_reasons": collections.Counter()}
    per = {}
    for name, _, state in _converted_blocks(model):
        for stream, s in state.stats.items():
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
    if per_block:
        total["blocks"] = per
    return total


__all__ = ["convert_qwen_image_transformer", "restore_qwen_image_transformer", "set_qwen_image_mode",
           "conversion_info", "fused_path_stats", "fc1_names", "calibrate_fc1_input_amax", "check_diffusers_version",
           "diffusers_version", "QwenImageConversion", "StreamStats", "SUPPORTED_DIFFUSERS",
           "TESTED_DIFFUSERS_VERSIONS", "MODES"]
