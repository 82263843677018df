"""diffusers' Qwen-Image 2.1 (``QwenImage21Transformer2DModel``): where the segment is.

Every ``QwenImage21TransformerBlock`` (single stream) runs diffusers'::

    hidden_states = hidden_states + img_gate1.tanh() * attn_output
    img_modulated2, img_gate2 = self._modulate(self.img_norm2(hidden_states), mod2, target_token_mask)
    hidden_states = hidden_states + img_gate2.tanh() * self.img_mlp(img_modulated2)

``img_norm2`` is a LayerNorm without affine parameters, ``_modulate`` multiplies by ``1 + scale`` (no shift:
the segment gets a shift of zeros), and ``img_mlp`` is a SwiGLU FFN whose ``proj`` and ``gate_layer`` both read
the modulated activation: the segment quantizes it once and feeds both from the same packed bytes (they share
one input global scale). With ``target_token_mask`` ([S] bool, the target image's tokens) the modulation has
B + 1 rows: target tokens use their sample's row b, the others the trailing t = 0 row; the segment passes that
as the op's [2B, D] rows with ``modulate_index`` = not target.

The converted forward is diffusers' ``QwenImage21TransformerBlock.forward`` (diffusers>=0.42.1,<0.43) with
those lines replaced.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from ._segments import clip_fp16, ffn_segment
from ._spec import ModelSpec, StreamSpec


def _select_modulation_rows(params: Tensor, target_token_mask: Optional[Tensor]) -> Tensor:
    """diffusers' ``_select_modulation_rows`` of the supported releases (same operations)."""
    if target_token_mask is None:
        return params.unsqueeze(1)
    real, zero = params[:-1].unsqueeze(1), params[-1:].unsqueeze(0)
    return torch.where(target_token_mask.view(1, -1, 1), real, zero)


def _op_rows(params: Tensor, target_token_mask: Optional[Tensor], batch: int) -> Tensor:
    """The op's form of the same selection: [B, D] as is; with the mask, [2B, D] = the B real rows, then the
    t = 0 row once per sample (rows B + b, picked where modulate_index is non-zero)."""
    if target_token_mask is None:
        return params
    return torch.cat([params[:-1], params[-1:].expand(batch, -1)])


def _converted_block_forward(
    self,
    hidden_states: Tensor,
    modulation: Tensor,
    rotary_emb: Optional[Tensor] = None,
    attention_mask: Optional[Any] = None,
    target_token_mask: Optional[Tensor] = None,
    layer_cache: Optional[Any] = None,
    kv_cache_mode: Optional[str] = None,
    cache_write_slice: Optional[slice] = None,
    segments: Optional[list] = None,
    key_valid: Optional[Tensor] = None,
) -> Tensor:
    """diffusers' QwenImage21TransformerBlock.forward (diffusers>=0.42.1,<0.43), with the norm2 + SwiGLU segment
    replaced by :func:`~qwen_resnorm_fp4.integrations._segments.ffn_segment`. Other lines are diffusers' own."""
    mod1, mod2 = modulation.chunk(2, dim=-1)

    img_modulated, img_gate1 = self._modulate(self.img_norm1(hidden_states), mod1, target_token_mask)
    attn_output = self.attn(
        hidden_states=img_modulated,
        attention_mask=attention_mask,
        rotary_emb=rotary_emb,
        layer_cache=layer_cache,
        kv_cache_mode=kv_cache_mode,
        cache_write_slice=cache_write_slice,
        segments=segments,
        key_valid=key_valid,
    )

    # --- changed: tanh-gated residual, norm2 * (1 + scale), SwiGLU, tanh-gated residual ---
    del img_gate1  # the segment takes the same rows of mod1's gate in the op's form
    batch = hidden_states.shape[0]
    _scale1, gate1 = mod1.chunk(2, dim=-1)
    scale2, gate2 = mod2.chunk(2, dim=-1)
    gate_rows = _op_rows(gate1.tanh(), target_token_mask, batch)
    scale_rows = _op_rows(scale2, target_token_mask, batch)
    index = None
    if target_token_mask is not None:
        index = (~target_token_mask.bool()).view(1, -1).expand(batch, -1).contiguous()
    residual_out, mlp_output = ffn_segment(self, "img", hidden_states, attn_output, gate_rows, scale_rows,
                                           torch.zeros_like(scale_rows), index=index)
    hidden_states = residual_out + _select_modulation_rows(gate2, target_token_mask).tanh() * mlp_output
    # --- end of the changed segment ---
    return clip_fp16(hidden_states)


SPEC = ModelSpec(
    label="Qwen-Image 2.1",
    model_class="QwenImage21Transformer2DModel",
    block_class="QwenImage21TransformerBlock",
    block_attrs=("img_norm1", "attn", "_modulate"),
    streams=(StreamSpec("img", "img_norm2", "img_mlp", ffn_kind="swiglu"),),
    block_forward=_converted_block_forward,
    modelopt_bf16=(r"img_mlp\.out",),  # the FFN output (the modulation comes from outside the blocks)
)
