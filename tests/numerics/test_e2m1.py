"""E2M1 (FP4) codes of the reference against the contract and an independent brute force."""

import math

import pytest
import torch

from helpers.oracles import E2M1_MAGNITUDES, e2m1_code_oracle, e2m1_codes_oracle
from qwen_resnorm_fp4 import reference as R

INF = float("inf")


def codes(values):
    return R.e2m1_code(torch.tensor(values, dtype=torch.float32)).tolist()


# (value, expected code) written out from the contract: ties go to the even code.
TIES = [
    (0.25, 0x0),  # between 0 (code 0) and 0.5 (code 1): even -> 0
    (0.75, 0x2),  # between 0.5 (1) and 1.0 (2) -> 2
    (1.25, 0x2),  # between 1.0 (2) and 1.5 (3) -> 2
    (1.75, 0x4),  # between 1.5 (3) and 2.0 (4) -> 4
    (2.5, 0x4),   # between 2.0 (4) and 3.0 (5) -> 4
    (3.5, 0x6),   # between 3.0 (5) and 4.0 (6) -> 6
    (5.0, 0x6),   # between 4.0 (6) and 6.0 (7) -> 6
]


@pytest.mark.parametrize("value,code", TIES)
def test_ties_to_even(value, code):
    assert codes([value]) == [code]
    assert codes([-value]) == [code | 0x8]
    assert e2m1_code_oracle(value) == code  # the oracle agrees with the hand table


@pytest.mark.parametrize("value,code", TIES)
def test_just_around_each_boundary(value, code):
    v = torch.tensor([value], dtype=torch.float32)
    above = torch.nextafter(v, torch.tensor([INF])).item()
    below = torch.nextafter(v, torch.tensor([-INF])).item()
    lower_code = [c for c in range(8) if E2M1_MAGNITUDES[c] < value][-1]
    upper_code = lower_code + 1
    assert codes([below]) == [lower_code]
    assert codes([above]) == [upper_code]
    assert codes([-below]) == [lower_code | 0x8]
    assert codes([-above]) == [upper_code | 0x8]


def test_exact_magnitudes_and_round_trip():
    # every code 0..15 decodes to its value and that value encodes back to the code
    all_codes = torch.arange(16, dtype=torch.uint8)
    vals = R.e2m1_value(all_codes)
    expected = [m for m in E2M1_MAGNITUDES] + [-m for m in E2M1_MAGNITUDES]
    assert vals.tolist() == expected
    assert torch.signbit(vals[8]).item()  # code 8 is -0.0
    assert torch.equal(R.e2m1_code(vals), all_codes)


def test_saturation():
    assert codes([6.0, 6.5, 7.0, 100.0, 3.4e38, INF]) == [0x7] * 6
    assert codes([-6.0, -6.5, -7.0, -100.0, -3.4e38, -INF]) == [0xF] * 6


def test_nan_gives_plus_six():
    nan = torch.tensor([float("nan"), -float("nan")], dtype=torch.float32)
    assert torch.isnan(nan).all() and torch.signbit(nan[1])
    assert R.e2m1_code(nan).tolist() == [0x7, 0x7]


def test_negative_zero_keeps_sign():
    tiny = torch.nextafter(torch.tensor(0.0), torch.tensor(1.0)).item()  # smallest subnormal
    assert codes([-0.0, -0.1, -0.25, -tiny]) == [0x8] * 4
    assert codes([0.0, 0.1, 0.25, tiny]) == [0x0] * 4


def test_against_brute_force_random():
    g = torch.Generator().manual_seed(0)
    v = torch.cat([
        torch.randn(3000, generator=g) * 3,
        (torch.rand(2000, generator=g) - 0.5) * 16,
        torch.randn(500, generator=g) * 1e-3,
    ]).float()
    assert torch.equal(R.e2m1_code(v), e2m1_codes_oracle(v))


def test_against_brute_force_boundary_neighbourhoods():
    # every boundary, tie, magnitude and a few ulps either side, both signs
    pts = sorted({b for b, _ in TIES} | set(E2M1_MAGNITUDES) | {6.0})
    v = torch.tensor(pts, dtype=torch.float32)
    vals = [v]
    up, down = v.clone(), v.clone()
    for _ in range(3):
        up = torch.nextafter(up, torch.full_like(up, INF))
        down = torch.nextafter(down, torch.full_like(down, -INF))
        vals += [up, down]
    v = torch.cat(vals)
    v = torch.cat([v, -v])
    assert torch.equal(R.e2m1_code(v), e2m1_codes_oracle(v))


def test_bf16_grid_exhaustive():
    # every finite bf16 value with |v| < 8 (all of the interesting range) against the brute force
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    v = bits.view(torch.bfloat16).float()
    v = v[torch.isfinite(v) & (v.abs() < 8)]
    assert v.numel() > 30000
    assert torch.equal(R.e2m1_code(v), e2m1_codes_oracle(v))


def test_code_dtype_and_shape():
    v = torch.zeros(3, 5, 16)
    c = R.e2m1_code(v)
    assert c.dtype == torch.uint8 and c.shape == v.shape
    assert math.isclose(R.e2m1_value(torch.tensor([0x7], dtype=torch.uint8)).item(), 6.0)
