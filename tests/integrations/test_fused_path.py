"""The fused path (try_fused_resnorm_quant): every decline reason, the switches, log-once, the success path
(same bytes as resnorm_quant), the device-capability rule, torch.compile(fullgraph=True), and on a GPU
CUDA-graph capture and the decisions on CUDA tensors (served, declined or raised, with the op called at most
once)."""

from __future__ import annotations

import dataclasses
import logging
import re
import types
from typing import List

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import device
from qwen_resnorm_fp4.fused_path import reset_decline_log
from qwen_resnorm_fp4 import fused_path as fused_mod
from qwen_resnorm_fp4.env import ALL_VARS
from qwen_resnorm_fp4.integrations._spec import ModelSpec
from qwen_resnorm_fp4.fused_path import DeclineReason as R

from helpers.paths import REPO_ROOT
from helpers.reliability import CUDA_OK  # noqa: E402


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for v in ALL_VARS:
        monkeypatch.delenv(v, raising=False)
    fused_mod.reset_decline_log()
    yield
    fused_mod.reset_decline_log()


def block(B=2, S=8, D=128, N=96, *, device="cpu", form="batch", param_dtype=torch.float32, bias=False, seed=0):
    """A DiT block's tensors for the fused path, plus an FC1 NVFP4Linear of width D -> N."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s, std=1.0: torch.randn(*s, generator=g) * std  # noqa: E731
    prow = {"shared": (), "batch": (B,), "batch1": (B, 1), "indexed": (2 * B,)}[form]
    kw = dict(
        residual=rnd(B, S, D, std=2.0).bfloat16(),
        x=rnd(B, S, D).bfloat16(),
        gate=(rnd(*prow, D, std=0.5) + 0.5).to(param_dtype),
        scale=rnd(*prow, D, std=0.3).to(param_dtype),
        shift=rnd(*prow, D, std=0.3).to(param_dtype),
    )
    extra = {}
    if bias:
        extra["bias"] = rnd(D, std=0.2).to(param_dtype)
    if form == "indexed":
        extra["modulate_index"] = torch.randint(0, 2, (B, S), generator=g).to(torch.int32)
    lin = torch.nn.Linear(D, N)
    with torch.no_grad():
        lin.weight.copy_(rnd(N, D, std=D ** -0.5))
        lin.bias.copy_(rnd(N, std=0.1))
    fc1 = q.NVFP4Linear.from_linear(lin.bfloat16(), 8.0)
    kw = {k: v.to(device) for k, v in kw.items()}
    extra = {k: v.to(device) for k, v in extra.items()}
    return kw, extra, fc1.to(device)


def direct(kw, extra, fc1, *, eps=1e-6, weight=None, norm_bias=None, fast_math=None, nvfp4_4over6=None):
    """resnorm_quant called directly, the way the fused path should call it."""
    gate, scale, shift = kw["gate"], kw["scale"], kw["shift"]
    if gate.dim() == 3:
        gate, scale, shift = gate.squeeze(1), scale.squeeze(1), shift.squeeze(1)
    return q.resnorm_quant(kw["residual"], kw["x"], extra.get("bias"), gate, scale, shift, fc1.input_global_scale,
                           eps, fast_math, weight=weight, norm_bias=norm_bias,
                           modulate_index=extra.get("modulate_index"), nvfp4_4over6=nvfp4_4over6)


def call(kw, extra, fc1, **more):
    return q.try_fused_resnorm_quant(kw["residual"], kw["x"], kw["gate"], kw["scale"], kw["shift"], fc1,
                                     **extra, **more)


def assert_same(out, ref):
    (packed, scales), residual_out, _ = out
    assert torch.equal(packed, ref[0])
    assert torch.equal(scales, ref[1])
    assert torch.equal(residual_out, ref[2])


# --------------------------------------------------------------------------------------------------
# Success on CPU (allow_cpu=True): the same bytes as resnorm_quant called directly
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["shared", "batch", "batch1", "indexed"])
@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
def test_success_matches_resnorm_quant(form, param_dtype, bias):
    kw, extra, fc1 = block(form=form, param_dtype=param_dtype, bias=bias)
    marker = torch.ones(3)
    out = call(kw, extra, fc1, allow_cpu=True, gate_out=marker)
    assert out is not None, q.last_decline_detail()
    assert out[2] is marker  # gate_out passes through untouched
    assert q.last_decline_reason() is None and q.last_decline_detail() is None
    assert_same(out, direct(kw, extra, fc1))
    (packed, scales), residual_out, _ = out
    M = kw["x"].numel() // 128
    assert packed.shape == (M, 64) and scales.shape == (128, 8) and residual_out.shape == kw["x"].shape


def test_norm_forms():
    kw, extra, fc1 = block()
    D = kw["x"].shape[-1]
    g = torch.Generator().manual_seed(5)
    w = (1 + 0.1 * torch.randn(D, generator=g)).bfloat16()
    b = (0.1 * torch.randn(D, generator=g)).bfloat16()
    ref_plain = direct(kw, extra, fc1, eps=1e-5)
    ref_affine = direct(kw, extra, fc1, eps=1e-5, weight=w, norm_bias=b)

    ln = torch.nn.LayerNorm(D, eps=1e-5, elementwise_affine=False)
    assert_same(call(kw, extra, fc1, allow_cpu=True, norm=ln), ref_plain)
    ln = torch.nn.LayerNorm(D, eps=1e-5).bfloat16().requires_grad_(False)
    with torch.no_grad():
        ln.weight.copy_(w)
        ln.bias.copy_(b)
    assert_same(call(kw, extra, fc1, allow_cpu=True, norm=ln), ref_affine)
    # the module's eps wins over the keyword
    assert_same(call(kw, extra, fc1, allow_cpu=True, norm=ln, eps=0.5), ref_affine)
    # a mapping and a namespace
    d = dict(type="layernorm", elementwise_affine=True, weight=w, bias=b, eps=1e-5)
    assert_same(call(kw, extra, fc1, allow_cpu=True, norm=d), ref_affine)
    assert_same(call(kw, extra, fc1, allow_cpu=True, norm=types.SimpleNamespace(**d)), ref_affine)
    assert_same(call(kw, extra, fc1, allow_cpu=True, norm=dict(d, type="LayerNorm")), ref_affine)
    # elementwise_affine=False ignores weight/bias; a missing eps falls back to the keyword
    assert_same(call(kw, extra, fc1, allow_cpu=True, norm=dict(d, elementwise_affine=False)), ref_plain)
    assert_same(call(kw, extra, fc1, allow_cpu=True, norm={"type": "layer_norm"}, eps=1e-5), ref_plain)
    # norm=None: non-affine LayerNorm with eps
    assert_same(call(kw, extra, fc1, allow_cpu=True, eps=1e-5), ref_plain)


def test_success_after_decline_clears_reason():
    kw, extra, fc1 = block()
    assert call(kw, extra, fc1) is None
    assert q.last_decline_reason() == R.CPU_TENSORS
    assert call(kw, extra, fc1, allow_cpu=True) is not None
    assert q.last_decline_reason() is None


def test_fused_output_feeds_fc1():
    """fc1((packed, scales)) of the fused output == fc1(y) of the unfused chain, bit for bit."""
    kw, extra, fc1 = block(bias=True)
    (packed, scales), residual_out, _ = call(kw, extra, fc1, allow_cpu=True)
    y, r = q.resnorm(kw["residual"], kw["x"], extra["bias"], kw["gate"], kw["scale"], kw["shift"], 1e-6)
    assert torch.equal(residual_out, r)
    h_fused = fc1((packed, scales), out_shape=kw["x"].shape[:-1])
    assert torch.equal(h_fused, fc1(y))


# --------------------------------------------------------------------------------------------------
# fast_math: the keyword, the layer's pin, and the environment
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def spy(monkeypatch):
    seen = {}
    real = fused_mod.call_resnorm_quant  # what the fused path calls once its checks passed

    def fake(*args, **kwargs):
        seen["fast_math"] = args[8]
        seen["eps"] = args[7]
        return real(*args, **kwargs)

    monkeypatch.setattr(fused_mod, "call_resnorm_quant", fake)
    return seen


@pytest.mark.parametrize("var", ["FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "TRTLLM_DISABLE_FP4_QUANT_FAST_MATH"])
def test_fast_math_follows_env(monkeypatch, spy, var):
    kw, extra, fc1 = block()
    call(kw, extra, fc1, allow_cpu=True)
    assert spy["fast_math"] is True
    monkeypatch.setenv(var, "1")
    out = call(kw, extra, fc1, allow_cpu=True)
    assert spy["fast_math"] is False
    assert_same(out, direct(kw, extra, fc1, fast_math=False))
    call(kw, extra, fc1, allow_cpu=True, fast_math=True)  # an explicit bool wins
    assert spy["fast_math"] is True
    monkeypatch.setenv(var, "0")  # only "1" counts, as in the production quantizer
    call(kw, extra, fc1, allow_cpu=True)
    assert spy["fast_math"] is True


def test_fast_math_from_layer(spy):
    kw, extra, fc1 = block()
    fc1.fast_math = False
    call(kw, extra, fc1, allow_cpu=True)
    assert spy["fast_math"] is False
    call(kw, extra, fc1, allow_cpu=True, fast_math=True)
    assert spy["fast_math"] is True


def test_fast_math_type_error():
    kw, extra, fc1 = block()
    with pytest.raises(TypeError):
        call(kw, extra, fc1, allow_cpu=True, fast_math="yes")


# --------------------------------------------------------------------------------------------------
# Every decline reason
# --------------------------------------------------------------------------------------------------


class _NotNVFP4:
    in_features = 128


def _fake_cuda_block():
    with FakeTensorMode():
        x = torch.empty(2, 8, 128, dtype=torch.bfloat16, device="cuda")
        p = torch.empty(128, dtype=torch.bfloat16, device="cuda")
    return x, p


def _mutated_block(mutate_kw=None, mutate_extra=None, fc1_fn=None, **block_kw):
    """block(**block_kw) with its tensors, extras and fc1 each passed through a mutation when given."""
    kw, extra, fc1 = block(**block_kw)
    if mutate_kw:
        kw = mutate_kw(kw)
    if mutate_extra:
        extra = mutate_extra(extra)
    if fc1_fn:
        fc1 = fc1_fn(fc1)
    return kw, extra, fc1


def _case(name):
    """(reason, callable returning the fused path's result) for a named decline case."""
    def run(mutate_kw=None, mutate_extra=None, fc1_fn=None, **more):
        kw, extra, fc1 = _mutated_block(mutate_kw, mutate_extra, fc1_fn)
        more.setdefault("allow_cpu", True)
        return call(kw, extra, fc1, **more)

    D = 128
    cases = {
        "cpu_tensors": (R.CPU_TENSORS, lambda: run(allow_cpu=False)),
        "meta_device": (R.UNSUPPORTED_DEVICE, lambda: run(lambda k: {n: t.to("meta") for n, t in k.items()})),
        "gate_on_meta": (R.DEVICE_MISMATCH, lambda: run(lambda k: dict(k, gate=k["gate"].to("meta")))),
        "bias_on_meta": (R.DEVICE_MISMATCH,
                         lambda: run(mutate_extra=lambda e: dict(bias=torch.zeros(D, device="meta")))),
        "norm_weight_on_meta": (R.DEVICE_MISMATCH, lambda: run(norm=dict(weight=torch.ones(D, device="meta")))),
        "fc1_scale_on_meta": (R.DEVICE_MISMATCH, lambda: run(fc1_fn=lambda f: f.to("meta"))),
        "x_fp16": (R.UNSUPPORTED_DTYPE, lambda: run(lambda k: dict(k, x=k["x"].half()))),
        "residual_fp32": (R.UNSUPPORTED_DTYPE, lambda: run(lambda k: dict(k, residual=k["residual"].float()))),
        "x_not_tensor": (R.UNSUPPORTED_DTYPE, lambda: run(lambda k: dict(k, x=k["x"].tolist()))),
        "gate_fp16": (R.UNSUPPORTED_DTYPE, lambda: run(lambda k: dict(k, gate=k["gate"].half()))),
        "shift_fp64": (R.UNSUPPORTED_DTYPE, lambda: run(lambda k: dict(k, shift=k["shift"].double()))),
        "bias_int": (R.UNSUPPORTED_DTYPE,
                     lambda: run(mutate_extra=lambda e: dict(bias=torch.zeros(D, dtype=torch.int32)))),
        "index_float": (R.UNSUPPORTED_DTYPE, lambda: run(
            lambda k: {n: torch.cat([t, t]) if n in ("gate", "scale", "shift") else t for n, t in k.items()},
            lambda e: dict(modulate_index=torch.zeros(2, 8)))),
        "norm_weight_fp16": (R.UNSUPPORTED_DTYPE, lambda: run(norm=dict(weight=torch.ones(D, dtype=torch.float16)))),
        "shape_mismatch": (R.UNSUPPORTED_SHAPE,
                           lambda: run(lambda k: dict(k, residual=k["residual"][:, :4].contiguous()))),
        "zero_rows": (R.UNSUPPORTED_SHAPE,
                      lambda: run(lambda k: dict(k, x=k["x"][:, :0], residual=k["residual"][:, :0]))),
        "scalar_x": (R.UNSUPPORTED_SHAPE,
                     lambda: run(lambda k: dict(k, x=k["x"][0, 0, 0], residual=k["residual"][0, 0, 0]))),
        "bias_wrong_shape": (R.UNSUPPORTED_SHAPE, lambda: run(mutate_extra=lambda e: dict(bias=torch.zeros(64)))),
        "width_96": (R.UNSUPPORTED_WIDTH, lambda: run(lambda k: dict(k, x=k["x"][..., :96].contiguous(),
                                                                     residual=k["residual"][..., :96].contiguous()))),
        "width_too_large": (R.UNSUPPORTED_WIDTH, lambda: q.try_fused_resnorm_quant(
            torch.zeros(1, 16448, dtype=torch.bfloat16), torch.zeros(1, 16448, dtype=torch.bfloat16),
            torch.zeros(16448), torch.zeros(16448), torch.zeros(16448), q.NVFP4Linear(64, 32), allow_cpu=True)),
        "x_transposed": (R.NON_CONTIGUOUS,
                         lambda: run(lambda k: dict(k, x=k["x"].transpose(0, 1).contiguous().transpose(0, 1)))),
        "residual_strided": (R.NON_CONTIGUOUS,
                             lambda: run(lambda k: dict(k, residual=torch.cat([k["residual"]] * 2, -1)[..., :128]))),
        "per_token_rows_mismatch": (R.UNSUPPORTED_MODULATION, lambda: run(lambda k: dict(
            k, gate=torch.zeros(2, 4, D), scale=torch.zeros(2, 4, D), shift=torch.zeros(2, 4, D)))),
        "gate_scale_shapes_differ": (R.UNSUPPORTED_MODULATION, lambda: run(lambda k: dict(k, gate=k["gate"][0]))),
        "gate_wrong_width": (R.UNSUPPORTED_MODULATION, lambda: run(lambda k: dict(
            k, gate=k["gate"][:, :64], scale=k["scale"][:, :64], shift=k["shift"][:, :64]))),
        "rows_not_split": (R.UNSUPPORTED_MODULATION, lambda: run(lambda k: dict(
            k, gate=torch.zeros(3, D), scale=torch.zeros(3, D), shift=torch.zeros(3, D)))),
        "gate_none": (R.UNSUPPORTED_MODULATION, lambda: run(lambda k: dict(k, gate=None))),
        "index_without_2B": (R.UNSUPPORTED_MODULATION, lambda: run(
            mutate_extra=lambda e: dict(modulate_index=torch.zeros(2, 8, dtype=torch.int32)))),
        "rmsnorm_module": (R.UNSUPPORTED_NORM, lambda: run(norm=torch.nn.RMSNorm(D))),
        "identity_module": (R.UNSUPPORTED_NORM, lambda: run(norm=torch.nn.Identity())),
        "rmsnorm_dict": (R.UNSUPPORTED_NORM, lambda: run(norm=dict(type="rmsnorm", eps=1e-6))),
        "rmsnorm_namespace": (R.UNSUPPORTED_NORM, lambda: run(norm=types.SimpleNamespace(type="RMSNorm"))),
        "layernorm_wrong_shape": (R.UNSUPPORTED_NORM, lambda: run(norm=torch.nn.LayerNorm((8, D)))),
        "norm_weight_wrong_shape": (R.UNSUPPORTED_NORM, lambda: run(norm=dict(weight=torch.ones(64)))),
        "eps_nan": (R.UNSUPPORTED_NORM, lambda: run(eps=float("nan"))),
        "eps_negative": (R.UNSUPPORTED_NORM, lambda: run(norm=dict(eps=-1.0))),
        "fc1_nn_linear": (R.FC1_NOT_NVFP4, lambda: run(fc1_fn=lambda f: torch.nn.Linear(D, 32))),
        "fc1_none": (R.FC1_NOT_NVFP4, lambda: run(fc1_fn=lambda f: None)),
        "fc1_no_scale": (R.FC1_NOT_NVFP4, lambda: run(fc1_fn=lambda f: _NotNVFP4())),
        "fc1_scale_fp16": (R.FC1_NOT_NVFP4, lambda: run(fc1_fn=lambda f: types.SimpleNamespace(
            in_features=D, input_global_scale=torch.ones(1, dtype=torch.float16)))),
        "fc1_width": (R.FC1_WIDTH_MISMATCH, lambda: run(fc1_fn=lambda f: q.NVFP4Linear(2 * D, 32))),
        "fake_cuda_no_library": (R.NO_KERNEL_FOR_DEVICE, lambda: q.try_fused_resnorm_quant(
            *(lambda x, p: (x, x, p, p, p))(*_fake_cuda_block()), q.NVFP4Linear(128, 32))),
    }
    return cases[name]


CASES = ["cpu_tensors", "meta_device", "gate_on_meta", "bias_on_meta", "norm_weight_on_meta", "fc1_scale_on_meta",
         "x_fp16", "residual_fp32", "x_not_tensor", "gate_fp16", "shift_fp64", "bias_int", "index_float",
         "norm_weight_fp16", "shape_mismatch", "zero_rows", "scalar_x", "bias_wrong_shape", "width_96",
         "width_too_large", "x_transposed", "residual_strided", "per_token_rows_mismatch", "gate_scale_shapes_differ",
         "gate_wrong_width", "rows_not_split", "gate_none", "index_without_2B", "rmsnorm_module",
         "identity_module", "rmsnorm_dict", "rmsnorm_namespace", "layernorm_wrong_shape",
         "norm_weight_wrong_shape", "eps_nan", "eps_negative", "fc1_nn_linear", "fc1_none", "fc1_no_scale",
         "fc1_scale_fp16", "fc1_width", "fake_cuda_no_library"]


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.skipif(
        CUDA_OK, reason="the library is loaded here: fake CUDA tensors pass the kernel check"))
    if n == "fake_cuda_no_library" else n for n in CASES])
def test_decline(name):
    reason, run = _case(name)
    assert run() is None
    assert q.last_decline_reason() is reason
    assert q.last_decline_reason() == reason.value  # a str enum: compares with its identifier
    detail = q.last_decline_detail()
    assert isinstance(detail, str) and detail and "{" not in detail


def test_env_switches(monkeypatch):
    kw, extra, fc1 = block()
    monkeypatch.setenv("QWEN_FP4_DISABLE", "1")
    assert call(kw, extra, fc1, allow_cpu=True) is None
    assert q.last_decline_reason() is R.DISABLED_BY_ENV
    for value in ("0", "true", ""):  # only "1" disables
        monkeypatch.setenv("QWEN_FP4_DISABLE", value)
        assert call(kw, extra, fc1, allow_cpu=True) is not None
    monkeypatch.delenv("QWEN_FP4_DISABLE")
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", "1")
    # the layer pinned its recipe (the standard one) when it was made: the environment now does not change it
    assert_same(call(kw, extra, fc1, allow_cpu=True), direct(kw, extra, fc1, nvfp4_4over6=None))
    # an FC1 without a recipe of its own follows the environment, as FlashInfer's fp4_quantize does
    bare = types.SimpleNamespace(in_features=fc1.in_features, input_global_scale=fc1.input_global_scale)
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6_ERR_MODE", "mse")
    served = call(kw, extra, bare, allow_cpu=True)
    assert_same(served, direct(kw, extra, fc1, nvfp4_4over6=q.NVFP44Over6Config(err_mode="MSE")))
    assert not torch.equal(served[0][1], direct(kw, extra, fc1)[1])  # the recipe made a difference
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6_ERR_MODE", "median")
    assert call(kw, extra, bare, allow_cpu=True) is None
    assert q.last_decline_reason() is R.UNSUPPORTED_RECIPE
    assert "median" in q.last_decline_detail()
    with pytest.raises(ValueError, match="err_mode"):  # a malformed argument is the caller's bug: raised
        call(kw, extra, bare, allow_cpu=True, nvfp4_4over6=types.SimpleNamespace(
            e4m3_max=448, err_mode="median", err_use_fast_math=False))
    monkeypatch.setenv("FLASHINFER_NVFP4_4OVER6", "0")
    assert call(kw, extra, fc1, allow_cpu=True) is not None
    # the switches come first: even an unservable call reports them
    monkeypatch.setenv("QWEN_FP4_DISABLE", "1")
    assert call(kw, extra, None) is None and q.last_decline_reason() is R.DISABLED_BY_ENV


def test_every_reason_is_covered_and_described(monkeypatch):
    # UNSUPPORTED_SCALE: the input_scale value rule's reason, which reads the value (a sync), so no gate applies
    # it; the ops' CPU implementations and the load checks raise it.
    from qwen_resnorm_fp4.validation import input_scale_value_problem

    value_problem = input_scale_value_problem(torch.tensor([float("nan")]))
    assert value_problem.reason is R.UNSUPPORTED_SCALE and value_problem.error is ValueError
    covered = {_case(n)[0] for n in CASES} | {R.DISABLED_BY_ENV, R.UNSUPPORTED_RECIPE, R.UNSUPPORTED_SCALE}
    assert covered == set(R)
    for r in R:
        assert r.description and str(r) == r.value
    assert {r.value for r in R} >= {"disabled_by_env", "unsupported_recipe", "no_kernel_for_device", "cpu_tensors",
                                     "unsupported_dtype", "unsupported_width", "non_contiguous",
                                     "unsupported_norm", "fc1_not_nvfp4", "fc1_width_mismatch"}


def test_no_kernel_for_old_gpu(monkeypatch):
    """The capability rule (>= 9.0 with the library loaded), checked without a GPU by patching."""
    monkeypatch.setattr(device._library, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", lambda *a: True)
    try:
        for cap, ok in (((8, 9), False), ((9, 0), True), ((10, 0), True), ((12, 1), True)):
            device.forget()
            monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None, cap=cap: cap)
            assert device.kernel_serves_cuda_device(0) is ok
            assert device.capability_major(0) == cap[0]
        device.forget()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (8, 6))
        x, p = _fake_cuda_block()
        assert q.try_fused_resnorm_quant(x, x, p, p, p, q.NVFP4Linear(128, 32)) is None
        assert q.last_decline_reason() is R.NO_KERNEL_FOR_DEVICE
    finally:
        device.forget()


@pytest.mark.parametrize("error", [RuntimeError("CUDA driver initialization failed"),
                                   AssertionError("Torch not compiled with CUDA enabled")])
def test_broken_cuda_means_no_kernel(monkeypatch, error):
    """torch.cuda's errors for a broken CUDA setup answer "no capability, no kernel" (and are cached)."""
    monkeypatch.setattr(device._library, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    calls = []

    def broken(i=None):
        calls.append(i)
        raise error

    monkeypatch.setattr(torch.cuda, "get_device_capability", broken)
    try:
        device.forget()
        assert device.capability(0) is None and device.capability_major(0) == 0
        assert device.kernel_serves_cuda_device(0) is False
        assert calls == [0]  # asked once, then cached
    finally:
        device.forget()


def test_other_errors_of_torch_cuda_propagate(monkeypatch):
    """Only torch.cuda's errors for a broken setup are an answer; anything else is a bug and propagates."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def buggy(i=None):
        raise KeyError("not a CUDA setup problem")

    monkeypatch.setattr(torch.cuda, "get_device_capability", buggy)
    try:
        device.forget()
        with pytest.raises(KeyError):
            device.capability(0)
    finally:
        device.forget()


def test_cpu_decline_says_how_to_serve_on_cpu():
    kw, extra, fc1 = block()
    assert call(kw, extra, fc1) is None
    assert q.last_decline_reason() is R.CPU_TENSORS
    assert "allow_cpu=True" in q.last_decline_detail() and "allow_cpu=True" in R.CPU_TENSORS.description


# --------------------------------------------------------------------------------------------------
# Logging: each distinct reason once, at DEBUG, on the "qwen_resnorm_fp4" logger
# --------------------------------------------------------------------------------------------------


def test_log_once(caplog, monkeypatch):
    kw, extra, fc1 = block()
    caplog.set_level(logging.DEBUG, logger="qwen_resnorm_fp4")

    def records():
        return [r for r in caplog.records if r.name == "qwen_resnorm_fp4"]

    call(kw, extra, fc1)
    call(kw, extra, fc1)
    assert len(records()) == 1
    assert records()[0].levelno == logging.DEBUG and "cpu_tensors" in records()[0].getMessage()
    call(kw, extra, fc1, allow_cpu=True, norm=dict(type="rmsnorm"))
    call(kw, extra, fc1, allow_cpu=True, norm=dict(type="rmsnorm"))
    call(kw, extra, fc1)
    assert len(records()) == 2 and "unsupported_norm" in records()[1].getMessage()
    call(kw, extra, fc1, allow_cpu=True)  # success logs nothing
    assert len(records()) == 2
    fused_mod.reset_decline_log()
    call(kw, extra, fc1)
    assert len(records()) == 3


# --------------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True)
# --------------------------------------------------------------------------------------------------


def _block_fn(fc1, norm, **more):
    def f(residual, x, gate, scale, shift):
        out = q.try_fused_resnorm_quant(residual, x, gate, scale, shift, fc1, norm=norm, gate_out=gate, **more)
        if out is None:
            return None
        (packed, scales), residual_out, _ = out
        return packed, scales, residual_out, fc1((packed, scales), out_shape=x.shape[:-1])
    return f


def test_compile_fullgraph_cpu():
    torch._dynamo.reset()
    kw, extra, fc1 = block()
    D = kw["x"].shape[-1]
    ln = torch.nn.LayerNorm(D, eps=1e-6).requires_grad_(False)
    with torch.no_grad():
        ln.weight.normal_(1.0, 0.1)
        ln.bias.normal_(0.0, 0.1)
    f = _block_fn(fc1, ln, allow_cpu=True)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    args = (kw["residual"], kw["x"], kw["gate"], kw["scale"], kw["shift"])
    eager = f(*args)
    got = compiled(*args)
    assert q.last_decline_reason() is None
    for a, b in zip(eager, got):
        assert torch.equal(a, b)
    # a decline inside compiled code returns None and records nothing (compiled code mutates no Python state)
    reset_decline_log()
    assert compiled(kw["residual"], kw["x"].half(), kw["gate"], kw["scale"], kw["shift"]) is None
    assert q.last_decline_reason() is None
    assert compiled(*args) is not None
    # the serve_ form returns the Decline itself, compiled too
    serve = torch.compile(lambda *a: q.serve_fused_resnorm_quant(*a, fc1, norm=ln, allow_cpu=True),
                          fullgraph=True, backend="aot_eager")
    declined = serve(kw["residual"], kw["x"].half(), kw["gate"], kw["scale"], kw["shift"])
    assert isinstance(declined, q.Decline) and declined.reason is R.UNSUPPORTED_DTYPE, declined
    assert not isinstance(serve(*args), q.Decline)
    torch._dynamo.reset()


def test_last_decline_reason_is_per_thread():
    import threading
    kw, extra, fc1 = block()
    args = (kw["residual"], kw["x"], kw["gate"], kw["scale"], kw["shift"], fc1)
    assert q.try_fused_resnorm_quant(*args) is None  # CPU tensors without allow_cpu
    assert q.last_decline_reason() is R.CPU_TENSORS
    seen = {}

    def other():
        seen["before"] = q.last_decline_reason()
        seen["result"] = q.try_fused_resnorm_quant(*args, allow_cpu=True)
        seen["after"] = q.last_decline_reason()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen["before"] is None and seen["result"] is not None and seen["after"] is None
    assert q.last_decline_reason() is R.CPU_TENSORS  # the other thread's success did not clear this one's


def test_last_decline_reason_is_per_asyncio_task():
    """Each asyncio task keeps its own last decline (a contextvars record): one task's decline is not another's,
    and a task's calls do not change the caller's."""
    import asyncio
    kw, extra, fc1 = block()
    args = (kw["residual"], kw["x"], kw["gate"], kw["scale"], kw["shift"], fc1)
    assert q.try_fused_resnorm_quant(*args, allow_cpu=True) is not None

    async def one(allow_cpu: bool, ready: asyncio.Event, other_done: asyncio.Event):
        q.try_fused_resnorm_quant(*args, allow_cpu=allow_cpu)
        ready.set()
        await other_done.wait()  # the other task has made its call by now
        return q.last_decline_reason()

    async def both():
        a, b = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(one(False, a, b), one(True, b, a))

    assert asyncio.run(both()) == [R.CPU_TENSORS, None]
    assert q.last_decline_reason() is None


# --------------------------------------------------------------------------------------------------
# No module-level mutable state in the fused-path modules
# --------------------------------------------------------------------------------------------------


def _fused_path_modules():
    import importlib
    import pkgutil

    import qwen_resnorm_fp4.integrations as integrations

    names = ["qwen_resnorm_fp4._fused_common", "qwen_resnorm_fp4.fused_path", "qwen_resnorm_fp4.fused_path_fp8"]
    names += [f"{integrations.__name__}.{m.name}" for m in pkgutil.iter_modules(integrations.__path__)]
    return [importlib.import_module(n) for n in names]


def _mutable_paths(value, path: str = "") -> List[str]:
    """Where a module-level value holds state that calls could change: a mutable container, a thread-local, a
    lock (which only guards state), an instance of a non-frozen dataclass; looked into: tuples, frozensets,
    the fields of frozen dataclasses and the attributes (``__dict__``, not ``__slots__``) of the package's own
    objects, which hold no cycles. Each found place as ``path: type`` (``path`` extended by ``[i]`` /
    ``.name``)."""
    import collections
    import threading
    import weakref

    containers = (dict, list, set, bytearray, collections.deque, weakref.WeakSet, weakref.WeakValueDictionary,
                  weakref.WeakKeyDictionary, threading.local, type(threading.Lock()), type(threading.RLock()))
    if isinstance(value, containers):
        return [f"{path}: {type(value).__name__}"]
    if isinstance(value, (tuple, frozenset)):
        return [p for i, v in enumerate(value) for p in _mutable_paths(v, f"{path}[{i}]")]
    if isinstance(value, type) or isinstance(value, types.ModuleType):
        return []
    if dataclasses.is_dataclass(value):
        if not value.__dataclass_params__.frozen:
            return [f"{path}: {type(value).__name__}"]
        return [p for f in dataclasses.fields(value)
                for p in _mutable_paths(getattr(value, f.name), f"{path}.{f.name}")]
    if type(value).__module__.startswith("qwen_resnorm_fp4") and hasattr(value, "__dict__"):
        if type(value).__name__ == "LiveConversions":  # reported whole: the one allowed kind (the test says why)
            return [f"{path}: LiveConversions"]
        return [p for k, v in vars(value).items() for p in _mutable_paths(v, f"{path}.{k}")]
    return []


def _mutable(value) -> bool:
    """Whether :func:`_mutable_paths` finds anything in ``value``."""
    return bool(_mutable_paths(value))


def _top_level_names(module) -> list:
    """The names a module's source binds at its top level (assignments, functions, classes, imports)."""
    import ast
    import inspect

    names = []
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [(a.asname or a.name).split(".")[0] for a in node.names]
    return names


def test_fused_path_modules_keep_no_module_level_mutable_state():
    """What a call accumulates lives on objects the caller owns (a conversion's blocks and record, the
    family's spec) or in the current contextvars context (the last decline), never in a module global."""
    import contextvars

    found = []
    for module in _fused_path_modules():
        for name, value in vars(module).items():
            # dunders (__all__, __builtins__, ...) and what dynamo puts into a compiled frame's globals
            # (__builtins_dict___N, __compiled_fn_N, __resume_at_N, ...): the package names none of its own "__"
            if name.startswith("__"):
                continue
            found += _mutable_paths(value, f"{module.__name__}.{name}")
    # The one exception: each family's registry of its live conversions (ModelSpec.live, weak references
    # under its own lock), which a traced block's compiled-path note reaches; dynamo keeps one compiled block
    # per code object for the whole process, so the conversions sharing it are the process's
    # (integrations/_compiled_paths.py).
    registries = sorted(f for f in found if f.endswith(".SPEC.live: LiveConversions"))
    assert [f for f in found if f not in registries] == [], found
    families = sorted(m.__name__ for m in _fused_path_modules() if isinstance(getattr(m, "SPEC", None), ModelSpec))
    assert families and registries == [f"{name}.SPEC.live: LiveConversions" for name in families], (registries,
                                                                                                     families)
    own = [f"{m.__name__}.{n}" for m in _fused_path_modules() for n in _top_level_names(m)
           if n.startswith("__") and not n.endswith("__")]
    assert not own, own  # what the scan skips as dynamo's is never the package's own
    handles = [(m.__name__, n) for m in _fused_path_modules() for n, v in vars(m).items()
               if isinstance(v, contextvars.ContextVar)]
    assert handles == [("qwen_resnorm_fp4._fused_common", "_DECLINE_LOG")], handles


def test_the_state_scan_finds_module_state():
    """The scan above would see the state this test forbids."""
    import threading
    import weakref

    assert _mutable(set()) and _mutable({}) and _mutable([]) and _mutable(threading.local())
    assert _mutable(threading.Lock()) and _mutable(weakref.WeakSet()) and _mutable((1, {}))
    from qwen_resnorm_fp4.integrations._state import StreamStats
    assert _mutable(StreamStats()) and not _mutable(q.Decline(R.CPU_TENSORS, "x"))
    assert not _mutable((1, "a", frozenset({2}))) and not _mutable(types.MappingProxyType({}))
    from qwen_resnorm_fp4.integrations._spec import StreamSpec
    frozen_holding_a_set = dataclasses.make_dataclass("Frozen", [("members", set)], frozen=True)(set())
    assert _mutable_paths(frozen_holding_a_set, "F") == ["F.members: set"]
    spec = ModelSpec(label="x", model_class="M", block_class="B", streams=(), block_forward=lambda self: None)
    assert _mutable_paths(spec, "S") == ["S.live: LiveConversions"]
    assert not _mutable(StreamSpec("img", "norm2", "ff"))

def test_compile_reads_env_at_trace_time(monkeypatch):
    torch._dynamo.reset()
    kw, extra, fc1 = block()
    args = (kw["residual"], kw["x"], kw["gate"], kw["scale"], kw["shift"])
    monkeypatch.setenv("QWEN_FP4_DISABLE", "1")
    compiled = torch.compile(_block_fn(fc1, None, allow_cpu=True), fullgraph=True, backend="aot_eager")
    assert compiled(*args) is None
    monkeypatch.delenv("QWEN_FP4_DISABLE")
    torch._dynamo.reset()  # the switch is read when tracing: recompile to pick up the change
    assert compiled(*args) is not None
    torch._dynamo.reset()


# --------------------------------------------------------------------------------------------------
# GPU: the kernel under the fused path, torch.compile and CUDA-graph capture
# --------------------------------------------------------------------------------------------------



@pytest.mark.gpu
@pytest.mark.parametrize("form", ["batch", "indexed"])
def test_gpu_success_matches_resnorm_quant(form):
    kw, extra, fc1 = block(B=2, S=300, D=3072, N=320, device="cuda", form=form, bias=True)
    out = call(kw, extra, fc1)
    assert out is not None, q.last_decline_detail()
    assert_same(out, direct(kw, extra, fc1))
    # and on CPU tensors without allow_cpu it declines
    assert call({k: v.cpu() for k, v in kw.items()}, {k: v.cpu() for k, v in extra.items()}, fc1.cpu()) is None


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_equals_eager():
    kw, extra, fc1 = block(B=2, S=256, D=3072, N=320, device="cuda", bias=True)
    f = _block_fn(fc1, torch.nn.LayerNorm(3072, eps=1e-6, elementwise_affine=False))
    args = (kw["residual"], kw["x"], kw["gate"], kw["scale"], kw["shift"])
    eager = f(*args)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm up (lazy init, GEMM autotuning) outside the capture
            f(*args)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = f(*args)
    graph.replay()
    torch.cuda.synchronize()
    assert q.last_decline_reason() is None
    for a, b in zip(eager, captured):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_gpu_compile_fullgraph_equals_eager():
    torch._dynamo.reset()
    kw, extra, fc1 = block(B=2, S=128, D=3072, N=320, device="cuda")
    fc1.gemm_backend = "reference"  # FlashInfer's GEMM is not part of what this checks
    f = _block_fn(fc1, None)
    args = (kw["residual"], kw["x"], kw["gate"], kw["scale"], kw["shift"])
    eager = f(*args)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(*args)
    for a, b in zip(eager, got):
        assert torch.equal(a, b)
    torch._dynamo.reset()


def _cuda_cases():
    """(name, build) pairs: build() returns (kw, extra, fc1, more) for one gate call on CUDA tensors, each a
    call the common-call fast path serves, or one it must leave to the checked path."""
    D = 128

    def mk(form="batch", param_dtype=torch.float32, bias=False, kw_fn=None, extra_fn=None, fc1_fn=None, **more):
        def build():
            kw, extra, fc1 = _mutated_block(kw_fn, extra_fn, fc1_fn, device="cuda", form=form,
                                            param_dtype=param_dtype, bias=bias)
            return kw, extra, fc1, {k: (v() if callable(v) else v) for k, v in more.items()}
        return build

    def ln(affine=True, shape=(D,), device="cuda", eps=1e-5):
        def make():
            m = torch.nn.LayerNorm(shape, eps=eps, elementwise_affine=affine).requires_grad_(False)
            if affine:
                with torch.no_grad():
                    m.weight.normal_(1.0, 0.1)
                    m.bias.normal_(0.0, 0.1)
            return m.bfloat16().to(device)
        return make

    def misaligned(t):
        buf = torch.zeros(t.numel() + 1, dtype=t.dtype, device=t.device)
        v = buf[1:].view(t.shape)
        v.copy_(t)
        return v

    def cuda_fc1(in_features=D, scale=lambda: torch.ones(1, device="cuda")):
        return lambda f: types.SimpleNamespace(in_features=in_features, input_global_scale=scale())

    return {
        "served_batch": mk(),
        "served_bias_bf16": mk(param_dtype=torch.bfloat16, bias=True),
        "served_shared": mk(form="shared"),
        "served_batch1": mk(form="batch1"),
        "served_indexed": mk(form="indexed"),
        "served_layernorm": mk(norm=ln(affine=False)),
        "served_layernorm_affine": mk(norm=ln()),
        "served_norm_dict": mk(norm=lambda: dict(type="layernorm", eps=1e-5)),
        "served_eps_int": mk(eps=0),
        "served_fast_math_false": mk(fast_math=False),
        "served_gate_strided": mk(kw_fn=lambda k: dict(k, gate=torch.cat([k["gate"]] * 2, -1)[..., :D])),
        "served_x_misaligned": mk(kw_fn=lambda k: dict(k, x=misaligned(k["x"]))),
        "served_residual_misaligned": mk(kw_fn=lambda k: dict(k, residual=misaligned(k["residual"]))),
        "layernorm_weight_on_cpu": mk(norm=ln(device="cpu")),
        "layernorm_wrong_shape": mk(norm=ln(affine=False, shape=(8, D))),
        "layernorm_fp16": mk(norm=lambda: ln()().half()),
        "x_fp16": mk(kw_fn=lambda k: dict(k, x=k["x"].half())),
        "residual_fp32": mk(kw_fn=lambda k: dict(k, residual=k["residual"].float())),
        "gate_fp16": mk(kw_fn=lambda k: dict(k, gate=k["gate"].half())),
        "shift_fp64": mk(kw_fn=lambda k: dict(k, shift=k["shift"].double())),
        "gate_on_cpu": mk(kw_fn=lambda k: dict(k, gate=k["gate"].cpu())),
        "gate_none": mk(kw_fn=lambda k: dict(k, gate=None)),
        "bias_int": mk(extra_fn=lambda e: dict(bias=torch.zeros(D, dtype=torch.int32, device="cuda"))),
        "bias_wrong_shape": mk(extra_fn=lambda e: dict(bias=torch.zeros(64, device="cuda"))),
        "bias_on_cpu": mk(extra_fn=lambda e: dict(bias=torch.zeros(D))),
        "zero_rows": mk(kw_fn=lambda k: dict(k, x=k["x"][:, :0], residual=k["residual"][:, :0])),
        "residual_shape": mk(kw_fn=lambda k: dict(k, residual=k["residual"][:, :4].contiguous())),
        "width_96": mk(kw_fn=lambda k: dict(k, x=k["x"][..., :96].contiguous(),
                                            residual=k["residual"][..., :96].contiguous()),
                       fc1_fn=cuda_fc1(96)),
        "x_transposed": mk(kw_fn=lambda k: dict(k, x=k["x"].transpose(0, 1).contiguous().transpose(0, 1))),
        "residual_strided": mk(kw_fn=lambda k: dict(k, residual=torch.cat([k["residual"]] * 2, -1)[..., :D])),
        "per_token_rows_mismatch": mk(kw_fn=lambda k: dict(k, gate=torch.zeros(2, 4, D, device="cuda"),
                                                           scale=torch.zeros(2, 4, D, device="cuda"),
                                                           shift=torch.zeros(2, 4, D, device="cuda"))),
        "batch1_gate_only": mk(form="batch1", kw_fn=lambda k: dict(k, scale=k["scale"].squeeze(1))),
        "gate_scale_shapes_differ": mk(kw_fn=lambda k: dict(k, gate=k["gate"][0])),
        "rows_not_split": mk(kw_fn=lambda k: dict(k, gate=torch.zeros(3, D, device="cuda"),
                                                  scale=torch.zeros(3, D, device="cuda"),
                                                  shift=torch.zeros(3, D, device="cuda"))),
        "index_without_2B": mk(extra_fn=lambda e: dict(modulate_index=torch.zeros(2, 8, dtype=torch.int32,
                                                                                  device="cuda"))),
        "index_float": mk(form="indexed", extra_fn=lambda e: dict(modulate_index=e["modulate_index"].float())),
        "index_on_cpu": mk(form="indexed", extra_fn=lambda e: dict(modulate_index=e["modulate_index"].cpu())),
        "eps_nan": mk(eps=float("nan")),
        "eps_negative": mk(eps=-1.0),
        "eps_bool": mk(eps=True),
        "norm_eps_negative": mk(norm=ln(eps=-1.0)),
        "fc1_width": mk(fc1_fn=lambda f: q.NVFP4Linear(2 * D, 32).cuda()),
        "fc1_in_features_bool": mk(fc1_fn=lambda f: types.SimpleNamespace(
            in_features=True, input_global_scale=torch.ones(1, device="cuda"))),
        "fc1_scale_fp16": mk(fc1_fn=cuda_fc1(scale=lambda: torch.ones(1, dtype=torch.float16, device="cuda"))),
        "fc1_scale_two_elements": mk(fc1_fn=cuda_fc1(scale=lambda: torch.ones(2, device="cuda"))),
        "fc1_scale_on_cpu": mk(fc1_fn=cuda_fc1(scale=lambda: torch.ones(1))),
        "fc1_nn_linear": mk(fc1_fn=lambda f: torch.nn.Linear(D, 32).cuda()),
        "fast_math_str": mk(fast_math="yes"),
    }


# What each CUDA case must give: "served", the decline reason, or the exception type.
_CUDA_OUTCOMES = {
    "layernorm_weight_on_cpu": R.DEVICE_MISMATCH, "layernorm_wrong_shape": R.UNSUPPORTED_NORM,
    "layernorm_fp16": R.UNSUPPORTED_DTYPE, "x_fp16": R.UNSUPPORTED_DTYPE, "residual_fp32": R.UNSUPPORTED_DTYPE,
    "gate_fp16": R.UNSUPPORTED_DTYPE, "shift_fp64": R.UNSUPPORTED_DTYPE, "gate_on_cpu": R.DEVICE_MISMATCH,
    "gate_none": R.UNSUPPORTED_MODULATION, "bias_int": R.UNSUPPORTED_DTYPE, "bias_wrong_shape": R.UNSUPPORTED_SHAPE,
    "bias_on_cpu": R.DEVICE_MISMATCH, "zero_rows": R.UNSUPPORTED_SHAPE, "residual_shape": R.UNSUPPORTED_SHAPE,
    "width_96": R.UNSUPPORTED_WIDTH, "x_transposed": R.NON_CONTIGUOUS, "residual_strided": R.NON_CONTIGUOUS,
    "per_token_rows_mismatch": R.UNSUPPORTED_MODULATION, "batch1_gate_only": R.UNSUPPORTED_MODULATION,
    "gate_scale_shapes_differ": R.UNSUPPORTED_MODULATION, "rows_not_split": R.UNSUPPORTED_MODULATION,
    "index_without_2B": R.UNSUPPORTED_MODULATION, "index_float": R.UNSUPPORTED_DTYPE,
    "index_on_cpu": R.DEVICE_MISMATCH, "eps_nan": R.UNSUPPORTED_NORM, "eps_negative": R.UNSUPPORTED_NORM,
    "eps_bool": R.UNSUPPORTED_NORM, "norm_eps_negative": R.UNSUPPORTED_NORM, "fc1_width": R.FC1_WIDTH_MISMATCH,
    "fc1_in_features_bool": R.FC1_NOT_NVFP4, "fc1_scale_fp16": R.FC1_NOT_NVFP4,
    "fc1_scale_two_elements": R.FC1_NOT_NVFP4, "fc1_scale_on_cpu": R.DEVICE_MISMATCH,
    "fc1_nn_linear": R.FC1_NOT_NVFP4, "fast_math_str": TypeError,
}


def _direct_for(kw, extra, fc1, more):
    """resnorm_quant called directly with what the fused path should take from ``norm``, ``eps`` and
    ``fast_math``."""
    norm, eps, weight, norm_bias = more.get("norm"), more.get("eps", 1e-6), None, None
    if isinstance(norm, torch.nn.LayerNorm):
        weight, norm_bias, eps = norm.weight, norm.bias, norm.eps
    elif isinstance(norm, dict):
        eps = norm.get("eps", eps)
    return direct(kw, extra, fc1, eps=eps, weight=weight, norm_bias=norm_bias, fast_math=more.get("fast_math"))


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(_cuda_cases()) if CUDA_OK else ["no_gpu"])
def test_gpu_decisions_call_the_op_at_most_once(monkeypatch, name):
    """Each eager CUDA call is served (the op called once, the same bytes as resnorm_quant called directly),
    or declined with its reason and a detail (the op not called), or raises (the op not called)."""
    kw, extra, fc1, more = _cuda_cases()[name]()
    real, calls = fused_mod.call_resnorm_quant, []

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(fused_mod, "call_resnorm_quant", counted)
    want = "served" if name.startswith("served_") else _CUDA_OUTCOMES[name]
    if want is TypeError:
        with pytest.raises(TypeError):
            call(kw, extra, fc1, **more)
        assert calls == []
        return
    out = call(kw, extra, fc1, **more)
    torch.cuda.synchronize()
    if want == "served":
        assert out is not None, (q.last_decline_reason(), q.last_decline_detail())
        assert calls == [1] and q.last_decline_reason() is None
        assert_same(out, _direct_for(kw, extra, fc1, more))
    else:
        assert out is None and calls == []
        assert q.last_decline_reason() is want, (q.last_decline_reason(), q.last_decline_detail())
        detail = q.last_decline_detail()
        assert isinstance(detail, str) and detail and "{" not in detail


def test_every_cuda_case_has_an_outcome():
    cases = set(_cuda_cases())
    assert {n for n in cases if not n.startswith("served_")} == set(_CUDA_OUTCOMES)


# --------------------------------------------------------------------------------------------------
# docs/integration.md: the worked example runs as written
# --------------------------------------------------------------------------------------------------

DOC = REPO_ROOT / "docs" / "integration.md"


@pytest.mark.skipif(not DOC.exists(), reason="docs/ not in this checkout")
def test_integration_doc_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    example = [b for b in blocks if "class MLPHalf" in b]
    assert len(example) == 1
    exec(compile(example[0], str(DOC), "exec"), {"__name__": "integration_example"})
    printed = capsys.readouterr().out
    assert "disabled_by_env" in printed
    if CUDA_OK or not torch.cuda.is_available():  # a CUDA machine without the library declines, rightly
        assert "fused path: served" in printed
