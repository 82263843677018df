"""The model of the GPU's rcp.approx.f32 (qwen_resnorm_fp4/rcp_approx.py): the table's shape and the rules
that tie the exponent ranges together. The GPU comparison is in tests/ops/test_gpu_fp8.py."""

import pytest
import torch

from qwen_resnorm_fp4.rcp_approx import MANTISSAS, mantissa_deltas, rcp_approx_f32


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def test_table_is_one_ulp_at_most_and_mostly_exact():
    d = mantissa_deltas()
    assert d.shape == (MANTISSAS,) and set(torch.unique(d).tolist()) <= {-1, 0, 1}
    assert 0.5 < float((d == 0).float().mean()) < 1.0  # a table of a faithful reciprocal, not of a constant


def test_normal_range_is_exponent_independent():
    g = torch.Generator().manual_seed(0)
    m = torch.randint(0, MANTISSAS, (4096,), generator=g, dtype=torch.int32)
    base = ((127 << 23) | m).view(torch.float32)
    r = rcp_approx_f32(base)
    for shift in (-126, -60, -1, 1, 60, 125):  # s * 2^shift stays in exponents 1..252
        scaled = rcp_approx_f32(base * 2.0 ** shift)
        assert torch.equal(_bits(scaled), _bits(r * 2.0 ** -shift))


def test_within_one_ulp_of_the_correctly_rounded_reciprocal():
    g = torch.Generator().manual_seed(1)
    s = torch.empty(100_000).uniform_(1e-6, 1e6, generator=g)
    diff = _bits(rcp_approx_f32(s)).long() - _bits(1 / s).long()
    assert int(diff.abs().max()) <= 1


def test_ranges_beyond_the_table():
    big = torch.tensor([2.0 ** 126, 3.0e38, torch.finfo(torch.float32).max])
    assert torch.equal(_bits(rcp_approx_f32(big)), _bits(0.25 * rcp_approx_f32(big * 0.25)))
    tiny = torch.tensor([1e-45, 1e-40, 2.0 ** -127])
    r = rcp_approx_f32(tiny)
    assert torch.isinf(r[:2]).all()
    assert _bits(r[2:]).item() == _bits(4.0 * rcp_approx_f32(torch.tensor([2.0 ** -125]))).item()


def test_refuses_what_is_not_a_positive_finite_float32():
    with pytest.raises(ValueError):
        rcp_approx_f32(torch.tensor([0.0]))
    with pytest.raises(ValueError):
        rcp_approx_f32(torch.tensor([float("inf")]))
    with pytest.raises(TypeError):
        rcp_approx_f32(torch.tensor([1.0], dtype=torch.float64))


def test_a_scale_where_div_full_is_not_correctly_rounded():
    # 0.4754464328289032 is one of the scales; the GPU's reciprocal is one ulp above RN(1/s) there
    s = torch.tensor([0.4754464328289032])
    assert rcp_approx_f32(s).view(torch.int32).item() == (1 / s).view(torch.int32).item() + 1
