"""FP8Linear on the CPU: the weight quantized by ModelOpt's FP8 recipe (bytes against an independent E4M3
oracle), the ModelOpt export loaded as written (bytes unchanged, every scale shape ModelOpt and SGLang's
build_modelopt_fp8_transformer write), the forward against a float64 oracle of the dequantized GEMM, the BF16
and the pre-quantized input giving the same bits, dtype-keeping moves, torch.compile(fullgraph=True) tracing,
and the errors (naming the argument, nothing changed).

The CUDA GEMM (torch._scaled_mm) is tested in tests/gemm/test_gpu_fp8_linear.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qwen_resnorm_fp4 as q
from helpers.oracles import e4m3_byte_oracle
from qwen_resnorm_fp4 import FP8Linear
from qwen_resnorm_fp4.linear_fp8 import E4M3_MAX, fp8_linear_reference

BF16 = torch.bfloat16


def make_linear(k: int = 64, n: int = 48, bias: bool = True, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias).to(BF16)
    with torch.no_grad():
        lin.weight[3, :5] = torch.tensor([0.0, -0.0, 1e-9, -1e-9, 7.0])  # zeros, tiny, and the amax
    return lin


def decoded(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float64)


def gemm_oracle(a_q: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, in_scale: torch.Tensor,
                bias) -> torch.Tensor:
    """float64: (decode(a) @ decode(W).T) * input_scale * weight_scale + bias (no rounding)."""
    out = (decoded(a_q) @ decoded(w_q).T) * in_scale.double() * w_scale.double()
    return out if bias is None else out + bias.double()


def assert_one_rounding_of(out: torch.Tensor, exact: torch.Tensor) -> None:
    """bf16 ``out`` is within one bf16 ulp of ``exact`` (fp32 accumulation in another order, then one
    rounding: half an ulp for the rounding plus the fp32 sum's few ulps)."""
    exact = exact.to(torch.float64)
    ulp = torch.exp2(torch.floor(torch.log2(exact.abs().clamp(min=2.0 ** -126))) - 7)
    err = (out.double() - exact).abs()
    assert bool((err <= ulp + 1e-6 * exact.abs().max()).all()), float((err / ulp).max())


@pytest.mark.parametrize("per_channel", [False, True])
def test_from_linear_quantizes_the_weight_with_modelopt_recipe(per_channel):
    lin = make_linear()
    layer = FP8Linear.from_linear(lin, 3.5, per_channel=per_channel)
    w = lin.weight.detach().float()
    if per_channel:
        amax = w.abs().amax(dim=1)
        assert layer.weight_scale.shape == (48,)
    else:
        amax = w.abs().amax().reshape(1)
        assert layer.weight_scale.shape == (1,)
    assert torch.equal(layer.weight_scale, amax / 448.0)
    assert torch.equal(layer.input_scale, torch.tensor([3.5 / 448.0]))
    scaled = w / layer.weight_scale.reshape(-1, 1)
    expected = e4m3_byte_oracle(scaled).reshape(48, 64)
    assert np.array_equal(layer.weight.view(torch.uint8).numpy(), expected)
    assert layer.weight.view(torch.uint8)[3, 4] == 0x7E  # the amax maps to 448
    assert torch.equal(layer.bias, lin.bias.detach())
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.bias.dtype == BF16


def test_zero_weight_rows_read_amax_one():
    lin = make_linear()
    with torch.no_grad():
        lin.weight[5].zero_()
    layer = FP8Linear.from_linear(lin, 1.0, per_channel=True)
    assert layer.weight_scale[5] == 1.0 / 448.0
    assert bool((layer.weight.view(torch.uint8)[5] == 0).all())


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_is_the_dequantized_gemm(per_channel, bias):
    lin = make_linear(bias=bias)
    layer = FP8Linear.from_linear(lin, 448.0 / 2, per_channel=per_channel)  # input_scale 0.5: 1/s exact
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 9, 64, generator=g) * 40).to(BF16)
    x[0, 0, :3] = torch.tensor([1000.0, -1000.0, 0.0])  # saturating inputs
    out = layer(x)
    assert out.shape == (2, 9, 48) and out.dtype == BF16
    a_q = layer.quantize_input(x)
    assert a_q.dtype == torch.float8_e4m3fn and a_q.shape == x.shape
    assert np.array_equal(a_q.view(torch.uint8).numpy(), e4m3_byte_oracle(x.float() * 2.0).reshape(a_q.shape))
    assert torch.equal(out, layer(a_q))  # the bf16 and the pre-quantized form: the same bits
    exact = gemm_oracle(a_q.reshape(-1, 64), layer.weight, layer.weight_scale, layer.input_scale, layer.bias)
    assert_one_rounding_of(out.reshape(-1, 48), exact)
    # within the calibrated range the original BF16 layer is not far (E4M3 has 3 mantissa bits)
    x = (torch.randn(2, 9, 64, generator=g) * 20).to(BF16)
    assert float(x.float().abs().max()) < 448.0 / 2
    ref = lin(x).detach().float()
    assert (layer(x).float() - ref).norm() / ref.norm() < 0.06


def test_reference_matches_cpu_scaled_mm_where_torch_has_one():
    layer = FP8Linear.from_linear(make_linear(), 5.0)
    a = (torch.randn(16, 64) * 3).to(torch.float8_e4m3fn)
    try:
        direct = torch._scaled_mm(a, layer.weight.t(), layer.input_scale, layer.weight_scale, bias=layer.bias,
                                  out_dtype=BF16)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"this torch has no CPU _scaled_mm: {e}")
    ours = fp8_linear_reference(a, layer.weight, layer.weight_scale, layer.input_scale, layer.bias)
    exact = gemm_oracle(a, layer.weight, layer.weight_scale, layer.input_scale, layer.bias)
    assert_one_rounding_of(ours, exact)
    assert_one_rounding_of(direct, exact)


# ------------------------------------------------------------------------------------------------------------
# ModelOpt's export, as written
# ------------------------------------------------------------------------------------------------------------


def modelopt_tensors(n: int = 32, k: int = 64, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    return weight, torch.tensor(0.0123), torch.tensor(0.0456), torch.randn(n, generator=g).to(BF16)


@pytest.mark.parametrize("scale_shape", [(), (1,), (32,), (32, 1)])
def test_from_modelopt_keeps_the_bytes(scale_shape):
    weight, _, input_scale, bias = modelopt_tensors()
    n = scale_shape[0] if scale_shape and scale_shape[0] != 1 else 1
    weight_scale = torch.linspace(0.01, 0.02, n).reshape(scale_shape)
    layer = FP8Linear.from_modelopt(weight, weight_scale, input_scale, bias)
    assert torch.equal(layer.weight.view(torch.uint8), weight.view(torch.uint8))
    assert layer.per_channel == (n == 32)
    assert torch.equal(layer.weight_scale, weight_scale.reshape(-1).float())
    assert torch.equal(layer.input_scale, input_scale.reshape(1))
    a = (torch.randn(5, 64) * 10).to(torch.float8_e4m3fn)
    exact = gemm_oracle(a, weight, weight_scale.reshape(-1), input_scale.reshape(1), bias)
    assert_one_rounding_of(layer(a), exact)


def test_from_modelopt_state_dict_reads_both_layouts():
    weight, weight_scale, input_scale, bias = modelopt_tensors()
    prefix = "transformer_blocks.0.img_mlp.net.0.proj."
    modelopt = {prefix + "weight": weight, prefix + "weight_scale": weight_scale,  # 0-dim, as ModelOpt writes
                prefix + "input_scale": input_scale, prefix + "bias": bias}
    sglang = {prefix + "weight": weight, prefix + "weight_scale": weight_scale.reshape(1),  # [1], SGLang's tool
              prefix + "input_scale": input_scale.reshape(1), prefix + "bias": bias}
    a = FP8Linear.from_modelopt_state_dict(modelopt, prefix)
    b = FP8Linear.from_modelopt_state_dict(sglang, prefix)
    x = (torch.randn(3, 64) * 0.5).to(BF16)
    assert torch.equal(a(x), b(x))
    assert torch.equal(a.weight.view(torch.uint8), weight.view(torch.uint8))
    del sglang[prefix + "bias"]
    assert FP8Linear.from_modelopt_state_dict(sglang, prefix).bias is None
    with pytest.raises(KeyError, match=r"input_scale"):
        FP8Linear.from_modelopt_state_dict({prefix + "weight": weight, prefix + "weight_scale": weight_scale}, prefix)


def test_load_state_dict_takes_modelopt_shapes_and_refuses_a_bf16_weight():
    weight, weight_scale, input_scale, bias = modelopt_tensors()
    layer = FP8Linear(64, 32)
    layer.load_state_dict({"weight": weight, "weight_scale": weight_scale, "input_scale": input_scale, "bias": bias})
    assert torch.equal(layer.weight.view(torch.uint8), weight.view(torch.uint8))
    assert layer.weight_scale.shape == (1,) and layer.weight_scale.item() == weight_scale.item()
    before = layer.weight.clone()
    with pytest.raises(TypeError, match="weight must be float8_e4m3fn"):
        layer.load_state_dict({"weight": weight.to(BF16), "weight_scale": weight_scale, "input_scale": input_scale,
                               "bias": bias})
    assert torch.equal(layer.weight.view(torch.uint8), before.view(torch.uint8))


def test_from_modelopt_errors_name_the_argument():
    weight, weight_scale, input_scale, bias = modelopt_tensors()
    with pytest.raises(TypeError, match="weight must be ModelOpt's FP8 weight"):
        FP8Linear.from_modelopt(weight.to(BF16), weight_scale, input_scale)
    with pytest.raises(ValueError, match="weight must be"):
        FP8Linear.from_modelopt(weight.reshape(-1), weight_scale, input_scale)
    with pytest.raises(ValueError, match="weight_scale must be one element"):
        FP8Linear.from_modelopt(weight, torch.ones(5), input_scale)
    with pytest.raises(ValueError, match="weight_scale must be finite and positive"):
        FP8Linear.from_modelopt(weight, torch.tensor(-1.0), input_scale)
    with pytest.raises(TypeError, match="weight_scale must be a floating-point"):
        FP8Linear.from_modelopt(weight, torch.tensor(1), input_scale)
    with pytest.raises(ValueError, match="input_scale must be finite and positive"):
        FP8Linear.from_modelopt(weight, weight_scale, torch.tensor(float("nan")))
    with pytest.raises(ValueError, match="input_scale must have one element"):
        FP8Linear.from_modelopt(weight, weight_scale, torch.ones(2))
    with pytest.raises(ValueError, match=r"bias must be a tensor of shape \(32,\)"):
        FP8Linear.from_modelopt(weight, weight_scale, input_scale, bias[:5])
    with pytest.raises(ValueError, match="in_features must be a positive multiple of 16"):
        FP8Linear.from_modelopt(weight[:, :40], weight_scale, input_scale)
    with pytest.raises(ValueError, match="out_features must be a positive multiple of 16"):
        FP8Linear.from_modelopt(weight[:20], weight_scale, input_scale)


def test_from_linear_and_forward_errors():
    with pytest.raises(TypeError, match="linear must be a torch.nn.Linear"):
        FP8Linear.from_linear(torch.nn.Conv1d(64, 64, 1), 1.0)
    with pytest.raises(ValueError, match="input_amax must be finite and positive"):
        FP8Linear.from_linear(make_linear(), 0.0)
    with pytest.raises(TypeError, match="per_channel must be a bool"):
        FP8Linear(64, 32, per_channel=1)
    with pytest.raises(ValueError, match="in_features must be a positive multiple of 16"):
        FP8Linear(40, 32)
    layer = FP8Linear.from_linear(make_linear(), 1.0)
    with pytest.raises(TypeError, match="x must be a bfloat16 or float8_e4m3fn tensor"):
        layer(torch.randn(2, 64))
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 64\]"):
        layer(torch.randn(2, 32).to(BF16))
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 64\]"):
        layer(torch.randn(2, 32).to(torch.float8_e4m3fn))


def test_moving_keeps_the_format():
    """``.to(dtype)`` / ``.half()`` / ``.bfloat16()`` keep the format's bytes and dtypes, and the tensors stay
    parameters without gradients (torch.compile guards buffers against aliasing, parameters not)."""
    layer = FP8Linear.from_linear(make_linear(), 2.0, per_channel=True)
    w, s, i, b = (t.clone() for t in (layer.weight, layer.weight_scale, layer.input_scale, layer.bias))
    for move in (lambda m: m.to(torch.float32), lambda m: m.half(), lambda m: m.bfloat16()):
        move(layer)
        assert list(layer.buffers()) == []
        assert [n for n, p in layer.named_parameters() if type(p) is torch.nn.Parameter and not p.requires_grad] \
            == ["weight", "weight_scale", "input_scale", "bias"]
        assert layer.weight.dtype == torch.float8_e4m3fn and torch.equal(layer.weight.view(torch.uint8),
                                                                         w.view(torch.uint8))
        assert layer.weight_scale.dtype == torch.float32 and torch.equal(layer.weight_scale, s)
        assert layer.input_scale.dtype == torch.float32 and torch.equal(layer.input_scale, i)
        assert layer.bias.dtype == BF16 and torch.equal(layer.bias, b)


def test_assigning_a_plain_tensor_keeps_it_a_frozen_parameter():
    """``layer.input_scale = t`` (as a buffer took it) stores t as a parameter without gradients."""
    layer = FP8Linear.from_linear(make_linear(), 2.0)
    scale = torch.tensor([0.25])
    layer.input_scale = scale
    assert type(layer.input_scale) is torch.nn.Parameter and not layer.input_scale.requires_grad
    assert torch.equal(layer.input_scale, scale) and torch.equal(layer.state_dict()["input_scale"], scale)
    layer.note = torch.ones(1)  # not one of its parameters: a plain attribute, as nn.Module keeps it
    assert "note" not in dict(layer.named_parameters()) and type(layer.note) is torch.Tensor


def test_state_dict_round_trip_and_repr():
    layer = FP8Linear.from_linear(make_linear(), 2.0)
    other = FP8Linear(64, 48)
    other.load_state_dict(layer.state_dict())
    x = torch.randn(4, 64).to(BF16)
    assert torch.equal(other(x), layer(x))
    assert "use_fast_accum=True" in repr(layer) and "per_channel=False" in repr(layer)
    assert FP8Linear(64, 48, use_fast_accum=False).use_fast_accum is False


def test_compile_fullgraph_traces_without_breaks():
    """No host synchronisation in the forward: fullgraph tracing (aot_eager: the graph torch.compile makes,
    run without code generation) of both input forms gives the eager bits."""
    torch._dynamo.reset()
    layer = FP8Linear.from_linear(make_linear(), 4.0)
    x = (torch.randn(2, 7, 64) * 2).to(BF16)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), layer(x))
    xq = layer.quantize_input(x)
    assert torch.equal(compiled(xq), layer(xq))


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_traced_gemm_is_one_opaque_op_with_the_eager_bytes(per_channel, bias):
    """The CUDA GEMM as torch.compile traces it: one ``qwen_fp4::_fp8_scaled_mm`` per call, no raw
    ``aten._scaled_mm`` for inductor to lower by mode (its max-autotune lowering fails on a 1-D bias), the eager
    call's bytes; the op passes opcheck. Run on CPU where torch has a CPU ``_scaled_mm``."""
    layer = FP8Linear.from_linear(make_linear(bias=bias), 5.0, per_channel=per_channel)
    a = (torch.randn(16, 64) * 3).to(torch.float8_e4m3fn)
    try:
        eager = layer._scaled_mm(a)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"this torch has no CPU _scaled_mm: {e}")
    from torch._dynamo.backends.common import aot_autograd

    aten_graphs = []  # what inductor would lower: the ATen graph AOT autograd hands its compiler

    def keep(gm, example_inputs):
        aten_graphs.append(str(gm.graph))
        return gm

    torch._dynamo.reset()
    traced = torch.compile(layer._scaled_mm, fullgraph=True, backend=aot_autograd(fw_compiler=keep))(a)
    assert torch.equal(traced, eager)
    assert len(aten_graphs) == 1 and "qwen_fp4._fp8_scaled_mm" in aten_graphs[0]
    assert "aten._scaled_mm" not in aten_graphs[0], aten_graphs[0]
    if per_channel:  # the row-wise operands _scaled_mm takes; the bias is added after the op
        scales = layer.input_scale.reshape(1, 1).expand(16, 1).contiguous(), layer.weight_scale.reshape(1, -1)
    else:
        scales = layer.input_scale, layer.weight_scale
    args = (a, layer.weight, *scales, None if per_channel else layer.bias, True)
    # opcheck's schema test compares inputs with allclose, which has no CPU float8 kernel
    torch.library.opcheck(torch.ops.qwen_fp4._fp8_scaled_mm.default, args,
                          test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))


def test_exported_from_the_package():
    assert q.FP8Linear is FP8Linear and "FP8Linear" in q.__all__
    assert E4M3_MAX == 448.0


def test_any_multiple_of_16():
    """K and N multiples of 16, not of 64 (torch._scaled_mm's rule, not the NVFP4 one)."""
    lin = torch.nn.Linear(80, 48).to(BF16)
    layer = FP8Linear.from_linear(lin, 448.0)  # input_scale 1: the E4M3 of x itself
    x = (torch.randn(3, 80) * 4).to(BF16)
    a_q = layer.quantize_input(x)
    assert np.array_equal(a_q.view(torch.uint8).numpy(), e4m3_byte_oracle(x.float()).reshape(3, 80))
    assert_one_rounding_of(layer(x), gemm_oracle(a_q, layer.weight, layer.weight_scale, layer.input_scale,
                                                 layer.bias))


@pytest.mark.parametrize("bad", [0.0, -2.0, float("inf"), float("nan"), 1e-40])
def test_load_state_dict_refuses_a_bad_input_scale_and_keeps_the_layer(bad):
    layer = FP8Linear.from_linear(torch.nn.Linear(32, 48).bfloat16(), 2.0)
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    sd = layer.state_dict()
    sd["input_scale"] = torch.tensor(bad)
    sd["weight_scale"] = sd["weight_scale"] * 2
    with pytest.raises(ValueError, match="input_scale"):
        layer.load_state_dict(sd)
    assert all(torch.equal(v, layer.state_dict()[k]) for k, v in before.items())
