"""The y tolerance of the GPU tests (helpers.reliability.Y_ULPS_BOUND), checked on step 7 alone.

The GPU's and the reference's n = bf16(...) may differ by one bf16 ulp (docs/numerics.md). This checks
what that does to y = bf16(fma(n, 1 + scale, shift)), computed with the reference's own fp32 fma and bf16
rounding, for n and its bf16 neighbour: the difference, in y_ulps's measure, exceeds 2 ulps (so a bound
of 2 is too tight for the arithmetic itself) and never exceeds Y_ULPS_BOUND. CPU only, fixed seed.
"""

from __future__ import annotations

import torch

from qwen_resnorm_fp4.reference import bf16_round, fma_fp32
from helpers.reliability import Y_ULPS_BOUND, y_ulps


def _step7_with_neighbour(n: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor):
    """y for n and for n one bf16 ulp away (up or down at random), same scale and shift."""
    g = torch.Generator().manual_seed(7)
    step = torch.where(torch.rand(n.shape, generator=g) < 0.5, 1, -1).to(torch.int16)
    n2 = (n.view(torch.int16) + step).view(torch.bfloat16)
    keep = torch.isfinite(n2.float()) & (n2.float() != 0)
    y = lambda v: bf16_round(fma_fp32(v.float(), 1.0 + scale, shift.float()))  # noqa: E731
    return y(n)[keep], y(n2)[keep], shift[keep]


def _worst_ulps(fp32_scale: bool, aim_at_binade_edges: bool, samples: int = 1 << 21) -> float:
    g = torch.Generator().manual_seed(1234 + 2 * fp32_scale + aim_at_binade_edges)
    n = (torch.randn(samples, generator=g) * 2).to(torch.bfloat16)
    shift = (torch.randn(samples, generator=g) * 0.5).to(torch.bfloat16)
    if aim_at_binade_edges:  # scale chosen so that y lands within 1.5% of +-2^k: where binades change
        k = torch.randint(-3, 4, (samples,), generator=g).float()
        sign = torch.where(torch.rand(samples, generator=g) < 0.5, -1.0, 1.0)
        target = sign * torch.exp2(k) * (1 + (torch.rand(samples, generator=g) - 0.5) * 0.03)
        scale = (target - shift.float()) / n.float() - 1.0
        scale = torch.where(scale.abs() < 3, scale, torch.zeros_like(scale))
    else:
        scale = torch.randn(samples, generator=g) * 0.5
    scale = scale.float() if fp32_scale else scale.to(torch.bfloat16).float()
    y, y_neighbour, sh = _step7_with_neighbour(n, scale, shift)
    return y_ulps(y_neighbour, y, sh).max().item()


def test_one_ulp_of_n_moves_y_by_more_than_2_and_at_most_the_bound():
    worst = max(_worst_ulps(fp32, edges) for fp32 in (False, True) for edges in (False, True))
    assert worst > 2.0, f"worst {worst}: expected step 7 alone to exceed 2 ulps"
    assert worst <= Y_ULPS_BOUND, f"worst {worst} ulps > Y_ULPS_BOUND = {Y_ULPS_BOUND}"
