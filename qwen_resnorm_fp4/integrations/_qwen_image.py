"""diffusers' Qwen-Image (``QwenImageTransformer2DModel``, Qwen-Image and Qwen-Image-Edit): where the segment is.

In every ``QwenImageTransformerBlock``, both streams (image: ``img_norm2`` / ``img_mlp``; text: ``txt_norm2`` /
``txt_mlp``) run diffusers'::

    hidden_states = hidden_states + gate1 * attn_output
    normed2 = norm2(hidden_states)                              # LayerNorm, no affine
    modulated2, gate2 = self._modulate(normed2, mod2, index)    # * (1 + scale2) + shift2
    hidden_states = hidden_states + gate2 * mlp(modulated2)     # FeedForward: FC1, GELU(tanh), FC2

The converted forward below is diffusers' ``QwenImageTransformerBlock.forward`` (diffusers>=0.42.1,<0.43) with
those lines replaced by :func:`~qwen_resnorm_fp4.integrations._segments.ffn_segment` and the update, and
``self.attn(...)`` by :func:`~qwen_resnorm_fp4.integrations._attention.joint_attention` (the same module in eager
calls; compiled, its operations with the rotary embedding on real pairs).
``modulate_index`` (zero_cond_t: condition-image tokens take rows B + b of the [2B, D] parameters) is served.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ._attention import joint_attention
from ._segments import attention_input, clip_fp16, ffn_segment
from ._spec import ModelSpec, StreamSpec


def _gate_rows(gate: Tensor, index: Optional[Tensor]) -> Tensor:
    """The ``gate_result`` of diffusers' ``QwenImageTransformerBlock._modulate`` (same operations)."""
    if index is not None:
        actual_batch = gate.size(0) // 2
        gate_0, gate_1 = gate[:actual_batch], gate[actual_batch:]
        index_expanded = index.unsqueeze(-1)
        return torch.where(index_expanded == 0, gate_0.unsqueeze(1), gate_1.unsqueeze(1))
    return gate.unsqueeze(1)


def _index_tensor(index: Any, like: Tensor) -> Optional[Tensor]:
    if index is not None and not isinstance(index, torch.Tensor):
        index = torch.as_tensor(index, device=like.device)
    return index


def _attention_input(block: torch.nn.Module, stream: str, x: Tensor, mod1: Tensor,
                     index: Optional[Tensor]) -> Optional[Tensor]:
    """The stream's norm1 + modulation as the E4M3 input of its q/k/v projections
    (:func:`~qwen_resnorm_fp4.integrations._segments.attention_input`), or None: diffusers' own lines run."""
    shift1, scale1, _gate1 = mod1.chunk(3, dim=-1)
    return attention_input(block, stream, x, scale1, shift1, index=index)


def _mlp_half(block: torch.nn.Module, stream: str, hidden_states: Tensor, attn_output: Tensor, mod1: Tensor,
              mod2: Tensor, index: Optional[Tensor]) -> Tensor:
    """One stream from the attention output to the end of the block."""
    _shift1, _scale1, gate1 = mod1.chunk(3, dim=-1)
    shift2, scale2, gate2 = mod2.chunk(3, dim=-1)
    residual_out, mlp_output = ffn_segment(block, stream, hidden_states, attn_output, gate1, scale2, shift2,
                                           index=index)
    return residual_out + _gate_rows(gate2, index) * mlp_output


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
    """diffusers' QwenImageTransformerBlock.forward (diffusers>=0.42.1,<0.43), with the norm2 + MLP segment of
    each stream replaced by :func:`_mlp_half`. Lines outside that segment are diffusers' own."""
    # --- changed: the segments' inputs once per block (a context-parallel shard of a batch > 1 is strided) ---
    hidden_states, encoder_hidden_states = hidden_states.contiguous(), encoder_hidden_states.contiguous()
    index = _index_tensor(modulate_index, hidden_states)
    # Get modulation parameters for both streams
    img_mod_params = self.img_mod(temb)  # [B, 6*dim]

    if self.zero_cond_t:
        temb = torch.chunk(temb, 2, dim=0)[0]
    txt_mod_params = self.txt_mod(temb)  # [B, 6*dim]

    # Split modulation parameters for norm1 and norm2
    img_mod1, img_mod2 = img_mod_params.chunk(2, dim=-1)  # Each [B, 3*dim]
    txt_mod1, txt_mod2 = txt_mod_params.chunk(2, dim=-1)  # Each [B, 3*dim]

    # --- changed (FP8 conversions): norm1 + modulation + the projections' one E4M3 quantization, fused ---
    img_modulated = _attention_input(self, "img", hidden_states, img_mod1, index)
    txt_modulated = _attention_input(self, "txt", encoder_hidden_states, txt_mod1, None)
    # --- end of the changed segment ---

    # Process image stream - norm1 + modulation
    if img_modulated is None:
        img_normed = self.img_norm1(hidden_states)
        img_modulated, _img_gate1 = self._modulate(img_normed, img_mod1, modulate_index)

    # Process text stream - norm1 + modulation
    if txt_modulated is None:
        txt_normed = self.txt_norm1(encoder_hidden_states)
        txt_modulated, _txt_gate1 = self._modulate(txt_normed, txt_mod1)

    # --- changed: self.attn(...), compiled with the rotation on real pairs (inductor has no complex code) ---
    img_attn_output, txt_attn_output = joint_attention(self.attn, img_modulated, txt_modulated,
                                                       encoder_hidden_states_mask, image_rotary_emb,
                                                       joint_attention_kwargs or {})

    # --- changed: attention gate + residual, norm2 + modulation, MLP, gate + residual ---
    # (the gate1 of diffusers' _modulate is what it multiplies here; the segment takes the gate chunk of
    # img_mod1 / txt_mod1 with modulate_index instead, the same rows.)
    hidden_states = _mlp_half(self, "img", hidden_states, img_attn_output, img_mod1, img_mod2, index)
    encoder_hidden_states = _mlp_half(self, "txt", encoder_hidden_states, txt_attn_output, txt_mod1, txt_mod2, None)
    # --- end of the changed segment ---

    return clip_fp16(encoder_hidden_states), clip_fp16(hidden_states)


SPEC = ModelSpec(
    label="Qwen-Image",
    model_class="QwenImageTransformer2DModel",
    block_class="QwenImageTransformerBlock",
    block_attrs=("img_mod", "txt_mod", "img_norm1", "txt_norm1", "attn", "_modulate", "zero_cond_t"),
    streams=(StreamSpec("img", "img_norm2", "img_mlp", attn_norm="img_norm1",
                        attn_inputs=("attn.to_q", "attn.to_k", "attn.to_v")),
             StreamSpec("txt", "txt_norm2", "txt_mlp", attn_norm="txt_norm1",
                        attn_inputs=("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"))),
    block_forward=_converted_block_forward,
    # SGLang's Qwen-Image FP8 checkpoint keeps these in BF16 (and, outside the blocks, img_in, txt_in, the
    # timestep embedder, norm_out and proj_out, which no conversion touches)
    modelopt_bf16=(r"(img|txt)_mod\.1", r"(img|txt)_mlp\.net\.2"),
)
