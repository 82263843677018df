"""diffusers' FLUX.1 (``FluxTransformer2DModel``): where the segment is.

In every double-stream ``FluxTransformerBlock``, both streams (image: ``norm2`` / ``ff``; text:
``norm2_context`` / ``ff_context``) run diffusers'::

    hidden_states = hidden_states + gate_msa.unsqueeze(1) * attn_output
    norm_hidden_states = self.norm2(hidden_states)                      # LayerNorm, no affine, eps 1e-6
    norm_hidden_states = norm_hidden_states * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    ff_output = self.ff(norm_hidden_states)                             # FeedForward: FC1, GELU(tanh), FC2
    hidden_states = hidden_states + gate_mlp.unsqueeze(1) * ff_output

The converted forward is diffusers' ``FluxTransformerBlock.forward`` (diffusers>=0.42.1,<0.43) with those lines
replaced; the IP-adapter output (a third attention output) is added after the FFN as diffusers does. The
single-stream blocks (``FluxSingleTransformerBlock``: attention and MLP in parallel on one norm) have no such
segment: their forward stays diffusers' own, and ``linears="all"`` makes their Linears NVFP4 too.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from torch import Tensor

from ._segments import clip_fp16, ffn_segment
from ._spec import ModelSpec, StreamSpec


def _converted_block_forward(
    self,
    hidden_states: Tensor,
    encoder_hidden_states: Tensor,
    temb: Tensor,
    image_rotary_emb: Optional[Tuple[Tensor, Tensor]] = None,
    joint_attention_kwargs: Optional[Dict[str, Any]] = None,
) -> Tuple[Tensor, Tensor]:
    """diffusers' FluxTransformerBlock.forward (diffusers>=0.42.1,<0.43), with the norm2 + FFN segment of each
    stream replaced by :func:`~qwen_resnorm_fp4.integrations._segments.ffn_segment`."""
    norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, emb=temb)

    norm_encoder_hidden_states, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(
        encoder_hidden_states, emb=temb
    )
    joint_attention_kwargs = joint_attention_kwargs or {}

    # Attention.
    attention_outputs = self.attn(
        hidden_states=norm_hidden_states,
        encoder_hidden_states=norm_encoder_hidden_states,
        image_rotary_emb=image_rotary_emb,
        **joint_attention_kwargs,
    )

    if len(attention_outputs) == 2:
        attn_output, context_attn_output = attention_outputs
    elif len(attention_outputs) == 3:
        attn_output, context_attn_output, ip_attn_output = attention_outputs

    # --- changed: gated residual, norm2 + modulation, FFN, gated residual (both streams) ---
    hidden_states, ff_output = ffn_segment(self, "img", hidden_states, attn_output, gate_msa, scale_mlp, shift_mlp)
    ff_output = gate_mlp.unsqueeze(1) * ff_output

    hidden_states = hidden_states + ff_output
    if len(attention_outputs) == 3:
        hidden_states = hidden_states + ip_attn_output

    encoder_hidden_states, context_ff_output = ffn_segment(self, "txt", encoder_hidden_states, context_attn_output,
                                                           c_gate_msa, c_scale_mlp, c_shift_mlp)
    encoder_hidden_states = encoder_hidden_states + c_gate_mlp.unsqueeze(1) * context_ff_output
    # --- end of the changed segment ---
    return clip_fp16(encoder_hidden_states), hidden_states


SPEC = ModelSpec(
    label="FLUX.1",
    model_class="FluxTransformer2DModel",
    block_class="FluxTransformerBlock",
    block_attrs=("norm1", "norm1_context", "attn"),
    streams=(StreamSpec("img", "norm2", "ff"), StreamSpec("txt", "norm2_context", "ff_context")),
    block_forward=_converted_block_forward,
    linear_only_blocks=("FluxSingleTransformerBlock",),
    # SGLang's FLUX.1 FP8 profile keeps the modulation Linears and the FFN in BF16; the FFN input stays
    # quantized here, since the fused segment feeds it
    modelopt_bf16=(r"norm1(_context)?\.linear", r"ff(_context)?\.net\.2", r"norm\.linear"),
)
