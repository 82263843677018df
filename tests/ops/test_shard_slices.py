"""The fused path on sequence shards, on CPU (the reference): every modulation form a sharded model passes
(tests/helpers/shards.py: [D], [B, D], per token contiguous, chunk views and stride-0 expanded views,
modulate_index with its boundary inside the shard) is served, not declined, and the shard's packed bytes,
scales (through the 128x4 layout; padding rows zero) and residual_out equal the same rows of the full call,
with one static global scale (calibrated on the whole sequence). Shards of 133 and 150 rows: not multiples of
128. tests/ops/test_gpu_shard_slices.py checks the same of the CUDA kernels.
"""

from __future__ import annotations

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4.linear import FP4_AMAX_SCALE
from helpers.shards import FORMS, full_inputs, shard_inputs, shard_matches_full

#: (B, S, s0, s1): the shard is tokens s0 .. s1 - 1 of every sample.
GEOMETRIES = {"b2-second_half": (2, 150, 75, 150), "b1-middle": (1, 301, 100, 233)}


class _FC1:
    """What the fused path reads of FC1."""

    def __init__(self, cols: int, global_scale: torch.Tensor):
        self.in_features = cols
        self.input_global_scale = global_scale


def _static_global_scale(inp) -> torch.Tensor:
    """448 * 6 / amax of the full call's y: calibrated on the whole sequence, the same on every shard."""
    y, _ = q.resnorm(inp["residual"], inp["x"], None, inp["gate"], inp["scale"], inp["shift"], inp["eps"],
                     modulate_index=inp["modulate_index"])
    return (FP4_AMAX_SCALE / y.float().abs().amax()).reshape(1)


def _fused(inp, fc1):
    result = q.try_fused_resnorm_quant(inp["residual"], inp["x"], inp["gate"], inp["scale"], inp["shift"], fc1,
                                       eps=inp["eps"], modulate_index=inp["modulate_index"], allow_cpu=True,
                                       fast_math=True)
    assert result is not None, (q.last_decline_reason(), q.last_decline_detail())
    (packed, scales), residual_out, _ = result
    return packed, scales, residual_out


@pytest.mark.parametrize("D", [64, 192])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("form", FORMS)
def test_shard_equals_rows_of_full_cpu(form, geometry, D):
    B, S, s0, s1 = GEOMETRIES[geometry]
    boundary = s0 + (s1 - s0) // 3  # inside the shard
    full = full_inputs(B, S, D, form, boundary=boundary, seed=D + S)
    fc1 = _FC1(D, _static_global_scale(full))
    shard = shard_inputs(full, s0, s1)
    if form == "indexed":
        local = shard["modulate_index"]
        assert bool((local == 0).any()) and bool((local != 0).any())  # both rows in this shard
    if form == "token_stride0":
        assert shard["gate"].stride()[1] == 0
    problem = shard_matches_full(_fused(full, fc1), _fused(shard, fc1), B, S, s0, s1)
    assert problem is None, problem


def test_stride0_per_token_equals_its_copy_cpu():
    """A stride-0 per-token view gives the bytes of its contiguous copy (the rows are read where they are)."""
    full = full_inputs(2, 40, 128, "token_stride0", boundary=0, seed=3)
    fc1 = _FC1(128, _static_global_scale(full))
    copied = dict(full, **{k: full[k].contiguous() for k in ("gate", "scale", "shift")})
    for a, b in zip(_fused(full, fc1), _fused(copied, fc1)):
        assert torch.equal(a, b)
