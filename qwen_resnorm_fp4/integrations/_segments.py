"""The segments a converted block forward calls: the fused (or unfused) residual + norm + modulation +
quantization in front of each FFN, and, with FP8 layers, the attention input and the GELU.

Job: what the model files' copied forwards call in place of diffusers' lines:

- :func:`ffn_segment`: ``residual + gate * x -> norm -> * (1 + scale) + shift -> FFN`` of one stream, the
  residual update, norm, modulation and the FFN input's quantization in one call
  (``serve_fused_resnorm_quant`` / ``serve_fused_resnorm_quant_fp8``) or as ``resnorm`` + the FFN input
  layer's quantizer (``mode="unfused"``, and where the fused gate declines), then the FFN on the quantized
  activations with the same code in both modes;
- :func:`attention_input`: an FP8 conversion's first norm + modulation into the one E4M3 input of the q/k/v
  projections (``serve_fused_norm_modulate_quant_fp8``; unfused: ``resnorm`` of (x, 0, gate 0) then the first
  projection's ``quantize_input``);
- the GELU(tanh) of a FeedForward whose second Linear is FP8 (``serve_fused_gelu_tanh_fp8_quantize``; unfused:
  PyTorch's GELU kernel then the Linear's own quantization);
- :func:`clip_fp16`, :func:`ones_gate`: diffusers' block end and an ungated update's gate.

Rules:

- Both modes write the same bytes; everything after the quantized activation is shared code.
- A converted forward mutates no Python state while compiled: eager calls count each segment's path in the
  block's ``StreamStats`` (a decline's fallback logged once per conversion, ``FallbackLog``); while dynamo
  traces, each segment's path is noted once per trace (:func:`~._compiled_paths.note_compiled`) instead.
- They read of the block state only what is equal in every block and conversion of a family (spec, mode,
  allow_cpu, the segment keys), so one compiled block serves them all.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Tuple, Union

import torch

from .. import FP8Linear, NVFP4Linear, resnorm
from .._fused_common import Decline
from ..fused_path import serve_fused_resnorm_quant
from ..fused_path_fp8 import serve_fused_gelu_tanh_fp8_quantize, serve_fused_norm_modulate_quant_fp8
from ..fused_path_fp8 import serve_fused_resnorm_quant_fp8
from ._compiled_paths import note_compiled
from ._options import input_scale_attr
from ._spec import StreamSpec
from ._state import STATE_ATTR, BlockState, StreamStats

Tensor = torch.Tensor

logger = logging.getLogger("qwen_resnorm_fp4")


def _offloaded(layer: Union[NVFP4Linear, FP8Linear], x: Tensor) -> bool:
    """Whether the layer's activation scale is elsewhere than ``x`` (accelerate's sequential offload keeps a
    layer's parameters on the meta device outside its own forward): then only the layer's forward can quantize
    its input, with the scale its hook brings back (the same bytes)."""
    return getattr(layer, input_scale_attr(layer)).device != x.device


def _unfused(residual: Tensor, x: Tensor, bias: Optional[Tensor], gate: Tensor, scale: Tensor, shift: Tensor,
             norm: torch.nn.LayerNorm, fc1: Union[NVFP4Linear, FP8Linear],
             index: Optional[Tensor]) -> Tuple[Any, Tensor]:
    """The baseline: ``resnorm`` (residual update, LayerNorm, modulation -> BF16 y), then FC1's own quantizer
    (what the layer does to a BF16 input): NVFP4 with its input global scale and fast-math mode, or E4M3 with
    its input_scale; y itself where the layer is offloaded (:func:`_offloaded`: its forward quantizes it)."""
    y, residual_out = resnorm(residual, x, bias, gate, scale, shift, float(norm.eps), weight=norm.weight,
                              norm_bias=norm.bias, modulate_index=index)
    return (y if _offloaded(fc1, y) else fc1.quantize_input(y)), residual_out


def _served(state: BlockState, segment: str, stats: StreamStats, outcome: Any) -> Any:
    """The result of one segment's call: a fused gate's outcome (its result, or None for a Decline), or None
    for the unfused mode (``outcome`` None). Counted in ``stats`` in eager mode (a decline's reason logged
    once per conversion); while torch.compile traces, noted once for the trace (:func:`note_compiled`)
    instead."""
    declined = isinstance(outcome, Decline)
    path = "unfused" if outcome is None else outcome.reason.value if declined else "fused"
    if torch.compiler.is_compiling():
        note_compiled(state.spec.block_forward.__module__, segment, path)
    elif outcome is None:
        stats.unfused += 1
    elif not declined:
        stats.fused += 1
    else:
        stats.fallback += 1
        stats.decline_reasons[path] += 1
        if state.fallbacks.first(path):
            logger.info("%s block %s (%s): the fused path declined (%s: %s); running the unfused chain (same "
                        "bytes). See fused_path_stats(model).", state.spec.label, state.name, segment, path,
                        outcome.detail)
    return None if declined else outcome


def attention_input(block: torch.nn.Module, stream: str, x: Tensor, scale: Tensor, shift: Tensor, *,
                    index: Optional[Tensor] = None) -> Optional[Tensor]:
    """The E4M3 input of a stream's attention projections (``StreamSpec.attn_inputs``, one shared
    input_scale) from its first norm: ``norm(x) * (1 + scale) + shift`` quantized once, fused
    (``serve_fused_norm_modulate_quant_fp8``) or unfused (``resnorm`` of (x, 0, gate 0), then the first
    projection's ``quantize_input``), the same
    bytes (bf16 y where the projections are offloaded, :func:`_offloaded`: they quantize it in their forwards).
    None where the conversion did not set this segment up (NVFP4, other layers, differing input scales): the
    caller runs the model's own norm and modulation. scale/shift as for :func:`ffn_segment`."""
    state: BlockState = getattr(block, STATE_ATTR)
    key = f"{stream}.attn"
    stats = state.stats.get(key)
    if stats is None:
        return None
    spec = state.spec.stream(stream)
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
        result = y if _offloaded(first, y) else first.quantize_input(y)
    return result


def _gelu_tanh(h: Tensor) -> Tensor:
    """PyTorch's own GELU(tanh) kernel: what the fused GELU + FP8 op's bf16 GELU equals bit for bit."""
    return torch.nn.functional.gelu(h, approximate="tanh")


#: :func:`_gelu_tanh` as one opaque op, for traced code: inductor would generate its own GELU, whose last bit
#: can differ from PyTorch's kernel. (Registered with torch.library once, at import.)
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
    spec = state.spec.stream(stream)
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
    if isinstance(quantized, Tensor):  # E4M3 or (offloaded) bf16 [..., D]: the layers keep the leading dims
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
