"""The SGLang drop-in ``try_fused_scale_residual_norm_scale_shift_nvfp4``: SGLang's parameter list, its return
value, what it serves (bytes equal to the unfused chain) and what it declines (with the reason kept).

CPU tests run the reference (``allow_cpu=True``). GPU tests (marked gpu): real widths 3072 and 5120 (1536 and 4096
in the exhaustive sweep, tests/helpers/tiers.py) at batch 2, eager, ``torch.compile(fullgraph=True)`` and
CUDA-graph capture, each byte-equal to resnorm + quantize.
"""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

import qwen_resnorm_fp4 as q
from helpers.sglang import leading_parameters
from helpers.tiers import sweep
from qwen_resnorm_fp4.integrations.sglang import try_fused_scale_residual_norm_scale_shift_nvfp4 as dropin

#: SGLang's parameter names, in order, read from sglang 0.5.23 (the PyPI wheel),
#: sglang/kernels/kda_kernels/norm_scale_shift_jit.py, try_fused_scale_residual_norm_scale_shift_nvfp4.
SGLANG_PARAMETERS = ("residual", "x", "input_bias", "gate", "weight", "bias", "scale", "shift", "global_scale",
                     "norm_type", "eps")


def test_signature_matches_recorded_sglang():
    sig = inspect.signature(dropin)
    assert leading_parameters(dropin) == SGLANG_PARAMETERS
    for name in SGLANG_PARAMETERS:  # SGLang's have no defaults: every call passes all eleven
        assert sig.parameters[name].default is inspect.Parameter.empty, name
    extra = [p for p in sig.parameters.values() if p.name not in SGLANG_PARAMETERS]
    assert extra and all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in extra)


def test_signature_matches_installed_sglang():
    try:
        module = importlib.import_module("sglang.kernels.kda_kernels.norm_scale_shift_jit")
    except Exception as e:  # noqa: BLE001 - not installed, or its JIT dependencies are missing
        pytest.skip(f"sglang's norm_scale_shift_jit does not import: {type(e).__name__}: {e}")
    assert leading_parameters(module.try_fused_scale_residual_norm_scale_shift_nvfp4) == SGLANG_PARAMETERS


def sglang_inputs(B: int, S: int, D: int, *, device: str = "cpu", affine: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, std=1.0: (torch.randn(*s, generator=g) * std)  # noqa: E731
    bf = torch.bfloat16
    out = dict(residual=r(B, S, D, std=2.0).to(bf), x=r(B, S, D).to(bf), input_bias=r(D, std=0.1).to(bf),
               gate=r(B, 1, D, std=0.5).to(bf), weight=None, bias=None, scale=r(B, 1, D, std=0.2).to(bf),
               shift=r(B, 1, D, std=0.2).to(bf), global_scale=torch.tensor([448.0 * 6.0 / 8.0]),
               norm_type="layer", eps=1e-6)
    if affine:  # SGLang's FP32LayerNorm keeps float32 parameters
        out["weight"], out["bias"] = 1 + r(D, std=0.1), r(D, std=0.1)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def unfused(inp, gate=None):
    """resnorm + the standalone quantizer: SGLang's unfused chain under the library's numerics contract."""
    g = inp["gate"] if gate is None else gate
    sq = lambda t: t.squeeze(1) if t.dim() == 3 else t  # noqa: E731
    y, residual_out = q.resnorm(inp["residual"], inp["x"], inp["input_bias"], sq(g), sq(inp["scale"]),
                                sq(inp["shift"]), inp["eps"], weight=inp["weight"], norm_bias=inp["bias"])
    return q.nvfp4_quantize(y, inp["global_scale"]), residual_out


def assert_same(result, expected):
    assert result is not None, q.last_decline_detail()
    (packed, scales), residual_out = result
    (e_packed, e_scales), e_residual = expected
    assert torch.equal(packed, e_packed) and torch.equal(scales, e_scales) and torch.equal(residual_out, e_residual)


@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("B", [1, 2])
def test_serves_batches_and_affine_norm_cpu(B, affine):
    inp = sglang_inputs(B, 13, 128, affine=affine, seed=B)
    result = dropin(*inp.values(), allow_cpu=True)
    assert_same(result, unfused(inp))
    (packed, scales), residual_out = result
    assert packed.shape == (B * 13, 64) and scales.shape == (128, 8) and residual_out.shape == (B, 13, 128)


def test_gate_one_and_no_input_bias_cpu():
    inp = sglang_inputs(2, 5, 64, seed=3)
    ones = torch.ones_like(inp["scale"])
    assert_same(dropin(**{**inp, "gate": 1}, allow_cpu=True), unfused(inp, gate=ones))
    assert_same(dropin(**{**inp, "gate": None}, allow_cpu=True), unfused(inp, gate=ones))
    no_bias = {**inp, "input_bias": None}
    assert_same(dropin(**no_bias, allow_cpu=True), unfused(no_bias))


def test_shared_gate_with_per_batch_scale_cpu():
    """A [D] gate next to SGLang's [B, 1, D] scale and shift is served: the same bytes as that gate repeated
    for every batch."""
    inp = sglang_inputs(2, 7, 128, seed=5)
    gate = inp["gate"][0, 0].clone()
    assert_same(dropin(**{**inp, "gate": gate}, allow_cpu=True), unfused(inp, gate=gate.expand(2, 1, 128)))


def test_declines_with_reason_cpu():
    inp = sglang_inputs(2, 5, 64, seed=4)
    cases = [
        (dict(), {}, "cpu_tensors"),
        (dict(norm_type="rms"), dict(allow_cpu=True), "unsupported_norm"),
        (dict(gate=2), dict(allow_cpu=True), "unsupported_modulation"),
        (dict(scale=torch.zeros(2, 5, 64, dtype=torch.bfloat16)), dict(allow_cpu=True), "unsupported_modulation"),
        (dict(x=inp["x"][..., :48].contiguous(), residual=inp["residual"][..., :48].contiguous()),
         dict(allow_cpu=True), "unsupported_width"),
    ]
    for change, kw, reason in cases:
        assert dropin(**{**inp, **change}, **kw) is None, change
        assert q.last_decline_reason() == reason, (change, q.last_decline_reason())


def _indexed_inputs(B: int, S: int, D: int, boundary: int, rows_shape: str, seed: int):
    """SGLang-shaped inputs with zero_cond_t: gate/scale/shift [2B, 1, D] ("sglang") or [2B, D], and
    modulate_index [B, S] = 0 before ``boundary``, 1 from it."""
    inp = sglang_inputs(2 * B, S, D, seed=seed)
    inp["residual"], inp["x"] = inp["residual"][:B], inp["x"][:B]
    if rows_shape != "sglang":
        for k in ("gate", "scale", "shift"):
            inp[k] = inp[k].squeeze(1)
    index = torch.zeros(B, S, dtype=torch.int32)
    index[:, boundary:] = 1
    return inp, index


def unfused_indexed(inp, index):
    sq = lambda t: t.squeeze(1) if t.dim() == 3 else t  # noqa: E731
    y, residual_out = q.resnorm(inp["residual"], inp["x"], inp["input_bias"], sq(inp["gate"]), sq(inp["scale"]),
                                sq(inp["shift"]), inp["eps"], modulate_index=index)
    return q.nvfp4_quantize(y, inp["global_scale"]), residual_out


@pytest.mark.parametrize("rows_shape", ["sglang", "2d"])
@pytest.mark.parametrize("B", [1, 2])
def test_modulate_index_cpu(B, rows_shape):
    """zero_cond_t (SGLang's own function returns None for it): the bytes of the unfused chain."""
    inp, index = _indexed_inputs(B, 24, 128, 16, rows_shape, seed=B)
    assert_same(dropin(*inp.values(), allow_cpu=True, modulate_index=index), unfused_indexed(inp, index))
    ones = torch.ones(2 * B, 128, dtype=torch.bfloat16)
    assert_same(dropin(**{**inp, "gate": 1}, allow_cpu=True, modulate_index=index),
                unfused_indexed({**inp, "gate": ones}, index))


@pytest.mark.parametrize("form", ["indexed", "per_token", "per_batch"])
def test_local_shard_equals_rows_of_full_cpu(form):
    """A sequence shard (tokens 12 .. 23 of every sample, as Ulysses rank 1 of 2 holds them; the index boundary
    at token 16, inside it): the shard's packed bytes, scales and residual_out equal those rows of the full
    call (static global scale), and the unfused chain on the shard."""
    from helpers.shards import shard_matches_full

    B, S, D, s0, s1 = 2, 24, 128, 12, 24
    index = None
    if form == "indexed":
        full, index = _indexed_inputs(B, S, D, 16, "sglang", seed=7)
    else:
        full = sglang_inputs(B, S, D, seed=8)
        if form == "per_token":
            g = torch.Generator().manual_seed(9)
            temb = (0.2 * torch.randn(B, S, 6 * D, generator=g)).to(torch.bfloat16)
            full["shift"], full["scale"], full["gate"] = temb.chunk(6, dim=-1)[:3]
    shard = dict(full, residual=full["residual"][:, s0:s1].contiguous(), x=full["x"][:, s0:s1].contiguous())
    if form == "per_token":
        shard.update({k: full[k][:, s0:s1] for k in ("gate", "scale", "shift")})
    local = None if index is None else index[:, s0:s1]
    (f_packed, f_scales), f_res = dropin(*full.values(), allow_cpu=True, modulate_index=index)
    result = dropin(*shard.values(), allow_cpu=True, modulate_index=local)
    assert result is not None, q.last_decline_detail()
    (packed, scales), res = result
    problem = shard_matches_full((f_packed, f_scales, f_res), (packed, scales, res), B, S, s0, s1)
    assert problem is None, problem
    if form == "indexed":
        assert_same(result, unfused_indexed(shard, local))


def test_fc1_width_mismatch_declines_cpu():
    """With FC1's width given, a width other than x's declines as "fc1_width_mismatch" (nothing computed);
    FC1's own width serves."""
    inp = sglang_inputs(2, 5, 128, seed=6)
    assert dropin(**inp, allow_cpu=True, fc1_in_features=256) is None
    assert q.last_decline_reason() == "fc1_width_mismatch", q.last_decline_detail()
    assert_same(dropin(**inp, allow_cpu=True, fc1_in_features=128), unfused(inp))


@pytest.mark.gpu
@sweep("D", [1536, 3072, 4096, 5120], [3072, 5120])  # each case compiles: the tuned widths by default
def test_gpu_eager_compile_and_graph(D):
    inp = sglang_inputs(2, 77, D, device="cuda", affine=D == 5120, seed=D)
    expected = unfused(inp)
    assert_same(dropin(*inp.values()), expected)

    compiled = torch.compile(dropin, fullgraph=True)
    assert_same(compiled(*inp.values()), expected)

    static = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    dropin(*static.values())  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = dropin(*static.values())
    assert captured is not None
    graph.replay()
    torch.cuda.synchronize()
    assert_same(captured, expected)
