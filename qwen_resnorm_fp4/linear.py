"""``NVFP4Linear``: a linear layer with NVFP4 weights that takes BF16 activations or already-quantized ones.

``layer(x)`` for a BF16 tensor ``x`` [..., K] quantizes it (:func:`~qwen_resnorm_fp4.nvfp4_quantize` with the
layer's ``input_global_scale``, the production recipe) and runs
:func:`~qwen_resnorm_fp4.gemm.apply_nvfp4_gemm_prequantized`; ``layer((packed, scales))`` skips the
quantization: that is how the output of :func:`~qwen_resnorm_fp4.try_fused_resnorm_quant` is consumed.
Given the same activations, the two forms return the same bits.

Layers come from a ``torch.nn.Linear`` (:meth:`NVFP4Linear.from_linear`, quantized here) or from NVIDIA
ModelOpt's NVFP4 export as it is (:meth:`NVFP4Linear.from_modelopt`, :meth:`NVFP4Linear.from_modelopt_state_dict`:
the same E2M1 bytes, the block scales only moved into the 128x4 layout, nothing re-quantized).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import torch

from .api import nvfp4_quantize
from .env import resolve_fast_math
from .recipe import UNSET, global_scale_numerator, nvfp4_4over6_code, resolve_config
from .gemm import GemmCache, apply_nvfp4_gemm_prequantized, check_gemm_backend, host_alpha
from ._linear_common import FrozenTensorsModule, frozen, positive_scalar
from .constants import FP4_AMAX_SCALE  # global scale = FP4_AMAX_SCALE / amax (4over6 with e4m3_max 256: recipe)
from .layout import packed_shape, scales_shape, swizzle_scales_128x4
from .validation import WIDTH_RULE, is_supported_width

Tensor = torch.Tensor


def _global_scale_from_amax(amax: Tensor, nvfp4_4over6_code: int) -> Tensor:
    """fp32 [1]: e4m3_max * 6 / amax (448 * 6, or 256 * 6 for a 4over6 recipe with e4m3_max 256), with
    amax = 0 (an all-zero tensor) read as 1."""
    amax = amax.reshape(1).to(torch.float32)
    amax = torch.where(amax > 0, amax, torch.ones_like(amax))
    numerator = global_scale_numerator(nvfp4_4over6_code)
    return torch.tensor([numerator], dtype=torch.float32, device=amax.device) / amax


class NVFP4Linear(FrozenTensorsModule):
    """``y = x @ W.T + bias`` with W stored in NVFP4 (E2M1 values, E4M3 scales per 16 inputs, one fp32 global
    scale) and the activations quantized to NVFP4 with a calibrated global scale.

    Tensors (parameters without gradients, :func:`~qwen_resnorm_fp4._linear_common.frozen`):
        weight_packed: uint8 [N, K/2], two E2M1 codes a byte (even input index in the low nibble).
        weight_scales: uint8 [round_up(N, 128), K/16], E4M3 block scales, 128x4 swizzled.
        weight_global_scale: fp32 [1], 448 * 6 / amax(|W|) (e4m3_max * 6 for a 4over6 recipe).
        input_global_scale: fp32 [1], 448 * 6 / input_amax (the calibrated activation range; likewise).
        alpha: fp32 [1], 1 / (input_global_scale * weight_global_scale): the GEMM's output scale.
        bias: optional [N] (bf16 or fp32), added in fp32 after the GEMM.

    Attributes:
        in_features (K, a multiple of 64, at most 16384), out_features (N);
        fast_math: the activation quantizer's mode (None follows the environment at call time, like the
            production quantizer; the gate uses it too, so that fused and unfused bytes agree);
        nvfp4_4over6: the block-scale recipe of the activations (and of a weight quantized by
            :meth:`from_linear`): a config of qwen_resnorm_fp4.recipe, or None for the standard recipe;
            resolved once when the layer is made, since its global scales follow it, from the
            ``nvfp4_4over6=`` argument (omitted: the FLASHINFER_NVFP4_4OVER6* environment then);
            ``nvfp4_4over6_code`` is its code;
        gemm_backend: the ``backend`` passed to :func:`apply_nvfp4_gemm_prequantized` ("auto" by default:
            FlashInfer on Blackwell, "tensor_core" on other CUDA GPUs, "reference" on CPU);
        cache_dequantized_weight: keep the tensor-core path's bf16 weight operand (N * K * 2 bytes) instead of
            dequantizing the weight on every call (False by default; setting it False frees the copy).
    """

    KEPT_DTYPES = ("weight_global_scale", "input_global_scale", "alpha")  # fp32 whatever the module's dtype

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 device: Optional[Union[str, torch.device]] = None, bias_dtype: torch.dtype = torch.bfloat16,
                 fast_math: Optional[bool] = None, gemm_backend: str = "auto",
                 cache_dequantized_weight: bool = False, nvfp4_4over6: Any = UNSET) -> None:
        super().__init__()
        if not is_supported_width(in_features):
            raise ValueError(f"in_features must be {WIDTH_RULE}, got {in_features}")
        if out_features <= 0:
            raise ValueError(f"out_features must be positive, got {out_features}")
        check_gemm_backend(gemm_backend)
        resolve_fast_math(fast_math)  # refused now, not at the first call
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.fast_math = fast_math
        self.nvfp4_4over6 = resolve_config(nvfp4_4over6)
        self.gemm_backend = gemm_backend
        k, n = self.in_features, self.out_features
        u8 = dict(dtype=torch.uint8, device=device)
        f32 = dict(dtype=torch.float32, device=device)
        self.register_parameter("weight_packed", frozen(torch.zeros(packed_shape(n, k), **u8)))
        self.register_parameter("weight_scales", frozen(torch.zeros(scales_shape(n, k), **u8)))
        self.register_parameter("weight_global_scale", frozen(torch.ones((1,), **f32)))
        self.register_parameter("input_global_scale", frozen(torch.ones((1,), **f32)))
        self.register_parameter("alpha", frozen(torch.ones((1,), **f32)))
        self.register_parameter("bias", frozen(torch.zeros((n,), dtype=bias_dtype, device=device)) if bias else None)
        #: What the GEMM keeps between calls (made from the tensors; emptied when they are replaced).
        self.gemm_cache = GemmCache()
        self.cache_dequantized_weight = cache_dequantized_weight
        self.register_load_state_dict_post_hook(_after_load_state_dict)

    def _apply(self, fn, recurse=True):
        """``module.to(dtype)`` / ``.half()`` / ``.bfloat16()`` move the tensors but keep the global scales and
        alpha fp32 (the quantizer and the fused path require it; a cast would also round them), and drop the
        caches made from the old tensors."""
        super()._apply(fn, recurse)
        _after_load_state_dict(self, None)
        return self

    @property
    def nvfp4_4over6_code(self) -> int:
        """The ops' code of the layer's recipe (0: the standard recipe)."""
        return nvfp4_4over6_code(self.nvfp4_4over6)

    @property
    def cache_dequantized_weight(self) -> bool:
        """Whether the tensor-core path keeps the bf16 weight operand on the layer (see the class docstring)."""
        return self._cache_dequantized_weight

    @cache_dequantized_weight.setter
    def cache_dequantized_weight(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"cache_dequantized_weight must be a bool, got {type(value).__name__}")
        self._cache_dequantized_weight = value
        if not value:
            self.gemm_cache.weight_bf16 = None

    def _set_quantized(self, packed: Tensor, scales: Tensor, weight_global_scale: Tensor,
                       input_global_scale: Tensor, alpha: Tensor, bias: Optional[Tensor]) -> None:
        """Copy a quantized weight and its scales into the layer's tensors; read alpha to the host once."""
        with torch.no_grad():
            self.weight_packed.copy_(packed)
            self.weight_scales.copy_(scales.reshape(self.weight_scales.shape))
            self.weight_global_scale.copy_(weight_global_scale)
            self.input_global_scale.copy_(input_global_scale)
            self.alpha.copy_(alpha)
            if bias is not None:
                self.bias.copy_(bias.detach())
        host_alpha(self, self.gemm_cache)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, input_amax: Union[float, Tensor], fast_math: Optional[bool] = None,
                    *, gemm_backend: str = "auto", cache_dequantized_weight: bool = False,
                    nvfp4_4over6: Any = UNSET) -> NVFP4Linear:
        """Quantize a ``torch.nn.Linear`` (on its device): weight global scale 448*6/amax(|W|), the weight
        quantized with :func:`~qwen_resnorm_fp4.nvfp4_quantize` (the production recipe; the CPU reference on
        the CPU, the kernel on a GPU), input global scale 448*6/``input_amax``. ``nvfp4_4over6``: the recipe
        of both (as for :class:`NVFP4Linear`); with e4m3_max 256 the global scales are 256*6/amax.

        A weight that is not bf16 is rounded to bf16 first (the quantizer reads bf16). ``input_amax`` is the
        calibrated max |activation| (a positive float or one-element tensor). ``fast_math`` is used for the
        weights now and stored for the activations (None: the environment, at each call).
        """
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        w = linear.weight.detach()
        n, k = w.shape
        dev = w.device
        amax_in = torch.as_tensor(input_amax, dtype=torch.float32).detach().to(dev).reshape(-1)
        if amax_in.numel() != 1:
            raise ValueError(f"input_amax must be one number, got {amax_in.numel()} elements")
        amax_in_value = float(amax_in.item())  # an offline conversion: a host sync is fine here
        if not (math.isfinite(amax_in_value) and amax_in_value > 0):
            raise ValueError(f"input_amax must be finite and positive, got {amax_in_value}")
        bias = linear.bias
        layer = cls(k, n, bias is not None, device=dev,
                    bias_dtype=bias.dtype if bias is not None else torch.bfloat16,
                    fast_math=fast_math, gemm_backend=gemm_backend,
                    cache_dequantized_weight=cache_dequantized_weight, nvfp4_4over6=nvfp4_4over6)
        code = layer.nvfp4_4over6_code
        wb = w.to(torch.bfloat16).contiguous()
        w_amax = wb.float().abs().nan_to_num().amax()
        wgs = _global_scale_from_amax(w_amax, code)
        packed, scales = nvfp4_quantize(wb, wgs, fast_math, nvfp4_4over6=layer.nvfp4_4over6)
        igs = _global_scale_from_amax(amax_in, code)
        layer._set_quantized(packed, scales, wgs, igs, torch.ones_like(igs) / (igs * wgs), bias)
        return layer

    @classmethod
    def from_modelopt(cls, weight: Tensor, weight_scale: Tensor, weight_scale_2: Union[float, Tensor],
                      input_scale: Union[float, Tensor], bias: Optional[Tensor] = None, *,
                      fast_math: Optional[bool] = None, gemm_backend: str = "auto",
                      cache_dequantized_weight: bool = False, nvfp4_4over6: Any = UNSET) -> NVFP4Linear:
        """A layer from NVIDIA ModelOpt's NVFP4 export of a Linear, as it is (on ``weight``'s device).

        Args:
            weight: uint8 [N, K/2], two E2M1 codes a byte, even input index in the low nibble (ModelOpt's
                ``NVFP4QTensor`` packing, the same as this library's): copied unchanged.
            weight_scale: E4M3 block scales [N, K/16] in the row-major (linear) layout, float8_e4m3fn or uint8:
                the same bytes, moved once into the 128x4 layout (:func:`swizzle_scales_128x4`).
            weight_scale_2: fp32 scalar, amax(|W|) / (6 * 448): the inverse of this library's weight global
                scale (weight_global_scale = 1 / weight_scale_2).
            input_scale: fp32 scalar, the calibrated input amax / (6 * 448) (input_global_scale = 1 /
                input_scale: the activations are quantized with it).
            bias: optional [N], kept in its dtype.
            fast_math, gemm_backend, cache_dequantized_weight, nvfp4_4over6: as for :class:`NVFP4Linear` (the
                recipe of the activations; the export's scales are taken as they are).

        ``alpha = input_scale * weight_scale_2`` (fp32), as ModelOpt's consumers compute it; nothing is
        re-quantized.
        """
        if not isinstance(weight, torch.Tensor) or weight.dtype != torch.uint8 or weight.dim() != 2:
            raise TypeError("weight must be ModelOpt's packed NVFP4 weight: a uint8 tensor [N, K/2]")
        n, k = weight.shape[0], weight.shape[1] * 2
        if not is_supported_width(k):
            raise ValueError(f"weight holds K = {k} inputs per row; K must be {WIDTH_RULE}")
        if not isinstance(weight_scale, torch.Tensor) or weight_scale.dtype not in (torch.float8_e4m3fn, torch.uint8):
            raise TypeError("weight_scale must be ModelOpt's E4M3 block scales: a float8_e4m3fn or uint8 tensor")
        if tuple(weight_scale.shape) != (n, k // 16):
            raise ValueError(f"weight_scale must be [N, K/16] = [{n}, {k // 16}] (row-major, one scale per 16 "
                             f"inputs), got shape {tuple(weight_scale.shape)}")
        if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n,)):
            raise ValueError(f"bias must be a tensor of shape ({n},), got "
                             f"{tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__}")
        dev = weight.device
        ws2 = positive_scalar("weight_scale_2", weight_scale_2, dev)
        in_scale = positive_scalar("input_scale", input_scale, dev)
        layer = cls(k, n, bias is not None, device=dev,
                    bias_dtype=bias.dtype if bias is not None else torch.bfloat16, fast_math=fast_math,
                    gemm_backend=gemm_backend, cache_dequantized_weight=cache_dequantized_weight,
                    nvfp4_4over6=nvfp4_4over6)
        scales = swizzle_scales_128x4(weight_scale.detach().to(dev).contiguous(), n, k)
        one = torch.ones((1,), dtype=torch.float32, device=dev)
        layer._set_quantized(weight.detach(), scales, one / ws2, one / in_scale, in_scale * ws2,
                             None if bias is None else bias.to(dev))
        return layer

    @classmethod
    def from_modelopt_state_dict(cls, state_dict: Mapping[str, Tensor], prefix: str = "",
                                 **kwargs: Any) -> NVFP4Linear:
        """:meth:`from_modelopt` from a module's keys in a ModelOpt NVFP4 checkpoint: ``{prefix}weight``,
        ``{prefix}weight_scale``, ``{prefix}weight_scale_2``, ``{prefix}input_scale`` and, if present,
        ``{prefix}bias`` (``prefix`` e.g. ``"transformer_blocks.0.img_mlp.net.0.proj."``). ``kwargs`` go to
        :meth:`from_modelopt`."""
        needed = ("weight", "weight_scale", "weight_scale_2", "input_scale")
        missing = [f"{prefix}{key}" for key in needed if f"{prefix}{key}" not in state_dict]
        if missing:
            raise KeyError(f"state_dict lacks {', '.join(missing)} (a ModelOpt NVFP4 export of a Linear has "
                           f"{', '.join(prefix + key for key in needed)})")
        return cls.from_modelopt(*(state_dict[f"{prefix}{key}"] for key in needed),
                                 bias=state_dict.get(f"{prefix}bias"), **kwargs)

    def input_amax(self) -> float:
        """The input amax the layer's input global scale stands for: ``e4m3_max * 6 / input_global_scale``, the
        inverse of :meth:`from_linear`'s rule (reads the tensor: a synchronisation on CUDA)."""
        return global_scale_numerator(self.nvfp4_4over6_code) / float(self.input_global_scale.float().item())

    def quantize_input(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """NVFP4 of bf16 ``x`` [..., K] with this layer's input global scale: (packed [M, K/2], scales)."""
        return nvfp4_quantize(x, self.input_global_scale, self.fast_math, nvfp4_4over6=self.nvfp4_4over6)

    def forward(self, x: Union[Tensor, Tuple[Tensor, Tensor]], out_shape: Optional[Sequence[int]] = None) -> Tensor:
        """``x``: bf16 [..., K] (quantized here) -> bf16 [..., N]; or ``(packed, scales)`` (already quantized
        with ``input_global_scale``, e.g. by :func:`~qwen_resnorm_fp4.try_fused_resnorm_quant`) -> bf16 [M, N],
        or [*out_shape, N] when ``out_shape`` (the leading dims, e.g. ``x.shape[:-1]``) is given."""
        if isinstance(x, (tuple, list)):
            if len(x) != 2:
                raise TypeError("a pre-quantized input must be a pair (packed, scales)")
            packed, scales = x
            out = apply_nvfp4_gemm_prequantized(self, packed, scales, torch.bfloat16, backend=self.gemm_backend)
            return out if out_shape is None else out.reshape(*out_shape, self.out_features)
        if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16:
            raise TypeError(f"x must be a bfloat16 tensor or a (packed, scales) pair, got "
                            f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"x must be [..., {self.in_features}], got shape {tuple(x.shape)}")
        lead = x.shape[:-1] if out_shape is None else tuple(out_shape)
        packed, scales = self.quantize_input(x)
        out = apply_nvfp4_gemm_prequantized(self, packed, scales, torch.bfloat16, backend=self.gemm_backend)
        return out.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"fast_math={self.fast_math}, nvfp4_4over6={self.nvfp4_4over6!r}, gemm_backend={self.gemm_backend!r}, "
                f"cache_dequantized_weight={self.cache_dequantized_weight}")


def _after_load_state_dict(module: NVFP4Linear, incompatible_keys: Any) -> None:
    """New tensors: drop every cache made from the old ones (the bf16 weight, the N-padded weight, the host
    alpha: for inference tensors their keys cannot see an in-place copy) and read alpha to the host again (so
    that a torch.compile trace made later sees the loaded value)."""
    module.gemm_cache.clear()
    if module.alpha.device.type != "meta":
        host_alpha(module, module.gemm_cache)


__all__ = ["NVFP4Linear", "FP4_AMAX_SCALE", "swizzle_scales_128x4"]
