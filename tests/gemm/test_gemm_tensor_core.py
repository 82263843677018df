"""The tensor-core GEMM path: the exact bf16 dequantization (op, CPU implementation, CUDA kernel), the GEMM's
numerics (fp32 accumulation, alpha once in fp32, bias in fp32, one rounding), the backend names, the per-layer
weight cache, the host copy of alpha, torch.compile and CUDA graphs.

Exactness of the GEMM is checked on operands whose fp32 accumulation is exact in any order: block scales in
one binade (E4M3 bytes 0x38-0x3F, values 1 to 1.875) make every operand a multiple of 2^-4 below 12, every
product a multiple of 2^-8 below 2^8, and a sum of up to 64 products a number of at most 22 significant bits.
Then the result must equal round(fp32(acc * alpha) (+ bias)) bit for bit, whatever order cuBLAS sums in.
"""

from __future__ import annotations

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import reference
from qwen_resnorm_fp4.api import dequantize_to_bf16
from qwen_resnorm_fp4.gemm import BACKENDS, GemmCache, apply_nvfp4_gemm_prequantized, flashinfer_serves, resolve_backend
from qwen_resnorm_fp4.reference import CANONICAL_NAN_BF16
from qwen_resnorm_fp4.layout import round_up
from qwen_resnorm_fp4.linear import NVFP4Linear

from helpers.reliability import as_bits, rel_err



def all_bytes_operand(rows: int, k: int, seed: int, nan_scales: bool = False):
    """(packed, scales): every packed byte and every E4M3 scale byte (NaN bytes 0x7F / 0xFF only when asked)
    present where there is room, the rest random, padding rows included."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (rows, k // 2), generator=g, dtype=torch.uint8)
    every = min(packed.numel(), 256)
    packed.view(-1)[:every] = torch.arange(every, dtype=torch.uint8)
    scale_bytes = torch.tensor([b for b in range(256) if nan_scales or b & 0x7F != 0x7F], dtype=torch.uint8)
    scales = scale_bytes[torch.randint(0, scale_bytes.numel(), (round_up(rows, 128), k // 16), generator=g)]
    every = min(scales.numel(), scale_bytes.numel())
    scales.view(-1)[:every] = scale_bytes[:every]
    return packed, scales


def exact_grid_layer(k: int, n: int, alpha: float, bias, seed: int, device="cpu"):
    """An NVFP4Linear with random E2M1 codes, block scales in [1, 2) and the given alpha (see the module
    docstring: its products accumulate exactly in fp32)."""
    g = torch.Generator().manual_seed(seed)
    layer = NVFP4Linear(k, n, bias is not None, device=device,
                        bias_dtype=bias.dtype if bias is not None else torch.bfloat16)
    packed = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(0x38, 0x40, (round_up(n, 128), k // 16), generator=g, dtype=torch.uint8)
    one = torch.ones(1)
    layer._set_quantized(packed.to(device), scales.to(device), one.to(device), one.to(device),
                         torch.tensor([alpha]).to(device), None if bias is None else bias.to(device))
    return layer


def exact_grid_activations(m: int, k: int, seed: int, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (m, k // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(0x38, 0x40, (round_up(m, 128), k // 16), generator=g, dtype=torch.uint8)
    return packed.to(device), scales.to(device)


def exact_expectation(layer, packed, scales, out_dtype, bias):
    """round_to_out_dtype(fp32(acc * alpha) (+ bias)), acc summed exactly (float64, then fp32: exact here)."""
    a = reference.nvfp4_dequantize_bf16(packed.cpu(), scales.cpu()).double()
    w = reference.nvfp4_dequantize_bf16(layer.weight_packed.cpu(), layer.weight_scales.cpu()).double()
    acc = (a @ w.t()).float()
    assert torch.equal(acc.double(), a @ w.t())  # the premise: the sum is exact in fp32
    out = acc * layer.alpha.cpu().float()
    if bias is not None:
        out = out + bias.cpu().float()
    return out.to(out_dtype)


# --------------------------------------------------------------------------------------------------
# dequantize_to_bf16
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows,k", [(1, 64), (130, 512), (256, 3072)])
def test_dequantize_to_bf16_is_the_exact_reference(rows, k):
    packed, scales = all_bytes_operand(rows, k, seed=rows)
    out = dequantize_to_bf16(packed, scales)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, k)
    ref = reference.dequantize_nvfp4(packed, scales, torch.ones(1), rows)
    # bit-exact, signed zeros included: e2m1 * e4m3 needs no rounding in bf16
    assert torch.equal(as_bits(out.float()), as_bits(ref))
    assert torch.equal(dequantize_to_bf16(packed, scales.view(torch.float8_e4m3fn)), out)
    assert torch.equal(dequantize_to_bf16(packed, scales.reshape(-1)), out)


def test_dequantize_to_bf16_nan_scale_is_canonical():
    packed, scales = all_bytes_operand(128, 128, seed=5, nan_scales=True)
    out = dequantize_to_bf16(packed, scales)
    ref = reference.dequantize_nvfp4(packed, scales, torch.ones(1), 128)
    nan = torch.isnan(ref)
    assert nan.any()
    assert torch.equal(torch.isnan(out.float()), nan)
    assert (as_bits(out)[nan] == CANONICAL_NAN_BF16).all()
    assert torch.equal(as_bits(out.float())[~nan], as_bits(ref)[~nan])


def test_dequantize_to_bf16_errors():
    packed, scales = all_bytes_operand(4, 64, seed=0)
    with pytest.raises(TypeError, match="packed"):
        dequantize_to_bf16(packed.to(torch.int8), scales)
    with pytest.raises(TypeError, match="scales"):
        dequantize_to_bf16(packed, scales.float())
    with pytest.raises(ValueError, match="K"):
        dequantize_to_bf16(packed[:, :16], scales)
    with pytest.raises(ValueError, match="scales has"):
        dequantize_to_bf16(packed, scales[:64])
    with pytest.raises(ValueError, match="scales has"):  # the raw op refuses it too
        torch.ops.qwen_fp4.nvfp4_dequantize_bf16(packed, scales[:64])


def test_dequantize_op_opcheck_cpu():
    packed, scales = all_bytes_operand(130, 128, seed=2)
    torch.library.opcheck(torch.ops.qwen_fp4.nvfp4_dequantize_bf16.default, (packed, scales))


# --------------------------------------------------------------------------------------------------
# Backend names
# --------------------------------------------------------------------------------------------------


def test_backend_names():
    assert {"tensor_core", "reference"} <= set(BACKENDS)
    assert "portable" not in BACKENDS  # the reference's old name is gone
    cpu = torch.device("cpu")
    assert resolve_backend("auto", cpu) == "reference"
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("portable", cpu)
    assert resolve_backend("tensor_core", cpu) == "tensor_core"
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("fp32", cpu)
    with pytest.raises(ValueError, match="Blackwell"):
        resolve_backend("cutlass", cpu)
    with pytest.raises(ValueError, match="gemm_backend must be one of"):
        NVFP4Linear(128, 32, gemm_backend="fp32")
    with pytest.raises(TypeError, match="gemm_backend must be a str"):  # the one rule the options type uses too
        NVFP4Linear(128, 32, gemm_backend=["reference"])
    with pytest.raises(ValueError, match="do_shuffle"):
        resolve_backend("trtllm", cpu)


def test_auto_on_cpu_is_the_reference():
    layer = NVFP4Linear.from_linear(torch.nn.Linear(128, 96).bfloat16(), 4.0)
    packed, scales = q.nvfp4_quantize(torch.randn(9, 128).bfloat16(), layer.input_global_scale)
    ref = apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="reference")
    assert torch.equal(apply_nvfp4_gemm_prequantized(layer, packed, scales), ref)  # auto on CPU


# --------------------------------------------------------------------------------------------------
# The GEMM's numerics (CPU: the same formula in fp32 arithmetic)
# --------------------------------------------------------------------------------------------------


CASES = [  # (out_dtype, bias dtype or None, alpha)
    (torch.bfloat16, None, 0.0123),
    (torch.bfloat16, torch.bfloat16, 0.125),
    (torch.bfloat16, torch.float32, 0.125),
    (torch.float16, torch.bfloat16, 0.125),
    (torch.float32, None, 0.0123),
    (torch.float32, torch.float32, 0.125),
]


def _exact_case(out_dtype, bias_dtype, alpha, m, k, n, device):
    g = torch.Generator().manual_seed(11)
    bias = None if bias_dtype is None else (torch.randint(-64, 64, (n,), generator=g) / 8).to(bias_dtype)
    layer = exact_grid_layer(k, n, alpha, bias, seed=1, device=device)
    packed, scales = exact_grid_activations(m, k, seed=2, device=device)
    out = apply_nvfp4_gemm_prequantized(layer, packed, scales, out_dtype, backend="tensor_core")
    assert out.dtype == out_dtype and out.shape == (m, n)
    return out, exact_expectation(layer, packed, scales, out_dtype, bias)


@pytest.mark.parametrize("out_dtype,bias_dtype,alpha", CASES)
def test_tensor_core_formula_cpu(out_dtype, bias_dtype, alpha):
    out, expect = _exact_case(out_dtype, bias_dtype, alpha, 37, 64, 100, "cpu")
    assert torch.equal(as_bits(out), as_bits(expect))


def test_tensor_core_close_to_reference_cpu():
    lin = torch.nn.Linear(512, 160).bfloat16()
    layer = NVFP4Linear.from_linear(lin, 4.0)
    packed, scales = q.nvfp4_quantize(torch.randn(33, 512).bfloat16() * 2, layer.input_global_scale)
    ref = apply_nvfp4_gemm_prequantized(layer, packed, scales, torch.float32, backend="reference")
    tc = apply_nvfp4_gemm_prequantized(layer, packed, scales, torch.float32, backend="tensor_core")
    # the same products summed in another order, alpha = 1/(Gx*Gw) against two divisions: fp32-level apart
    assert rel_err(tc, ref) < 1e-5


def test_gemm_op_opcheck_cpu():
    a = dequantize_to_bf16(*exact_grid_activations(5, 64, seed=3))
    w = dequantize_to_bf16(*exact_grid_activations(7, 64, seed=4))
    op = torch.ops.qwen_fp4._bf16_gemm_fp32_accumulate_scaled.default
    alpha = torch.tensor([0.5])
    torch.library.opcheck(op, (a, w, alpha, None, torch.bfloat16))
    torch.library.opcheck(op, (a, w, alpha, torch.ones(7), torch.float32))


# --------------------------------------------------------------------------------------------------
# Weight cache, host alpha, state dicts, compile
# --------------------------------------------------------------------------------------------------


def test_weight_cache_follows_the_weight():
    layer = exact_grid_layer(128, 96, 0.25, None, seed=7)
    packed, scales = exact_grid_activations(9, 128, seed=8)
    per_call = apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="tensor_core")
    layer.cache_dequantized_weight = True
    assert torch.equal(apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="tensor_core"), per_call)
    cached = layer.gemm_cache.weight_bf16[1]
    assert torch.equal(cached, dequantize_to_bf16(layer.weight_packed, layer.weight_scales))
    other = exact_grid_layer(128, 96, 0.25, None, seed=9)
    with torch.no_grad():
        layer.weight_packed.copy_(other.weight_packed)  # changed tensors refresh the cache
        layer.weight_scales.copy_(other.weight_scales)
    assert torch.equal(apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="tensor_core"),
                       apply_nvfp4_gemm_prequantized(other, packed, scales, backend="tensor_core"))
    assert layer.gemm_cache.weight_bf16[1] is not cached
    layer.cache_dequantized_weight = False
    assert layer.gemm_cache.weight_bf16 is None
    assert set(layer.state_dict()) == {"weight_packed", "weight_scales", "weight_global_scale",
                                       "input_global_scale", "alpha", "bias"} - {"bias"}
    with pytest.raises(TypeError, match="cache_dequantized_weight"):
        layer.cache_dequantized_weight = 1


def test_alpha_changes_are_seen():
    layer = exact_grid_layer(64, 32, 0.5, None, seed=1)
    packed, scales = exact_grid_activations(4, 64, seed=2)
    before = apply_nvfp4_gemm_prequantized(layer, packed, scales, torch.float32, backend="tensor_core")
    with torch.no_grad():
        layer.alpha.fill_(0.25)
    after = apply_nvfp4_gemm_prequantized(layer, packed, scales, torch.float32, backend="tensor_core")
    assert torch.equal(after, before * 0.5)


def test_load_state_dict_refreshes_host_alpha():
    src = exact_grid_layer(64, 32, 0.375, None, seed=3)
    dst = NVFP4Linear(64, 32, bias=False, gemm_backend="tensor_core", cache_dequantized_weight=True)
    dst.load_state_dict(src.state_dict())
    assert dst.gemm_cache.host_alpha[1] == 0.375
    packed, scales = exact_grid_activations(4, 64, seed=2)
    assert torch.equal(dst((packed, scales)), apply_nvfp4_gemm_prequantized(src, packed, scales, backend="tensor_core"))


def test_tensor_core_forward_compiles_fullgraph():
    torch._dynamo.reset()
    layer = NVFP4Linear.from_linear(torch.nn.Linear(128, 96).bfloat16(), 4.0, gemm_backend="tensor_core")
    x = torch.randn(2, 9, 128).bfloat16()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), layer(x))
    layer.cache_dequantized_weight = True
    layer(x)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(layer, fullgraph=True, backend="aot_eager")(x), layer(x))
    torch._dynamo.reset()


# --------------------------------------------------------------------------------------------------
# GPU
# --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("rows,k", [(1, 64), (130, 512), (1000, 3072), (300, 16384)])
def test_gpu_dequantize_kernel_bytes(rows, k):
    packed, scales = all_bytes_operand(rows, k, seed=rows, nan_scales=True)
    on_gpu = torch.ops.qwen_fp4.nvfp4_dequantize_bf16(packed.cuda(), scales.cuda())
    on_cpu = torch.ops.qwen_fp4.nvfp4_dequantize_bf16(packed, scales)
    assert torch.equal(as_bits(on_gpu.cpu()), as_bits(on_cpu))  # NaN bytes included
    clean, clean_scales = all_bytes_operand(rows, k, seed=rows)
    out = dequantize_to_bf16(clean.cuda(), clean_scales.cuda().view(torch.float8_e4m3fn))
    ref = reference.dequantize_nvfp4(clean, clean_scales, torch.ones(1), rows)
    assert torch.equal(as_bits(out.float().cpu()), as_bits(ref))  # == the fp32 reference, bit for bit


@pytest.mark.gpu
def test_gpu_dequantize_op_opcheck():
    packed, scales = all_bytes_operand(130, 256, seed=4)
    torch.library.opcheck(torch.ops.qwen_fp4.nvfp4_dequantize_bf16.default, (packed.cuda(), scales.cuda()))


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype,bias_dtype,alpha", CASES)
@pytest.mark.parametrize("m,n", [(1, 96), (300, 100), (4096, 1024)])
def test_gpu_tensor_core_formula_exact(out_dtype, bias_dtype, alpha, m, n):
    out, expect = _exact_case(out_dtype, bias_dtype, alpha, m, 64, n, "cuda")
    assert torch.equal(as_bits(out.cpu()), as_bits(expect))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [256, 4096])
@pytest.mark.parametrize("k,n", [(3072, 12288), (12288, 3072)])
def test_gpu_tensor_core_against_reference(m, k, n):
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(k, n).bfloat16()
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g) * k ** -0.5)
    layer = NVFP4Linear.from_linear(lin.cuda(), 4.0)
    if not flashinfer_serves(torch.device("cuda")):
        assert resolve_backend(layer.gemm_backend, torch.device("cuda")) == "tensor_core"
    packed, scales = q.nvfp4_quantize(torch.randn(m, k, generator=g).bfloat16().cuda(), layer.input_global_scale)
    ref = apply_nvfp4_gemm_prequantized(layer, packed, scales, torch.float32, backend="reference")
    tc32 = apply_nvfp4_gemm_prequantized(layer, packed, scales, torch.float32, backend="tensor_core")
    tc = apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="tensor_core")
    err32, err = rel_err(tc32, ref), rel_err(tc, ref)
    same = (tc == ref.to(torch.bfloat16)).float().mean().item()
    print(f"M={m} K={k} N={n}: tensor_core vs reference rel err fp32 out {err32:.2e}, bf16 out {err:.2e}; "
          f"{same:.4%} of the bf16 outputs equal the reference rounded to bf16")
    assert err32 < 1e-5  # the same exact products, only the summation order differs
    assert err < 4e-3  # plus one bf16 rounding (2^-9 relative at most per element)
    layer.cache_dequantized_weight = True
    assert torch.equal(apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="tensor_core"), tc)


@pytest.mark.gpu
def test_gpu_reduction_setting_restored():
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction
    layer = NVFP4Linear.from_linear(torch.nn.Linear(3072, 256).bfloat16().cuda(), 4.0, gemm_backend="tensor_core")
    layer(torch.randn(8, 3072, device="cuda").bfloat16())
    assert matmul.allow_bf16_reduced_precision_reduction == before


@pytest.mark.gpu
@pytest.mark.parametrize("cache", [False, True])
def test_gpu_tensor_core_cuda_graph(cache):
    layer = NVFP4Linear.from_linear(torch.nn.Linear(3072, 320).bfloat16().cuda(), 6.0, gemm_backend="tensor_core",
                                    cache_dequantized_weight=cache)
    x = torch.randn(256, 3072, device="cuda").bfloat16()
    layer(x)  # the first eager call: cuBLAS handle and workspace, the host alpha
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer(x)
    fresh = torch.randn_like(x)
    x.copy_(fresh)  # replay on new data in the captured input
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, layer(fresh))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_gpu_tensor_core_compile_fullgraph(backend):
    torch._dynamo.reset()
    layer = NVFP4Linear.from_linear(torch.nn.Linear(3072, 320).bfloat16().cuda(), 6.0, gemm_backend="tensor_core")
    x = torch.randn(2, 100, 3072, device="cuda").bfloat16()
    assert torch.equal(torch.compile(layer, fullgraph=True, backend=backend)(x), layer(x))
    torch._dynamo.reset()



def test_layer_built_and_run_under_inference_mode() -> None:
    """A layer converted and called inside torch.inference_mode (buffers without version counters) works,
    and gives the bytes of the same layer built outside it."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 64, dtype=torch.bfloat16)
    x = torch.randn(3, 128).bfloat16()
    want = NVFP4Linear.from_linear(lin, input_amax=4.0)(x)
    with torch.inference_mode():
        layer = NVFP4Linear.from_linear(lin, input_amax=4.0)
        got = layer(x)
        assert torch.equal(got, layer(x))
    assert torch.equal(got, want)


def test_layer_moved_to_bf16_keeps_fp32_scales() -> None:
    """``layer.to(torch.bfloat16)`` (what ``pipe.to(device, dtype)`` does to a converted model) leaves the
    global scales and alpha fp32 and the output unchanged; so does ``.half()`` for the scales (it casts the bias,
    which is not a format tensor). The tensors stay parameters without gradients (torch.compile guards buffers
    against aliasing, parameters not)."""
    torch.manual_seed(1)
    layer = NVFP4Linear.from_linear(torch.nn.Linear(128, 64, dtype=torch.bfloat16), input_amax=4.0)
    x = torch.randn(3, 128).bfloat16()
    want = layer(x)
    names = ["weight_packed", "weight_scales", "weight_global_scale", "input_global_scale", "alpha", "bias"]
    for move in ("bfloat16", "half"):
        getattr(layer, move)()
        for name in ("weight_global_scale", "input_global_scale", "alpha"):
            assert getattr(layer, name).dtype == torch.float32, name
        assert list(layer.buffers()) == []
        assert [n for n, p in layer.named_parameters() if type(p) is torch.nn.Parameter and not p.requires_grad] \
            == names
        if move == "bfloat16":
            assert torch.equal(layer(x), want)


def test_load_state_dict_under_inference_mode_takes_the_new_alpha() -> None:
    """Loading another layer's state into a layer built under inference_mode gives that layer's output (the
    host alpha and weight caches are not kept from the old tensors)."""
    torch.manual_seed(2)
    b = NVFP4Linear.from_linear(torch.nn.Linear(128, 64, dtype=torch.bfloat16), input_amax=9.0)
    x = torch.randn(3, 128).bfloat16()
    with torch.inference_mode():
        layer = NVFP4Linear.from_linear(torch.nn.Linear(128, 64, dtype=torch.bfloat16), input_amax=1.0)
        layer(x)
        layer.load_state_dict(b.state_dict())
        got = layer(x)
    assert torch.equal(got, b(x))


def test_dequantize_refuses_k_beyond_its_limit() -> None:
    """K > 2^27 (32-bit scale offsets in the kernel) is refused by name before anything is read."""
    from qwen_resnorm_fp4.validation import MAX_DEQUANTIZE_COLS

    packed = torch.zeros((1, MAX_DEQUANTIZE_COLS // 2 + 32), dtype=torch.uint8)
    with pytest.raises(ValueError, match=rf"packed.shape\[1\] \* 2 \(K\) must be at most {MAX_DEQUANTIZE_COLS}\b"):
        dequantize_to_bf16(packed, torch.zeros(16, dtype=torch.uint8))


def test_the_layer_owns_its_gemm_cache():
    """The GEMM keeps nothing on a layer without a gemm_cache (it adds no attribute) and fills the one an
    NVFP4Linear owns."""
    layer = exact_grid_layer(64, 32, 0.5, None, seed=1)
    packed, scales = exact_grid_activations(4, 64, seed=2)
    want = apply_nvfp4_gemm_prequantized(layer, packed, scales, backend="tensor_core")
    assert isinstance(layer.gemm_cache, GemmCache) and layer.gemm_cache.host_alpha[1] == 0.5
    plain = type("Layer", (), {})()
    for name in ("weight_packed", "weight_scales", "weight_global_scale", "input_global_scale", "alpha", "out_features",
                 "bias"):
        setattr(plain, name, getattr(layer, name))
    before = set(vars(plain))
    assert torch.equal(apply_nvfp4_gemm_prequantized(plain, packed, scales, backend="tensor_core"), want)
    assert set(vars(plain)) == before
    layer.gemm_cache.clear()
    assert layer.gemm_cache.host_alpha is None and layer.gemm_cache.weight_bf16 is None
