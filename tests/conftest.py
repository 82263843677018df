"""Shared helpers for the test suite: input builders and *independent* oracles.

Everything here is written from the numerics contract (docs/numerics.md),
not from ``qwen_resnorm_fp4.reference``: the oracles use float64, ``fractions.Fraction``, numpy float32
scalar arithmetic and explicit tables, so that a test comparing the reference (or a GPU kernel) with them
checks something. GPU test files (tests/test_gpu_*.py) may import them:

    from conftest import make_inputs, op_args, nvfp4_quantize_oracle, ...

Fixtures and markers
- ``seed``: a fresh random seed per test (``QWEN_FP4_TEST_SEED=N`` fixes it); torch is seeded with it, and a
  failing test's report has a "seed" section with the command that reruns it with that seed.
- ``@pytest.mark.gpu`` (``pytestmark = pytest.mark.gpu`` for a whole file): the test needs a CUDA GPU and the
  compiled kernels; it is skipped where there is no GPU (or with QWEN_FP4_TEST_CPU_ONLY=1). A session on a GPU
  machine that cannot load the compiled kernels is refused (see the session guard at the end).
- ``@pytest.mark.blackwell``: skipped unless the GPU is a Blackwell (capability 10.x-12.x);
  ``@pytest.mark.blackwell_emulation``: skipped unless the emulation build (QWEN_FP4_EMULATE_BLACKWELL=1) is
  loaded. Both also take ``gpu``'s rule.
- ``exhaustive``: a case of an exhaustive sweep, deselected unless the run asks for the sweep (``--exhaustive``,
  ``QWEN_FP4_TEST_EXHAUSTIVE=1``, or a ``-m`` expression that names ``exhaustive``); ``sweep(...)`` below puts
  it on the parametrizations outside the representative subset. docs/testing.md lists what is behind it.

Helpers
- ``sweep(argnames, values, default)``: ``pytest.mark.parametrize`` in two tiers: ``default`` (a subset of
  ``values``) runs by default, the other values are marked ``exhaustive``.
- ``exhaustive_run()``: whether this session runs the exhaustive sweep (for settings chosen at import).
- ``HANG_GUARD_S``: the timeout of the suite's subprocesses: a guard against a hang, never a time budget.
- ``make_inputs(B, S, D, form, param_dtype, seed, ...)``: a dict of op arguments (see its docstring).
- ``op_args(inp, op)``: the positional argument tuple of ``torch.ops.qwen_fp4.<op>`` for such a dict.
- ``e2m1_code_oracle(v)``, ``e2m1_codes_oracle(tensor)``: E2M1 code by brute force (nearest of 8 magnitudes).
- ``e4m3_table()``, ``e4m3_byte_oracle(tensor)``: all finite E4M3 values decoded by formula; nearest-even encode.
- ``round_fraction_to_fp32(fr)``, ``fma_oracle(a, b, c)``: exact (single rounding) fp32 arithmetic.
- ``sf_offsets_by_permute(M, D)``: the 128x4 scale layout built by reshape/permute (no offset formula).
- ``round_up(n, m)``: the library's own (qwen_resnorm_fp4.layout), checked against its definition.
- ``nvfp4_quantize_oracle(y, G, fast)``: the whole step-8 recipe with numpy float32 scalars and the oracles.
- ``nvfp4_4over6_oracle(y, G, fast, mse, fp16_form)``: the same for the 4over6 recipe.
- ``layer_norm_f64(...)``: steps 1-7 in float64 (no intermediate roundings except where stated).
"""

from __future__ import annotations

import math
import os
import re
from fractions import Fraction
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence

import numpy as np
import pytest
import torch

from qwen_resnorm_fp4.layout import round_up  # noqa: F401 - the tests' one round_up (test_layout.py checks it)

# ----------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------

#: Modulation forms understood by make_inputs.
FORMS = ("shared", "batch", "token", "indexed_int32", "indexed_int64", "indexed_bool")


def make_inputs(
    B: int,
    S: int,
    D: int,
    form: str = "shared",
    param_dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    *,
    device: str | torch.device = "cpu",
    bias: bool = True,
    affine: bool = False,
    global_scale: float = 200.0,
    eps: float = 1e-6,
    x_std: float = 1.0,
    residual_std: float = 2.0,
    generate_on_device: bool = False,
    strided: bool = False,
) -> Dict[str, object]:
    """Random but deterministic inputs of the three ops, the test suite's one input builder
    (``reliability_utils.block_inputs`` and the GPU kernel tests call it with their own defaults).

    Generated on CPU, then moved to ``device``, so the same seed gives the same values on every device;
    ``generate_on_device=True`` draws them on ``device`` instead (fast for large GPU cases; other values).

    x, residual: bf16 [B, S, D] with standard deviations ``x_std`` and ``residual_std``. ``form`` picks the
    modulation parameters gate/scale/shift:
      "shared" -> [D]; "batch" -> [B, D]; "token" -> [B, S, D] (per token; ``strided=True``: shift, scale
      and gate are ``temb.chunk(6, dim=2)[:3]`` views of one contiguous temb [B, S, 6D], row stride 6D, the
      other three chunks random, same values as without it); "indexed_<int32|int64|bool>" -> [2B, D] plus
      modulate_index [B, S] of that dtype (about half the tokens non-zero; for the ints, non-zero
      values other than 1 appear too, since the contract says "non-zero", not "1").
    Parameters are ``param_dtype`` (bf16 or fp32). bias: [D] or None; affine: weight/norm_bias [D] or None.
    global_scale: fp32 one-element tensor [1]. Returns a dict keyed by the op's argument names.
    """
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}")
    gen_device = torch.device(device) if generate_on_device else torch.device("cpu")
    g = torch.Generator(device=gen_device).manual_seed(seed)

    def randn(*shape, std=1.0, mean=0.0):
        return torch.randn(*shape, generator=g, device=gen_device) * std + mean

    x = randn(B, S, D, std=x_std).to(torch.bfloat16)
    residual = randn(B, S, D, std=residual_std).to(torch.bfloat16)
    if strided and form != "token":
        raise ValueError("strided=True needs form='token'")
    rows = 1 if form == "shared" else (B if form == "batch" else 2 * B)
    pshape = (D,) if form == "shared" else ((B, S, D) if form == "token" else (rows, D))
    gate = randn(*pshape, std=0.5, mean=0.5).to(param_dtype)
    scale = randn(*pshape, std=0.3).to(param_dtype)
    shift = randn(*pshape, std=0.3).to(param_dtype)
    modulate_index = None
    if form.startswith("indexed"):
        idx = torch.randint(0, 2, (B, S), generator=g, device=gen_device)
        if form == "indexed_bool":
            modulate_index = idx.bool()
        else:
            idx = idx * torch.randint(1, 4, (B, S), generator=g, device=gen_device)  # non-zero values 1..3
            modulate_index = idx.to(torch.int32 if form == "indexed_int32" else torch.int64)
    inp = dict(
        residual=residual,
        x=x,
        bias=randn(D, std=0.2).to(param_dtype) if bias else None,
        gate=gate,
        scale=scale,
        shift=shift,
        global_scale=torch.tensor([global_scale], dtype=torch.float32),
        eps=eps,
        weight=randn(D, std=0.2, mean=1.0).to(param_dtype) if affine else None,
        norm_bias=randn(D, std=0.2).to(param_dtype) if affine else None,
        modulate_index=modulate_index,
    )
    out = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    if strided:  # the views are made on the target device (moving a view would copy it contiguous)
        temb = torch.cat([shift, scale, gate, randn(B, S, 3 * D).to(param_dtype)], dim=2).to(device)
        out["shift"], out["scale"], out["gate"] = temb.chunk(6, dim=2)[:3]
    return out


def op_args(inp: Dict[str, object], op: str, fast_math: bool = True) -> tuple:
    """Positional arguments of ``torch.ops.qwen_fp4.<op>`` (op: "resnorm_quant" or "resnorm") for a
    make_inputs dict (all optional arguments passed explicitly)."""
    common = (inp["residual"], inp["x"], inp["bias"], inp["gate"], inp["scale"], inp["shift"])
    tail = (inp["weight"], inp["norm_bias"], inp["modulate_index"])
    if op == "resnorm_quant":
        return common + (inp["global_scale"], float(inp["eps"]), fast_math) + tail
    if op == "resnorm":
        return common + (float(inp["eps"]),) + tail
    raise ValueError(op)


def wrapper_kwargs(inp: Dict[str, object]) -> Dict[str, object]:
    """Keyword-only arguments of the typed wrappers for a make_inputs dict."""
    return dict(weight=inp["weight"], norm_bias=inp["norm_bias"], modulate_index=inp["modulate_index"])


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


# ----------------------------------------------------------------------------------------------------
# Tiers: the default run (a representative case of every behaviour) and the exhaustive sweep
# ----------------------------------------------------------------------------------------------------

#: Set to "1" to run the exhaustive sweep, as ``--exhaustive`` does.
EXHAUSTIVE_VAR = "QWEN_FP4_TEST_EXHAUSTIVE"
EXHAUSTIVE_MARKER = "exhaustive"  # registered with its help in pyproject.toml's [tool.pytest.ini_options]
#: The timeout of every subprocess the tests start: a guard that turns a hang into a failure, not a time limit
#: (a loaded machine may take minutes where an idle one takes seconds).
HANG_GUARD_S = 1800

_EXHAUSTIVE_RUN: Optional[bool] = None  # set by pytest_configure
_DESELECTED_KEY = pytest.StashKey[int]()


def pytest_addoption(parser) -> None:
    parser.addoption("--exhaustive", action="store_true", default=False,
                     help="also run the exhaustive sweeps (tests marked 'exhaustive'; by default only the "
                          f"representative cases run). The same as {EXHAUSTIVE_VAR}=1.")


def _exhaustive_requested(config) -> bool:
    """--exhaustive, QWEN_FP4_TEST_EXHAUSTIVE=1, or a -m expression naming the marker (which then selects)."""
    if config.getoption("exhaustive", False) or os.environ.get(EXHAUSTIVE_VAR, "").strip() == "1":
        return True
    return bool(re.search(rf"\b{EXHAUSTIVE_MARKER}\b", config.getoption("markexpr", "") or ""))


def pytest_configure(config) -> None:
    global _EXHAUSTIVE_RUN
    _EXHAUSTIVE_RUN = _exhaustive_requested(config)


def exhaustive_run() -> bool:
    """Whether this session runs the exhaustive sweep (--exhaustive / QWEN_FP4_TEST_EXHAUSTIVE=1 / -m exhaustive);
    for what a test module decides at import (hypothesis' example counts). False outside a pytest session."""
    if _EXHAUSTIVE_RUN is not None:
        return _EXHAUSTIVE_RUN
    return os.environ.get(EXHAUSTIVE_VAR, "").strip() == "1"


def sweep(argnames, values: Iterable, default: Iterable, *, ids=None):
    """``pytest.mark.parametrize(argnames, values, ids=ids)`` in two tiers: the values in ``default``, the
    representative cases, run in every session; the others are marked ``exhaustive`` and run only in the
    exhaustive sweep. ``default`` must be a subset of ``values`` (checked), so the sweep always holds the
    default. With several argnames each value is a tuple of them, as for parametrize."""
    names = [n.strip() for n in argnames.split(",")] if isinstance(argnames, str) else list(argnames)
    values, default = list(values), list(default)
    missing = [d for d in default if not any(d is v or d == v for v in values)]
    if missing or not default:
        raise ValueError(f"sweep({argnames!r}): the default {default!r} must be a non-empty subset of the values "
                         f"{values!r} (missing {missing!r})")
    params = []
    for v in values:
        in_default = any(v is d or v == d for d in default)
        args = tuple(v) if len(names) > 1 else (v,)
        params.append(pytest.param(*args, marks=() if in_default else (pytest.mark.exhaustive,)))
    return pytest.mark.parametrize(argnames, params, ids=ids)


def _named_node_ids(config) -> set:
    """The node ids named on the command line (path::name[params]), relative to the rootdir like item.nodeid:
    such a test runs whatever its tier (a failure's rerun command names it)."""
    named = set()
    for arg in config.args:
        if "::" not in arg:
            continue
        path, rest = arg.split("::", 1)
        try:
            rel = Path(path).resolve().relative_to(config.rootpath).as_posix()
        except ValueError:
            rel = path
        named.add(f"{rel}::{rest}")
    return named


def _select_tier(config, items) -> None:
    """Outside the exhaustive sweep, deselect the tests marked exhaustive (unless named on the command line)."""
    if _exhaustive_requested(config):
        return
    named = _named_node_ids(config)
    kept, dropped = [], []
    for item in items:
        (dropped if item.get_closest_marker(EXHAUSTIVE_MARKER) and item.nodeid not in named else kept).append(item)
    config.stash[_DESELECTED_KEY] = len(dropped)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _tier_line(config) -> str:
    if _exhaustive_requested(config):
        return "tests: the exhaustive sweep (every case; the default run deselects those marked exhaustive)"
    n = config.stash.get(_DESELECTED_KEY, None)  # None: collected elsewhere (pytest-xdist workers)
    left_out = f"{n} cases of the exhaustive sweeps deselected" if n is not None else "the exhaustive sweeps left out"
    return f"tests: the default tier ({left_out}; --exhaustive or {EXHAUSTIVE_VAR}=1 runs them too)"


# ----------------------------------------------------------------------------------------------------
# The seed fixture
# ----------------------------------------------------------------------------------------------------

#: Set to an integer to rerun tests with that seed (a failing test's report names its seed).
SEED_VAR = "QWEN_FP4_TEST_SEED"
_SEED_KEY = pytest.StashKey[int]()


def _draw_seed() -> int:
    text = os.environ.get(SEED_VAR, "").strip()
    if not text:
        return int.from_bytes(os.urandom(4), "little")
    try:
        return int(text, 0)
    except ValueError:
        raise pytest.UsageError(f"{SEED_VAR} must be an integer, got {text!r}") from None


@pytest.fixture
def seed(request) -> int:
    """A fresh random seed for this test, or ``QWEN_FP4_TEST_SEED``; torch's generators are seeded with it.
    Recorded as the test's "seed" property (junit XML) and shown in the report of a failure."""
    value = _draw_seed()
    request.node.stash[_SEED_KEY] = value
    request.node.user_properties.append(("seed", value))
    torch.manual_seed(value)
    return value


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    value = item.stash.get(_SEED_KEY, None)
    if value is not None and report.failed:
        report.sections.append(("seed", f"seed={value}: rerun with {SEED_VAR}={value} python -m pytest "
                                        f"'{item.nodeid}'"))
    return report


# ----------------------------------------------------------------------------------------------------
# The gpu, blackwell and blackwell_emulation markers
# ----------------------------------------------------------------------------------------------------

#: Set to "1" for a deliberate CPU-only run on a machine that has a GPU (the GPU tests then skip).
CPU_ONLY_VAR = "QWEN_FP4_TEST_CPU_ONLY"
#: The capability majors of Blackwell GPUs (SM100/103/110/120/121).
BLACKWELL_MAJORS = (10, 11, 12)


def gpu_skip_reason() -> Optional[str]:
    """Why tests marked gpu cannot run in this session, or None when they can."""
    from qwen_resnorm_fp4 import _library

    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if os.environ.get(CPU_ONLY_VAR) == "1":
        return f"{CPU_ONLY_VAR}=1: CPU tests only"
    if not _library.cuda_available():  # a GPU session refuses this at its start: reached only by a direct call
        return f"needs the compiled library ({_library.status()})"
    return None


def _marker_skip_reasons() -> Dict[str, Optional[str]]:
    gpu = gpu_skip_reason()
    if gpu is not None:
        return {"gpu": gpu, "blackwell": gpu, "blackwell_emulation": gpu}
    from qwen_resnorm_fp4 import info

    major, minor = torch.cuda.get_device_capability()
    return {
        "gpu": None,
        "blackwell": None if major in BLACKWELL_MAJORS else f"needs a Blackwell GPU, not capability {major}.{minor}",
        "blackwell_emulation": None if info.build_info()["blackwell_emulation"] else
        "needs the Blackwell emulation build (QWEN_FP4_EMULATE_BLACKWELL=1) loaded",
    }


def pytest_collection_modifyitems(config, items) -> None:
    _select_tier(config, items)
    reasons = None
    for item in items:
        marked = [m for m in ("gpu", "blackwell", "blackwell_emulation") if item.get_closest_marker(m)]
        if not marked:
            continue
        reasons = reasons if reasons is not None else _marker_skip_reasons()
        reason = next((reasons[m] for m in marked if reasons[m] is not None), None)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


# ----------------------------------------------------------------------------------------------------
# Session guard: on a GPU machine the compiled kernels must be what is tested
# ----------------------------------------------------------------------------------------------------


def _what_runs() -> tuple:
    """(one-line description of what this session tests, reason to refuse it or None)."""
    import qwen_resnorm_fp4
    from qwen_resnorm_fp4 import _library

    where = f"qwen_resnorm_fp4 from {os.path.dirname(qwen_resnorm_fp4.__file__)}: {_library.status()}"
    if not torch.cuda.is_available():
        return f"{where}; no CUDA GPU: CPU tests only", None
    gpu = torch.cuda.get_device_name()
    if os.environ.get(CPU_ONLY_VAR) == "1":
        return f"{where}; GPU {gpu} present but {CPU_ONLY_VAR}=1: CPU tests only", None
    if not _library.cuda_available():
        return where, (
            f"a CUDA GPU ({gpu}) is present but the compiled library is not loaded ({_library.status()}), so "
            f"every GPU test would skip. Build it in place (the README's quickstart: pip install -e .) or run "
            f"from outside the checkout against an installed wheel; set {CPU_ONLY_VAR}=1 for a deliberate "
            "CPU-only run.")
    return f"{where}; GPU {gpu}: CPU and GPU tests", None


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.write_line(_tier_line(terminalreporter.config))
    terminalreporter.write_line(_what_runs()[0])


def pytest_sessionstart(session) -> None:
    refusal = _what_runs()[1]
    if refusal is not None:
        pytest.exit(f"qwen-resnorm-fp4 tests: {refusal}", returncode=3)
