"""E4M3 block scales: the reference's conversion against a brute force over all finite E4M3 values, and
the block-scale bytes of both quantizer modes on hand-computed blocks."""

import math

import numpy as np
import pytest
import torch

from helpers.oracles import block_scale_oracle, e4m3_byte_oracle, e4m3_decode_formula, e4m3_table, nvfp4_quantize_oracle
from qwen_resnorm_fp4 import reference as R

INF = float("inf")
TABLE = e4m3_table()  # bytes 0x00..0x7E


def sat(values):
    return R.e4m3_satfinite(torch.tensor(values, dtype=torch.float32)).tolist()


def test_table_shape_and_known_values():
    assert len(TABLE) == 127 and np.all(np.diff(TABLE) > 0)
    assert TABLE[0x7E] == 448.0 and TABLE[0x01] == 2.0 ** -9 and TABLE[0x08] == 2.0 ** -6 and TABLE[0x38] == 1.0


def test_decode_matches_formula_all_bytes():
    got = R.e4m3_to_float(torch.arange(256, dtype=torch.int32).to(torch.uint8)).tolist()
    for b in range(256):
        want = e4m3_decode_formula(b)
        if math.isnan(want):
            assert math.isnan(got[b]), hex(b)
        else:
            assert got[b] == want and math.copysign(1, got[b]) == math.copysign(1, want), hex(b)


def test_every_representable_value_encodes_to_itself():
    v = torch.tensor(TABLE, dtype=torch.float32)
    assert R.e4m3_satfinite(v).tolist() == list(range(0x7F))
    assert R.e4m3_satfinite(-v[1:]).tolist() == [0x80 | b for b in range(1, 0x7F)]


def test_every_midpoint_ties_to_even():
    lo = torch.tensor(TABLE[:-1], dtype=torch.float32)
    hi = torch.tensor(TABLE[1:], dtype=torch.float32)
    mid = (lo.double() + hi.double()) / 2
    assert torch.equal(mid.float().double(), mid)  # midpoints are exact in fp32
    mid = mid.float()
    lower = torch.arange(0, 0x7E)
    expected = torch.where(lower % 2 == 0, lower, lower + 1)  # even byte of the two neighbours
    assert torch.equal(R.e4m3_satfinite(mid).long(), expected)
    assert torch.equal(R.e4m3_satfinite(-mid).long(), expected | 0x80)
    above = torch.nextafter(mid, torch.full_like(mid, INF))
    below = torch.nextafter(mid, torch.full_like(mid, -INF))
    assert torch.equal(R.e4m3_satfinite(above).long(), lower + 1)
    assert torch.equal(R.e4m3_satfinite(below).long(), lower)
    assert torch.equal(torch.from_numpy(e4m3_byte_oracle(mid)).long(), expected)  # oracle agrees


def test_saturation_and_specials():
    assert sat([448.0, 448.5, 463.9, 464.0, 480.0, 500.0, 1e6, 3.4e38, INF]) == [0x7E] * 9
    assert sat([-448.0, -464.0, -1e6, -INF]) == [0xFE] * 4
    assert sat([float("nan")]) == [0x7F]
    assert sat([0.0, -0.0]) == [0x00, 0x80]
    assert sat([2.0 ** -10, 2.0 ** -11, -2.0 ** -11]) == [0x00, 0x00, 0x80]  # tie to 0 and underflow
    assert sat([3 * 2.0 ** -10]) == [0x02]  # tie between 2^-9 (odd) and 2^-8 (even)


def test_random_against_brute_force():
    g = torch.Generator().manual_seed(1)
    mag = torch.exp2(torch.rand(6000, generator=g) * 22 - 13)  # 2^-13 .. 2^9
    sign = torch.where(torch.rand(6000, generator=g) < 0.5, -1.0, 1.0)
    v = torch.cat([mag * sign, torch.randn(2000, generator=g) * 100]).float()
    assert torch.equal(R.e4m3_satfinite(v), torch.from_numpy(e4m3_byte_oracle(v)))


# ---------------------------------------------------------------------------------------------------
# Block scales of nvfp4_quantize, both modes, worked out by hand (the comments are the derivation).
# rcp(6) = fp32(1/6) = 0x3E2AAAAB = 0.16666667163...; on CPU fast mode uses this IEEE reciprocal.
# E4M3 byte = sign<<7 | E<<3 | m, value 2^(E-7) * (1 + m/8); subnormal E=0: m * 2^-9.
# ---------------------------------------------------------------------------------------------------

# (amax, G, fast SF byte, exact SF byte)
HAND_SCALES = [
    # 6 * 0.16666667 = 1.0000000298 -> fp32 1.0; SF = 1.0 = 0x38 in both modes
    (6.0, 1.0, 0x38, 0x38),
    # fast: 5 * 0.16666667 -> 0.83333337, * 2 -> 1.6666667; exact: 5 * 0.33333334 -> 1.6666667.
    # E4M3 neighbours 1.625 (0x3D) and 1.75 (0x3E): 0x3D.
    (5.0, 2.0, 0x3D, 0x3D),
    # G = 6: 6 * fp32(1/6) rounds to exactly 1.0, so the SF is amax itself; 1.0625 is the midpoint of
    # 1.0 (0x38, even) and 1.125 (0x39): tie -> 0x38. 1.1875 between 0x39 and 0x3A (1.25): -> 0x3A.
    (1.0625, 6.0, 0x38, 0x38),
    (1.1875, 6.0, 0x3A, 0x3A),
    # subnormal SF: 0.010009765625 / 6 = 0.0016683 = 0.854 * 2^-9 -> m = 1: 0x01
    (0.010009765625, 1.0, 0x01, 0x01),
    # underflow: 2^-12 / 6 = 4.07e-5 < 2^-10 (half the smallest subnormal) -> 0x00
    (2.0 ** -12, 1.0, 0x00, 0x00),
    # saturation: 6 / 6 * 1000 = 1000 > 448 -> 0x7E
    (6.0, 1000.0, 0x7E, 0x7E),
    # the modes differ: fast 1.5 * 0.16666667 = 0.2500000075 -> fp32 0.25, * 100 = 25.0 exactly, the
    # midpoint of 24 (0x5C, even) and 26 (0x5D) -> 0x5C; exact: 100 * 0.16666667 -> 16.666668,
    # * 1.5 -> 25.000002, above the midpoint -> 0x5D.
    (1.5, 100.0, 0x5C, 0x5D),
    # all zero: SF 0 in both modes
    (0.0, 1.0, 0x00, 0x00),
]


def _one_block_row(amax, D=64):
    y = torch.zeros(1, D)
    y[0, 3] = amax  # the amax at an arbitrary position of block 0; the other blocks are zero
    y = y.to(torch.bfloat16)
    assert y[0, 3].item() == amax  # the hand-picked values are bf16-exact
    return y


@pytest.mark.parametrize("amax,G,sf_fast,sf_exact", HAND_SCALES)
def test_block_scale_bytes_by_hand(amax, G, sf_fast, sf_exact):
    y = _one_block_row(amax)
    gs = torch.tensor([G], dtype=torch.float32)
    for fast, want in ((True, sf_fast), (False, sf_exact)):
        packed, scales = R.nvfp4_quantize(y, gs, fast)
        # row 0, block k sits at offset k (m = 0), so scales[0, :4] are blocks 0..3
        assert scales[0, :4].tolist() == [want, 0, 0, 0], (fast, hex(scales[0, 0].item()))
        assert int(scales.reshape(-1).count_nonzero()) == (1 if want else 0)
        assert block_scale_oracle(amax, G, fast)[0] == want  # the oracle agrees with the hand value


def test_sf_zero_encode_scale_fast_vs_exact():
    # amax = 2^-12 with G = 1: SF byte 0 in both modes. Fast mode (production FlashInfer 0.7.4) then uses
    # encode scale 0, so every code is zero (0x8 for a negative value: -x * 0 = -0.0); exact mode checks
    # amax != 0 and uses min(1 / (0 * 1), FLT_MAX) = FLT_MAX, so non-zero values saturate to +-6.
    y = torch.zeros(1, 64)
    y[0, 0], y[0, 1], y[0, 2] = 2.0 ** -12, -(2.0 ** -12), 2.0 ** -14
    y = y.to(torch.bfloat16)
    gs = torch.tensor([1.0])
    pf, sf_ = R.nvfp4_quantize(y, gs, True)
    pe, se = R.nvfp4_quantize(y, gs, False)
    assert sf_[0, 0].item() == 0 and se[0, 0].item() == 0
    assert pf[0, :2].tolist() == [0x80, 0x00]   # codes 0, 8 | 0, 0
    assert pe[0, :2].tolist() == [0xF7, 0x07]   # codes 7, F | 7, 0 (the zero stays 0)
    assert pf[0, 2:].count_nonzero() == 0 and pe[0, 2:].count_nonzero() == 0


def test_nan_and_inf_blocks():
    # amax ignores NaN; an all-NaN block has amax NaN -> SF 0x7F and codes 0x7.
    y = torch.zeros(1, 64)
    y[0, 0:16] = float("nan")
    y[0, 16], y[0, 17], y[0, 18] = float("nan"), 3.0, -1.5     # block 1: amax 3
    y[0, 32], y[0, 33] = float("inf"), 1.0                     # block 2: amax inf -> SF 448
    y = y.to(torch.bfloat16)
    G = 2.0
    for fast in (True, False):
        packed, scales = R.nvfp4_quantize(y, torch.tensor([G]), fast)
        sf = scales[0, :4].tolist()
        assert sf[0] == 0x7F
        assert sf[1] == block_scale_oracle(3.0, G, fast)[0] == 0x38  # 2 * 3 / 6 = 1.0
        assert sf[2] == 0x7E and sf[3] == 0
        assert packed[0, :8].tolist() == [0x77] * 8  # all-NaN block
        # block 1: o = 1 / (1.0 * (1 / 2)) = 2: NaN -> 7, 3.0 * 2 = 6 -> 7; -1.5 * 2 = -3 -> 0xD, 0 -> 0
        assert packed[0, 8:10].tolist() == [0x77, 0x0D]
        # block 2: inf -> 7; 1.0 * (1 / (448 / 2)) ~ 0.0045 -> 0
        assert packed[0, 16].item() == 0x07


def test_block_scales_match_oracle_random():
    g = torch.Generator().manual_seed(3)
    # blocks with amax spread over many binades so that subnormal, normal and saturated SFs all occur
    binade = torch.exp2(torch.randint(-14, 8, (8, 16, 1), generator=g).float())
    y = torch.randn(8, 256, generator=g) * binade.repeat_interleave(16, 1).reshape(8, 256)
    y = y.to(torch.bfloat16)
    for G in (1.0, 100.0, 336.0):
        for fast in (True, False):
            want = nvfp4_quantize_oracle(y, G, fast)
            got = R.nvfp4_quantize(y, torch.tensor([G]), fast)
            assert torch.equal(got[1], want[1]), (G, fast)
            assert torch.equal(got[0], want[0]), (G, fast)


# ---------------------------------------------------------------------------------------------------
# docs/numerics.md, worked examples 1 and 2 (the numbers printed there)
# ---------------------------------------------------------------------------------------------------

DOC_BLOCK = [1.5, -1.0, 0.625, 0.25, -0.125, 0.75, 1.25, -0.5, 0.0, 0.375, -1.5, 0.875, 1.0, -0.0625, 0.5, -0.25]


def _packed_codes(packed_row):
    return [c for b in packed_row.tolist() for c in (b & 0xF, b >> 4)]


@pytest.mark.parametrize("fast,sf,o,codes,packed", [
    (True, 0x5C, 4.166667, [0x7, 0xE, 0x5, 0x2, 0x9, 0x5, 0x7, 0xC, 0x0, 0x3, 0xF, 0x6, 0x6, 0x9, 0x4, 0xA],
     [0xE7, 0x25, 0x59, 0xC7, 0x30, 0x6F, 0x96, 0xA4]),
    (False, 0x5D, 3.846154, [0x7, 0xE, 0x4, 0x2, 0x9, 0x5, 0x6, 0xC, 0x0, 0x3, 0xF, 0x5, 0x6, 0x8, 0x4, 0xA],
     [0xE7, 0x24, 0x59, 0xC6, 0x30, 0x5F, 0x86, 0xA4]),
])
def test_docs_example_1(fast, sf, o, codes, packed):
    y = torch.zeros(1, 64)
    y[0, :16] = torch.tensor(DOC_BLOCK)
    y = y.to(torch.bfloat16)
    p, s = R.nvfp4_quantize(y, torch.tensor([100.0]), fast)
    assert s[0, 0].item() == sf
    assert p[0, :8].tolist() == packed and _packed_codes(p[0, :8]) == codes
    assert block_scale_oracle(1.5, 100.0, fast) == (sf, np.float32(o))
    # the codes are the nearest E2M1 values of v * o (the oracle from the printed o)
    from helpers.oracles import e2m1_code_oracle
    assert [e2m1_code_oracle(float(np.float32(v) * np.float32(o))) for v in DOC_BLOCK] == codes


def test_docs_example_2():
    y = torch.zeros(1, 64)
    y[0, :3] = torch.tensor([2.0 ** -12, -(2.0 ** -12), 2.0 ** -14])
    y = y.to(torch.bfloat16)
    pf, sf = R.nvfp4_quantize(y, torch.tensor([1.0]), True)
    pe, se = R.nvfp4_quantize(y, torch.tensor([1.0]), False)
    assert sf.count_nonzero() == 0 and se.count_nonzero() == 0
    assert pf[0, :2].tolist() == [0x80, 0x00] and pe[0, :2].tolist() == [0xF7, 0x07]
