"""Drop-ins for SGLang's ``try_fused_scale_residual_norm_scale_shift_nvfp4`` and
``try_fused_scale_residual_norm_scale_shift_fp8``.

SGLang (0.5.23: ``sglang/kernels/kda_kernels/norm_scale_shift_jit.py``, called from
``sglang/multimodal_gen/runtime/models/dits/qwen_image.py``, ``_try_nvfp4_resnorm_quant``) computes, for the
MLP half of a Qwen-Image block::

    residual_out = residual + gate * (x + input_bias)
    y = LayerNorm(residual_out) * (1 + scale) + shift          -> NVFP4(y, global_scale) for FC1

and returns ``((packed, scales), residual_out)``, or ``None`` so that the caller runs its unfused code. Its
kernel serves only width 3072, batch 1, B200-class GPUs (sm_10x), eager mode outside CUDA-graph capture, a
LayerNorm without affine parameters, bf16 [D]-shaped parameters with an ``input_bias``, and the fast-math
quantizer; it declines everything else.

:func:`try_fused_scale_residual_norm_scale_shift_nvfp4` has the same parameters in the same order and the
same return value, and serves much more through ``qwen_resnorm_fp4.try_fused_resnorm_quant``: Hopper and
Blackwell, any batch (scale/shift [B, 1, D] or [B, D]), per-token modulation ([B, S, D], strided views such as
``temb.chunk(6, dim=-1)`` read in place), any width the op supports (a multiple of 64),
``torch.compile`` and CUDA-graph capture, an affine LayerNorm (``weight`` / ``bias``), no ``input_bias``,
fp32 parameters, ``modulate_index`` (zero_cond_t, which SGLang's own function declines) on any sequence
shard, both quantizer modes (FLASHINFER_/TRTLLM_DISABLE_FP4_QUANT_FAST_MATH select the exact one,
as for the production quantizer). It declines (returns ``None``, the reason in
``qwen_resnorm_fp4.last_decline_reason()``) what the op cannot serve: ``norm_type`` other than ``"layer"``
(e.g. ``"rms"``: "unsupported_norm"), a scalar ``gate`` other than 1 ("unsupported_modulation"), CPU tensors
unless ``allow_cpu=True`` ("cpu_tensors"), and the rest of the gate's reasons. SGLang's own function declines
when FLASHINFER_NVFP4_4OVER6 is set (its unfused path then quantizes with FlashInfer's 4over6 recipe, read from
the environment); this one serves that recipe, read from the same environment unless ``nvfp4_4over6=`` names
one, so its bytes are the unfused path's.

Parameter meanings (SGLang's): ``residual``, ``x``: bf16 [B, S, D]; ``input_bias``: the attention output's
bias, added to ``x`` before the gate, or None; ``gate``: the attention gate (like scale, or [D]) or the int 1
for an ungated update (SGLang's ``ScaleResidualNormScaleShift`` convention; None means the same);
``weight``, ``bias``: the norm's affine parameters or None; ``scale``, ``shift``: the adaLN modulation as SGLang
passes them, [B, 1, D] (or per token [B, S, D]); ``global_scale``: FC1's ``input_scale_inv`` (448 * 6 / input
amax), a float32 one-element tensor; ``norm_type``: "layer" or "rms"; ``eps``: the norm's epsilon.

FP8: SGLang's ``try_fused_scale_residual_norm_scale_shift_fp8(residual, x, gate, weight, bias, scale, shift,
input_scale, norm_type, eps)`` (same file) computes ``residual_out = residual + gate * x`` (no input bias),
``normalized = LayerNorm(residual_out) * (1 + scale) + shift`` in BF16 and ``quantized`` = that tensor in
static per-tensor E4M3 with ModelOpt's ``input_scale`` (amax / 448; what its ``static_quant_fp8`` gives), and
returns ``(normalized, quantized, residual_out)``. Its kernel serves only width 3072, batch 1, Blackwell (sm
>= 10), bf16 [D]-shaped gate/scale/shift and a LayerNorm without affine parameters, and declines the rest.
:func:`try_fused_scale_residual_norm_scale_shift_fp8` takes the same parameters in the same order and returns
the same triple, through ``qwen_resnorm_fp4.try_fused_resnorm_quant_fp8``: Hopper and Blackwell, every width
the op supports, any batch, per-batch and per-token modulation, ``modulate_index`` (a keyword of its own,
zero_cond_t), an affine LayerNorm, fp32 parameters, ``torch.compile`` and CUDA graphs. It declines what the
op cannot serve, with the reason in ``qwen_resnorm_fp4.last_decline_reason()`` (eager calls, per thread). One
kernel writes all three (``resnorm_quant_fp8_out`` with its ``y_bf16`` output); only the E4M3 tensor feeds an
FP8 FC1, so ``need_normalized=False`` skips writing the BF16 copy (2 bytes an element) and returns ``None`` in
its place.
The bytes are the same either way.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

import qwen_resnorm_fp4 as _q

Tensor = torch.Tensor

#: SGLang's norm_type for a LayerNorm (its other value, "rms", is an RMSNorm).
LAYER_NORM_TYPE = "layer"


class _PrequantizedFC1(NamedTuple):
    """What the fused path needs of FC1: its width and its input global scale."""

    in_features: int
    input_global_scale: Tensor


def _sglang_gate_and_norm(gate, scale, shift, weight, bias, norm_type: str, eps: float, modulate_index):
    """SGLang's modulation and norm arguments in the fused paths' form: (gate, scale, shift, norm). With
    ``modulate_index`` SGLang's [2B, 1, D] rows are the op's [2B, D]; the int 1 or None as gate is an ungated
    update; any norm_type other than "layer" becomes a norm the fused paths decline."""
    if modulate_index is not None:
        gate, scale, shift = (t.squeeze(1) if isinstance(t, Tensor) and t.dim() == 3 and t.shape[1] == 1 else t
                              for t in (gate, scale, shift))
    if gate is None or (type(gate) is int and gate == 1):  # an ungated update: fma(a, 1, residual)
        gate = (torch.ones(scale.shape[-1:], dtype=scale.dtype, device=scale.device).expand(scale.shape)
                if isinstance(scale, Tensor) else 1)  # one [D] row, broadcast: no per-token ones in memory
    elif isinstance(gate, Tensor) and isinstance(scale, Tensor) and gate.dim() < scale.dim():
        gate = gate.expand(scale.shape)  # a shared [D] gate next to per-batch [B, 1, D] scale and shift
    if norm_type == LAYER_NORM_TYPE and weight is None and bias is None:
        return gate, scale, shift, None  # the common case: a LayerNorm without affine parameters, epsilon eps
    kind = "layernorm" if norm_type == LAYER_NORM_TYPE else norm_type  # e.g. "rms" declines as a non-LayerNorm
    return gate, scale, shift, {"type": kind, "weight": weight, "bias": bias, "eps": eps}


def _one_element(t):
    """A one-element scale tensor as [1] (SGLang passes () or [1])."""
    if isinstance(t, Tensor) and t.dim() != 1 and t.numel() == 1:
        return t.reshape(1)
    return t


def try_fused_scale_residual_norm_scale_shift_nvfp4(
    residual: Tensor,
    x: Tensor,
    input_bias: Optional[Tensor],
    gate,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    scale: Tensor,
    shift: Tensor,
    global_scale: Tensor,
    norm_type: str,
    eps: float,
    *,
    allow_cpu: bool = False,
    fast_math: Optional[bool] = None,
    nvfp4_4over6=_q.recipe.UNSET,
    modulate_index: Optional[Tensor] = None,
    fc1_in_features: Optional[int] = None,
) -> Optional[Tuple[Tuple[Tensor, Tensor], Tensor]]:
    """SGLang's function of this name, served by the fused kernel (see the module docstring).

    Returns ``((packed uint8 [M, D/2], scales uint8 [round_up(M, 128), D/16]), residual_out bf16 like x)`` or
    ``None`` (then, in eager mode, ``qwen_resnorm_fp4.last_decline_reason()`` says why). ``allow_cpu``: run the
    pure-PyTorch reference on CPU tensors. ``fast_math``: the quantizer's mode (None: the environment).
    ``nvfp4_4over6``: the block-scale recipe (omitted: the FLASHINFER_NVFP4_4OVER6* environment; None:
    standard; a config).
    ``modulate_index``: [B, S] (int32, int64 or bool), the zero_cond_t convention: gate, scale and shift are
    then [2B, 1, D] or [2B, D], token (b, s) taking row b where the index is 0 and row B + b elsewhere. Any
    sequence shard serves (x, residual [B, S_local, D] with the index's [B, S_local] columns of that shard).
    ``fc1_in_features``: the width of the FC1 layer the result feeds; where it is not x's width the call
    declines ("fc1_width_mismatch"). SGLang's parameters carry no FC1 layer, so without it nothing checks that
    the packed activations fit FC1."""
    gate, scale, shift, norm = _sglang_gate_and_norm(gate, scale, shift, weight, bias, norm_type, eps,
                                                     modulate_index)
    if fc1_in_features is None:  # no FC1 named: the gate's width check compares x with itself
        fc1_in_features = x.shape[-1] if isinstance(x, Tensor) and x.dim() > 0 else 0
    fc1 = _PrequantizedFC1(fc1_in_features, _one_element(global_scale))
    result = _q.try_fused_resnorm_quant(residual, x, gate, scale, shift, fc1,
                                        bias=input_bias, eps=eps, norm=norm, modulate_index=modulate_index,
                                        allow_cpu=allow_cpu,
                                        fast_math=fast_math, nvfp4_4over6=nvfp4_4over6)
    if result is None:
        return None
    packed_scales, residual_out, _ = result
    return packed_scales, residual_out


def try_fused_scale_residual_norm_scale_shift_fp8(
    residual: Tensor,
    x: Tensor,
    gate,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    scale: Tensor,
    shift: Tensor,
    input_scale: Tensor,
    norm_type: str,
    eps: float,
    *,
    modulate_index: Optional[Tensor] = None,
    need_normalized: bool = True,
    allow_cpu: bool = False,
) -> Optional[Tuple[Optional[Tensor], Tensor, Tensor]]:
    """SGLang's function of this name, served by this library (see the module docstring).

    Parameters as SGLang's: ``residual``, ``x`` bf16 [B, S, D]; ``gate`` like scale, [D], or the int 1 /
    None (ungated); ``weight``, ``bias``: the norm's affine parameters or None; ``scale``, ``shift``:
    [B, 1, D], [B, D], [D] or per token [B, S, D] (or [2B, D] with ``modulate_index``); ``input_scale``: FC1's
    ModelOpt ``input_scale`` (amax / 448), a float32 one-element tensor; ``norm_type``: "layer" (anything else
    declines); ``eps``. Keywords of this library: ``modulate_index`` ([B, S], zero_cond_t), ``need_normalized``
    (False: the BF16 copy is not written, ``None`` for ``normalized``), ``allow_cpu`` (run the CPU reference
    on CPU tensors).

    Returns ``(normalized bf16 like x, quantized float8_e4m3fn like x, residual_out bf16 like x)`` or ``None``
    (then, in eager mode, ``qwen_resnorm_fp4.last_decline_reason()`` says why)."""
    gate, scale, shift, norm = _sglang_gate_and_norm(gate, scale, shift, weight, bias, norm_type, eps,
                                                     modulate_index)
    result = _q.try_fused_resnorm_quant_fp8(residual, x, gate, scale, shift, _one_element(input_scale), eps=eps,
                                            norm=norm, modulate_index=modulate_index, allow_cpu=allow_cpu,
                                            with_bf16=need_normalized)
    if result is None:
        return None
    if need_normalized:
        quantized, residual_out, normalized = result
        return normalized, quantized, residual_out
    quantized, residual_out = result
    return None, quantized, residual_out


__all__ = ["try_fused_scale_residual_norm_scale_shift_nvfp4", "try_fused_scale_residual_norm_scale_shift_fp8",
           "LAYER_NORM_TYPE"]
