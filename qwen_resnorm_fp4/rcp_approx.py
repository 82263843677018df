"""The GPU's ``rcp.approx.f32`` reproduced bit for bit in torch, from a table measured on the GPU.

``div.full.f32(1, s)``, the fp32 ``1/s`` of SGLang's fused FP8 kernel and of Triton (and so the FP8 ops'
inverse input scale, reference.fp8_inverse_scale), equals ``rcp.approx.f32(s)`` for every positive finite
fp32 ``s`` (checked on an H200 over all 2^31 of them with tools/rcp_approx_probe.cu). That reciprocal is not
correctly rounded: for 13% of mantissas it is one ulp above or below ``RN(1/s)``. The rules, each checked over
every ``s`` of its range by the probe:

- s normal with biased exponent 1 .. 252: ``RN(1/s) + delta[m]`` ulps, where ``m`` is the 23-bit mantissa
  of ``s`` and ``delta[m]`` in {-1, 0, +1} does not depend on the exponent;
- exponent 253 or 254 (s >= 2^126, so 1/s is subnormal): ``RN(0.25 * rcp(0.25 * s))``;
- s subnormal (exponent 0): ``4 * rcp(4 * s)``, applied until the argument is normal (exact, or inf on
  overflow).

The table (qwen_resnorm_fp4/data/rcp_approx_f32.xz) holds ``delta``: an LZMA stream of a little-endian bit
map of the 2^23 mantissas whose delta is non-zero, then, for those in mantissa order, a bit map of which are
+1. tools/rcp_approx_table.py writes it from the probe's output.
"""

from __future__ import annotations

import functools
import lzma
from typing import Union
from pathlib import Path

import torch

Tensor = torch.Tensor

TABLE_PATH = Path(__file__).parent / "data" / "rcp_approx_f32.xz"
MANTISSAS = 1 << 23
_MANTISSA_MASK = MANTISSAS - 1


def _unpack_bits_little(raw: Tensor, count: int) -> Tensor:
    """The first ``count`` bits of uint8 ``raw``, least significant bit of each byte first (bool)."""
    bits = (raw.to(torch.int32).unsqueeze(-1) >> torch.arange(8, dtype=torch.int32)) & 1
    return bits.reshape(-1)[:count].bool()


@functools.lru_cache(maxsize=1)
def _cpu_deltas() -> Tensor:
    raw = torch.frombuffer(bytearray(lzma.decompress(TABLE_PATH.read_bytes())), dtype=torch.uint8)
    nonzero = _unpack_bits_little(raw[: MANTISSAS // 8], MANTISSAS)
    count = int(nonzero.sum())
    plus = _unpack_bits_little(raw[MANTISSAS // 8:], count)
    delta = torch.zeros(MANTISSAS, dtype=torch.int8)
    delta[nonzero] = torch.where(plus, 1, -1).to(torch.int8)
    return delta


@functools.lru_cache(maxsize=8)
def _deltas_on(device: torch.device) -> Tensor:
    return _cpu_deltas().to(device)


def mantissa_deltas(device: Union[str, torch.device] = "cpu") -> Tensor:
    """int8 [2^23] on ``device``: ``rcp.approx.f32(s) - RN(1/s)`` in ulps for a normal ``s`` of each
    mantissa (read once)."""
    return _deltas_on(torch.device(device))


def _exponent(s: Tensor) -> Tensor:
    return (s.view(torch.int32) >> 23) & 0xFF


def _rcp_normal(s: Tensor) -> Tensor:
    """rcp.approx.f32 of normal positive fp32 values with biased exponent 1 .. 252."""
    bits = s.view(torch.int32)
    nearest = torch.ones_like(s) / s  # IEEE division: RN(1/s)
    delta = mantissa_deltas(s.device)[(bits & _MANTISSA_MASK).long()].to(torch.int32)
    return (nearest.view(torch.int32) + delta).view(torch.float32)


def rcp_approx_f32(s: Tensor) -> Tensor:
    """rcp.approx.f32 (= div.full.f32(1, s)) of a positive finite float32 tensor, on its device, same shape.
    TypeError for another dtype, ValueError for a non-positive or non-finite value."""
    if not isinstance(s, Tensor) or s.dtype != torch.float32:
        raise TypeError("rcp_approx_f32: s must be a float32 tensor")
    if not bool((torch.isfinite(s) & (s > 0)).all()):
        raise ValueError("rcp_approx_f32: the values must be positive and finite")
    s = s.contiguous()
    exponent = _exponent(s)
    quarter, four = torch.tensor(0.25, device=s.device), torch.tensor(4.0, device=s.device)
    big = exponent >= 253
    # Subnormal s: scaled by 4 until normal (at most 12 times), the reciprocal then scaled back by a power of 2.
    t, factor = s, torch.ones_like(s)
    for _ in range(12):
        sub = _exponent(t) == 0
        t = torch.where(sub, t * four, t)
        factor = torch.where(sub, factor * four, factor)
    t = torch.where(big, t * quarter, t)  # exact: s >= 2^126
    r = _rcp_normal(t)
    return torch.where(big, r * quarter, factor * r)


__all__ = ["rcp_approx_f32", "mantissa_deltas", "MANTISSAS", "TABLE_PATH"]
