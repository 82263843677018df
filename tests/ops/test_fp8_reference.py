"""CPU tests of the FP8 (E4M3) ops' reference (docs/numerics.md, "FP8 (E4M3) output"): the quantization
against an independent oracle (numpy float32 arithmetic and the E4M3 table of helpers.oracles), the inverse scale
(qwen_resnorm_fp4.rcp_approx's model of div.full.f32), the no-residual ops, fake shapes, opcheck, and the
argument rules."""

from __future__ import annotations


import numpy as np
import pytest
import torch

import qwen_resnorm_fp4 as q
from helpers.inputs import make_inputs
from helpers.oracles import e4m3_byte_oracle
from qwen_resnorm_fp4 import reference
from qwen_resnorm_fp4.rcp_approx import rcp_approx_f32

SCALES = (0.005, 0.03125, 0.4263392984867096, 0.4754464328289032, 1.0)


def _oracle_inv(s: float) -> np.float32:
    """IEEE RN(1/s) in fp32 (numpy scalars): the inverse without corrections."""
    return np.float32(1.0) / np.float32(s)


def fp8_oracle(y: torch.Tensor, inv: np.float32) -> np.ndarray:
    """The rule element by element: v = fp32(y) * inv (one fp32 multiply), fmaxf then fminf against
    -448 / 448 (a NaN operand loses), then nearest-even E4M3 (helpers.oracles.e4m3_byte_oracle)."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = y.float().numpy().astype(np.float32) * inv
    v = np.where(np.isnan(v), np.float32(-448.0), np.minimum(np.maximum(v, np.float32(-448.0)), np.float32(448.0)))
    return e4m3_byte_oracle(v.astype(np.float64)).astype(np.uint8)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def _ieee_inverse(s: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(s) / s


@pytest.mark.parametrize("s", SCALES)
def test_every_bf16_value_matches_the_oracle(s):
    """All 65536 bf16 bit patterns (signs, zeros, subnormals, ties, saturation, inf, NaN), with a given
    inverse (IEEE 1/s) and with the default one (the div.full model)."""
    y = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    got = _bytes(reference.fp8_quantize(y, torch.tensor([s]), inverse=_ieee_inverse))
    assert np.array_equal(got.numpy(), fp8_oracle(y, _oracle_inv(s)))
    div_full = np.float32(rcp_approx_f32(torch.tensor([s])).item())
    got = _bytes(reference.fp8_quantize(y, torch.tensor([s])))
    assert np.array_equal(got.numpy(), fp8_oracle(y, div_full))


def test_hand_computed_bytes():
    """inv = 1: ties to even (1.0625 -> 1.0, 1.1875 -> 1.25, 0.01171875 = 6 * 2^-9 -> 0x06 exactly,
    2^-10 (half the smallest subnormal) -> 0), saturation (456, 1e6, inf), NaN -> -448, signs, -0."""
    y = torch.tensor([1.0625, 1.1875, 0.01171875, 2.0 ** -10, 456.0, 1e6, float("inf"), -float("inf"),
                      float("nan"), -1.0625, -0.0, 0.0, -2.0 ** -10, 240.0], dtype=torch.bfloat16)
    got = _bytes(reference.fp8_quantize(y, torch.tensor([1.0]), inverse=_ieee_inverse)).tolist()
    assert got == [0x38, 0x3A, 0x06, 0x00, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE, 0xB8, 0x80, 0x00, 0x80, 0x77]


@pytest.mark.parametrize("s", [0.0, -0.0, -1.0, float("inf"), float("nan"), 1e-40, -float("inf")])
def test_refused_scale(s):
    """A scale that is not a positive normal finite fp32: the reference writes 0x7F everywhere (the GPU's
    rule), the CPU op and check_fp8_input_scale raise ValueError naming input_scale."""
    y = torch.randn(3, 32).bfloat16()
    scale = torch.tensor([s])
    assert bool((_bytes(reference.fp8_quantize(y, scale)) == 0x7F).all())
    with pytest.raises(ValueError, match=r"^input_scale must be a positive, normal, finite float32"):
        q.fp8_quantize(y, scale)
    with pytest.raises(ValueError, match=r"^input_scale "):
        q.check_fp8_input_scale(scale)
    inp = make_inputs(1, 3, 32)
    with pytest.raises(ValueError, match=r"^input_scale "):
        q.resnorm_quant_fp8(inp["residual"], inp["x"], None, inp["gate"], inp["scale"], inp["shift"], scale)


def test_accepted_scale_limits():
    for s in (torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max):
        q.check_fp8_input_scale(torch.tensor([s]))
        assert reference.fp8_scale_valid(torch.tensor(s)).item()


def test_inverse_is_the_div_full_model():
    """fp8_inverse_scale is rcp_approx_f32 (div.full.f32(1, s)) at every accepted scale, subnormal inverses
    included, and NaN at a refused one; at 0.4754464328289032 it is one ulp above IEEE 1/s."""
    g = torch.Generator().manual_seed(1)
    s = torch.exp2(torch.empty(20000).uniform_(-126, 127, generator=g)) * (1 + torch.rand(20000, generator=g))
    s = s[torch.isfinite(s)]
    assert torch.equal(reference.fp8_inverse_scale(s).view(torch.int32), rcp_approx_f32(s).view(torch.int32))
    big = torch.tensor([1.5 * 2.0 ** 126, torch.finfo(torch.float32).max])
    assert torch.equal(reference.fp8_inverse_scale(big).view(torch.int32), rcp_approx_f32(big).view(torch.int32))
    refused = reference.fp8_inverse_scale(torch.tensor([0.0, -1.0, 1e-40, float("inf"), float("nan")]))
    assert bool(torch.isnan(refused).all())
    s_b = torch.tensor([0.4754464328289032])
    assert _bits(float(reference.fp8_inverse_scale(s_b))) == _bits(float(_oracle_inv(0.4754464328289032))) + 1


def _bits(v: float) -> int:
    return int(torch.tensor([v], dtype=torch.float32).view(torch.int32))


@pytest.mark.parametrize("form", ["shared", "batch", "token", "indexed_int64"])
@pytest.mark.parametrize("D", [16, 48, 64, 208])
def test_resnorm_quant_fp8_is_fp8_of_resnorm(form, D):
    inp = make_inputs(2, 5, D, form, affine=form == "batch", seed=D)
    s = torch.tensor([0.03125])
    kw = dict(weight=inp["weight"], norm_bias=inp["norm_bias"], modulate_index=inp["modulate_index"])
    y, r = q.resnorm_quant_fp8(inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"], s,
                               inp["eps"], **kw)
    y_bf16, r_ref = q.resnorm(inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"],
                              inp["eps"], **kw)
    assert y.dtype == torch.float8_e4m3fn and y.shape == inp["x"].shape and torch.equal(r, r_ref)
    assert torch.equal(_bytes(y), _bytes(q.fp8_quantize(y_bf16, s)))
    assert np.array_equal(_bytes(y).numpy().reshape(-1),
                          fp8_oracle(y_bf16.reshape(-1), np.float32(reference.fp8_inverse_scale(s)[0])))
    # the out-variant, in place on the residual, with the bf16 y as well
    res = inp["residual"].clone()
    out_y = torch.empty_like(y)
    out_bf16 = torch.empty_like(y_bf16)
    q.resnorm_quant_fp8_out(res, inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"], s, inp["eps"],
                            y=out_y, residual_out=res, y_bf16=out_bf16, **kw)
    assert torch.equal(_bytes(out_y), _bytes(y)) and torch.equal(res, r) and torch.equal(out_bf16, y_bf16)


def test_stride0_modulation_views_equal_the_shared_form():
    inp = make_inputs(2, 6, 64, "shared")
    s = torch.tensor([0.4754464328289032])
    args = (inp["residual"], inp["x"], inp["bias"])
    want = q.resnorm_quant_fp8(*args, inp["gate"], inp["scale"], inp["shift"], s)
    views = [t.expand(2, 6, 64) for t in (inp["gate"], inp["scale"], inp["shift"])]
    got = q.resnorm_quant_fp8(*args, *views, s)
    assert torch.equal(_bytes(got[0]), _bytes(want[0])) and torch.equal(got[1], want[1])


def test_norm_modulate_ops_are_resnorm_of_zero_x_and_gate():
    inp = make_inputs(2, 5, 128, "indexed_bool", affine=True, seed=3)
    x, sc, sh = inp["x"], inp["scale"], inp["shift"]
    kw = dict(weight=inp["weight"], norm_bias=inp["norm_bias"], modulate_index=inp["modulate_index"])
    y_bf16, _ = q.resnorm(x, torch.zeros_like(x), None, torch.zeros_like(sc), sc, sh, 1e-6, **kw)
    s = torch.tensor([0.005])
    assert torch.equal(_bytes(q.norm_modulate_quant_fp8(x, sc, sh, s, **kw)), _bytes(q.fp8_quantize(y_bf16, s)))
    g = torch.tensor([200.0])
    packed, scales = q.norm_modulate_quant(x, sc, sh, g, fast_math=False, **kw)
    want = q.nvfp4_quantize(y_bf16, g, False)
    assert torch.equal(packed, want[0]) and torch.equal(scales, want[1])
    out, out_bf16 = torch.empty(x.shape, dtype=torch.float8_e4m3fn), torch.empty_like(x)
    q.norm_modulate_quant_fp8_out(x, sc, sh, s, y=out, y_bf16=out_bf16, **kw)
    assert torch.equal(out_bf16, y_bf16) and torch.equal(_bytes(out), _bytes(q.fp8_quantize(y_bf16, s)))
    assert torch.equal(reference.norm_modulate(x, sc, sh, 1e-6, **kw), y_bf16)


def test_fp8_quantize_any_shape_and_out():
    s = torch.tensor([0.4263392984867096])
    for shape in [(), (7,), (3, 5), (2, 3, 17)]:
        y = torch.randn(shape).bfloat16() * 100
        got = q.fp8_quantize(y, s)
        assert got.shape == y.shape and got.dtype == torch.float8_e4m3fn
        assert np.array_equal(_bytes(got).numpy().reshape(-1),
                              fp8_oracle(y.reshape(-1), np.float32(reference.fp8_inverse_scale(s)[0])))
    y = torch.randn(4, 32).bfloat16()
    strided = y.t()
    assert torch.equal(_bytes(q.fp8_quantize(strided, s)), _bytes(q.fp8_quantize(strided.contiguous(), s)))
    out = torch.empty(y.shape, dtype=torch.float8_e4m3fn)
    assert q.fp8_quantize_out(y, s, out=out) is out and torch.equal(_bytes(out), _bytes(q.fp8_quantize(y, s)))


def test_gelu_table_matches_torch_cpu_gelu_except_where_tanh_differs():
    """The table is torch's CUDA GELU; torch's CPU GELU differs from it only at a few inputs (each NaN for
    NaN), so a table that were read wrongly (byte order, offset) fails here."""
    x = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    table, cpu = reference.gelu_tanh_bf16(x), torch.nn.functional.gelu(x, approximate="tanh")
    differ = (table.view(torch.int16) != cpu.view(torch.int16)) & ~(torch.isnan(table) & torch.isnan(cpu))
    assert 0 <= int(differ.sum()) <= 16, x[differ]
    assert int(table.view(torch.int16)[0]) == 0 and int(table.view(torch.int16)[4]) == 2  # gelu(x) = x / 2 near 0
    assert float(table[0x3F80]) == float(cpu[0x3F80]) == 0.83984375  # gelu(1) = 0.8412 in bf16


def test_gelu_tanh_fp8_quantize_cpu_is_gelu_then_quantize():
    s = torch.tensor([0.4754464328289032])
    y = (torch.randn(3, 5, 64) * 4).bfloat16()
    want = q.fp8_quantize(reference.gelu_tanh_bf16(y), s)
    got = q.gelu_tanh_fp8_quantize(y, s)
    assert got.shape == y.shape and got.dtype == torch.float8_e4m3fn and torch.equal(_bytes(got), _bytes(want))
    out = torch.empty(y.shape, dtype=torch.float8_e4m3fn)
    assert q.gelu_tanh_fp8_quantize_out(y, s, out=out) is out and torch.equal(_bytes(out), _bytes(want))
    assert torch.equal(_bytes(q.gelu_tanh_fp8_quantize(y.transpose(0, 2), s)), _bytes(want.transpose(0, 2)))
    with pytest.raises(TypeError, match="y"):
        q.gelu_tanh_fp8_quantize(y.float(), s)
    with pytest.raises(ValueError, match="input_scale"):
        q.gelu_tanh_fp8_quantize(y, torch.tensor([0.0]))
    with pytest.raises(ValueError, match="out"):
        q.gelu_tanh_fp8_quantize_out(y, s, out=torch.empty(3, 5, dtype=torch.float8_e4m3fn))


def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    inp = make_inputs(2, 3, 48)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        f = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in inp.items()}
        s = mode.from_tensor(torch.tensor([0.5]))
        y, r = torch.ops.qwen_fp4.resnorm_quant_fp8(f["residual"], f["x"], f["bias"], f["gate"], f["scale"],
                                                    f["shift"], s, 1e-6)
        assert y.shape == (2, 3, 48) and y.dtype == torch.float8_e4m3fn and r.dtype == torch.bfloat16
        assert torch.ops.qwen_fp4.fp8_quantize(f["x"], s).dtype == torch.float8_e4m3fn
        assert torch.ops.qwen_fp4.norm_modulate_quant_fp8(f["x"], f["scale"], f["shift"], s, 1e-6).shape == (2, 3, 48)
    inp = make_inputs(2, 3, 128)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        f = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in inp.items()}
        packed, scales = torch.ops.qwen_fp4.norm_modulate_quant(f["x"], f["scale"], f["shift"], f["global_scale"],
                                                               1e-6, True)
        assert packed.shape == (6, 64) and scales.shape == (128, 8)


# opcheck's test_schema compares tensors by arithmetic, which torch does not implement for float8_e4m3fn on
# the CPU; the FP8 ops are checked without it (the fake, autograd registration and AOT dispatch tests).
FP8_OPCHECK = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")


def test_opcheck_cpu():
    inp = make_inputs(2, 3, 64, "batch", affine=True)
    s = torch.tensor([0.03125])
    common = (inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"], s, 1e-6)
    tail = (inp["weight"], inp["norm_bias"], None)
    ops = torch.ops.qwen_fp4
    check = lambda op, args: torch.library.opcheck(op, args, test_utils=FP8_OPCHECK)  # noqa: E731
    check(ops.resnorm_quant_fp8, common + tail)
    y = torch.empty(inp["x"].shape, dtype=torch.float8_e4m3fn)
    check(ops.resnorm_quant_fp8_out, common + (y, torch.empty_like(inp["x"])) + tail + (torch.empty_like(inp["x"]),))
    check(ops.fp8_quantize, (inp["x"], s))
    check(ops.fp8_quantize_out, (inp["x"], s, torch.empty_like(y)))
    check(ops.gelu_tanh_fp8_quantize, (inp["x"], s))
    check(ops.gelu_tanh_fp8_quantize_out, (inp["x"], s, torch.empty_like(y)))
    nm = (inp["x"], inp["scale"], inp["shift"])
    check(ops.norm_modulate_quant_fp8, nm + (s, 1e-6) + tail)
    check(ops.norm_modulate_quant_fp8_out, nm + (s, 1e-6, torch.empty_like(y)) + tail)
    torch.library.opcheck(ops.norm_modulate_quant, nm + (inp["global_scale"], 1e-6, True) + tail)


def _good():
    inp = make_inputs(2, 3, 48)
    return dict(residual=inp["residual"], x=inp["x"], bias=inp["bias"], gate=inp["gate"], scale=inp["scale"],
                shift=inp["shift"], input_scale=torch.tensor([0.5]))


@pytest.mark.parametrize("overrides,exc,pattern", [
    (dict(x=torch.zeros(2, 3, 48)), TypeError, r"^x must be bfloat16"),
    (dict(x=torch.zeros(2, 3, 40, dtype=torch.bfloat16), residual=torch.zeros(2, 3, 40, dtype=torch.bfloat16)),
     ValueError, r"^x\.shape\[-1\] \(D\) must be a positive multiple of 16, got 40"),
    (dict(input_scale=torch.tensor([0.5], dtype=torch.float64)), TypeError, r"^input_scale must be float32"),
    (dict(input_scale=torch.tensor([0.5, 1.0])), ValueError, r"^input_scale must have exactly one element"),
    (dict(input_scale=0.5), TypeError, r"^input_scale must be a torch.Tensor"),
    (dict(gate=torch.zeros(3, 48, dtype=torch.bfloat16)), ValueError, r"gate"),
])
def test_resnorm_quant_fp8_argument_errors(overrides, exc, pattern):
    kw = dict(_good(), **overrides)
    with pytest.raises(exc, match=pattern):
        q.resnorm_quant_fp8(**kw)
    if isinstance(kw["input_scale"], torch.Tensor):  # (the dispatcher refuses a non-tensor itself)
        with pytest.raises(exc, match=pattern):
            torch.ops.qwen_fp4.resnorm_quant_fp8(*kw.values(), 1e-6)


def test_norm_modulate_errors_name_scale():
    g = _good()
    with pytest.raises(TypeError, match=r"^scale must be bfloat16 or float32"):
        q.norm_modulate_quant_fp8(g["x"], g["scale"].half(), g["shift"], g["input_scale"])
    with pytest.raises(ValueError, match=r"^scale and shift must have one shape, but scale is \(48,\)"):
        q.norm_modulate_quant_fp8(g["x"], g["scale"], g["shift"][None].expand(2, 48), g["input_scale"])
    with pytest.raises(ValueError, match=r"multiple of 64"):
        q.norm_modulate_quant(g["x"], g["scale"], g["shift"], torch.tensor([1.0]))


def test_out_variant_errors():
    g = _good()
    x = g["x"]
    with pytest.raises(TypeError, match=r"^y must be float8_e4m3fn"):
        q.resnorm_quant_fp8_out(**g, y=torch.empty_like(x), residual_out=torch.empty_like(x))
    y = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"^y_bf16 must have shape"):
        q.resnorm_quant_fp8_out(**g, y=y, residual_out=torch.empty_like(x), y_bf16=torch.empty(2, 48).bfloat16())
    with pytest.raises(ValueError, match=r"^residual_out overlaps the input x"):
        q.resnorm_quant_fp8_out(**g, y=y, residual_out=x)
    with pytest.raises(ValueError, match=r"^out must have shape"):
        q.fp8_quantize_out(x, g["input_scale"], out=y[0])
    before = x.clone()
    with pytest.raises(ValueError, match=r"^input_scale "):
        q.resnorm_quant_fp8_out(**dict(g, input_scale=torch.tensor([-1.0])), y=y, residual_out=torch.empty_like(x))
    assert torch.equal(x, before)


def test_resnorm_accepts_every_multiple_of_16():
    for d in (16, 48, 80, 3088):
        inp = make_inputs(1, 3, d, seed=d)
        y, r = q.resnorm(inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"])
        y_ref, r_ref = reference.resnorm(inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"],
                                         inp["shift"], 1e-6)
        assert torch.equal(y, y_ref) and torch.equal(r, r_ref)
    inp = make_inputs(1, 3, 48)
    with pytest.raises(ValueError, match="multiple of 64"):
        q.resnorm_quant(inp["residual"], inp["x"], None, inp["gate"], inp["scale"], inp["shift"], torch.tensor([1.0]))
