"""The CPU model of the GPU's rcp.approx.f32 (qwen_resnorm_fp4/rcp_approx.py): the table's shape and the
rules that tie the exponent ranges together. The GPU comparison is in tests/test_gpu_fp8.py."""

import numpy as np
import pytest
import torch

from qwen_resnorm_fp4.rcp_approx import MANTISSAS, mantissa_deltas, rcp_approx_f32, rcp_approx_f32_numpy


def test_table_is_one_ulp_at_most_and_mostly_exact():
    d = mantissa_deltas()
    assert d.shape == (MANTISSAS,) and set(np.unique(d).tolist()) <= {-1, 0, 1}
    assert 0.5 < float((d == 0).mean()) < 1.0  # a table of a faithful reciprocal, not of a constant


def test_normal_range_is_exponent_independent():
    rng = np.random.default_rng(0)
    m = rng.integers(0, MANTISSAS, 4096, dtype=np.uint32)
    base = ((127 << 23) | m).astype(np.uint32).view(np.float32)
    r = rcp_approx_f32_numpy(base)
    for shift in (-126, -60, -1, 1, 60, 125):  # s * 2^shift stays in exponents 1..252
        scaled = rcp_approx_f32_numpy((base * np.float32(2.0) ** shift).astype(np.float32))
        assert np.array_equal(scaled, (r * np.float32(2.0) ** -shift).astype(np.float32))


def test_within_one_ulp_of_the_correctly_rounded_reciprocal():
    rng = np.random.default_rng(1)
    s = rng.uniform(1e-6, 1e6, 100_000).astype(np.float32)
    diff = rcp_approx_f32_numpy(s).view(np.int32).astype(np.int64) - (np.float32(1) / s).view(np.int32)
    assert np.abs(diff).max() <= 1


def test_ranges_beyond_the_table():
    big = np.array([2.0 ** 126, 3.0e38, np.finfo(np.float32).max], dtype=np.float32)
    r = rcp_approx_f32_numpy(big)
    assert np.array_equal(r, (np.float32(0.25) * rcp_approx_f32_numpy(big * np.float32(0.25))).astype(np.float32))
    tiny = np.array([1e-45, 1e-40, 2.0 ** -127], dtype=np.float32)
    r = rcp_approx_f32_numpy(tiny)
    assert np.isinf(r[:2]).all() and r[2] == np.float32(4.0) * rcp_approx_f32_numpy(np.float32(2.0 ** -125) * np.ones(1, np.float32))[0]


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
