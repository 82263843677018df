"""The joint attention of a converted Qwen-Image block under torch.compile, with the rotary embedding in real
arithmetic.

Job: what a converted ``QwenImageTransformerBlock`` calls in place of ``self.attn(...)``
(:func:`joint_attention`).

Why: diffusers' Qwen-Image rotates queries and keys as complex numbers (``view_as_complex``, a complex64
product, ``view_as_real``). Inductor generates no code for complex tensors, so under torch.compile each rotated
query and key leaves its QK-norm kernel in fp32, goes through an eager complex kernel and comes back: about five
passes over the tensor where one fused kernel (QK-norm, rotation, the joint concatenation) makes one. The same
products written on (real, imaginary) fp32 pairs (:func:`rotate_pairs`) are fused.

Rules:

- Only while dynamo traces, only with diffusers' own ``Attention`` forward and ``QwenDoubleStreamAttnProcessor2_0``
  (its attention backend and context-parallel settings are honoured), no hook on the attention module
  (diffusers' attention caches replace its forward) and no extra attention kwargs. Anything else, and every
  eager call, runs ``block.attn(...)`` unchanged: eager, the complex kernel makes fewer passes than the real
  form would.
- Numerics: ``(a + ib)(c + id) = (ac - bd) + i(ad + bc)`` in fp32, rounded once to the input's dtype, as the
  complex kernel computes it. Equal to it bit for bit where neither contracts a product into an FMA (PyTorch's CPU
  kernels); where one does (CUDA), a component differs by at most about one last bit of the larger product (an
  absolute bound: where the products cancel, many last bits of the result), which the rounding to bf16 rarely
  shows.
- The rest of the attention is diffusers' processor's operations (the image stream's first): q/k/v
  projections, QK-norm, rotation, ``[text, image]`` concatenation, ``dispatch_attention_fn``, output
  projections.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor


def rotate_pairs(x: Tensor, freqs: Tensor) -> Tensor:
    """``x`` [B, S, H, D] with each (even, odd) pair of its last dimension multiplied by ``freqs`` [S, D/2]
    (complex64, unit rotations): diffusers' ``apply_rotary_emb_qwen(x, freqs, use_real=False)`` on real fp32
    pairs, in ``x``'s dtype.

    Written as one pointwise expression over the pairs, ``(re, im) * (cos, cos) + (im, re) * (-sin, sin)``, so
    that inductor fuses it with the QK-norm before it and the joint concatenation after it (two rotated halves
    stacked back together are a concatenation it realizes as separate fp32 buffers). Each component is the
    complex product's expression in the same bits: ``re*cos + im*(-sin) == re*cos - im*sin`` and
    ``im*cos + re*sin == re*sin + im*cos`` (IEEE negation and addition order)."""
    angle = torch.view_as_real(freqs).unsqueeze(1)  # [S, 1, D/2, 2]: (cos, sin), broadcast over the heads
    cos = angle[..., :1].expand_as(angle)  # (cos, cos)
    sin = angle[..., 1:] * torch.tensor([-1.0, 1.0], dtype=angle.dtype, device=angle.device)  # (-sin, sin)
    pairs = x.float().unflatten(-1, (-1, 2))  # (re, im)
    return (pairs * cos + pairs.flip(-1) * sin).flatten(-2).type_as(x)


def _diffusers_processor_class() -> Optional[type]:
    try:
        from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0
    except ImportError:  # pragma: no cover - converted Qwen-Image blocks exist only with diffusers
        return None
    return QwenDoubleStreamAttnProcessor2_0


def _stream_heads(x: Tensor, projections: Tuple[Any, Any, Any], norms: Tuple[Any, Any], head_dim: int,
                  freqs: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """One stream's query, key, value [B, S, H, head_dim]: projected, QK-normed, rotated."""
    query, key, value = (layer(x).unflatten(-1, (-1, head_dim)) for layer in projections)
    norm_q, norm_k = norms
    if norm_q is not None:
        query = norm_q(query)
    if norm_k is not None:
        key = norm_k(key)
    if freqs is not None:
        query, key = rotate_pairs(query, freqs), rotate_pairs(key, freqs)
    return query, key, value


def _traced_joint_attention(attn: torch.nn.Module, img: Tensor, txt: Tensor, txt_mask: Optional[Tensor],
                            rotary: Optional[Tuple[Tensor, Tensor]]) -> Tuple[Tensor, Tensor]:
    """diffusers' QwenDoubleStreamAttnProcessor2_0 with :func:`rotate_pairs` for the rotation."""
    processor = attn.processor
    head_dim = attn.inner_dim // attn.heads
    mask = None
    if txt_mask is not None:  # the joint key mask: the text mask, then every image token
        image_mask = torch.ones(img.shape[:2], dtype=torch.bool, device=img.device)
        mask = torch.cat([txt_mask, image_mask], dim=1)[:, None, None, :]
    img_freqs, txt_freqs = rotary if rotary is not None else (None, None)
    img_qkv = _stream_heads(img, (attn.to_q, attn.to_k, attn.to_v), (attn.norm_q, attn.norm_k), head_dim, img_freqs)
    txt_qkv = _stream_heads(txt, (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj),
                            (attn.norm_added_q, attn.norm_added_k), head_dim, txt_freqs)
    query, key, value = (torch.cat([t, i], dim=1) for t, i in zip(txt_qkv, img_qkv))

    from diffusers.models.attention_dispatch import dispatch_attention_fn

    joint = dispatch_attention_fn(query, key, value, attn_mask=mask, dropout_p=0.0, is_causal=False,
                                  backend=processor._attention_backend, parallel_config=processor._parallel_config)
    joint = joint.flatten(2, 3).to(query.dtype)
    seq_txt = txt.shape[1]
    img_out = attn.to_out[0](joint[:, seq_txt:, :].contiguous())
    for module in attn.to_out[1:]:  # dropout
        img_out = module(img_out)
    return img_out, attn.to_add_out(joint[:, :seq_txt, :].contiguous())


def _diffusers_attention_forward() -> Optional[Any]:
    try:
        from diffusers.models.attention_processor import Attention
    except ImportError:  # pragma: no cover - converted Qwen-Image blocks exist only with diffusers
        return None
    return Attention.forward


def _unhooked(attn: torch.nn.Module) -> bool:
    """Whether calling ``attn`` runs diffusers' ``Attention.forward`` and nothing else: that class forward, no
    forward or pre-forward hook (the module's or global), and an instance-level ``forward`` only where it is the
    class's own, bound to ``attn`` (diffusers' hooks, e.g. its attention caches, replace it, and put that back
    when removed)."""
    from torch.nn.modules import module as nn_module

    if type(attn).forward is not _diffusers_attention_forward():
        return False
    if attn._forward_hooks or attn._forward_pre_hooks:
        return False
    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return False
    instance_forward = attn.__dict__.get("forward")
    return instance_forward is None or (getattr(instance_forward, "__func__", None) is type(attn).forward
                                        and getattr(instance_forward, "__self__", None) is attn)


def joint_attention(attn: torch.nn.Module, img: Tensor, txt: Tensor, txt_mask: Optional[Tensor],
                    rotary: Optional[Tuple[Tensor, Tensor]], kwargs: Dict[str, Any]) -> Tuple[Tensor, Tensor]:
    """A Qwen-Image block's ``self.attn(hidden_states=img, encoder_hidden_states=txt, ...)``: (image output,
    text output). While dynamo traces an unhooked module with diffusers' own processor and no extra kwargs,
    the same operations with the rotation on real pairs (:func:`rotate_pairs`); otherwise the module itself."""
    if (torch.compiler.is_compiling() and not kwargs and type(attn.processor) is _diffusers_processor_class()
            and _unhooked(attn)):
        return _traced_joint_attention(attn, img, txt, txt_mask, rotary)
    return attn(hidden_states=img, encoder_hidden_states=txt, encoder_hidden_states_mask=txt_mask,
                image_rotary_emb=rotary, **kwargs)
