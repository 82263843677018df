"""Property-based tests (hypothesis).

CPU, the reference and the CPU ops (100 examples each; 500 in the exhaustive sweep):
- fused == nvfp4_quantize(resnorm(...)) byte for byte, for contiguous, strided and misaligned inputs alike;
- scale bytes never carry the sign bit for a positive finite global scale (NaN scales are 0x7F);
- dequantize(quantize(y)) is within one E2M1 half-step of the block scale of y, plus the saturation
  excess: |deq - y| <= s + max(0, amax - 6 s) per block, s = float(SF) / G (SF = 0: the block reads 0);
- padding rows of the scales are zero;
- the codes: NaN -> 0x7; otherwise the sign bit is y's sign bit; in a block with a normal, finite E4M3
  scale (byte 0x08..0x7E) the element of largest magnitude codes as +-6;
- rows are independent: permuting the rows of x and residual permutes every output the same way;
- scaling y by 2^k and G by 2^-k leaves packed and scales unchanged (all values stay normal fp32/bf16:
  then every product in the recipe scales exactly; checked to hold, it is not an approximation).

GPU (40 examples, 200 in the exhaustive sweep; skipped without CUDA): the kernels against the reference over
random shapes (rows 1..300, D a multiple of 64 up to 4096), per-row magnitudes from bf16 denormals to overflow,
injected NaN / Inf / zeros / denormals, all-zero rows, every modulation form and option, and global scales from
denormal to inf (0, negative and NaN included): fused == unfused, residual_out exact, packed/scales exact against the
reference quantizer of the GPU's y (fast mode with the GPU's reciprocal), padding rows zero, rows with a
non-finite r give an all-NaN y row, and y within helpers.reliability.Y_ULPS_BOUND (3) bf16 ulps of the
reference on rows whose mean and variance are far from fp32 overflow (docs/numerics.md explains why y is
not bit-exact).
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import reference
from qwen_resnorm_fp4.layout import round_up
from helpers.tiers import exhaustive_run
from helpers.reliability import (CUDA_OK, Y_ULPS_BOUND, as_bits, first_difference, logical_scales, padding_scale_bytes,
                                 same_bits, y_ulps)

# More examples for a deeper run: QWEN_FP4_HYPOTHESIS_CPU_EXAMPLES / QWEN_FP4_HYPOTHESIS_GPU_EXAMPLES; the exhaustive
# sweep (--exhaustive, tests/conftest.py) takes five times the default's.
_DEPTH = 5 if exhaustive_run() else 1
CPU_SETTINGS = settings(max_examples=int(os.environ.get("QWEN_FP4_HYPOTHESIS_CPU_EXAMPLES", 100 * _DEPTH)),
                        deadline=None, database=None, print_blob=True,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
GPU_SETTINGS = settings(max_examples=int(os.environ.get("QWEN_FP4_HYPOTHESIS_GPU_EXAMPLES", 40 * _DEPTH)),
                        deadline=None, database=None, print_blob=True,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

FLT_MAX = torch.finfo(torch.float32).max
SPECIALS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "zero": 0.0, "-zero": -0.0,
            "denormal": 1e-40, "-denormal": -3e-39, "huge": 3.0e38, "-huge": -2.5e38, "tiny": 2.0 ** -133}
FINITE_SPECIALS = ("zero", "-zero", "denormal", "-denormal", "tiny")


# ---------------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------------


@st.composite
def shapes(draw, max_rows=300, max_cols=1024):
    batches = draw(st.integers(1, 3))
    per_batch = draw(st.integers(1, max_rows // batches))
    cols = 64 * draw(st.integers(1, max_cols // 64))
    return batches, per_batch, cols


@st.composite
def row_values(draw, rows, cols, exp_range=(-133, 127), specials=tuple(SPECIALS), max_specials=8,
               zero_rows=True, std=1.0):
    """bf16 [rows, cols]: N(0, std) times 2^e with e drawn per row, specials injected at drawn positions,
    some rows all zero. The data drawn is small (a seed, the exponents, a few positions)."""
    seed = draw(st.integers(0, 2 ** 31 - 1))
    exps = draw(st.lists(st.integers(*exp_range), min_size=rows, max_size=rows))
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(rows, cols, generator=g, dtype=torch.float64) * std
    v = v * torch.exp2(torch.tensor(exps, dtype=torch.float64)).unsqueeze(1)
    t = v.to(torch.bfloat16)  # beyond the bf16 range: +-inf, as any overflowing input
    if specials:
        for r, c, kind in draw(st.lists(st.tuples(st.integers(0, rows - 1), st.integers(0, cols - 1),
                                                  st.sampled_from(specials)), max_size=max_specials)):
            t[r, c] = SPECIALS[kind]
    if zero_rows:
        for r in draw(st.lists(st.integers(0, rows - 1), max_size=2)):
            t[r] = 0
    return t


def global_scales(min_exp=-149, max_exp=127, invalid=False):
    """fp32 global scales: m * 2^e over the whole range, and the extremes; with invalid=True also 0, < 0, NaN."""
    finite = st.builds(lambda m, e: float(torch.tensor(m * 2.0 ** e, dtype=torch.float32)),
                       st.floats(1.0, 2.0, exclude_max=True), st.integers(min_exp, max_exp))
    lo, hi = 2.0 ** min_exp, 2.0 ** (max_exp + 1)
    extremes = [v for v in (1e-30, 1e30, 2.0 ** -149, 1e-39, 2.0 ** 127, FLT_MAX, math.inf)
                if lo <= v < hi or (v == math.inf and max_exp >= 127)]
    choices = [finite] + ([st.sampled_from(extremes)] if extremes else [])
    if invalid:
        choices.append(st.sampled_from([0.0, -0.0, -1.0, -1e30, math.nan]))
    return st.one_of(*choices).filter(lambda v: v != 0 or invalid)


def modulation(draw, batches, cols, device="cpu"):
    form = draw(st.sampled_from(("shared", "batch", "indexed")))
    pdt = draw(st.sampled_from((torch.bfloat16, torch.float32)))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    g = torch.Generator().manual_seed(seed)
    nrow = {"shared": (), "batch": (batches,), "indexed": (2 * batches,)}[form]

    def rnd(*shape, s=1.0, mean=0.0):
        return (torch.randn(*shape, generator=g) * s + mean).to(pdt).to(device)

    kw = dict(gate=rnd(*nrow, cols, s=0.5, mean=0.5), scale=rnd(*nrow, cols, s=0.3), shift=rnd(*nrow, cols, s=0.3),
              bias=rnd(cols, s=0.1) if draw(st.booleans()) else None)
    affine = draw(st.booleans())
    kw["weight"] = rnd(cols, s=0.1, mean=1.0) if affine else None
    kw["norm_bias"] = rnd(cols, s=0.1) if affine else None
    kw["modulate_index"] = None
    kw["form"] = form
    return kw


def with_index(kw, batches, per_batch, draw, device="cpu"):
    if kw.pop("form") == "indexed":
        dt = draw(st.sampled_from((torch.int32, torch.int64, torch.bool)))
        seed = draw(st.integers(0, 2 ** 31 - 1))
        idx = torch.randint(0, 3, (batches, per_batch), generator=torch.Generator().manual_seed(seed))
        kw["modulate_index"] = (idx != 0 if dt == torch.bool else idx.to(dt)).to(device)
    return kw


def relayout(t: torch.Tensor, how: str) -> torch.Tensor:
    """The same values as a non-contiguous view ("strided") or at a misaligned offset ("misaligned")."""
    if t is None or how == "contiguous":
        return t
    if how == "strided":
        v = torch.stack([t, torch.zeros_like(t)], dim=-1)[..., 0]
    else:
        buf = torch.zeros(t.numel() + 1, dtype=t.dtype, device=t.device)
        v = buf[1:].view(t.shape)
        v.copy_(t)
    assert torch.equal(as_bits(v.contiguous()), as_bits(t.contiguous()))
    return v


# ---------------------------------------------------------------------------------------------------
# CPU properties
# ---------------------------------------------------------------------------------------------------

ops = torch.ops.qwen_fp4


@CPU_SETTINGS
@given(data=st.data(), fast=st.booleans())
def test_cpu_fused_equals_unfused_any_layout(data, fast):
    batches, per_batch, cols = data.draw(shapes())
    rows = batches * per_batch
    x = data.draw(row_values(rows, cols)).reshape(batches, per_batch, cols)
    residual = data.draw(row_values(rows, cols, std=4.0)).reshape(batches, per_batch, cols)
    kw = with_index(modulation(data.draw, batches, cols), batches, per_batch, data.draw)
    G = torch.tensor([data.draw(global_scales(invalid=True))], dtype=torch.float32)
    eps = data.draw(st.sampled_from((0.0, 1e-6, 1e-5)))
    how = data.draw(st.sampled_from(("contiguous", "strided", "misaligned")))
    args = [relayout(t, how) for t in (residual, x, kw["bias"], kw["gate"], kw["scale"], kw["shift"])]
    tail = [relayout(kw[n], how) for n in ("weight", "norm_bias", "modulate_index")]

    packed, scales, r_out = ops.resnorm_quant(*args, G, eps, fast, *tail)
    y, r_out2 = ops.resnorm(*args, eps, *tail)
    packed_u, scales_u = ops.nvfp4_quantize(y, G, fast)
    assert torch.equal(packed, packed_u) and torch.equal(scales, scales_u)
    assert torch.equal(as_bits(r_out), as_bits(r_out2))
    # the same bytes as for contiguous inputs, through the wrappers
    want = q.resnorm_quant(residual, x, kw["bias"], kw["gate"], kw["scale"], kw["shift"], G, eps, fast,
                           weight=kw["weight"], norm_bias=kw["norm_bias"], modulate_index=kw["modulate_index"])
    assert torch.equal(packed, want[0]) and torch.equal(scales, want[1])
    assert torch.equal(as_bits(r_out), as_bits(want[2]))
    assert packed.shape == (rows, cols // 2) and scales.shape == (round_up(rows, 128), cols // 16)


@CPU_SETTINGS
@given(data=st.data(), fast=st.booleans())
def test_cpu_scale_bytes_have_no_sign_and_padding_is_zero(data, fast):
    _, per_batch, cols = data.draw(shapes())
    y = data.draw(row_values(per_batch, cols))
    gs = data.draw(global_scales())
    assume(gs > 0)
    packed, scales = reference.nvfp4_quantize(y, torch.tensor([gs]), fast)
    assert not (scales & 0x80).any(), f"sign bit set in a scale byte for G={gs}"
    assert not padding_scale_bytes(scales, per_batch, cols).any()


@CPU_SETTINGS
@given(data=st.data(), fast=st.booleans())
def test_cpu_dequantize_error_bounded_by_block_scale(data, fast):
    _, rows, cols = data.draw(shapes())
    y = data.draw(row_values(rows, cols, exp_range=(-100, 100), specials=FINITE_SPECIALS))
    gs = data.draw(global_scales(min_exp=-60, max_exp=60))
    G = torch.tensor([gs])
    packed, scales = reference.nvfp4_quantize(y, G, fast)
    deq = reference.dequantize_nvfp4(packed, scales, G, rows).double()
    yd = y.double()
    s = reference.e4m3_to_float(logical_scales(scales, rows, cols)).double() / float(G)  # [rows, D/16]
    amax = yd.abs().reshape(rows, -1, 16).amax(-1)
    bound = (s + (amax - 6 * s).clamp(min=0)) * (1 + 2 ** -18) + amax * 2 ** -20
    err = (deq - yd).abs().reshape(rows, -1, 16).amax(-1)
    bad = err > bound
    assert not bad.any(), (f"G={gs}: block {bad.nonzero()[0].tolist()} error {err[bad][0].item()!r} > bound "
                           f"{bound[bad][0].item()!r} (s={s[bad][0].item()!r}, amax={amax[bad][0].item()!r})")


@CPU_SETTINGS
@given(data=st.data(), fast=st.booleans())
def test_cpu_codes(data, fast):
    _, rows, cols = data.draw(shapes())
    y = data.draw(row_values(rows, cols, exp_range=(-100, 100)))
    gs = data.draw(global_scales(min_exp=-60, max_exp=60))
    packed, scales = reference.nvfp4_quantize(y, torch.tensor([gs]), fast)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(rows, cols)
    yf = y.float()
    nan = torch.isnan(yf)
    assert (codes[nan] == 0x7).all(), "NaN must code as 0x7"
    assert torch.equal((codes[~nan] >> 3).bool(), torch.signbit(yf[~nan])), "code sign != sign of y"
    assert (codes[yf == 0] & 0x7 == 0).all(), "zero must code as +-0"
    sf = logical_scales(scales, rows, cols)
    blocks = yf.reshape(rows, -1, 16)
    amax = torch.where(torch.isnan(blocks), torch.zeros_like(blocks), blocks.abs()).amax(-1)
    normal = (sf >= 0x08) & (sf <= 0x7E) & torch.isfinite(amax) & (amax > 0)
    at_max = (blocks.abs() == amax.unsqueeze(-1)) & normal.unsqueeze(-1)
    mags = (codes.reshape(rows, -1, 16) & 0x7)
    assert (mags[at_max] == 0x7).all(), "the block maximum must code as +-6 when the scale is normal"


@CPU_SETTINGS
@given(data=st.data(), fast=st.booleans())
def test_cpu_rows_are_independent(data, fast):
    _, rows, cols = data.draw(shapes(max_cols=512))
    x = data.draw(row_values(rows, cols))
    residual = data.draw(row_values(rows, cols, std=4.0))
    kw = modulation(data.draw, 1, cols)
    if kw["form"] != "shared":  # row-dependent modulation would move with the rows: use the shared form
        for n in ("gate", "scale", "shift"):
            kw[n] = kw[n][0]
    perm = torch.tensor(data.draw(st.permutations(range(rows))))
    G = torch.tensor([data.draw(global_scales(invalid=True))])
    common = dict(weight=kw["weight"], norm_bias=kw["norm_bias"])
    p0, s0, r0 = q.resnorm_quant(residual, x, kw["bias"], kw["gate"], kw["scale"], kw["shift"], G, 1e-6, fast, **common)
    p1, s1, r1 = q.resnorm_quant(residual[perm], x[perm], kw["bias"], kw["gate"], kw["scale"], kw["shift"], G, 1e-6,
                                 fast, **common)
    assert torch.equal(p1, p0[perm])
    assert torch.equal(as_bits(r1), as_bits(r0[perm]))
    assert torch.equal(logical_scales(s1, rows, cols), logical_scales(s0, rows, cols)[perm])


@CPU_SETTINGS
@given(data=st.data(), fast=st.booleans(), k=st.integers(-40, 40))
def test_cpu_power_of_two_rescaling_leaves_bytes_unchanged(data, fast, k):
    _, rows, cols = data.draw(shapes())
    y = data.draw(row_values(rows, cols, exp_range=(-60, 60), specials=("nan", "inf", "-inf", "zero", "-zero")))
    gs = data.draw(global_scales(min_exp=-30, max_exp=30))
    y2 = (y.float() * 2.0 ** k).to(torch.bfloat16)
    finite = torch.isfinite(y.float())
    assert torch.equal(y2.float()[finite], y.float()[finite] * 2.0 ** k), "the rescaled y must be exact"
    p1, s1 = reference.nvfp4_quantize(y, torch.tensor([gs]), fast)
    p2, s2 = reference.nvfp4_quantize(y2, torch.tensor([gs * 2.0 ** -k]), fast)
    assert torch.equal(p1, p2), first_difference(p1, p2)
    assert torch.equal(s1, s2), first_difference(s1, s2)


# ---------------------------------------------------------------------------------------------------
# GPU: the kernels against the reference
# ---------------------------------------------------------------------------------------------------


def _well_conditioned_rows(r_ref: torch.Tensor) -> torch.Tensor:
    """Rows where the GPU's and the reference's y must agree within Y_ULPS_BOUND ulps: r finite, and the row
    sum and the sum of squared deviations far from fp32 overflow (< 2^120), or the latter certainly
    overflowing (> 2^132, where both give rstd = 0 and y = shift)."""
    r = r_ref.double()
    finite = torch.isfinite(r).all(-1)
    r0 = torch.where(torch.isfinite(r), r, torch.zeros_like(r))
    abs_sum = r0.abs().sum(-1)
    ss = ((r0 - r0.mean(-1, keepdim=True)) ** 2).sum(-1)
    return finite & (abs_sum < 2.0 ** 120) & ((ss < 2.0 ** 120) | (ss > 2.0 ** 132))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA_OK, reason="needs a CUDA GPU and the compiled library")
@GPU_SETTINGS
@given(data=st.data(), fast=st.booleans())
def test_gpu_kernels_match_reference(data, fast):
    from qwen_resnorm_fp4.testing import gpu_rcp

    batches, per_batch, cols = data.draw(shapes(max_cols=4096))
    rows = batches * per_batch
    x = data.draw(row_values(rows, cols)).reshape(batches, per_batch, cols).cuda()
    residual = data.draw(row_values(rows, cols, std=4.0)).reshape(batches, per_batch, cols).cuda()
    kw = with_index(modulation(data.draw, batches, cols, device="cuda"), batches, per_batch, data.draw, "cuda")
    G = torch.tensor([data.draw(global_scales(invalid=True))], dtype=torch.float32, device="cuda")
    eps = data.draw(st.sampled_from((1e-6, 1e-5)))
    args = (residual, x, kw["bias"], kw["gate"], kw["scale"], kw["shift"])
    extra = dict(weight=kw["weight"], norm_bias=kw["norm_bias"], modulate_index=kw["modulate_index"])
    name = f"rows={rows} (B={batches}) D={cols} G={G.item()!r} fast={fast} eps={eps}"

    packed, scales, r_out = q.resnorm_quant(*args, G, eps, fast, **extra)
    y, r_out2 = q.resnorm(*args, eps, **extra)
    packed_u, scales_u = q.nvfp4_quantize(y, G, fast)
    torch.cuda.synchronize()
    assert torch.equal(packed, packed_u) and torch.equal(scales, scales_u), f"{name}: fused != unfused"
    assert torch.equal(as_bits(r_out), as_bits(r_out2)), f"{name}: residual_out differs between the ops"
    assert not padding_scale_bytes(scales, rows, cols).any(), f"{name}: padding rows of the scales not zero"

    y_ref, r_ref = reference.resnorm(*args, eps, **extra)
    assert same_bits(r_out, r_ref), f"{name}: residual_out vs reference: {first_difference(r_out, r_ref)}"
    p_ref, s_ref = reference.nvfp4_quantize(y, G, fast, rcp=gpu_rcp if fast else None)
    assert torch.equal(packed, p_ref), f"{name}: packed vs reference quantizer: {first_difference(packed, p_ref)}"
    assert torch.equal(scales, s_ref), f"{name}: scales vs reference quantizer: {first_difference(scales, s_ref)}"

    r2 = r_ref.reshape(rows, cols)
    y2, yr2 = y.reshape(rows, cols).float(), y_ref.reshape(rows, cols).float()
    nonfinite_rows = ~torch.isfinite(r2.float()).all(-1)
    assert torch.isnan(y2[nonfinite_rows]).all(), f"{name}: a row with a non-finite r must give an all-NaN y"
    ok = _well_conditioned_rows(r2)
    if ok.any():
        shift_rows = reference._modulation_rows(kw["shift"], rows, per_batch, kw["modulate_index"]).reshape(rows, cols)
        a, b, sh = y2[ok], yr2[ok], shift_rows[ok].float()
        assert torch.equal(torch.isnan(a), torch.isnan(b)), f"{name}: NaN pattern of y differs"
        fin = ~torch.isnan(b)
        ulps = y_ulps(a[fin], b[fin], sh[fin])
        worst = ulps.max().item() if ulps.numel() else 0.0
        assert worst <= Y_ULPS_BOUND, f"{name}: y differs by {worst} ulps"
