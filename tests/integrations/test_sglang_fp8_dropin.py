"""The SGLang drop-in ``try_fused_scale_residual_norm_scale_shift_fp8``: SGLang's parameter list and return
value ``(normalized, quantized, residual_out)``, what it serves (bytes equal to resnorm + fp8_quantize, the
normalized BF16 equal to resnorm's y) and what it declines (with the reason kept).

CPU tests run the reference (``allow_cpu=True``). GPU tests (marked gpu): widths 3072, 5120 and one that is a
multiple of 16 but not of 64 (SGLang's kernel serves 3072 only; 1536 and 4096 in the exhaustive sweep,
tests/conftest.py), batch 2, eager,
``torch.compile(fullgraph=True)`` and CUDA-graph capture, each byte-equal to resnorm + fp8_quantize.
"""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

import qwen_resnorm_fp4 as q
from helpers.tiers import sweep
from qwen_resnorm_fp4.integrations.sglang import try_fused_scale_residual_norm_scale_shift_fp8 as dropin
from helpers.sglang import leading_parameters

#: SGLang's parameter names, in order, read from sglang's
#: sglang/kernels/kda_kernels/norm_scale_shift_jit.py, try_fused_scale_residual_norm_scale_shift_fp8.
SGLANG_PARAMETERS = ("residual", "x", "gate", "weight", "bias", "scale", "shift", "input_scale", "norm_type", "eps")


def test_signature_matches_recorded_sglang():
    sig = inspect.signature(dropin)
    assert leading_parameters(dropin) == SGLANG_PARAMETERS
    for name in SGLANG_PARAMETERS:
        assert sig.parameters[name].default is inspect.Parameter.empty, name
    extra = [p for p in sig.parameters.values() if p.name not in SGLANG_PARAMETERS]
    assert {p.name for p in extra} == {"modulate_index", "need_normalized", "allow_cpu"}
    assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in extra)


def test_signature_matches_installed_sglang():
    try:
        module = importlib.import_module("sglang.kernels.kda_kernels.norm_scale_shift_jit")
    except Exception as e:  # noqa: BLE001 - not installed, or its JIT dependencies are missing
        pytest.skip(f"sglang's norm_scale_shift_jit does not import: {type(e).__name__}: {e}")
    fn = getattr(module, "try_fused_scale_residual_norm_scale_shift_fp8", None)
    if fn is None:
        pytest.skip("the installed sglang has no try_fused_scale_residual_norm_scale_shift_fp8")
    assert leading_parameters(fn) == SGLANG_PARAMETERS


def sglang_inputs(B: int, S: int, D: int, *, device: str = "cpu", affine: bool = False, seed: int = 0,
                  input_scale: float = 0.03125):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, std=1.0: (torch.randn(*s, generator=g) * std)  # noqa: E731
    bf = torch.bfloat16
    out = dict(residual=r(B, S, D, std=2.0).to(bf), x=r(B, S, D).to(bf), gate=r(B, 1, D, std=0.5).to(bf),
               weight=None, bias=None, scale=r(B, 1, D, std=0.2).to(bf), shift=r(B, 1, D, std=0.2).to(bf),
               input_scale=torch.tensor(input_scale, dtype=torch.float32), norm_type="layer", eps=1e-6)
    if affine:  # SGLang's FP32LayerNorm keeps float32 parameters
        out["weight"], out["bias"] = 1 + r(D, std=0.1), r(D, std=0.1)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def unfused(inp, gate=None, modulate_index=None):
    """resnorm + fp8_quantize: SGLang's unfused chain (its LayerNormScaleShift + static_quant_fp8) under the
    library's numerics contract."""
    g = inp["gate"] if gate is None else gate
    sq = lambda t: t.squeeze(1) if t.dim() == 3 and t.shape[1] == 1 else t  # noqa: E731
    y, residual_out = q.resnorm(inp["residual"], inp["x"], None, sq(g), sq(inp["scale"]), sq(inp["shift"]),
                                inp["eps"], weight=inp["weight"], norm_bias=inp["bias"], modulate_index=modulate_index)
    return y, q.fp8_quantize(y, inp["input_scale"].reshape(1)), residual_out


def assert_same(result, expected, normalized: bool = True):
    assert result is not None, q.last_decline_detail()
    normalized_bf16, quantized, residual_out = result
    e_y, e_q, e_residual = expected
    assert quantized.dtype == torch.float8_e4m3fn and quantized.shape == e_q.shape
    assert torch.equal(quantized.view(torch.uint8), e_q.view(torch.uint8))
    assert torch.equal(residual_out, e_residual)
    if normalized:
        assert normalized_bf16.dtype == torch.bfloat16 and torch.equal(normalized_bf16, e_y)
    else:
        assert normalized_bf16 is None


@pytest.mark.parametrize("need_normalized", [True, False])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("B", [1, 2])
def test_serves_batches_and_affine_norm_cpu(B, affine, need_normalized):
    inp = sglang_inputs(B, 13, 128, affine=affine, seed=B)
    result = dropin(*inp.values(), need_normalized=need_normalized, allow_cpu=True)
    assert_same(result, unfused(inp), need_normalized)
    assert result[1].shape == (B, 13, 128) and result[2].shape == (B, 13, 128)


def test_gate_one_per_token_and_modulate_index_cpu():
    inp = sglang_inputs(2, 5, 64, seed=3)
    ones = torch.ones_like(inp["scale"])
    assert_same(dropin(**{**inp, "gate": 1}, allow_cpu=True), unfused(inp, gate=ones))
    assert_same(dropin(**{**inp, "gate": None}, allow_cpu=True), unfused(inp, gate=ones))
    g = torch.Generator().manual_seed(9)
    per_token = {**inp, **{k: (torch.randn(2, 5, 64, generator=g) * 0.3).to(torch.bfloat16)
                           for k in ("gate", "scale", "shift")}}
    assert_same(dropin(**per_token, allow_cpu=True), unfused(per_token))
    indexed = {**inp, **{k: (torch.randn(4, 64, generator=g) * 0.3).to(torch.bfloat16)
                         for k in ("gate", "scale", "shift")}}
    index = torch.tensor([[0, 1, 1, 0, 1], [1, 0, 0, 0, 1]], dtype=torch.int32)
    assert_same(dropin(**indexed, modulate_index=index, allow_cpu=True), unfused(indexed, modulate_index=index))


@pytest.mark.parametrize("D", [80, 1536])
def test_widths_sglang_declines_and_a_zero_dim_scale_cpu(D):
    """SGLang's kernel serves D = 3072 only; the FP8 op every multiple of 16. A 0-dim input_scale (what
    SGLang's callers pass) is taken as [1]."""
    inp = sglang_inputs(2, 3, D, seed=7)
    assert inp["input_scale"].dim() == 0
    assert_same(dropin(*inp.values(), allow_cpu=True), unfused(inp))


def test_declines_with_reason_cpu():
    inp = sglang_inputs(2, 5, 64, seed=4)
    cases = [
        (dict(), {}, "cpu_tensors"),
        (dict(norm_type="rms"), dict(allow_cpu=True), "unsupported_norm"),
        (dict(gate=2), dict(allow_cpu=True), "unsupported_modulation"),
        (dict(input_scale=inp["input_scale"].half()), dict(allow_cpu=True), "unsupported_dtype"),
        (dict(input_scale=torch.ones(2)), dict(allow_cpu=True), "unsupported_shape"),
        (dict(x=inp["x"].transpose(0, 1).contiguous().transpose(0, 1)), dict(allow_cpu=True), "non_contiguous"),
    ]
    for change, kw, reason in cases:
        assert dropin(**{**inp, **change}, **kw) is None, change
        assert q.last_decline_reason() == reason, (change, q.last_decline_reason(), q.last_decline_detail())


@pytest.mark.gpu
@pytest.mark.gpu
# Each case compiles (inductor): by default every width of the three below and both need_normalized values, not
# every pair; 1536, 4096 and the other pairs in the exhaustive sweep.
@sweep("D,need_normalized", [(d, n) for n in (True, False) for d in (1536, 3072, 4096, 5120, 3088)],
       [(3072, True), (3072, False), (5120, True), (3088, False)])
def test_gpu_eager_compile_and_graph(D, need_normalized):
    inp = sglang_inputs(2, 77, D, device="cuda", affine=D == 5120, seed=D, input_scale=0.4263392984867096)
    expected = unfused(inp)
    call = lambda *a: dropin(*a, need_normalized=need_normalized)  # noqa: E731
    assert_same(call(*inp.values()), expected, need_normalized)

    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True)
    assert_same(compiled(*inp.values()), expected, need_normalized)

    static = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    call(*static.values())  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(*static.values())
    assert captured is not None
    graph.replay()
    torch.cuda.synchronize()
    assert_same(captured, expected, need_normalized)
