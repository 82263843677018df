"""diffusers' Wan 2.1 / 2.2 (``WanTransformer3DModel``): where the segment is.

Every ``WanTransformerBlock`` enters its FFN after the cross-attention, diffusers'::

    hidden_states = hidden_states + attn_output                          # ungated: the segment's gate is ones
    norm_hidden_states = (self.norm3(hidden_states.float()) * (1 + c_scale_msa) + c_shift_msa).type_as(hidden_states)
    ff_output = self.ffn(norm_hidden_states)                             # FeedForward: FC1, GELU(tanh), FC2
    hidden_states = (hidden_states.float() + ff_output.float() * c_gate_msa).type_as(hidden_states)

``norm3`` is an ``FP32LayerNorm`` without affine parameters. ``c_scale_msa`` / ``c_shift_msa`` are fp32
[B, 1, D] (Wan 2.1, Wan 2.2 A14B) or, in Wan 2.2 TI2V (``timestep`` of shape [B, S]), per token [B, S, D]
(``chunk(6, dim=2)`` views of one contiguous [B, S, 6, D] sum, row stride 6 * D): the fused op serves both,
reading the per-token views in place.

The converted forward is diffusers' ``WanTransformerBlock.forward`` (diffusers>=0.42.1,<0.43) with those lines
replaced.
"""

from __future__ import annotations

from torch import Tensor

from ._segments import ffn_segment, ones_gate
from ._spec import ModelSpec, StreamSpec


def _converted_block_forward(
    self,
    hidden_states: Tensor,
    encoder_hidden_states: Tensor,
    temb: Tensor,
    rotary_emb: Tensor,
) -> Tensor:
    """diffusers' WanTransformerBlock.forward (diffusers>=0.42.1,<0.43), with the cross-attention residual +
    norm3 + FFN segment replaced by :func:`~qwen_resnorm_fp4.integrations._segments.ffn_segment`."""
    if temb.ndim == 4:
        # temb: batch_size, seq_len, 6, inner_dim (wan2.2 ti2v)
        shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = (
            self.scale_shift_table.unsqueeze(0) + temb.float()
        ).chunk(6, dim=2)
        # batch_size, seq_len, 1, inner_dim
        shift_msa = shift_msa.squeeze(2)
        scale_msa = scale_msa.squeeze(2)
        gate_msa = gate_msa.squeeze(2)
        c_shift_msa = c_shift_msa.squeeze(2)
        c_scale_msa = c_scale_msa.squeeze(2)
        c_gate_msa = c_gate_msa.squeeze(2)
    else:
        # temb: batch_size, 6, inner_dim (wan2.1/wan2.2 14B)
        shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = (
            self.scale_shift_table + temb.float()
        ).chunk(6, dim=1)

    # 1. Self-attention
    norm_hidden_states = (self.norm1(hidden_states.float()) * (1 + scale_msa) + shift_msa).type_as(hidden_states)
    attn_output = self.attn1(norm_hidden_states, None, None, rotary_emb)
    hidden_states = (hidden_states.float() + attn_output * gate_msa).type_as(hidden_states)

    # 2. Cross-attention
    norm_hidden_states = self.norm2(hidden_states.float()).type_as(hidden_states)
    attn_output = self.attn2(norm_hidden_states, encoder_hidden_states, None, None)

    # --- changed: residual, norm3 + modulation, FFN (the update below is diffusers' own) ---
    hidden_states, ff_output = ffn_segment(self, "img", hidden_states, attn_output, ones_gate(c_scale_msa),
                                           c_scale_msa, c_shift_msa)
    # --- end of the changed segment ---
    hidden_states = (hidden_states.float() + ff_output.float() * c_gate_msa).type_as(hidden_states)

    return hidden_states


SPEC = ModelSpec(
    label="Wan",
    model_class="WanTransformer3DModel",
    block_class="WanTransformerBlock",
    block_attrs=("norm1", "attn1", "norm2", "attn2", "scale_shift_table"),
    streams=(StreamSpec("img", "norm3", "ffn"),),
    block_forward=_converted_block_forward,
    modelopt_bf16=(r"ffn\.net\.2",),  # the FFN output (the modulation is a parameter table, no Linear)
)
