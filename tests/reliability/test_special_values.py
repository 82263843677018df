"""Defined behaviour for NaN / Inf inputs, overflowing rows, eps = 0, and extreme or invalid global scales
(docs/reliability.md, "Special values"), on CPU (the reference) and on CUDA (against the reference, with
the GPU's approximate reciprocal in fast mode, applied to the GPU's own y).

What is asserted:
- a NaN or Inf in row m of x or residual (or a finite row whose r overflows bf16) changes only row m of
  every output: every other row's bytes (residual_out, y, packed, scales) equal those of a clean run; in
  row m, residual_out changes only at the poisoned element (non-finite there), y is NaN everywhere, every
  packed byte is 0x77 (two +6 codes) and every scale byte 0x7F (E4M3 NaN), in both modes;
- NaN in a parameter column j: gate / bias poison column j of r and so whole rows of y; scale / shift /
  weight / norm_bias poison only column j of y; every NaN element of y codes as 0x7;
- eps = 0 on a constant row gives a NaN row of y (0 * rsqrt(0)); eps > 0 gives y = shift there; a row
  whose squared deviations overflow fp32 normalises to n = 0, so y = shift exactly;
- extreme global scales (1e30, 2^127, inf, 1e-30, the smallest denormals) and invalid ones (0, < 0, NaN,
  which the ops cannot check without a host sync) give the documented bytes, which are the production
  recipe's, and on CUDA the reference's bytes exactly.
"""

from __future__ import annotations

import math

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import reference
from helpers.reliability import (CUDA_OK, block_inputs, extra_kwargs, first_difference, logical_scales,
                                 padding_scale_bytes, reference_rcp, resnorm_args, same_bits)

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not CUDA_OK, reason="needs a CUDA GPU and the compiled library")])]
FAST = pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))

ROWS, COLS, BATCHES = 300, 256, 2  # 3 row tiles of the scale layout, the last one partial
POISON_ROW, POISON_COL = 129, 37


def run_all(kw, G, fast):
    """(packed, scales, residual_out) of the fused op and (y, residual_out) of resnorm, checking that the
    fused op equals nvfp4_quantize(resnorm(...)) byte for byte on this device."""
    packed, scales, r_out = q.resnorm_quant(*resnorm_args(kw), G, 1e-6, fast, **extra_kwargs(kw))
    y, r_out2 = q.resnorm(*resnorm_args(kw), 1e-6, **extra_kwargs(kw))
    packed_u, scales_u = q.nvfp4_quantize(y, G, fast)
    assert torch.equal(packed, packed_u) and torch.equal(scales, scales_u), "fused != unfused"
    assert same_bits(r_out, r_out2), "residual_out of resnorm_quant != that of resnorm"
    return packed, scales, r_out, y


def check_against_reference(kw, G, fast, packed, scales, r_out, y):
    """residual_out exactly as the reference; packed/scales exactly as the reference quantizer of this y."""
    _, r_ref = reference.resnorm(*resnorm_args(kw), 1e-6, **extra_kwargs(kw))
    assert same_bits(r_out, r_ref), f"residual_out vs reference: {first_difference(r_out, r_ref)}"
    p_ref, s_ref = reference.nvfp4_quantize(y, G, fast, rcp=reference_rcp(y.device) if fast else None)
    assert torch.equal(packed, p_ref), f"packed vs reference quantizer: {first_difference(packed, p_ref)}"
    assert torch.equal(scales, s_ref), f"scales vs reference quantizer: {first_difference(scales, s_ref)}"


def rows_except(t, m):
    t = t.reshape(-1, t.shape[-1])
    return torch.cat([t[:m], t[m + 1:]])


POISONS = {
    "x_nan": ("x", float("nan")),
    "x_inf": ("x", float("inf")),
    "x_minus_inf": ("x", -float("inf")),
    "residual_nan": ("residual", float("nan")),
    "residual_inf": ("residual", float("inf")),
    "residual_minus_inf": ("residual", -float("inf")),
    "overflow": ("x", 3.0e38),  # finite x; fma(x, gate, residual) overflows bf16 where gate > ~1.1
}


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("form", ("batch", "indexed"))
@pytest.mark.parametrize("poison", sorted(POISONS))
@FAST
def test_nonfinite_input_affects_only_its_row(poison, form, fast, dev):
    clean = block_inputs(ROWS, COLS, batches=BATCHES, form=form, affine=True, seed=7, device=dev)
    name, value = POISONS[poison]
    dirty = dict(clean)
    t = clean[name].clone()
    t.view(-1, COLS)[POISON_ROW, POISON_COL] = value
    dirty[name] = t
    if poison == "overflow":  # make sure the product overflows: gate 2 at that column for every row
        g = clean["gate"].clone()
        g[..., POISON_COL] = 2.0
        clean["gate"] = dirty["gate"] = g
    G = torch.tensor([37.5], device=dev)

    p0, s0, r0, y0 = run_all(clean, G, fast)
    p1, s1, r1, y1 = run_all(dirty, G, fast)
    m = POISON_ROW

    # other rows: the clean run's bytes
    assert same_bits(rows_except(r1, m), rows_except(r0, m)), "residual_out of other rows changed"
    assert same_bits(rows_except(y1, m), rows_except(y0, m)), "y of other rows changed"
    assert torch.equal(rows_except(p1, m), rows_except(p0, m)), "packed of other rows changed"
    ls0, ls1 = logical_scales(s0, ROWS, COLS), logical_scales(s1, ROWS, COLS)
    assert torch.equal(rows_except(ls1, m), rows_except(ls0, m)), "scales of other rows changed"
    assert not padding_scale_bytes(s1, ROWS, COLS).any(), "padding rows of the scales are not zero"

    # row m: residual_out changes only at the poisoned element, which is non-finite
    r0m, r1m = r0.reshape(-1, COLS)[m], r1.reshape(-1, COLS)[m]
    keep = torch.ones(COLS, dtype=torch.bool, device=r0m.device)
    keep[POISON_COL] = False
    assert same_bits(r1m[keep], r0m[keep]), "residual_out of the poisoned row changed beyond the poisoned element"
    assert not torch.isfinite(r1m[POISON_COL].float()), "the poisoned element of residual_out is finite"
    # row m: y all NaN, packed all 0x77, scales all 0x7F
    assert torch.isnan(y1.reshape(-1, COLS)[m].float()).all(), "y of the poisoned row is not all NaN"
    assert (p1[m] == 0x77).all(), f"packed of the poisoned row: {p1[m].unique().tolist()}"
    assert (ls1[m] == 0x7F).all(), f"scales of the poisoned row: {ls1[m].unique().tolist()}"

    check_against_reference(dirty, G, fast, p1, s1, r1, y1)


PARAM_NAN = {
    # parameter: does a NaN in column j poison whole rows of y (via r) or only column j of y?
    "gate": "rows", "bias": "rows", "scale": "column", "shift": "column", "weight": "column", "norm_bias": "column",
}


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("param", sorted(PARAM_NAN))
@FAST
def test_nan_in_a_parameter(param, fast, dev):
    rows = 130
    clean = block_inputs(rows, COLS, batches=1, form="shared", affine=True, seed=8, device=dev)
    dirty = dict(clean)
    p = clean[param].clone()
    p[..., POISON_COL] = float("nan")
    dirty[param] = p
    G = torch.tensor([37.5], device=dev)
    p0, s0, r0, y0 = run_all(clean, G, fast)
    p1, s1, r1, y1 = run_all(dirty, G, fast)
    y1f = y1.reshape(rows, COLS).float()
    codes = torch.stack([p1 & 0xF, p1 >> 4], dim=-1).reshape(rows, COLS)
    if PARAM_NAN[param] == "rows":
        assert torch.isnan(r1.reshape(rows, COLS)[:, POISON_COL].float()).all()
        assert torch.isnan(y1f).all(), "a NaN in r must make its whole row of y NaN"
        assert (p1 == 0x77).all() and (logical_scales(s1, rows, COLS) == 0x7F).all()
    else:
        assert same_bits(r1, r0), "residual_out must not depend on the LayerNorm / modulation parameters"
        assert torch.isnan(y1f[:, POISON_COL]).all()
        other = torch.ones(COLS, dtype=torch.bool, device=y1f.device)
        other[POISON_COL] = False
        assert same_bits(y1.reshape(rows, COLS)[:, other], y0.reshape(rows, COLS)[:, other])
        assert (codes[:, POISON_COL] == 0x7).all(), "a NaN element of y must code as 0x7 (+6)"
        # the block's scale ignores the NaN (amax is a NaN-ignoring max): finite, not 0x7F
        assert (logical_scales(s1, rows, COLS)[:, POISON_COL // 16] != 0x7F).all()
    check_against_reference(dirty, G, fast, p1, s1, r1, y1)


@pytest.mark.parametrize("dev", DEVICES)
@FAST
def test_constant_rows_and_eps(fast, dev):
    rows = 129
    kw = block_inputs(rows, COLS, batches=1, form="shared", bias=False, seed=9, device=dev)
    for t in (kw["x"], kw["residual"]):
        t.view(-1, COLS)[5] = 0  # r = fma(0, gate, 0) = 0: a constant row
    G = torch.tensor([10.0], device=dev)
    for eps in (0.0, 1e-6):
        packed, scales, r_out = q.resnorm_quant(*resnorm_args(kw), G, eps, fast)
        y, _ = q.resnorm(*resnorm_args(kw), eps)
        row = y.reshape(rows, COLS)[5]
        if eps == 0.0:
            assert torch.isnan(row.float()).all(), "eps = 0 on a constant row: 0 * rsqrt(0) = NaN"
            assert (packed[5] == 0x77).all() and (logical_scales(scales, rows, COLS)[5] == 0x7F).all()
        else:
            assert same_bits(row, kw["shift"].to(torch.bfloat16)), "a constant row normalises to 0: y = shift"
        others = torch.ones(rows, dtype=torch.bool, device=y.device)
        others[5] = False
        assert torch.isfinite(y.reshape(rows, COLS)[others].float()).all()
        p_ref, s_ref = reference.nvfp4_quantize(y, G, fast, rcp=reference_rcp(dev) if fast else None)
        assert torch.equal(packed, p_ref) and torch.equal(scales, s_ref)


@pytest.mark.parametrize("dev", DEVICES)
@FAST
def test_variance_overflow_gives_shift(fast, dev):
    """|r| ~ 1e30: the mean is finite but the sum of squared deviations overflows fp32, so rstd =
    rsqrt(inf) = 0, n = 0 and y = shift exactly; residual_out is exact."""
    rows = 64
    kw = block_inputs(rows, COLS, batches=1, form="shared", bias=False, seed=10, device=dev)
    big = 1e30
    kw["x"] = (kw["x"].float() * big).to(torch.bfloat16)
    kw["residual"] = (kw["residual"].float() * big).to(torch.bfloat16)
    G = torch.tensor([10.0], device=dev)
    packed, scales, r_out = q.resnorm_quant(*resnorm_args(kw), G, 1e-6, fast)
    y, _ = q.resnorm(*resnorm_args(kw), 1e-6)
    assert torch.isfinite(r_out.float()).all()
    assert same_bits(y, kw["shift"].to(torch.bfloat16).expand(y.shape).contiguous())
    check_against_reference(kw, G, fast, packed, scales, r_out, y)


# ---------------------------------------------------------------------------------------------------
# Global scales
# ---------------------------------------------------------------------------------------------------


def quantizer_input(dev):
    """y [260, 256] with |y| in [1e-3, 1e3] or exactly +-0: per-row magnitudes, signed zeros inside
    non-zero blocks, an all-zero block and an all-(-0) block."""
    g = torch.Generator().manual_seed(11)
    rows = 260
    mag = torch.exp2(torch.randint(-9, 10, (rows, 1), generator=g).float())
    y = (torch.randn(rows, COLS, generator=g) * mag).clamp(-1000, 1000)
    y = torch.where(y.abs() < 1e-3, torch.full_like(y, 1e-3) * torch.sign(y + 1e-30), y)
    zeros = torch.rand(rows, COLS, generator=g) < 0.05
    y = torch.where(zeros, torch.zeros_like(y) * torch.sign(torch.randn(rows, COLS, generator=g)), y)
    y[3, 16:32] = 0.0
    y[4, 32:48] = -0.0
    return y.to(torch.bfloat16).to(dev)


def expected_bytes(y, name, fast, gpu):
    """The documented outcome of an extreme / invalid global scale for a ``quantizer_input`` y:
    (logical scale bytes [rows, D/16], codes [rows, D]), or None where docs/reliability.md states no closed
    form (G < 0: see test_negative_global_scale)."""
    yf = y.float().cpu()
    rows = yf.shape[0]
    nonzero_block = (yf.reshape(rows, -1, 16) != 0).any(-1)  # [rows, D/16]
    in_nonzero_block = nonzero_block.repeat_interleave(16, dim=1)  # [rows, D]
    is_zero = yf == 0
    zero_code = torch.signbit(yf).to(torch.uint8) << 3  # 0x0 / 0x8: the sign only
    six = zero_code | 0x7  # +-6
    nan_code = torch.full_like(zero_code, 0x7)  # a NaN product codes as +6

    def per_block(nonzero, zero):
        return torch.where(nonzero_block, torch.tensor(nonzero, dtype=torch.uint8),
                           torch.tensor(zero, dtype=torch.uint8))

    saturated = (per_block(0x7E, 0), torch.where(is_zero, zero_code, six))  # 448 and +-6; zeros stay 0
    underflow = (per_block(0, 0), zero_code if fast else torch.where(is_zero, zero_code, six))
    if name == "nan":
        if fast:
            return per_block(0x7F, 0x7F), nan_code
        return per_block(0x7F, 0), torch.where(in_nonzero_block & ~is_zero, six, zero_code)
    if name == "inf":  # rcp(inf) = 0, so the encode scale rcp(448 * 0) = inf (fast) / FLT_MAX (exact)
        if fast:
            return per_block(0x7E, 0x7F), torch.where(in_nonzero_block & ~is_zero, six, nan_code)
        return saturated
    if name in ("2^127", "FLT_MAX"):  # rcp.approx.ftz(G) is subnormal, flushed to 0 on the GPU
        if fast and gpu:
            return per_block(0x7E, 0), torch.where(is_zero, torch.where(in_nonzero_block, nan_code, zero_code), six)
        return saturated
    if name == "1e30":
        return saturated
    if name in ("1e-30", "1e-39_denormal", "min_denormal", "zero"):
        return underflow
    if name == "minus_zero":
        if fast:  # G * amax = -0 -> scale byte 0x80 (non-zero), encode scale rcp(-0 * -inf) = NaN
            return per_block(0x80, 0x80), nan_code
        return per_block(0x80, 0), torch.where(is_zero, zero_code, six)
    return None


GLOBAL_SCALES = {
    "1e30": 1e30, "2^127": 2.0 ** 127, "inf": math.inf, "1e-30": 1e-30, "1e-39_denormal": 1e-39,
    "min_denormal": 2.0 ** -149, "zero": 0.0, "minus_zero": -0.0, "minus_one": -1.0, "nan": math.nan,
    "FLT_MAX": 3.4028234663852886e38,
}


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("gs_name", sorted(GLOBAL_SCALES))
@FAST
def test_extreme_global_scales(gs_name, fast, dev):
    gs = GLOBAL_SCALES[gs_name]
    y = quantizer_input(dev)
    rows = y.shape[0]
    G = torch.tensor([gs], dtype=torch.float32, device=dev)
    packed, scales = q.nvfp4_quantize(y, G, fast)
    # the reference (with the GPU's reciprocal on CUDA): exact, whatever G is
    p_ref, s_ref = reference.nvfp4_quantize(y, G, fast, rcp=reference_rcp(dev) if fast else None)
    assert torch.equal(packed, p_ref), first_difference(packed, p_ref)
    assert torch.equal(scales, s_ref), first_difference(scales, s_ref)
    assert not padding_scale_bytes(scales, rows, COLS).any()
    # the documented closed forms
    exp = expected_bytes(y, gs_name, fast, dev == "cuda")
    if exp is not None:
        want_sf, want_codes = exp
        codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(rows, COLS).cpu()
        got_sf = logical_scales(scales, rows, COLS).cpu()
        assert torch.equal(got_sf, want_sf), gs_name
        assert torch.equal(codes, want_codes), f"{gs_name}: {first_difference(codes, want_codes)}"


@pytest.mark.parametrize("dev", DEVICES)
@FAST
def test_negative_global_scale(fast, dev):
    """G < 0 is not checked (no host sync). Blocks with a non-zero scale at |G|: the same scale byte with
    the sign bit set and the same codes, so dequantize_nvfp4 with the same G gives the same values.
    Blocks whose scale is zero at |G| (amax = 0 or underflow): the scale byte is 0x80 (E4M3 -0); in exact
    mode the codes are those of |G|; in fast mode 0x80 counts as a non-zero scale, the encode scale is
    rcp(-0 * rcp(G)) = rcp(+0) = inf, so non-zero elements code as +-6 and zeros (0 * inf = NaN) as 0x7."""
    y = quantizer_input(dev)
    rows = y.shape[0]
    pos, neg = torch.tensor([3.0], device=dev), torch.tensor([-3.0], device=dev)
    p_pos, s_pos = q.nvfp4_quantize(y, pos, fast)
    p_neg, s_neg = q.nvfp4_quantize(y, neg, fast)
    p_ref, s_ref = reference.nvfp4_quantize(y, neg, fast, rcp=reference_rcp(dev) if fast else None)
    assert torch.equal(p_neg, p_ref) and torch.equal(s_neg, s_ref)
    lp, ln = logical_scales(s_pos, rows, COLS), logical_scales(s_neg, rows, COLS)
    amax_nonzero = (y.reshape(rows, -1, 16).float() != 0).any(-1)
    scaled = lp != 0
    assert scaled.any() and (~scaled & amax_nonzero).any() and (~amax_nonzero).any()  # all three kinds occur
    assert torch.equal(ln[scaled], lp[scaled] | 0x80)
    by_byte = scaled.repeat_interleave(8, dim=1)
    assert torch.equal(p_neg[by_byte], p_pos[by_byte])
    codes = torch.stack([p_neg & 0xF, p_neg >> 4], dim=-1).reshape(rows, COLS)
    yf = y.float()
    zero_scale_elems = (~scaled).repeat_interleave(16, dim=1)
    if fast:
        assert (ln[~scaled] == 0x80).all()
        want = torch.where(yf == 0, torch.full_like(codes, 0x7), (torch.signbit(yf).to(torch.uint8) << 3) | 0x7)
        assert torch.equal(codes[zero_scale_elems], want[zero_scale_elems])
    else:
        assert (ln[~scaled & amax_nonzero] == 0x80).all() and (ln[~amax_nonzero] == 0).all()
        assert torch.equal(p_neg, p_pos)
    d_pos = q.dequantize_nvfp4(p_pos, s_pos, pos)
    d_neg = q.dequantize_nvfp4(p_neg, s_neg, neg)
    by_elem = scaled.repeat_interleave(16, dim=1)
    assert torch.equal(d_neg[by_elem], d_pos[by_elem])


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("gs", (1e-30, 1e30, math.inf, 0.0, math.nan), ids=("1e-30", "1e30", "inf", "zero", "nan"))
@FAST
def test_fused_op_with_extreme_global_scales(gs, fast, dev):
    """The fused op equals quantize(resnorm) and the reference quantizer of its y for any G; residual_out
    and y do not depend on G."""
    kw = block_inputs(2 * 150, COLS, batches=2, form="batch", affine=True, seed=12, device=dev)
    packed, scales, r_out, y = run_all(kw, torch.tensor([gs], device=dev), fast)
    check_against_reference(kw, torch.tensor([gs], device=dev), fast, packed, scales, r_out, y)
    _, _, r_out1, y1 = run_all(kw, torch.tensor([1.0], device=dev), fast)
    assert same_bits(r_out, r_out1) and same_bits(y, y1)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("case", ("G=inf,fast,zero_block", "G=2^-149,exact,inf_block"))
def test_nan_scale_byte_is_0x7f(case, dev, request):
    """A NaN block scale is the byte 0x7F (contract step 8: e4m3_rn_satfinite(NaN) = 0x7F, as the GPU's
    conversion of its canonical NaN gives). On x86 CPUs inf * 0 is a *negative* NaN: the reference
    canonicalises it."""
    y = torch.ones(1, 64, dtype=torch.bfloat16, device=dev)
    if case.startswith("G=inf"):
        y[0, :16] = 0  # an all-zero block: inf * 0
        G, fast = torch.tensor([math.inf], device=dev), True
    else:
        y[0, 3] = math.inf  # an inf amax times G / 6 = 0
        G, fast = torch.tensor([2.0 ** -149], device=dev), False
    _, scales = q.nvfp4_quantize(y, G, fast)
    _, s_ref = reference.nvfp4_quantize(y, G, fast, rcp=reference_rcp(dev) if fast else None)
    assert logical_scales(scales, 1, 64)[0, 0 if case.startswith("G=inf") else 0].item() == 0x7F
    assert torch.equal(scales, s_ref)
