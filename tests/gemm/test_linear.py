"""NVFP4Linear and apply_nvfp4_gemm_prequantized: conversion, dequantization against the reference,
prequantized == regular forward bit for bit, accuracy against the BF16 linear, and on GPUs the same
identities for the portable path and for each FlashInfer backend (Blackwell only)."""

from __future__ import annotations

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import reference
from qwen_resnorm_fp4.gemm import BACKENDS, apply_nvfp4_gemm_prequantized, flashinfer_mm_fp4, flashinfer_serves
from qwen_resnorm_fp4.layout import round_up
from qwen_resnorm_fp4.linear import FP4_AMAX_SCALE, NVFP4Linear

from helpers.reliability import CUDA_OK, rel_err  # noqa: E402


def make_linear(K=128, N=96, bias=True, seed=0, dtype=torch.bfloat16, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(K, N, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=g) * K ** -0.5)
        if bias:
            lin.bias.copy_(torch.randn(N, generator=g) * 0.1)
    return lin.to(dtype=dtype, device=device)


def make_x(*lead, K=128, seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*lead, K, generator=g).bfloat16().to(device)


# --------------------------------------------------------------------------------------------------
# Conversion
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("N", [96, 100, 256])
def test_from_linear_tensors(N):
    K = 128
    lin = make_linear(K, N)
    layer = NVFP4Linear.from_linear(lin, 5.0)
    assert layer.in_features == K and layer.out_features == N
    assert layer.weight_packed.dtype == torch.uint8 and layer.weight_packed.shape == (N, K // 2)
    assert layer.weight_scales.dtype == torch.uint8 and layer.weight_scales.shape == (round_up(N, 128), K // 16)
    for name in ("weight_global_scale", "input_global_scale", "alpha"):
        t = getattr(layer, name)
        assert t.dtype == torch.float32 and t.shape == (1,)
    amax = lin.weight.float().abs().max().reshape(1)
    assert torch.equal(layer.weight_global_scale, torch.tensor([FP4_AMAX_SCALE]) / amax)
    assert torch.equal(layer.input_global_scale, torch.tensor([FP4_AMAX_SCALE]) / torch.tensor([5.0]))
    assert torch.equal(layer.alpha, 1.0 / (layer.input_global_scale * layer.weight_global_scale))
    assert torch.equal(layer.bias, lin.bias.detach())
    # the weight bytes are the production recipe (the reference on CPU), padding rows of the scales zero
    packed, scales = reference.nvfp4_quantize(lin.weight.detach(), layer.weight_global_scale, True)
    assert torch.equal(layer.weight_packed, packed) and torch.equal(layer.weight_scales, scales)
    # input_amax as a tensor gives the same layer
    layer2 = NVFP4Linear.from_linear(lin, torch.tensor(5.0))
    assert torch.equal(layer2.input_global_scale, layer.input_global_scale)
    assert NVFP4Linear.from_linear(make_linear(K, N, bias=False), 5.0).bias is None


def test_from_linear_fast_math_and_fp32_weight(monkeypatch):
    lin = make_linear(dtype=torch.float32)
    layer = NVFP4Linear.from_linear(lin, 4.0, fast_math=False)
    assert layer.fast_math is False
    wb = lin.weight.detach().bfloat16()
    packed, scales = reference.nvfp4_quantize(wb, layer.weight_global_scale, False)
    assert torch.equal(layer.weight_packed, packed) and torch.equal(layer.weight_scales, scales)
    assert layer.bias.dtype == torch.float32


def test_from_linear_errors():
    with pytest.raises(TypeError):
        NVFP4Linear.from_linear(torch.nn.Conv1d(4, 4, 1), 1.0)
    with pytest.raises(ValueError):
        NVFP4Linear.from_linear(make_linear(), 0.0)
    with pytest.raises(ValueError):
        NVFP4Linear.from_linear(make_linear(), float("inf"))
    with pytest.raises(ValueError):
        NVFP4Linear.from_linear(make_linear(K=96), 1.0)  # K must be a multiple of 64
    with pytest.raises(ValueError):
        NVFP4Linear(128, 32, gemm_backend="trtllm")


def test_zero_weight():
    lin = make_linear()
    with torch.no_grad():
        lin.weight.zero_()
    layer = NVFP4Linear.from_linear(lin, 1.0)
    assert torch.isfinite(layer.weight_global_scale).all() and torch.isfinite(layer.alpha).all()
    out = layer(make_x(4))
    assert torch.equal(out, lin.bias.detach().expand(4, -1).float().bfloat16())


# --------------------------------------------------------------------------------------------------
# Dequantization and the portable GEMM against the reference
# --------------------------------------------------------------------------------------------------


def test_weight_dequantization_against_reference():
    lin = make_linear(256, 160)
    layer = NVFP4Linear.from_linear(lin, 4.0)
    wd = q.dequantize_nvfp4(layer.weight_packed, layer.weight_scales, layer.weight_global_scale)
    ref = reference.dequantize_nvfp4(layer.weight_packed, layer.weight_scales, layer.weight_global_scale, 160)
    assert torch.equal(wd, ref)
    # element-wise: every value is e2m1 * e4m3 / G of its own block, and close to the weight
    assert rel_err(wd, lin.weight.detach()) < 0.15
    # the dequantized block maxima are within one E2M1 step of the weight's
    assert (wd.abs().amax() - lin.weight.detach().float().abs().amax()).abs() < 0.2 * wd.abs().amax()


def test_capture_safe_dequantizer_equals_reference():
    """gemm._dequantize (no host-to-device copies) == reference.dequantize_nvfp4 on every byte value and
    a spread of E4M3 scales (all 126 finite positive ones), with padding rows present."""
    from qwen_resnorm_fp4.gemm import _dequantize

    g = torch.Generator().manual_seed(7)
    rows, k = 130, 512
    packed = torch.randint(0, 256, (rows, k // 2), generator=g, dtype=torch.uint8)
    packed[0, :] = torch.arange(256, dtype=torch.uint8)  # every byte (both nibbles) at least once
    scales = torch.randint(0, 0x7F, (round_up(rows, 128), k // 16), generator=g, dtype=torch.uint8)
    scales.view(-1)[:0x7F] = torch.arange(0x7F, dtype=torch.uint8)
    gs = torch.tensor([123.456], dtype=torch.float32)
    ref = reference.dequantize_nvfp4(packed, scales, gs, rows)
    assert torch.equal(_dequantize(packed, scales, gs, rows), ref)
    assert torch.equal(_dequantize(packed, scales.view(torch.float8_e4m3fn), gs, rows), ref)
    assert torch.equal(_dequantize(packed, scales, gs, 77), ref[:77])


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
def test_portable_gemm_is_dequantize_matmul(out_dtype, bias):
    lin = make_linear(192, 100, bias=bias)
    layer = NVFP4Linear.from_linear(lin, 4.0)
    x = make_x(37, K=192)
    packed, scales = q.nvfp4_quantize(x, layer.input_global_scale)
    out = apply_nvfp4_gemm_prequantized(layer, packed, scales, out_dtype=out_dtype)
    a = reference.dequantize_nvfp4(packed, scales, layer.input_global_scale, 37)
    w = reference.dequantize_nvfp4(layer.weight_packed, layer.weight_scales, layer.weight_global_scale, 100)
    expect = a @ w.t()
    if bias:
        expect = expect + lin.bias.detach().float()
    assert out.dtype == out_dtype and out.shape == (37, 100)
    assert torch.equal(out, expect.to(out_dtype))


def test_gemm_bias_argument():
    layer = NVFP4Linear.from_linear(make_linear(), 4.0)
    packed, scales = q.nvfp4_quantize(make_x(8), layer.input_global_scale)
    base = apply_nvfp4_gemm_prequantized(layer, packed, scales, torch.float32, bias=torch.zeros(96))
    with_layer_bias = apply_nvfp4_gemm_prequantized(layer, packed, scales, torch.float32)
    assert torch.equal(with_layer_bias, base + layer.bias.float())
    extra = torch.full((96,), 0.5)
    assert torch.equal(apply_nvfp4_gemm_prequantized(layer, packed, scales, torch.float32, bias=extra), base + 0.5)


def test_gemm_argument_checks():
    layer = NVFP4Linear.from_linear(make_linear(), 4.0)
    packed, scales = q.nvfp4_quantize(make_x(8), layer.input_global_scale)
    with pytest.raises(ValueError, match="do_shuffle"):
        apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="trtllm")
    with pytest.raises(ValueError):
        apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="cutlass")  # no Blackwell here
    with pytest.raises(ValueError):
        apply_nvfp4_gemm_prequantized(layer, packed[:, :32], scales)  # K mismatch
    with pytest.raises(ValueError):
        apply_nvfp4_gemm_prequantized(layer, packed, scales[:64])  # too few scale rows
    with pytest.raises(TypeError):
        apply_nvfp4_gemm_prequantized(layer, packed.float(), scales)
    with pytest.raises(TypeError):
        apply_nvfp4_gemm_prequantized(torch.nn.Linear(128, 96), packed, scales)
    with pytest.raises(TypeError):
        apply_nvfp4_gemm_prequantized(layer, packed, scales, out_dtype=torch.int32)


def test_scales_as_float8_and_flat():
    layer = NVFP4Linear.from_linear(make_linear(), 4.0)
    packed, scales = q.nvfp4_quantize(make_x(8), layer.input_global_scale)
    ref = apply_nvfp4_gemm_prequantized(layer, packed, scales)
    assert torch.equal(apply_nvfp4_gemm_prequantized(layer, packed, scales.view(torch.float8_e4m3fn)), ref)
    assert torch.equal(apply_nvfp4_gemm_prequantized(layer, packed, scales.reshape(-1)), ref)
    assert torch.equal(apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="reference"), ref)


# --------------------------------------------------------------------------------------------------
# Prequantized == regular forward, bit for bit
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lead", [(1,), (37,), (2, 65), (3, 128, 1)])
@pytest.mark.parametrize("N,bias", [(96, True), (100, False), (256, True)])
@pytest.mark.parametrize("fast_math", [None, False])
def test_prequantized_equals_forward(lead, N, bias, fast_math):
    layer = NVFP4Linear.from_linear(make_linear(128, N, bias=bias), 4.0, fast_math=fast_math)
    x = make_x(*lead)
    regular = layer(x)
    assert regular.dtype == torch.bfloat16 and regular.shape == (*lead, N)
    packed, scales = q.nvfp4_quantize(x, layer.input_global_scale, fast_math)
    pre = layer((packed, scales))
    assert pre.shape == (packed.shape[0], N)
    assert torch.equal(pre.reshape(regular.shape), regular)
    assert torch.equal(layer((packed, scales), out_shape=lead), regular)
    assert torch.equal(apply_nvfp4_gemm_prequantized(layer, packed, scales).reshape(regular.shape), regular)


def test_fused_gate_output_equals_forward_of_unfused():
    layer = NVFP4Linear.from_linear(make_linear(128, 96), 6.0)
    g = torch.Generator().manual_seed(3)
    B, S, D = 2, 40, 128
    residual = torch.randn(B, S, D, generator=g).bfloat16()
    x = torch.randn(B, S, D, generator=g).bfloat16()
    gate, scale, shift = (torch.randn(B, D, generator=g) * 0.3 for _ in range(3))
    (packed, scales), r_fused, _ = q.try_fused_resnorm_quant(residual, x, gate, scale, shift, layer, allow_cpu=True)
    y, r = q.resnorm(residual, x, None, gate, scale, shift, 1e-6)
    assert torch.equal(r_fused, r)
    assert torch.equal(layer((packed, scales), out_shape=(B, S)), layer(y))


def test_forward_errors():
    layer = NVFP4Linear.from_linear(make_linear(), 4.0)
    with pytest.raises(TypeError):
        layer(make_x(4).float())
    with pytest.raises(ValueError):
        layer(make_x(4, K=64))
    with pytest.raises(TypeError):
        layer((1, 2, 3))


def test_state_dict_round_trip():
    layer = NVFP4Linear.from_linear(make_linear(128, 100), 4.0)
    fresh = NVFP4Linear(128, 100)
    fresh.load_state_dict(layer.state_dict())
    x = make_x(5)
    assert torch.equal(fresh(x), layer(x))
    assert set(layer.state_dict()) == {"weight_packed", "weight_scales", "weight_global_scale",
                                       "input_global_scale", "alpha", "bias"}


def test_forward_compiles_fullgraph():
    torch._dynamo.reset()
    layer = NVFP4Linear.from_linear(make_linear(), 4.0)
    x = make_x(2, 9)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), layer(x))
    torch._dynamo.reset()


# --------------------------------------------------------------------------------------------------
# Accuracy against the BF16 linear
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("K,N", [(128, 96), (512, 320), (3072, 256)])
def test_approximates_bf16_linear(K, N):
    lin = make_linear(K, N)
    x = make_x(64, K=K)
    layer = NVFP4Linear.from_linear(lin, x.float().abs().max())
    assert rel_err(layer(x), lin(x)) < 0.2


# --------------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------------



def _blackwell_flashinfer() -> bool:
    return torch.cuda.is_available() and flashinfer_serves(torch.device("cuda"))


blackwell = pytest.mark.skipif(not (CUDA_OK and _blackwell_flashinfer()),
                               reason="needs a Blackwell GPU (capability 10.x-12.x) and an importable FlashInfer")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("M,N", [(1, 96), (300, 100), (4096, 12288)])
def test_gpu_prequantized_equals_forward(backend, M, N):
    K = 3072
    layer = NVFP4Linear.from_linear(make_linear(K, N, device="cuda"), 6.0, gemm_backend=backend)
    x = make_x(M, K=K, device="cuda")
    regular = layer(x)
    packed, scales = q.nvfp4_quantize(x, layer.input_global_scale)
    assert torch.equal(layer((packed, scales)), regular)
    ref = make_linear(K, N, device="cuda")(x)
    assert rel_err(regular, ref) < 0.2


@pytest.mark.gpu
def test_gpu_weights_match_cpu_reference_exact_mode():
    lin = make_linear(3072, 320)
    on_cpu = NVFP4Linear.from_linear(lin, 6.0, fast_math=False)
    on_gpu = NVFP4Linear.from_linear(lin.cuda(), 6.0, fast_math=False)
    assert torch.equal(on_gpu.weight_packed.cpu(), on_cpu.weight_packed)
    assert torch.equal(on_gpu.weight_scales.cpu(), on_cpu.weight_scales)


@pytest.mark.gpu
def test_gpu_cuda_graph_forward():
    layer = NVFP4Linear.from_linear(make_linear(3072, 320, device="cuda"), 6.0)
    x = make_x(256, K=3072, device="cuda")
    eager = layer(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            layer(x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


FI_BACKENDS = list(BACKENDS)


@blackwell
@pytest.mark.gpu
@pytest.mark.blackwell
@pytest.mark.parametrize("backend", FI_BACKENDS)
@pytest.mark.parametrize("M,N", [(1, 96), (8, 320), (300, 100), (2048, 12288)])
def test_blackwell_backend_prequantized_equals_forward(backend, M, N):
    mm_fp4 = flashinfer_mm_fp4()
    major, minor = torch.cuda.get_device_capability()
    if backend != "auto" and not mm_fp4.is_backend_supported(backend, major * 10 + minor):
        pytest.skip(f"FlashInfer backend {backend!r} does not support SM{major}{minor}")
    K = 3072
    layer = NVFP4Linear.from_linear(make_linear(K, N, device="cuda"), 6.0, gemm_backend=backend)
    x = make_x(M, K=K, device="cuda")
    try:
        regular = layer(x)
    except Exception as exc:  # noqa: BLE001 - a backend that cannot take this problem (e.g. M > 8)
        pytest.skip(f"backend {backend!r} declined M={M}, N={N}: {exc}")
    packed, scales = q.nvfp4_quantize(x, layer.input_global_scale)
    assert torch.equal(layer((packed, scales)), regular)
    # and it computes the same product as the reference path, up to bf16 rounding and summation order
    fp32_reference = apply_nvfp4_gemm_prequantized(layer, packed, scales, torch.float32, backend="reference")
    assert rel_err(regular, fp32_reference) < 1e-2
