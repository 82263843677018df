"""NVFP4Linear.from_modelopt / from_modelopt_state_dict against NVIDIA ModelOpt itself (skipped when
``modelopt`` does not import): weights quantized by ``NVFP4QTensor.quantize`` on CPU, the layer built from
ModelOpt's export tensors as they are.

What is bit-exact and why:
- the packed bytes are ModelOpt's, unchanged, and the swizzled scales hold ModelOpt's bytes at the 128x4
  offsets (padding zero);
- ModelOpt's dequantization is fp32(e2m1 * fp32(e4m3 * weight_scale_2)); the same expression evaluated on the
  layer's own bytes (decoded through this library's E2M1 table and scale layout) equals it bit for bit, which
  checks the nibble order, the code table and the layout;
- with ``double_scale = 1`` ModelOpt's dequantization is e2m1 * e4m3, which equals the tensor-core path's bf16
  operand (``dequantize_to_bf16``) bit for bit.
One exception in both, by design: ModelOpt's E2M1 table maps code 8 (sign set, magnitude 0) to +0, this
library (like cuda_fp4.h) to -0, so those elements differ in the sign of zero only; -0 and +0 contribute the
same to every GEMM.
Not bit-exact: this library's reference dequantization divides by the global scale 1 / weight_scale_2 (itself
rounded to fp32), ModelOpt multiplies by the rounded product e4m3 * weight_scale_2; both round the same exact
value at most twice in fp32, so they agree to 2^-22 relative.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from qwen_resnorm_fp4 import reference
from qwen_resnorm_fp4.api import dequantize_to_bf16
from qwen_resnorm_fp4.gemm import apply_nvfp4_gemm_prequantized
from qwen_resnorm_fp4.layout import round_up, sf_offsets
from qwen_resnorm_fp4.linear import NVFP4Linear

from helpers.reliability import as_bits, rel_err

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    nvfp4_tensor = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor")
NVFP4QTensor = nvfp4_tensor.NVFP4QTensor


def modelopt_export(n: int, k: int, seed: int, input_amax: float = 5.0):
    """ModelOpt's NVFP4 export of a random bf16 Linear: (weight, weight_scale, weight_scale_2, input_scale,
    the bf16 weight, the QTensor)."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * k ** -0.5).bfloat16()
    w[0, :16] = 0  # a zero block: ModelOpt writes its scale as 1.0 (then clamped to E4M3)
    qt, weight_scale, weight_scale_2 = NVFP4QTensor.quantize(w, 16)
    input_scale = torch.tensor(input_amax / (6 * 448), dtype=torch.float32)
    return qt._quantized_data, weight_scale, weight_scale_2, input_scale, w, qt


def modelopt_dequantize(qt, weight_scale, double_scale) -> torch.Tensor:
    return qt.dequantize(dtype=torch.float32, scale=weight_scale, double_scale=double_scale, block_sizes={-1: 16})


def assert_same_bits_but_zero_sign(ours: torch.Tensor, theirs: torch.Tensor, codes: torch.Tensor) -> None:
    """Bit-equal except where the code is 8 (-0 here, +0 in ModelOpt's table)."""
    negative_zero = codes == 8
    assert negative_zero.any()
    assert torch.equal(as_bits(ours)[~negative_zero], as_bits(theirs)[~negative_zero])
    assert (as_bits(ours)[negative_zero] == as_bits(torch.tensor(-0.0))).all()
    assert (as_bits(theirs)[negative_zero] == 0).all()


@pytest.mark.parametrize("n,k", [(96, 128), (300, 3072)])
def test_from_modelopt_keeps_the_bytes(n, k):
    weight, ws, ws2, in_scale, _, qt = modelopt_export(n, k, seed=n)
    assert weight.dtype == torch.uint8 and weight.shape == (n, k // 2)
    assert ws.dtype == torch.float8_e4m3fn and ws.shape == (n, k // 16)
    layer = NVFP4Linear.from_modelopt(weight, ws, ws2, in_scale)
    assert torch.equal(layer.weight_packed, weight)
    assert layer.weight_scales.shape == (round_up(n, 128), k // 16)
    flat = layer.weight_scales.reshape(-1)
    offs = sf_offsets(n, k).reshape(-1)
    assert torch.equal(flat[offs], ws.view(torch.uint8).reshape(-1))
    padding = torch.ones(flat.numel(), dtype=torch.bool)
    padding[offs] = False
    assert (flat[padding] == 0).all()
    # the scalars: ours are the inverses, alpha is ModelOpt's product
    assert torch.equal(layer.alpha, (in_scale * ws2).reshape(1))
    assert torch.equal(layer.weight_global_scale, 1.0 / ws2.reshape(1))
    assert torch.equal(layer.input_global_scale, 1.0 / in_scale.reshape(1))


@pytest.mark.parametrize("n,k", [(96, 128), (300, 3072)])
def test_dequantization_equals_modelopt(n, k):
    weight, ws, ws2, in_scale, w, qt = modelopt_export(n, k, seed=n + 1)
    layer = NVFP4Linear.from_modelopt(weight, ws.view(torch.uint8), ws2, in_scale)  # uint8 scales accepted too
    theirs = modelopt_dequantize(qt, ws, ws2)
    # ModelOpt's expression on the layer's own bytes
    packed = layer.weight_packed
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(n, k)
    sf = reference.e4m3_to_float(layer.weight_scales.reshape(-1)[sf_offsets(n, k).reshape(-1)]).reshape(n, k // 16)
    ours = (reference.e2m1_value(codes).reshape(n, k // 16, 16) * (sf * ws2.float()).unsqueeze(-1)).reshape(n, k)
    assert_same_bits_but_zero_sign(ours, theirs, codes)
    # the tensor-core operand is ModelOpt's value without weight_scale_2
    unscaled = modelopt_dequantize(qt, ws, torch.tensor(1.0))
    assert_same_bits_but_zero_sign(dequantize_to_bf16(layer.weight_packed, layer.weight_scales).float(), unscaled,
                                   codes)
    # the reference's division by 1 / weight_scale_2: the same value within two fp32 roundings
    ref = reference.dequantize_nvfp4(layer.weight_packed, layer.weight_scales, layer.weight_global_scale, n)
    assert ((ref - theirs).abs() <= theirs.abs() * 2.0 ** -22).all()
    assert rel_err(theirs, w) < 0.15  # and it is the weight, quantized


@pytest.mark.parametrize("backend", ["reference", "tensor_core"])
def test_modelopt_layer_forward(backend):
    n, k = 160, 512
    weight, ws, ws2, _, w, qt = modelopt_export(n, k, seed=3)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(33, k, generator=g).bfloat16()
    bias = torch.randn(n, generator=g).bfloat16()
    in_scale = x.float().abs().amax() / (6 * 448)
    layer = NVFP4Linear.from_modelopt(weight, ws, ws2, in_scale, bias=bias, gemm_backend=backend)
    out = layer(x)
    assert out.dtype == torch.bfloat16 and out.shape == (33, n)
    expect = x.float() @ modelopt_dequantize(qt, ws, ws2).t() + bias.float()
    assert rel_err(out, expect) < 0.15  # the activation quantization's error only
    packed, scales = layer.quantize_input(x)
    assert torch.equal(layer((packed, scales)), out)
    other = "tensor_core" if backend == "reference" else "reference"
    assert rel_err(apply_nvfp4_gemm_prequantized(layer, packed, scales, torch.float32, backend=other),
                   apply_nvfp4_gemm_prequantized(layer, packed, scales, torch.float32, backend=backend)) < 1e-5


def test_from_modelopt_state_dict():
    n, k = 96, 128
    weight, ws, ws2, in_scale, _, _ = modelopt_export(n, k, seed=5)
    bias = torch.randn(n).bfloat16()
    prefix = "transformer_blocks.0.img_mlp.net.0.proj."
    sd = {f"{prefix}weight": weight, f"{prefix}weight_scale": ws, f"{prefix}weight_scale_2": ws2,
          f"{prefix}input_scale": in_scale, f"{prefix}bias": bias, "other.weight": torch.zeros(3)}
    layer = NVFP4Linear.from_modelopt_state_dict(sd, prefix, gemm_backend="tensor_core")
    direct = NVFP4Linear.from_modelopt(weight, ws, ws2, in_scale, bias=bias)
    for name, t in direct.state_dict().items():
        assert torch.equal(layer.state_dict()[name], t), name
    assert layer.gemm_backend == "tensor_core"
    del sd[f"{prefix}bias"]
    assert NVFP4Linear.from_modelopt_state_dict(sd, prefix).bias is None
    del sd[f"{prefix}input_scale"]
    with pytest.raises(KeyError, match="input_scale"):
        NVFP4Linear.from_modelopt_state_dict(sd, prefix)


def test_from_modelopt_errors():
    weight, ws, ws2, in_scale, _, _ = modelopt_export(96, 128, seed=6)
    with pytest.raises(TypeError, match="weight"):
        NVFP4Linear.from_modelopt(weight.to(torch.int8), ws, ws2, in_scale)
    with pytest.raises(TypeError, match="weight_scale"):
        NVFP4Linear.from_modelopt(weight, ws.float(), ws2, in_scale)
    with pytest.raises(ValueError, match="weight_scale must be"):
        NVFP4Linear.from_modelopt(weight, ws[:, :4], ws2, in_scale)
    with pytest.raises(ValueError, match="weight_scale_2"):
        NVFP4Linear.from_modelopt(weight, ws, torch.tensor(0.0), in_scale)
    with pytest.raises(ValueError, match="input_scale"):
        NVFP4Linear.from_modelopt(weight, ws, ws2, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="bias"):
        NVFP4Linear.from_modelopt(weight, ws, ws2, in_scale, bias=torch.zeros(5))
    with pytest.raises(ValueError, match="K"):
        NVFP4Linear.from_modelopt(weight[:, :16], ws[:, :2], ws2, in_scale)
