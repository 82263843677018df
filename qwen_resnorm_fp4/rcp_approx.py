"""The GPU's ``rcp.approx.f32`` reproduced bit for bit on the CPU, from a table measured on the GPU.

``div.full.f32(1, s)``, the fp32 ``1/s`` of SGLang's fused FP8 kernel and of Triton, equals
``rcp.approx.f32(s)`` for every positive finite fp32 ``s`` (checked on an H200 over all 2^31 of them with
tools/rcp_approx_probe.cu). That reciprocal is not correctly rounded: for 13% of mantissas it is one ulp
above or below ``RN(1/s)``. The rules, each checked over every ``s`` of its range by the probe:

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
from pathlib import Path

import numpy as np
import torch

Tensor = torch.Tensor

TABLE_PATH = Path(__file__).parent / "data" / "rcp_approx_f32.xz"
MANTISSAS = 1 << 23


@functools.lru_cache(maxsize=1)
def mantissa_deltas() -> np.ndarray:
    """int8 [2^23]: ``rcp.approx.f32(s) - RN(1/s)`` in ulps for a normal ``s`` of each mantissa."""
    raw = np.frombuffer(lzma.decompress(TABLE_PATH.read_bytes()), dtype=np.uint8)
    nonzero = np.unpackbits(raw[: MANTISSAS // 8], bitorder="little").astype(bool)
    count = int(nonzero.sum())
    plus = np.unpackbits(raw[MANTISSAS // 8:], count=count, bitorder="little").astype(bool)
    delta = np.zeros(MANTISSAS, dtype=np.int8)
    delta[nonzero] = np.where(plus, 1, -1)
    return delta


def _rcp_normal(s: np.ndarray) -> np.ndarray:
    """rcp.approx.f32 of normal positive fp32 values with biased exponent 1 .. 252."""
    bits = s.view(np.uint32)
    nearest = (np.float32(1.0) / s).astype(np.float32)  # IEEE division: RN(1/s)
    delta = mantissa_deltas()[bits & (MANTISSAS - 1)].astype(np.int64)
    return (nearest.view(np.uint32).astype(np.int64) + delta).astype(np.uint32).view(np.float32)


def rcp_approx_f32_numpy(s: np.ndarray) -> np.ndarray:
    """rcp.approx.f32 of positive finite fp32 values (numpy float32 in, float32 out, same shape)."""
    s = np.ascontiguousarray(s, dtype=np.float32)
    if not (np.isfinite(s).all() and (s > 0).all()):
        raise ValueError("rcp_approx_f32: the values must be positive and finite")
    exponent = (s.view(np.uint32) >> 23) & 0xFF
    out = np.empty_like(s)
    normal = (exponent >= 1) & (exponent <= 252)
    out[normal] = _rcp_normal(s[normal])
    big = exponent >= 253
    if big.any():
        out[big] = (np.float32(0.25) * _rcp_normal(np.float32(0.25) * s[big])).astype(np.float32)
    tiny = exponent == 0
    if tiny.any():
        t, factor = s[tiny], np.ones(int(tiny.sum()), dtype=np.float32)
        while True:
            sub = ((t.view(np.uint32) >> 23) & 0xFF) == 0
            if not sub.any():
                break
            t = np.where(sub, t * np.float32(4.0), t).astype(np.float32)
            factor = np.where(sub, factor * np.float32(4.0), factor).astype(np.float32)
        with np.errstate(over="ignore"):
            out[tiny] = (factor * _rcp_normal(t)).astype(np.float32)  # a power of two: exact, or inf
    return out


def rcp_approx_f32(s: Tensor) -> Tensor:
    """rcp.approx.f32 (= div.full.f32(1, s)) of a positive finite fp32 tensor, computed on the CPU; the
    result is on ``s``'s device. ValueError for a non-positive or non-finite value."""
    if not isinstance(s, Tensor) or s.dtype != torch.float32:
        raise TypeError("rcp_approx_f32: s must be a float32 tensor")
    values = rcp_approx_f32_numpy(s.detach().cpu().numpy())
    return torch.from_numpy(values).to(s.device)


__all__ = ["rcp_approx_f32", "rcp_approx_f32_numpy", "mantissa_deltas", "TABLE_PATH"]
