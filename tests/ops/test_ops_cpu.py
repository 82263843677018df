"""The ops and typed wrappers on CPU: fake shapes, torch.compile, opcheck, argument checks, the fast-math
environment switches."""

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import qwen_resnorm_fp4 as q
from helpers.inputs import make_inputs, op_args, wrapper_kwargs
from helpers.oracles import round_up

ops = torch.ops.qwen_fp4
FAST_VARS = ("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "TRTLLM_DISABLE_FP4_QUANT_FAST_MATH")


def equal_outputs(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def shape_inputs(shape, form="shared"):
    """Inputs with x of an arbitrary shape [..., D] (modulation [D], or [B, D] with B = shape[0])."""
    D = shape[-1]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g).bfloat16()
    pshape = (D,) if form == "shared" else (shape[0], D)
    return dict(residual=torch.randn(*shape, generator=g).bfloat16(), x=x, bias=None,
                gate=torch.randn(*pshape, generator=g).bfloat16(), scale=torch.zeros(pshape, dtype=torch.bfloat16),
                shift=torch.zeros(pshape, dtype=torch.bfloat16), global_scale=torch.tensor([50.0]), eps=1e-6,
                weight=None, norm_bias=None, modulate_index=None)


# ---------------------------------------------------------------------------------------------------
# Fake (meta) implementations
# ---------------------------------------------------------------------------------------------------

SHAPES = [((3, 64), "shared"), ((0, 128), "shared"), ((2, 0, 64), "batch"), ((2, 5, 192), "batch"),
          ((2, 3, 4, 64), "shared"), ((130, 256), "shared")]


def _expect(shape):
    D = shape[-1]
    M = math.prod(shape[:-1])
    return (M, D // 2), (round_up(M, 128), D // 16)


@pytest.mark.parametrize("shape,form", SHAPES)
def test_fake_shapes_match_contract_and_real(shape, form):
    inp = shape_inputs(shape, form)
    packed_shape, scales_shape = _expect(shape)
    real_rq = ops.resnorm_quant(*op_args(inp, "resnorm_quant"))
    real_rn = ops.resnorm(*op_args(inp, "resnorm"))
    real_q = ops.nvfp4_quantize(inp["x"], inp["global_scale"], True)
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in inp.items()}
        rq = ops.resnorm_quant(*op_args(fake, "resnorm_quant"))
        rn = ops.resnorm(*op_args(fake, "resnorm"))
        qq = ops.nvfp4_quantize(fake["x"], fake["global_scale"], False)
    for fake_out, real_out in ((rq, real_rq), (rn, real_rn), (qq, real_q)):
        for f, r in zip(fake_out, real_out):
            assert f.shape == r.shape and f.dtype == r.dtype and f.stride() == r.stride()
            assert f.device == r.device
    assert tuple(rq[0].shape) == packed_shape and rq[0].dtype == torch.uint8
    assert tuple(rq[1].shape) == scales_shape and rq[1].dtype == torch.uint8
    assert rq[2].shape == inp["x"].shape and rq[2].dtype == torch.bfloat16
    assert rn[0].shape == rn[1].shape == inp["x"].shape and rn[0].dtype == torch.bfloat16
    assert tuple(qq[0].shape) == packed_shape and tuple(qq[1].shape) == scales_shape


def test_fake_with_optional_tensors():
    inp = make_inputs(2, 3, 128, "indexed_int32", torch.float32, affine=True)
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in inp.items()}
        packed, scales, r = ops.resnorm_quant(*op_args(fake, "resnorm_quant"))
    assert packed.shape == (6, 64) and scales.shape == (128, 8) and r.shape == (2, 3, 128)


# ---------------------------------------------------------------------------------------------------
# torch.compile
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["shared", "indexed_int64"])
def test_compile_op_fullgraph_aot_eager(form):
    torch._dynamo.reset()
    inp = make_inputs(2, 40, 128, form, torch.bfloat16, seed=3, affine=True)
    args = op_args(inp, "resnorm_quant", fast_math=True)

    def f(*a):
        packed, scales, r = torch.ops.qwen_fp4.resnorm_quant(*a)
        return packed, scales, r

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert equal_outputs(compiled(*args), f(*args))


def test_compile_wrappers_fullgraph_inductor():
    torch._dynamo.reset()
    inp = make_inputs(2, 40, 128, "batch", torch.bfloat16, seed=4)

    def chain(residual, x, bias, gate, scale, shift, gs):
        fused = q.resnorm_quant(residual, x, bias, gate, scale, shift, gs, 1e-6, False)
        y, r = q.resnorm(residual, x, bias, gate, scale, shift, 1e-6)
        unfused = q.nvfp4_quantize(y, gs, False)
        return fused + unfused + (y,)

    a = (inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"], inp["global_scale"])
    eager = chain(*a)
    out = torch.compile(chain, fullgraph=True, backend="inductor")(*a)
    assert equal_outputs(out, eager)
    assert torch.equal(out[0], out[3]) and torch.equal(out[1], out[4])  # fused == unfused inside the graph


def test_compile_dynamic_shapes():
    torch._dynamo.reset()

    def f(residual, x, gate, scale, shift, gs):
        return torch.ops.qwen_fp4.resnorm_quant(residual, x, None, gate, scale, shift, gs, 1e-6, True)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=True)
    for S in (3, 70, 131):
        inp = make_inputs(1, S, 64, "shared", torch.bfloat16, seed=S)
        a = (inp["residual"], inp["x"], inp["gate"], inp["scale"], inp["shift"], inp["global_scale"])
        out = compiled(*a)
        assert equal_outputs(out, f(*a))
        assert out[1].shape == (round_up(S, 128), 4)


# ---------------------------------------------------------------------------------------------------
# opcheck
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form,affine,fast", [("shared", False, True), ("indexed_int64", True, False),
                                              ("indexed_bool", False, True), ("batch", True, False)])
def test_opcheck_resnorm_quant(form, affine, fast):
    inp = make_inputs(2, 3, 64, form, torch.bfloat16, seed=7, affine=affine)
    torch.library.opcheck(ops.resnorm_quant.default, op_args(inp, "resnorm_quant", fast_math=fast))


@pytest.mark.parametrize("form,affine", [("batch", False), ("indexed_int32", True)])
def test_opcheck_resnorm(form, affine):
    inp = make_inputs(2, 3, 64, form, torch.float32, seed=8, affine=affine)
    torch.library.opcheck(ops.resnorm.default, op_args(inp, "resnorm"))


@pytest.mark.parametrize("fast", [True, False])
def test_opcheck_nvfp4_quantize(fast):
    y = torch.randn(2, 3, 128, generator=torch.Generator().manual_seed(9)).bfloat16()
    torch.library.opcheck(ops.nvfp4_quantize.default, (y, torch.tensor([30.0]), fast))


# ---------------------------------------------------------------------------------------------------
# Typed wrappers
# ---------------------------------------------------------------------------------------------------


def test_wrappers_equal_ops_and_keep_inputs():
    inp = make_inputs(2, 5, 128, "indexed_bool", torch.bfloat16, seed=12, affine=True)
    before = {k: v.clone() for k, v in inp.items() if isinstance(v, torch.Tensor)}
    pos = (inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"])
    fused = q.resnorm_quant(*pos, inp["global_scale"], inp["eps"], True, **wrapper_kwargs(inp))
    y, r = q.resnorm(*pos, inp["eps"], **wrapper_kwargs(inp))
    unfused = q.nvfp4_quantize(y, inp["global_scale"], True)
    assert equal_outputs(fused, ops.resnorm_quant(*op_args(inp, "resnorm_quant", fast_math=True)))
    assert equal_outputs((y, r), ops.resnorm(*op_args(inp, "resnorm")))
    assert torch.equal(fused[0], unfused[0]) and torch.equal(fused[1], unfused[1]) and torch.equal(fused[2], r)
    deq = q.dequantize_nvfp4(fused[0], fused[1], inp["global_scale"])
    assert deq.shape == (10, 128) and deq.dtype == torch.float32
    for k, v in before.items():
        assert torch.equal(inp[k], v), k  # no input was modified


def test_outputs_do_not_alias_inputs():
    inp = make_inputs(1, 4, 64, "shared", torch.bfloat16, seed=13, bias=False)
    pos = (inp["residual"], inp["x"], None, inp["gate"], inp["scale"], inp["shift"])
    _, _, r = q.resnorm_quant(*pos, inp["global_scale"])
    y, r2 = q.resnorm(*pos)
    for out in (r, y, r2):
        for t in (inp["residual"], inp["x"]):
            assert out.data_ptr() != t.data_ptr()


def test_non_contiguous_and_misaligned_inputs():
    inp = make_inputs(2, 6, 128, "batch", torch.float32, seed=14)
    pos = (inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"])
    want = q.resnorm_quant(*pos, inp["global_scale"], 1e-6, True)
    # x as a transposed view, residual at a 2-byte offset (not 16-byte aligned), gate as a strided view
    x_t = inp["x"].transpose(0, 1).contiguous().transpose(0, 1)
    assert not x_t.is_contiguous()
    buf = torch.empty(inp["residual"].numel() + 1, dtype=torch.bfloat16)
    res_off = buf[1:].view_as(inp["residual"])
    res_off.copy_(inp["residual"])
    assert res_off.data_ptr() % 16 != 0
    gate_s = torch.stack([inp["gate"], inp["gate"]], dim=-1)[..., 0]
    assert not gate_s.is_contiguous()
    got = q.resnorm_quant(res_off, x_t, inp["bias"], gate_s, inp["scale"], inp["shift"], inp["global_scale"], 1e-6,
                          True)
    assert equal_outputs(got, want)


def _good():
    inp = make_inputs(2, 4, 128, "batch", torch.bfloat16, seed=15, affine=True)
    return dict(residual=inp["residual"], x=inp["x"], bias=inp["bias"], gate=inp["gate"], scale=inp["scale"],
                shift=inp["shift"], global_scale=inp["global_scale"], eps=1e-6, fast_math=True,
                weight=inp["weight"], norm_bias=inp["norm_bias"], modulate_index=None)


def _call_rq(kw):
    kw = dict(kw)
    pos = [kw.pop(k) for k in ("residual", "x", "bias", "gate", "scale", "shift", "global_scale", "eps", "fast_math")]
    return q.resnorm_quant(*pos, **kw)


def _call_rn(kw):
    kw = dict(kw)
    kw.pop("global_scale"), kw.pop("fast_math")
    pos = [kw.pop(k) for k in ("residual", "x", "bias", "gate", "scale", "shift", "eps")]
    return q.resnorm(*pos, **kw)


D = 128
BAD = [
    # (overrides, exception, regex the message must match: it names the argument)
    (dict(x=torch.zeros(2, 4, D)), TypeError, r"^x "),
    (dict(x=torch.zeros(2, 4, D, dtype=torch.float16)), TypeError, r"^x "),
    (dict(x=[[0.0] * D]), TypeError, r"^x "),
    (dict(residual=torch.zeros(2, 4, D)), TypeError, r"^residual "),
    (dict(residual=torch.zeros(2, 5, D, dtype=torch.bfloat16)), ValueError, r"^residual "),
    (dict(x=torch.zeros(2, 4, 40, dtype=torch.bfloat16), residual=torch.zeros(2, 4, 40, dtype=torch.bfloat16)),
     ValueError, r"x\.shape\[-1\].*multiple of (64|16)"),  # resnorm: 16, resnorm_quant: 64
    (dict(x=torch.zeros(1, 16448, dtype=torch.bfloat16), residual=torch.zeros(1, 16448, dtype=torch.bfloat16)),
     ValueError, r"x\.shape\[-1\].*at most 16384"),
    (dict(gate=torch.zeros(2, D, dtype=torch.int32)), TypeError, r"^gate "),
    (dict(gate=torch.zeros(2, D, dtype=torch.float16)), TypeError, r"^gate "),
    (dict(gate=torch.zeros(2, D + 64, dtype=torch.bfloat16)), ValueError, r"^gate "),
    (dict(scale=torch.zeros(D, dtype=torch.bfloat16)), ValueError, r"scale"),
    (dict(shift=torch.zeros(2, D - 64, dtype=torch.bfloat16)), ValueError, r"^shift "),
    (dict(scale=torch.zeros(1, 1, 2, D, dtype=torch.bfloat16)), ValueError, r"^scale "),
    (dict(gate=torch.zeros(3, D), scale=torch.zeros(3, D), shift=torch.zeros(3, D)), ValueError, r"gate\.shape\[0\]"),
    (dict(bias=torch.zeros(D, dtype=torch.float64)), TypeError, r"^bias "),
    (dict(bias=torch.zeros(2, D, dtype=torch.bfloat16)), ValueError, r"^bias "),
    (dict(weight=torch.zeros(D + 64, dtype=torch.bfloat16)), ValueError, r"^weight "),
    (dict(norm_bias=torch.zeros(D, dtype=torch.int64)), TypeError, r"^norm_bias "),
    (dict(global_scale=torch.tensor([1.0], dtype=torch.float64)), TypeError, r"^global_scale "),
    (dict(global_scale=torch.tensor([1.0, 2.0])), ValueError, r"^global_scale "),
    (dict(global_scale=1.0), TypeError, r"^global_scale "),
    (dict(eps=-1e-6), ValueError, r"^eps "),
    (dict(eps=float("nan")), ValueError, r"^eps "),
    (dict(eps=float("inf")), ValueError, r"^eps "),
    (dict(eps="1e-6"), TypeError, r"^eps "),
    (dict(eps=True), TypeError, r"^eps "),
    (dict(fast_math=1), TypeError, r"^fast_math "),
    (dict(modulate_index=torch.zeros(2, 4)), TypeError, r"^modulate_index "),
    (dict(modulate_index=torch.zeros(8, dtype=torch.int32)), ValueError, r"^modulate_index "),
    (dict(modulate_index=torch.zeros(2, 4, dtype=torch.int32)), ValueError, r"gate/scale/shift must be \[2B, D\]"),
    (dict(modulate_index=torch.zeros(2, 3, dtype=torch.int32), gate=torch.zeros(4, D), scale=torch.zeros(4, D),
          shift=torch.zeros(4, D)), ValueError, r"^modulate_index "),
]


@pytest.mark.parametrize("overrides,exc,pattern", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_wrapper_argument_checks(overrides, exc, pattern):
    kw = dict(_good(), **overrides)
    before = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(exc, match=pattern):
        _call_rq(kw)
    if "global_scale" not in overrides and "fast_math" not in overrides:
        with pytest.raises(exc, match=pattern):
            _call_rn(kw)
    for k, v in before.items():
        assert torch.equal(kw[k], v)


def test_good_arguments_pass():
    assert len(_call_rq(_good())) == 3 and len(_call_rn(_good())) == 2
    # the accepted variants: fp32 parameters, int64/bool index, eps = 0, a 0-d global scale
    kw = dict(_good(), gate=torch.ones(4, D), scale=torch.zeros(4, D), shift=torch.zeros(4, D),
              modulate_index=torch.ones(2, 4, dtype=torch.bool), eps=0, global_scale=torch.tensor(3.0))
    assert len(_call_rq(kw)) == 3


def test_nvfp4_quantize_and_dequantize_checks():
    gs = torch.tensor([1.0])
    with pytest.raises(TypeError, match=r"^y "):
        q.nvfp4_quantize(torch.zeros(2, 64), gs)
    with pytest.raises(ValueError, match=r"y\.shape\[-1\].*multiple of 64"):
        q.nvfp4_quantize(torch.zeros(2, 80, dtype=torch.bfloat16), gs)
    with pytest.raises(ValueError, match=r"^global_scale "):
        q.nvfp4_quantize(torch.zeros(2, 64, dtype=torch.bfloat16), torch.ones(2))
    with pytest.raises(TypeError, match=r"^fast_math "):
        q.nvfp4_quantize(torch.zeros(2, 64, dtype=torch.bfloat16), gs, "yes")
    packed, scales = q.nvfp4_quantize(torch.ones(3, 64, dtype=torch.bfloat16), gs)
    with pytest.raises(TypeError, match=r"^packed "):
        q.dequantize_nvfp4(packed.float(), scales, gs)
    with pytest.raises(ValueError, match=r"^rows "):
        q.dequantize_nvfp4(packed, scales, gs, rows=4)
    with pytest.raises(ValueError, match=r"^scales "):
        q.dequantize_nvfp4(packed, scales[:1], gs)


# ---------------------------------------------------------------------------------------------------
# fast_math=None follows the production quantizer's environment switches
# ---------------------------------------------------------------------------------------------------


@pytest.fixture
def differing_inputs():
    inp = make_inputs(2, 64, 256, "batch", torch.bfloat16, seed=22, global_scale=100.0)
    pos = (inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"], inp["global_scale"])
    fast = q.resnorm_quant(*pos, 1e-6, True)
    exact = q.resnorm_quant(*pos, 1e-6, False)
    assert not torch.equal(fast[0], exact[0]) and not torch.equal(fast[1], exact[1])  # the modes differ here
    y, _ = q.resnorm(*pos[:-1])
    qf, qe = q.nvfp4_quantize(y, inp["global_scale"], True), q.nvfp4_quantize(y, inp["global_scale"], False)
    assert not equal_outputs(qf, qe)
    return pos, fast, exact, y, qf, qe


@pytest.mark.parametrize("env,expect_fast", [
    ({}, True),
    ({FAST_VARS[0]: "1"}, False),
    ({FAST_VARS[1]: "1"}, False),
    ({FAST_VARS[0]: "1", FAST_VARS[1]: "1"}, False),
    ({FAST_VARS[0]: "0"}, True),
    ({FAST_VARS[1]: "0", FAST_VARS[0]: ""}, True),
])
def test_fast_math_none_follows_environment(monkeypatch, differing_inputs, env, expect_fast):
    pos, fast, exact, y, qf, qe = differing_inputs
    for v in FAST_VARS:
        monkeypatch.delenv(v, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    got = q.resnorm_quant(*pos, 1e-6, None)
    assert equal_outputs(got, fast if expect_fast else exact)
    assert equal_outputs(q.resnorm_quant(*pos), fast if expect_fast else exact)  # the default is None
    assert equal_outputs(q.nvfp4_quantize(y, pos[-1]), qf if expect_fast else qe)
    # an explicit bool wins over the environment
    assert equal_outputs(q.resnorm_quant(*pos, 1e-6, True), fast)
    assert equal_outputs(q.resnorm_quant(*pos, 1e-6, False), exact)


def test_environment_read_at_call_time(monkeypatch, differing_inputs):
    pos, fast, exact, *_ = differing_inputs
    for v in FAST_VARS:
        monkeypatch.delenv(v, raising=False)
    assert equal_outputs(q.resnorm_quant(*pos), fast)
    monkeypatch.setenv(FAST_VARS[1], "1")
    assert equal_outputs(q.resnorm_quant(*pos), exact)
    monkeypatch.delenv(FAST_VARS[1])
    assert equal_outputs(q.resnorm_quant(*pos), fast)


@pytest.mark.parametrize("name", [*FAST_VARS, "QWEN_FP4_DISABLE", "FLASHINFER_NVFP4_4OVER6"])
def test_switches_follow_every_way_of_setting_the_environment(monkeypatch, name):
    """The switches are read from os.environ at call time: they see os.environ[...] =, del, monkeypatch, a
    value other than "1", and an os.environ replaced by another mapping."""
    import os

    from qwen_resnorm_fp4 import env

    monkeypatch.delenv(name, raising=False)
    assert not env.flag_enabled(name)
    os.environ[name] = "1"
    try:
        assert env.flag_enabled(name)
        assert env.default_fast_math() == (name not in FAST_VARS)
        os.environ[name] = "true"  # only exactly "1" counts, as in the production quantizer
        assert not env.flag_enabled(name)
    finally:
        del os.environ[name]
    assert not env.flag_enabled(name) and env.default_fast_math()
    monkeypatch.setenv(name, "1")
    assert env.flag_enabled(name)
    monkeypatch.setattr(os, "environ", {name: "0"})  # a plain mapping in place of os.environ
    assert not env.flag_enabled(name)
    monkeypatch.setattr(os, "environ", {name: "1"})
    assert env.flag_enabled(name) and env.default_fast_math() == (name not in FAST_VARS)

