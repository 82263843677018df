"""``FP8Linear``: a linear layer with E4M3 weights (the ModelOpt FP8 format) that takes BF16 activations or
already-quantized E4M3 ones.

``layer(x)`` for a BF16 tensor ``x`` [..., K] quantizes it with the layer's static ``input_scale``
(:func:`~qwen_resnorm_fp4.fp8_quantize`: q = E4M3(clamp(x * (1 / input_scale), -448, 448)), round to
nearest even) and runs the GEMM; ``layer(q)`` for a ``float8_e4m3fn`` tensor skips the quantization: that is
how the output of a fused FP8 op (the FP8 row op, the no-residual FP8 op, GELU + FP8) is consumed. Given the
same activations, the two forms return the same bits.

The GEMM, ``y = (q @ W.T) * input_scale * weight_scale + bias`` with fp32 accumulation and one rounding to
bf16:

- on CUDA, ``torch._scaled_mm`` (E4M3 x E4M3, cuBLASLt / CUTLASS): tensor-wise scales for a per-tensor
  ``weight_scale``; row-wise scales (``scale_a`` [M, 1] = input_scale repeated, ``scale_b`` [1, N] =
  weight_scale) for a per-channel one. ``_scaled_mm`` needs K and N multiples of 16 and the weight operand
  column-major (``weight.t()`` of the row-major [N, K] weight is). With tensor-wise scales the bf16 bias
  goes into the call; with row-wise scales the bias is added to the GEMM's bf16 output (a second rounding):
  cuBLASLt refuses some shapes of a row-wise bias epilogue (K = 12288, N = 3072 with fast accumulation on an
  H200, torch 2.11), and row-wise scaling has no fp32 output.
  ``use_fast_accum`` (default True: what SGLang's and vLLM's FP8 linear layers pass) lets Hopper's tensor
  cores accumulate in their faster reduced-precision mode; False asks for the exact fp32 accumulation.
- elsewhere (CPU), a dequantized reference: the E4M3 codes as fp32, an fp32 matmul, times
  ``input_scale * weight_scale``, plus the bias, rounded once to bf16.

Layers come from a ``torch.nn.Linear`` (:meth:`FP8Linear.from_linear`, quantized here) or from NVIDIA
ModelOpt's FP8 export as it is written (:meth:`FP8Linear.from_modelopt`,
:meth:`FP8Linear.from_modelopt_state_dict`: the E4M3 weight bytes and the scales unchanged, nothing
re-quantized). The forward does no host synchronisation, so ``torch.compile(fullgraph=True)`` and CUDA-graph
capture work through it.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

import torch

from . import api
from ._linear_common import FrozenTensorsModule, check_bool, frozen, positive_scalar
from .constants import E4M3_MAX, FP8_DTYPE

Tensor = torch.Tensor

#: K and N must be multiples of this (torch._scaled_mm's rule).
FP8_ALIGNMENT = 16


def is_fp8_linear_shape(in_features: int, out_features: int) -> bool:
    """Whether an FP8Linear of this shape exists: K and N positive multiples of 16."""
    return (in_features > 0 and out_features > 0 and in_features % FP8_ALIGNMENT == 0
            and out_features % FP8_ALIGNMENT == 0)


def quantize_fp8(v: Tensor, scale: Tensor) -> Tensor:
    """E4M3 of ``v / scale`` (IEEE fp32 division, as ModelOpt quantizes a weight), clamped to +-448 first
    (saturating), round to nearest even; NaN stays NaN. ``scale``: one element, or one per row of ``v``."""
    s = scale.to(torch.float32)
    if s.numel() != 1:
        s = s.reshape(-1, *([1] * (v.dim() - 1)))
    return (v.to(torch.float32) / s).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)


def _check_weight_scale(weight_scale: Tensor, n: int) -> Tensor:
    """fp32 [1] (per tensor) or [N] (per channel) from a ModelOpt weight_scale of shape (), (1,), (N,) or
    (N, 1); every value finite and positive."""
    if not isinstance(weight_scale, Tensor) or not weight_scale.is_floating_point() \
            or weight_scale.dtype == FP8_DTYPE:
        raise TypeError("weight_scale must be a floating-point tensor (ModelOpt writes fp32), got "
                        f"{weight_scale.dtype if isinstance(weight_scale, Tensor) else type(weight_scale).__name__}")
    shape = tuple(weight_scale.shape)
    if weight_scale.numel() == 1 and len(shape) <= 1:
        s = weight_scale.detach().reshape(1)
    elif shape in ((n,), (n, 1)):
        s = weight_scale.detach().reshape(n)
    else:
        raise ValueError(f"weight_scale must be one element (per tensor) or [{n}] / [{n}, 1] (per output channel), "
                         f"got shape {shape}")
    s = s.to(torch.float32)
    if not bool(torch.isfinite(s).all() and (s > 0).all()):
        raise ValueError("weight_scale must be finite and positive everywhere")
    return s


class FP8Linear(FrozenTensorsModule):
    """``y = x @ W.T + bias`` with W stored in E4M3 and the activations quantized to E4M3 with a static,
    calibrated ``input_scale`` (ModelOpt's FP8 recipe; see the module docstring for the GEMM).

    Tensors (parameters without gradients, :func:`~qwen_resnorm_fp4._linear_common.frozen`):
        weight: float8_e4m3fn [N, K], the E4M3 weight as quantized or loaded (W ~ weight * weight_scale).
        weight_scale: fp32 [1] (per tensor) or [N] (per output channel, ``per_channel=True``): amax(|W|) / 448.
        input_scale: fp32 [1]: the calibrated input amax / 448 (activations are quantized with 1 / input_scale).
        bias: optional bf16 [N], added inside the GEMM (fp32, before the one rounding).

    Attributes:
        in_features (K), out_features (N): positive multiples of 16;
        per_channel: whether ``weight_scale`` has one value per output channel (then the CUDA GEMM uses
            torch._scaled_mm's row-wise scaling);
        use_fast_accum: passed to torch._scaled_mm (default True, as SGLang and vLLM do; False: exact fp32
            accumulation on Hopper, slower).

    The tensors keep their dtypes whatever dtype the module is moved to (``.to(torch.bfloat16)`` moves nothing
    but the device): the E4M3 bytes and the fp32 scales are the format.
    """

    KEPT_DTYPES = ("weight", "weight_scale", "input_scale", "bias")  # the E4M3 bytes, the fp32 scales

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 device: Optional[Union[str, torch.device]] = None, per_channel: bool = False,
                 use_fast_accum: bool = True) -> None:
        super().__init__()
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if not (in_features > 0 and in_features % FP8_ALIGNMENT == 0):
            raise ValueError(f"in_features must be a positive multiple of {FP8_ALIGNMENT} (torch._scaled_mm), "
                             f"got {in_features}")
        if not (out_features > 0 and out_features % FP8_ALIGNMENT == 0):
            raise ValueError(f"out_features must be a positive multiple of {FP8_ALIGNMENT} (torch._scaled_mm), "
                             f"got {out_features}")
        for name, v in (("bias", bias), ("per_channel", per_channel), ("use_fast_accum", use_fast_accum)):
            check_bool(name, v)
        self.in_features = in_features
        self.out_features = out_features
        self.per_channel = per_channel
        self.use_fast_accum = use_fast_accum
        n, k = out_features, in_features
        f32 = dict(dtype=torch.float32, device=device)
        self.register_parameter("weight", frozen(torch.zeros((n, k), dtype=FP8_DTYPE, device=device)))
        self.register_parameter("weight_scale", frozen(torch.ones((n if per_channel else 1,), **f32)))
        self.register_parameter("input_scale", frozen(torch.ones((1,), **f32)))
        self.register_parameter("bias", frozen(torch.zeros((n,), dtype=torch.bfloat16, device=device)) if bias
                                else None)

    # --------------------------------------------------------------------------------------------------
    # Construction
    # --------------------------------------------------------------------------------------------------

    def _set(self, weight: Tensor, weight_scale: Tensor, input_scale: Tensor, bias: Optional[Tensor]) -> None:
        with torch.no_grad():
            self.weight.copy_(weight)
            self.weight_scale.copy_(weight_scale.reshape(self.weight_scale.shape))
            self.input_scale.copy_(input_scale.reshape(1))
            if bias is not None:
                self.bias.copy_(bias.detach())

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, input_amax: Union[float, Tensor], *, per_channel: bool = False,
                    use_fast_accum: bool = True) -> FP8Linear:
        """Quantize a ``torch.nn.Linear`` (on its device), ModelOpt's FP8 recipe:
        ``weight_scale = amax(|W|) / 448`` over the whole weight (or per output row with ``per_channel``; an
        all-zero weight or row reads amax 1), the weight quantized once, ``E4M3(clamp(W / weight_scale))``
        (round to nearest even, saturating), and ``input_scale = input_amax / 448``.

        ``input_amax``: the calibrated max |activation| (a positive float or one-element tensor). The bias
        is kept as bf16 (the GEMM's bias operand)."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        n, k = w.shape
        dev = w.device
        in_scale = positive_scalar("input_amax", input_amax, dev) / E4M3_MAX
        api.check_fp8_input_scale(in_scale)  # the ops' value rule: a normal fp32
        layer = cls(k, n, linear.bias is not None, device=dev, per_channel=per_channel,
                    use_fast_accum=use_fast_accum)
        wf = w.to(torch.float32)
        amax = wf.abs().nan_to_num().amax(dim=1) if per_channel else wf.abs().nan_to_num().amax().reshape(1)
        amax = torch.where(amax > 0, amax, torch.ones_like(amax))
        w_scale = amax / E4M3_MAX
        layer._set(quantize_fp8(wf, w_scale), w_scale, in_scale, linear.bias)
        return layer

    @classmethod
    def from_modelopt(cls, weight: Tensor, weight_scale: Tensor, input_scale: Union[float, Tensor],
                      bias: Optional[Tensor] = None, *, use_fast_accum: bool = True) -> FP8Linear:
        """A layer from NVIDIA ModelOpt's FP8 export of a Linear, as written (on ``weight``'s device).

        Args:
            weight: float8_e4m3fn [N, K] (``quant_algo: FP8``; safetensors ``F8_E4M3``): copied unchanged. A
                weight in any other dtype is refused (quantize a BF16 layer with :meth:`from_linear`).
            weight_scale: amax(|W|) / 448: one element (shape () or (1,), per tensor; what ModelOpt and
                SGLang's build_modelopt_fp8_transformer write) or [N] / [N, 1] (per output channel); any
                floating dtype, taken as fp32.
            input_scale: the calibrated input amax / 448, one element.
            bias: optional [N], kept as bf16.
            use_fast_accum: as for :class:`FP8Linear`.
        """
        if not isinstance(weight, Tensor) or weight.dtype != FP8_DTYPE:
            raise TypeError("weight must be ModelOpt's FP8 weight, a float8_e4m3fn tensor [N, K], got "
                            f"{weight.dtype if isinstance(weight, Tensor) else type(weight).__name__} "
                            "(a BF16 weight: FP8Linear.from_linear quantizes one)")
        if weight.dim() != 2:
            raise ValueError(f"weight must be [N, K], got shape {tuple(weight.shape)}")
        n, k = weight.shape
        dev = weight.device
        w_scale = _check_weight_scale(weight_scale, n).to(dev)
        in_scale = positive_scalar("input_scale", input_scale, dev)
        api.check_fp8_input_scale(in_scale)  # the ops' value rule: a normal fp32
        if bias is not None and (not isinstance(bias, Tensor) or tuple(bias.shape) != (n,)):
            raise ValueError(f"bias must be a tensor of shape ({n},), got "
                             f"{tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__}")
        layer = cls(k, n, bias is not None, device=dev, per_channel=w_scale.numel() != 1,
                    use_fast_accum=use_fast_accum)
        layer._set(weight.detach(), w_scale, in_scale, None if bias is None else bias.to(dev))
        return layer

    @classmethod
    def from_modelopt_state_dict(cls, state_dict: Mapping[str, Tensor], prefix: str = "",
                                 **kwargs: Any) -> FP8Linear:
        """:meth:`from_modelopt` from a module's keys in a ModelOpt FP8 checkpoint (or one written by SGLang's
        build_modelopt_fp8_transformer, the same keys): ``{prefix}weight``, ``{prefix}weight_scale``,
        ``{prefix}input_scale`` and, if present, ``{prefix}bias`` (``prefix`` e.g.
        ``"transformer_blocks.0.img_mlp.net.0.proj."``). ``kwargs`` go to :meth:`from_modelopt`."""
        needed = ("weight", "weight_scale", "input_scale")
        missing = [f"{prefix}{key}" for key in needed if f"{prefix}{key}" not in state_dict]
        if missing:
            raise KeyError(f"state_dict lacks {', '.join(missing)} (a ModelOpt FP8 export of a Linear has "
                           f"{', '.join(prefix + key for key in needed)})")
        return cls.from_modelopt(*(state_dict[f"{prefix}{key}"] for key in needed),
                                 bias=state_dict.get(f"{prefix}bias"), **kwargs)

    # --------------------------------------------------------------------------------------------------
    # Module plumbing
    # --------------------------------------------------------------------------------------------------

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Load a ModelOpt FP8 export's keys as written: a 0-dim ``weight_scale`` / ``input_scale`` (or an
        [N, 1] per-channel ``weight_scale``) fits the layer's tensors; a weight that is not E4M3 is refused (loading
        would quantize it silently), and so is an ``input_scale`` that is not one positive, normal fp32
        (:func:`~qwen_resnorm_fp4.check_fp8_input_scale`), before anything is copied."""
        w = state_dict.get(prefix + "weight")
        if isinstance(w, Tensor) and w.dtype != FP8_DTYPE:
            raise TypeError(f"{prefix}weight must be float8_e4m3fn (a ModelOpt FP8 export), got {w.dtype}")
        s_in = state_dict.get(prefix + "input_scale")
        if isinstance(s_in, Tensor) and s_in.device.type != "meta" and s_in.numel() == 1:
            try:  # the value rule the layer was built under: a refused scale would make every output NaN
                api.check_fp8_input_scale(s_in.detach().to(torch.float32).reshape(1))
            except (TypeError, ValueError) as e:
                raise ValueError(f"{prefix}input_scale: {e}") from None
        for name in ("weight_scale", "input_scale"):
            t = state_dict.get(prefix + name)
            buf = getattr(self, name)
            if isinstance(t, Tensor) and t.numel() == buf.numel() and tuple(t.shape) != tuple(buf.shape):
                state_dict = dict(state_dict)
                state_dict[prefix + name] = t.reshape(buf.shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # --------------------------------------------------------------------------------------------------
    # Forward
    # --------------------------------------------------------------------------------------------------

    def input_amax(self) -> float:
        """The input amax the layer's input_scale stands for: ``input_scale * 448``, the inverse of
        :meth:`from_linear`'s rule (reads the tensor: a synchronisation on CUDA)."""
        return float(self.input_scale.float().item()) * E4M3_MAX

    def quantize_input(self, x: Tensor) -> Tensor:
        """E4M3 of bf16 ``x`` [..., K] with this layer's input scale (:func:`~qwen_resnorm_fp4.fp8_quantize`)."""
        return api.fp8_quantize(x, self.input_scale)

    def forward(self, x: Tensor) -> Tensor:
        """``x``: bf16 [..., K] (quantized here) or float8_e4m3fn [..., K] (already quantized with
        ``input_scale``, e.g. by a fused FP8 op) -> bf16 [..., N]."""
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a tensor, got {type(x).__name__}")
        if x.dtype not in (torch.bfloat16, FP8_DTYPE):
            raise TypeError(f"x must be a bfloat16 or float8_e4m3fn tensor, got {x.dtype}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"x must be [..., {self.in_features}], got shape {tuple(x.shape)}")
        q = self.quantize_input(x) if x.dtype == torch.bfloat16 else x
        if q.device != self.weight.device:
            raise ValueError(f"x is on {q.device} but the layer's weight is on {self.weight.device}")
        lead = q.shape[:-1]
        a = q.reshape(-1, self.in_features)
        if a.device.type == "cuda":
            out = self._scaled_mm(a)
        else:
            out = fp8_linear_reference(a, self.weight, self.weight_scale, self.input_scale, self.bias)
        return out.reshape(*lead, self.out_features)

    def _scaled_mm(self, a: Tensor) -> Tensor:
        """torch._scaled_mm on E4M3 activations [M, K] (row-major) and the weight (column-major [K, N]); traced,
        one opaque op (:func:`_fp8_scaled_mm_traced`), so every compile mode runs eager's GEMM."""
        a = a.contiguous()
        mm = _fp8_scaled_mm_traced if torch.compiler.is_compiling() else _fp8_scaled_mm
        if self.per_channel:  # row-wise on both operands: scale_a [M, 1], scale_b [1, N], both contiguous
            scale_a = self.input_scale.reshape(1, 1).expand(a.shape[0], 1).contiguous()
            scale_b = self.weight_scale.reshape(1, self.out_features)
            if self.bias is not None:  # no row-wise bias epilogue (not every shape has one): bf16 out, + bias
                return mm(a, self.weight, scale_a, scale_b, None, self.use_fast_accum) + self.bias
        else:
            scale_a, scale_b = self.input_scale, self.weight_scale
        return mm(a, self.weight, scale_a, scale_b, self.bias, self.use_fast_accum)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"per_channel={self.per_channel}, use_fast_accum={self.use_fast_accum}")


def _fp8_scaled_mm(a: Tensor, weight: Tensor, scale_a: Tensor, scale_b: Tensor, bias: Optional[Tensor],
                   use_fast_accum: bool) -> Tensor:
    """bf16 ``a @ weight.T`` of E4M3 ``a`` [M, K] and ``weight`` [N, K] with their scales (+ ``bias``), by
    ``torch._scaled_mm`` (cuBLASLt)."""
    return torch._scaled_mm(a, weight.t(), scale_a, scale_b, bias=bias, out_dtype=torch.bfloat16,
                            use_fast_accum=use_fast_accum)


# Traced code calls the GEMM as one opaque op: inductor lowers a raw aten._scaled_mm by mode, and its max-autotune
# lowering fails on a 1-D bias (torch 2.11: tuned_scaled_mm hands the bias unexpanded to the Triton template's
# epilogue) or may pick a Triton GEMM whose sums differ from eager's; the op runs eager's call in every mode.
_fp8_scaled_mm_traced = torch.library.custom_op(
    "qwen_fp4::_fp8_scaled_mm", _fp8_scaled_mm, mutates_args=(),
    schema="(Tensor a, Tensor weight, Tensor scale_a, Tensor scale_b, Tensor? bias, bool use_fast_accum) -> Tensor")


@_fp8_scaled_mm_traced.register_fake
def _fp8_scaled_mm_fake(a: Tensor, weight: Tensor, scale_a: Tensor, scale_b: Tensor, bias: Optional[Tensor],
                        use_fast_accum: bool) -> Tensor:
    return a.new_empty((a.shape[0], weight.shape[0]), dtype=torch.bfloat16)


def fp8_linear_reference(a: Tensor, weight: Tensor, weight_scale: Tensor, input_scale: Tensor,
                         bias: Optional[Tensor]) -> Tensor:
    """The dequantized reference of the FP8 GEMM: bf16(((a @ W.T) in fp32 on the E4M3 values) * input_scale *
    weight_scale + bias). ``a``: float8_e4m3fn [M, K]; ``weight``: float8_e4m3fn [N, K]; ``weight_scale``:
    fp32 [1] or [N]; ``input_scale``: fp32 [1]; ``bias``: [N] or None."""
    acc = a.to(torch.float32) @ weight.to(torch.float32).t()
    out = acc * (input_scale.to(torch.float32) * weight_scale.to(torch.float32))
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(torch.bfloat16)


__all__ = ["FP8Linear", "E4M3_MAX", "FP8_ALIGNMENT", "is_fp8_linear_shape", "quantize_fp8",
           "fp8_linear_reference"]
