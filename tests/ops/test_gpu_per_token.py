"""GPU tests of per-token modulation (gate/scale/shift [B, S, D] or [M, D], any row stride) in every kernel
configuration: D = 3072 and 5120 (fixed shapes) and generic widths, few rows (the split kernel for rows <= SMs,
the one-CTA kernel above) and many rows (>= 2048), bf16 and fp32 parameters, plain and with bias + affine.

What is exact where (tests/ops/test_gpu_kernels.py's docstring; docs/numerics.md):
- strided chunk views == contiguous copies, and per-token == shared / per-batch where the rows agree: byte-exact
  (the same call shape, so the same kernel and the same sums).
- token m of a per-token call == row m of the same call shape with token m's parameters as [D]: byte-exact;
  == the op on token m alone (one row): byte-exact for residual_out always, for y / packed / scales in the
  few-rows class (rows < 2048: the one-row call has the same configuration and the same sums).
- fused == resnorm + nvfp4_quantize: byte-exact; residual_out == reference; y within the suite's bound of the
  reference (Y_ULPS_BOUND, tests/ops/test_y_tolerance.py); packed / scales == the reference quantizer on the GPU's y.
"""

from __future__ import annotations

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import reference
from qwen_resnorm_fp4.linear import FP4_AMAX_SCALE
from qwen_resnorm_fp4.testing import gpu_rcp
from helpers.inputs import make_inputs
from helpers.tiers import sweep
from helpers.reliability import Y_ULPS_BOUND, capture_graph, logical_scales, y_ulps

pytestmark = pytest.mark.gpu

OPS = torch.ops.qwen_fp4
DIMS = (64, 1536, 3072, 5120, 4096, 16384)
#: rows -> (B, S): 1 and 17 (split kernel at 3072 / 5120), 129 (one CTA a row, few rows), 2304 and 4096 (many rows)
SHAPES = {1: (1, 1), 17: (1, 17), 129: (3, 43), 2304: (2, 1152), 4096: (2, 2048)}
MANY_ROWS = 2048
# The default run's subset (the rest: the exhaustive sweep): the smallest width, the tuned widths and the
# largest; few rows over 3 batches (the split kernel on an H200) and many rows.
DEFAULT_DIMS = (64, 3072, 5120, 16384)
DEFAULT_ROWS = (129, 4096)
EPS = 1e-6


def _inputs(rows, cols, param_dtype, options, seed, strided=True):
    b, s = SHAPES[rows]
    return make_inputs(b, s, cols, "token", param_dtype, seed, device="cuda", bias=options, affine=options,
                       generate_on_device=True, strided=strided)


def _params(kw):
    return kw["gate"], kw["scale"], kw["shift"]


def _with(kw, gate, scale, shift):
    return dict(kw, gate=gate, scale=scale, shift=shift)


def _global_scale(kw):
    y, _ = _resnorm(kw)
    return (FP4_AMAX_SCALE / y.float().abs().amax().clamp(min=1e-6)).reshape(1).float()


def _resnorm(kw):
    """The raw op (no wrapper: the views reach ops.cpp as they are)."""
    return OPS.resnorm(kw["residual"], kw["x"], kw["bias"], *_params(kw), EPS, kw["weight"], kw["norm_bias"], None)


def _resnorm_quant(kw, g, fast=True):
    return OPS.resnorm_quant(kw["residual"], kw["x"], kw["bias"], *_params(kw), g, EPS, fast, kw["weight"],
                             kw["norm_bias"], None)


def _all(kw, g):
    return _resnorm(kw) + _resnorm_quant(kw, g)


def _equal(a, b):
    return all(torch.equal(u, v) for u, v in zip(a, b))


def _row(outputs, m, cols):
    """Row m of (y, residual_out, packed, scales, residual_out): the scales as row m's logical bytes."""
    y, r, packed, scales, r2 = outputs
    return (y.reshape(-1, cols)[m], r.reshape(-1, cols)[m], packed[m], logical_scales(scales, 1, cols, m)[0],
            r2.reshape(-1, cols)[m])


@pytest.mark.parametrize("options", (False, True), ids=("plain", "bias_affine"))
@pytest.mark.parametrize("param_dtype", (torch.bfloat16, torch.float32), ids=("bf16", "fp32"))
@sweep("rows", list(SHAPES), DEFAULT_ROWS)
@sweep("cols", DIMS, DEFAULT_DIMS)
def test_per_token_chunk_views(cols, rows, param_dtype, options):
    kw = _inputs(rows, cols, param_dtype, options, seed=rows + cols)
    assert kw["gate"].stride(-2) == 6 * cols  # chunk views of one temb [B, S, 6D]
    g = _global_scale(kw)
    out = _all(kw, g)
    y, r, packed, scales, r_fused = out
    name = f"rows={rows} D={cols} {param_dtype} options={options}"

    # strided == contiguous copies ([B, S, D] and [M, D]); the wrappers read the views in place
    contiguous = _with(kw, *(p.contiguous() for p in _params(kw)))
    assert _equal(_all(contiguous, g), out), name
    flat = _with(kw, *(p.contiguous().reshape(rows, cols) for p in _params(kw)))
    assert _equal(_all(flat, g), out), name
    args = (kw["residual"], kw["x"], kw["bias"], *_params(kw))
    extra = dict(weight=kw["weight"], norm_bias=kw["norm_bias"])
    assert _equal(q.resnorm(*args, EPS, **extra) + q.resnorm_quant(*args, g, EPS, True, **extra), out), name

    # fused == resnorm + nvfp4_quantize, same call shape
    p_u, s_u = OPS.nvfp4_quantize(y, g, True)
    assert torch.equal(packed, p_u) and torch.equal(scales, s_u) and torch.equal(r_fused, r), name

    # the reference: residual_out exact, y within the bound, quantization of the GPU's y exact
    y_ref, r_ref = reference.resnorm(*args, EPS, **extra)
    assert torch.equal(r, r_ref), name
    shift_rows = kw["shift"].float().reshape(rows, cols)
    ulps = y_ulps(y.reshape(rows, cols), y_ref.reshape(rows, cols), shift_rows)
    assert ulps.max().item() <= Y_ULPS_BOUND, f"{name}: y differs by {ulps.max().item()} ulps"
    assert (ulps != 0).float().mean().item() <= 0.01, name
    p_ref, s_ref = reference.nvfp4_quantize(y, g, True, rcp=gpu_rcp)
    assert torch.equal(packed, p_ref) and torch.equal(scales, s_ref), name

    # token m == row m of the same call shape with token m's rows as [D] parameters (shared form), and, in the
    # few-rows class, == the op on token m alone
    for m in sorted({0, rows // 2, rows - 1}):
        token = tuple(p.reshape(rows, cols)[m] for p in _params(kw))
        shared = _all(_with(kw, *token), g)
        assert _equal(_row(shared, m, cols), _row(out, m, cols)), f"{name}: token {m} vs shared"
        alone_kw = _with(kw, *token)
        alone_kw.update(residual=kw["residual"].reshape(rows, cols)[m:m + 1], x=kw["x"].reshape(rows, cols)[m:m + 1])
        alone = _all(alone_kw, g)
        assert torch.equal(alone[1][0], r.reshape(rows, cols)[m]), f"{name}: token {m} residual_out alone"
        if rows < MANY_ROWS:
            assert _equal(_row(alone, 0, cols), _row(out, m, cols)), f"{name}: token {m} alone"


@pytest.mark.parametrize("param_dtype", (torch.bfloat16, torch.float32), ids=("bf16", "fp32"))
@sweep("rows", (17, 129, 4096), (17, 4096))
@pytest.mark.parametrize("cols", (1536, 3072, 5120))
def test_per_token_equals_shared_and_per_batch_forms(cols, rows, param_dtype):
    """Tokens of a batch sharing a row (stride-0 views, materialized copies, [B, 1, D]) == the per-batch form;
    all tokens sharing one row == the shared form; mixed layouts (an expanded gate next to chunk views) too."""
    b, s = SHAPES[rows]
    kw = make_inputs(b, s, cols, "batch", param_dtype, seed=cols + rows, device="cuda", bias=False,
                     generate_on_device=True)
    g = _global_scale(kw)
    want = _all(kw, g)
    per_batch = _params(kw)
    for form in ((p[:, None].expand(b, s, cols) for p in per_batch),
                 (p[:, None].expand(b, s, cols).contiguous() for p in per_batch),
                 (p[:, None] for p in per_batch)):
        assert _equal(_all(_with(kw, *form), g), want)
    shared = tuple(p[0] for p in per_batch)
    want_shared = _all(_with(kw, *shared), g)
    assert _equal(_all(_with(kw, *(p.expand(b, s, cols) for p in shared)), g), want_shared)
    assert _equal(_all(_with(kw, *(p.expand(rows, cols) for p in shared)), g), want_shared)

    tok = _inputs(rows, cols, param_dtype, False, seed=cols * 3 + rows)
    ones = torch.ones(cols, dtype=param_dtype, device="cuda").expand(b, s, cols)
    mixed = _all(_with(tok, ones, tok["scale"], tok["shift"]), g)
    assert _equal(_all(_with(tok, ones.contiguous(), tok["scale"].contiguous(), tok["shift"].contiguous()), g), mixed)
    blocks = torch.stack([tok["gate"], tok["scale"], tok["shift"]] * 2, dim=1)  # [B, 6, S, D]: not one row index
    assert _equal(_all(_with(tok, blocks[:, 0], blocks[:, 1], blocks[:, 2]), g), _all(_with(tok, *(
        p.contiguous() for p in _params(tok))), g))


def test_raw_op_refuses_unreadable_layouts():
    cols, rows = 3072, 17
    kw = _inputs(rows, cols, torch.bfloat16, False, seed=1, strided=False)
    g = torch.ones(1, device="cuda")
    odd_rows = torch.zeros(1, rows, 6 * cols + 4, dtype=torch.bfloat16, device="cuda")[..., :cols]
    with pytest.raises(RuntimeError, match=r"gate's rows must start at 16-byte boundaries.*pass gate.contiguous"):
        _resnorm_quant(dict(kw, gate=odd_rows), g)
    transposed = torch.zeros(cols, rows, dtype=torch.bfloat16, device="cuda").t()
    with pytest.raises(RuntimeError, match=r"scale must have stride 1 in its last dimension.*scale.contiguous"):
        _resnorm_quant(dict(kw, gate=kw["gate"].reshape(rows, cols), scale=transposed,
                            shift=kw["shift"].reshape(rows, cols)), g)
    shifted = torch.zeros(rows * cols + 1, dtype=torch.bfloat16, device="cuda")[1:].view(1, rows, cols)
    with pytest.raises(RuntimeError, match=r"shift must be 16-byte aligned"):
        _resnorm_quant(dict(kw, shift=shifted), g)
    with pytest.raises(RuntimeError, match=r"need B \* S = x's rows"):
        _resnorm_quant(_with(kw, *(p[:, :16] for p in _params(kw))), g)
    # the wrappers copy such layouts and give the contiguous result
    want = _resnorm_quant(kw, g)
    got = q.resnorm_quant(kw["residual"], kw["x"], None, odd_rows.copy_(kw["gate"]), kw["scale"], kw["shift"], g,
                          EPS, True)
    assert _equal(got, want)


def _block(residual, x, temb, g):
    shift, scale, gate = temb.chunk(6, dim=2)[:3]
    return q.resnorm_quant(residual, x, None, gate, scale, shift, g, EPS, True)


def test_torch_compile_fullgraph_with_chunk_views():
    kw = _inputs(4096, 3072, torch.bfloat16, False, seed=5)
    temb = torch.randn(2, 2048, 6 * 3072, device="cuda").to(torch.bfloat16)
    g = torch.tensor([100.0], device="cuda")
    args = (kw["residual"], kw["x"], temb, g)
    assert _equal(torch.compile(_block, fullgraph=True)(*args), _block(*args))


@pytest.mark.parametrize("rows", (4096, 17))
def test_cuda_graph_replay_with_chunk_views(rows):
    b, s = SHAPES[rows]
    kw = _inputs(rows, 3072, torch.bfloat16, False, seed=6)
    static = [kw["residual"].clone(), kw["x"].clone(), torch.randn(b, s, 6 * 3072, device="cuda").to(torch.bfloat16),
              torch.tensor([100.0], device="cuda")]
    graph, out = capture_graph(_block, *static)
    static[2].copy_(torch.randn(b, s, 6 * 3072, device="cuda"))
    static[0].copy_(torch.randn(b, s, 3072, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert _equal(out, _block(*static))
