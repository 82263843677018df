"""Independent oracles of the numerics contract (docs/numerics.md).

Written from the contract, not from ``qwen_resnorm_fp4.reference``: they use float64, ``fractions.Fraction``,
numpy float32 scalar arithmetic and explicit tables, so that a test comparing the reference (or a GPU kernel)
with them checks something.

- ``e2m1_code_oracle(v)``, ``e2m1_codes_oracle(tensor)``: E2M1 code by brute force (nearest of 8 magnitudes).
- ``e4m3_table()``, ``e4m3_byte_oracle(tensor)``: all finite E4M3 values decoded by formula; nearest-even encode.
- ``round_fraction_to_fp32(fr)``, ``fma_oracle(a, b, c)``: exact (single rounding) fp32 arithmetic.
- ``sf_offsets_by_permute(M, D)``: the 128x4 scale layout built by reshape/permute (no offset formula).
- ``round_up(n, m)``: the library's own (qwen_resnorm_fp4.layout), checked against its definition
  (tests/numerics/test_layout.py).
- ``nvfp4_quantize_oracle(y, G, fast)``: the whole step-8 recipe with numpy float32 scalars and the oracles.
- ``nvfp4_4over6_oracle(y, G, fast, mse, fp16_form)``: the same for the 4over6 recipe.
- ``modulation_rows(p, B, S, modulate_index)``, ``layer_norm_f64(inp)``: steps 1-7 in float64 (no intermediate
  roundings except where stated).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Dict, Optional, Sequence

import numpy as np
import torch

from qwen_resnorm_fp4.layout import round_up  # noqa: F401 - the tests' one round_up (test_layout.py checks it)

# ----------------------------------------------------------------------------------------------------
# E2M1
# ----------------------------------------------------------------------------------------------------

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # by code 0..7 (contract), bit 3 = sign


def e2m1_code_oracle(v: float) -> int:
    """E2M1 code of a float by brute force: the nearest of the 8 magnitudes (float64 distances), a tie
    going to the even code; |v| > 6 (and inf) saturates to 6; NaN -> 0x7; the sign bit (0x8) is the
    float's sign bit, so -0.0 and negatives that round to zero give 0x8."""
    v = float(v)
    if math.isnan(v):
        return 0x7
    sign = 0x8 if math.copysign(1.0, v) < 0 else 0
    a = abs(v)
    if a > 6.0:
        return sign | 0x7
    best = min(range(8), key=lambda c: (abs(a - E2M1_MAGNITUDES[c]), c % 2))
    return sign | best


def e2m1_codes_oracle(t: torch.Tensor) -> torch.Tensor:
    """e2m1_code_oracle element-wise on a (small) tensor; returns uint8 of the same shape."""
    flat = [e2m1_code_oracle(v) for v in t.double().reshape(-1).tolist()]
    return torch.tensor(flat, dtype=torch.uint8).reshape(t.shape)


# ----------------------------------------------------------------------------------------------------
# E4M3 (fn: no infinities, 0x7F/0xFF NaN, max 448)
# ----------------------------------------------------------------------------------------------------


def e4m3_decode_formula(byte: int) -> float:
    """Value of an E4M3 byte by the formula: bias 7, 3 mantissa bits, exponent field 0 = subnormal."""
    sign = -1.0 if byte & 0x80 else 1.0
    e = (byte >> 3) & 0xF
    m = byte & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    mag = m * 2.0 ** -9 if e == 0 else 2.0 ** (e - 7) * (1.0 + m / 8.0)
    return sign * mag


def e4m3_table() -> np.ndarray:
    """float64 values of bytes 0x00..0x7E (all finite non-negative E4M3 values, increasing)."""
    return np.array([e4m3_decode_formula(b) for b in range(0x7F)], dtype=np.float64)


_E4M3 = e4m3_table()


def e4m3_byte_oracle(t) -> np.ndarray:
    """fp32 values -> E4M3 bytes: nearest, ties to the even byte, |v| >= 448 (and inf) -> 448 (satfinite),
    NaN -> 0x7F, sign bit from the float's sign (so -tiny -> 0x80). Accepts a tensor or an array."""
    v = np.asarray(t.double().numpy() if isinstance(t, torch.Tensor) else t, dtype=np.float64).reshape(-1)
    out = np.zeros(v.shape, dtype=np.uint8)
    for i, x in enumerate(v):
        if math.isnan(x):
            out[i] = 0x7F
            continue
        sign = 0x80 if math.copysign(1.0, x) < 0 else 0
        a = abs(x)
        if a >= 448.0:
            out[i] = sign | 0x7E
            continue
        j = int(np.searchsorted(_E4M3, a))  # _E4M3[j-1] < a <= _E4M3[j]
        cands = [c for c in (j - 1, j) if 0 <= c < 0x7F]
        best = min(cands, key=lambda c: (abs(a - _E4M3[c]), c % 2))
        out[i] = sign | best
    return out.reshape(np.shape(t))


# ----------------------------------------------------------------------------------------------------
# Exact fp32 arithmetic
# ----------------------------------------------------------------------------------------------------

FLT_MAX = float(np.finfo(np.float32).max)


def round_fraction_to_fp32(x: Fraction) -> float:
    """Correctly rounded (nearest, ties to even) fp32 value of an exact rational, as a Python float.
    Subnormals included; overflow gives +-inf. An exact zero gives +0.0."""
    if x == 0:
        return 0.0
    sign = -1.0 if x < 0 else 1.0
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2^e <= a < 2^(e+2)
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    e = max(e, -126)
    ulp = Fraction(2) ** (e - 23)
    q = a / ulp
    n = q.numerator // q.denominator
    rem = q - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1):
        n += 1
    val = n * ulp
    if val >= Fraction(2) ** 128:
        return sign * math.inf
    return sign * float(val)


def fma_oracle(a: float, b: float, c: float) -> float:
    """fp32 fused multiply-add round32(a*b + c) with one rounding, via exact rationals (finite inputs)."""
    return round_fraction_to_fp32(Fraction(a) * Fraction(b) + Fraction(c))


def f32(v) -> np.float32:
    return np.float32(v)


# ----------------------------------------------------------------------------------------------------
# 128x4 layout
# ----------------------------------------------------------------------------------------------------


def sf_offsets_by_permute(M: int, D: int) -> torch.Tensor:
    """int64 [round_up(M, 128), D/16]: storage offset of logical scale (m, k), built without the offset
    formula: the storage order is the logical [m, k] matrix viewed as
    [numMTiles, 4 (m%128)//32, 32 m%32, numKTiles, 4 k%4] and permuted to
    [numMTiles, numKTiles, 32, 4, 4]; offsets are the inverse of that permutation."""
    K = D // 16
    Mp = round_up(M, 128)
    n = Mp * K
    logical = torch.arange(n).reshape(Mp // 128, 4, 32, K // 4, 4)
    storage = logical.permute(0, 3, 2, 1, 4).reshape(-1)  # storage position p holds logical index storage[p]
    offsets = torch.empty(n, dtype=torch.int64)
    offsets[storage] = torch.arange(n)
    return offsets.reshape(Mp, K)


# ----------------------------------------------------------------------------------------------------
# Step 8 oracle
# ----------------------------------------------------------------------------------------------------


def block_scale_oracle(amax: float, G: float, fast: bool):
    """(SF byte, encode scale o as np.float32) for one block, the contract's step 8 with IEEE fp32
    arithmetic (numpy float32 scalars; fast mode with the IEEE reciprocal, as on CPU)."""
    amax, G = f32(amax), f32(G)
    one, six = f32(1.0), f32(6.0)
    with np.errstate(all="ignore"):
        if fast:
            rcp = lambda v: one / v  # noqa: E731
            sf = int(e4m3_byte_oracle(np.array([G * (amax * rcp(six))]))[0])
            sf_val = f32(e4m3_decode_formula(sf))
            o = rcp(sf_val * rcp(G)) if sf != 0 else f32(0.0)
        else:
            if amax != 0:  # NaN != 0 is true
                sf = int(e4m3_byte_oracle(np.array([amax * (G * (one / six))]))[0])
            else:
                sf = 0
            sf_val = f32(e4m3_decode_formula(sf))
            o = np.fmin(one / (sf_val * (one / G)), f32(FLT_MAX)) if amax != 0 else f32(0.0)
    return sf, f32(o)


def block_amax_oracle(block: Sequence[float]) -> float:
    """max |v| ignoring NaN; NaN only when every element is NaN."""
    vals = [abs(v) for v in block if not math.isnan(v)]
    return max(vals) if vals else math.nan


def _quantize_rows_oracle(y: torch.Tensor, block_oracle):
    """Step 8 on a small y [..., D] (pure Python loops), block_oracle(block) -> (SF byte, 16 codes) per block:
    returns (packed [M, D/2] uint8, scales [round_up(M,128), D/16] uint8) with the scale layout from
    sf_offsets_by_permute."""
    D = y.shape[-1]
    rows = y.reshape(-1, D).float().tolist()
    M, K = len(rows), D // 16
    packed = torch.zeros(M, D // 2, dtype=torch.uint8)
    logical = torch.zeros(round_up(M, 128), K, dtype=torch.uint8)
    with np.errstate(all="ignore"):
        for m, row in enumerate(rows):
            codes = []
            for k in range(K):
                sf, block_codes = block_oracle(row[16 * k:16 * k + 16])
                logical[m, k] = sf
                codes += block_codes
            packed[m] = torch.tensor([codes[2 * i] | (codes[2 * i + 1] << 4) for i in range(D // 2)], dtype=torch.uint8)
    storage = torch.zeros(logical.numel(), dtype=torch.uint8)
    storage[sf_offsets_by_permute(M, D).reshape(-1)] = logical.reshape(-1)
    return packed, storage.reshape(logical.shape)


def nvfp4_quantize_oracle(y: torch.Tensor, G: float, fast: bool):
    """Independent step 8 on a small y [..., D] (:func:`_quantize_rows_oracle`)."""
    def block_oracle(block):
        sf, o = block_scale_oracle(block_amax_oracle(block), G, fast)
        return sf, [e2m1_code_oracle(float(f32(v) * o)) for v in block]

    return _quantize_rows_oracle(y, block_oracle)


def block_4over6_oracle(block: Sequence[float], G: float, fast: bool, mse: bool, fp16_form: bool):
    """(SF byte, 16 codes) of one block by the 4over6 recipe (docs/numerics.md), numpy float32 scalars (fast
    mode with the IEEE reciprocal, as on CPU): candidates amax -> 6 and amax -> 4 (1.5 x the first scale),
    each decoded and compared with the block, the error summed per half-block in order, then the halves
    added; candidate 4 only when its error is strictly smaller; an all-zero block gives byte 0, codes 0."""
    G, one = f32(G), f32(1.0)
    amax = f32(block_amax_oracle(block))
    if amax == 0:
        return 0, [0] * 16
    rcp = lambda v: one / v  # noqa: E731
    s6 = G * (amax * rcp(f32(6.0))) if fast else (amax / f32(6.0)) * G
    results = []
    for s in (s6 * f32(1.5), s6):
        sf = int(e4m3_byte_oracle(np.array([s], dtype=np.float64))[0])
        sv = f32(e4m3_decode_formula(sf))
        g_decode = rcp(G) if fast else one / G
        o = rcp(sv * g_decode) if fast else np.fmin(one / (sv * g_decode), f32(FLT_MAX))
        codes = [e2m1_code_oracle(float(f32(v) * o)) for v in block]
        halves = [f32(0.0), f32(0.0)]
        for i, (v, c) in enumerate(zip(block, codes)):
            value = f32(E2M1_MAGNITUDES[c & 7] * (-1.0 if c & 8 else 1.0))
            p = value * sv
            d = p - f32(v) * G if fp16_form else p * g_decode - f32(v)
            halves[i // 8] = halves[i // 8] + (d * d if mse else f32(abs(d)))
        results.append((sf, codes, halves[0] + halves[1]))
    (sf4, codes4, err4), (sf6, codes6, err6) = results
    return (sf4, codes4) if err4 < err6 else (sf6, codes6)


def nvfp4_4over6_oracle(y: torch.Tensor, G: float, fast: bool, mse: bool, fp16_form: bool):
    """Step 8 by the 4over6 recipe on a small y [..., D] (:func:`block_4over6_oracle` per block)."""
    return _quantize_rows_oracle(y, lambda block: block_4over6_oracle(block, G, fast, mse, fp16_form))


# ----------------------------------------------------------------------------------------------------
# Steps 1-7 in float64
# ----------------------------------------------------------------------------------------------------


def modulation_rows(p: torch.Tensor, B: int, S: int, modulate_index: Optional[torch.Tensor]) -> torch.Tensor:
    """float64 [B, S, D] view of a gate/scale/shift parameter, by explicit loops over (b, s)."""
    D = p.shape[-1]
    out = torch.empty(B, S, D, dtype=torch.float64)
    for b in range(B):
        for s in range(S):
            if p.dim() == 1:
                row = p
            elif p.dim() == 3:  # per token
                row = p[b, s]
            elif modulate_index is None:
                row = p[b]
            else:
                row = p[B + b] if bool(modulate_index[b, s] != 0) else p[b]
            out[b, s] = row.double()
    return out


def layer_norm_f64(inp: Dict[str, object]):
    """(y64, r) for a make_inputs dict: r = residual_out computed exactly per contract steps 1-2 (the fp64
    product/sum are exact for these magnitudes; rounded to fp32 then bf16), then LayerNorm, affine and
    modulation in float64 from r without further rounding. Shapes [B, S, D]."""
    x, res = inp["x"].double(), inp["residual"].double()
    B, S, D = x.shape
    mi = inp["modulate_index"]
    gate = modulation_rows(inp["gate"], B, S, mi)
    scale = modulation_rows(inp["scale"], B, S, mi)
    shift = modulation_rows(inp["shift"], B, S, mi)
    a = x if inp["bias"] is None else (x + inp["bias"].double()).float().bfloat16().double()
    r = (a * gate + res).float().bfloat16().double()
    mu = r.mean(-1, keepdim=True)
    var = ((r - mu) ** 2).mean(-1, keepdim=True)
    n = (r - mu) / torch.sqrt(var + inp["eps"])
    if inp["weight"] is not None:
        n = n * inp["weight"].double()
    if inp["norm_bias"] is not None:
        n = n + inp["norm_bias"].double()
    y = n * (1.0 + scale) + shift
    return y, n, scale, r
