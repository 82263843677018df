"""Pure-PyTorch reference of the numerics contract (docs/numerics.md).

This module *is* the specification: the CPU implementations of the ``qwen_fp4`` ops are these functions
behind the rules (ops.py; each takes its op's arguments in the schema's order), and the GPU tests compare
the CUDA kernels against it. It runs on any device (plain tensor ops, no Python loops
over elements). Every step names the contract step it implements.

Exactness notes
- Every fp32 operation here is a single IEEE operation, as on the GPU. The fused multiply-adds of the
  contract are emulated exactly by ``fma_fp32`` (float64 product + TwoSum + a fix for the one double
  rounding case), because ``a * b + c`` in fp32 would round twice.
- The row mean/variance are plain ``torch.sum`` in fp32 and ``torch.rsqrt``: a different reduction order
  and a correctly rounded rsqrt, where the GPU uses a tree reduction and ``rsqrt.approx``. So ``y`` may
  differ from the GPU in the last bf16 bit for a small fraction of elements; everything else is exact.
- Fast mode needs the GPU's approximate reciprocal to be byte-exact; pass ``rcp=`` (the CUDA extension
  provides it: :func:`qwen_resnorm_fp4.testing.gpu_rcp`). Without it, IEEE ``1/x`` stands in.
"""

from __future__ import annotations

import functools
import lzma
from pathlib import Path
from typing import Callable, Optional, Tuple

import torch

from .constants import E2M1_MAX, E4M3_MAX, FLT_MAX, FP8_DTYPE, NVFP4_BLOCK, is_fp8_input_scale
from .layout import sf_offsets, swizzle_scales_128x4
from .rcp_approx import rcp_approx_f32
from .recipe import NVFP4_4OVER6_ERR_FAST_MATH, NVFP4_4OVER6_ERR_MODE_SHIFT, NVFP4_4OVER6_ON

Tensor = torch.Tensor

#: What the bf16 dequantization writes for a NaN block scale (torch's own fp32 -> bf16 NaN).
CANONICAL_NAN_BF16 = 0x7FC0

# Rounding boundaries between consecutive codes, and whether a tie there rounds up (to the even code).
_E2M1_BOUNDARIES = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def bf16_round(t: Tensor) -> Tensor:
    """bf16(v): round-to-nearest-even to bf16, returned as fp32."""
    return t.to(torch.bfloat16).to(torch.float32)


def fma_fp32(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """fp32 fused multiply-add ``round_fp32(a * b + c)`` with a single rounding, like CUDA's ``fmaf``.

    The product of two fp32 values is exact in fp64. The fp64 sum rounds once; TwoSum recovers its exact
    error. Rounding that fp64 sum to fp32 is then correct unless the sum sits exactly halfway between two
    fp32 values while the true sum is not: then the error's sign decides the direction.
    """
    p = a.double() * b.double()
    cd = c.double()
    s = p + cd
    bb = s - p
    err = (p - (s - bb)) + (cd - bb)
    f = s.float()
    lo = torch.where(f.double() <= s, f, torch.nextafter(f, torch.full_like(f, -float("inf"))))
    hi = torch.nextafter(lo, torch.full_like(lo, float("inf")))
    # Past +-FLT_MAX the neighbour for the midpoint is +-2^128 (not inf): the overflow threshold is a tie too.
    big = torch.full_like(s, 2.0 ** 128)
    lo_d = torch.where(torch.isinf(lo) & torch.isfinite(hi), -big, lo.double())
    hi_d = torch.where(torch.isinf(hi) & torch.isfinite(lo), big, hi.double())
    tie = (s == (lo_d + hi_d) * 0.5) & (err != 0) & torch.isfinite(s)
    return torch.where(tie, torch.where(err > 0, hi, lo), f)


def _modulation_rows(p: Tensor, rows: int, rows_per_batch: int, modulate_index: Optional[Tensor]) -> Tensor:
    """The [rows, D] fp32 view of a modulation parameter given as [D], [B, D] or [B, 1, D] (row m uses row
    m // rows_per_batch), per token [B, S, D] with B * S = rows (row m uses token m, whatever the strides),
    or [2B, D] + modulate_index."""
    pf = p.float()
    if pf.dim() == 1:
        return pf.unsqueeze(0).expand(rows, -1)
    if pf.dim() == 3:
        if pf.shape[1] != 1:
            return pf.reshape(rows, pf.shape[-1])
        pf = pf.squeeze(1)
    batch = torch.arange(rows, device=p.device) // rows_per_batch
    if modulate_index is not None:
        num_batches = pf.shape[0] // 2
        batch = batch + num_batches * (modulate_index.reshape(-1) != 0).long()
    return pf[batch]


def resnorm(residual: Tensor, x: Tensor, bias: Optional[Tensor], gate: Tensor, scale: Tensor, shift: Tensor,
            eps: float, weight: Optional[Tensor] = None, norm_bias: Optional[Tensor] = None,
            modulate_index: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Contract steps 1-7. Returns (y, residual_out), both bf16 and shaped like ``x``."""
    d = x.shape[-1]
    rows = x.numel() // d if d else 0
    num_batches = 1 if gate.dim() == 1 else (gate.shape[0] // 2 if modulate_index is not None else gate.shape[0])
    rows_per_batch = max(rows // num_batches, 1)
    mod = lambda p: _modulation_rows(p, rows, rows_per_batch, modulate_index)  # noqa: E731

    xf = x.reshape(rows, d).float()
    a = xf if bias is None else bf16_round(xf + bias.float())  # 1
    r = bf16_round(fma_fp32(a, mod(gate), residual.reshape(rows, d).float()))  # 2
    inv_d = torch.tensor(1.0, dtype=torch.float32, device=x.device) / d
    mu = r.sum(-1, keepdim=True) * inv_d  # 3
    centered = r - mu
    var = (centered * centered).sum(-1, keepdim=True) * inv_d  # 4
    rstd = torch.rsqrt(var + torch.tensor(eps, dtype=torch.float32, device=x.device))  # 5
    n = centered * rstd  # 6
    if weight is not None or norm_bias is not None:
        w = weight.float() if weight is not None else torch.ones_like(n)
        nb = norm_bias.float() if norm_bias is not None else torch.zeros_like(n)
        n = fma_fp32(n, w.expand_as(n), nb.expand_as(n))
    n = bf16_round(n)
    y = bf16_round(fma_fp32(n, 1.0 + mod(scale), mod(shift)))  # 7
    out_dtype = x.dtype
    return y.to(out_dtype).reshape(x.shape), r.to(out_dtype).reshape(x.shape)


def e4m3_satfinite(v: Tensor) -> Tensor:
    """fp32 -> E4M3 byte (uint8): round to nearest even, saturating to 448; NaN gives 0x7F."""
    v = torch.where(v > E4M3_MAX, torch.full_like(v, E4M3_MAX), v)
    v = torch.where(v < -E4M3_MAX, torch.full_like(v, -E4M3_MAX), v)
    b = v.to(FP8_DTYPE).view(torch.uint8)
    # NaN is the canonical positive 0x7F, whatever the NaN's sign (x86 makes inf * 0 a negative NaN).
    return torch.where(torch.isnan(v), torch.full_like(b, 0x7F), b)


def e4m3_to_float(b: Tensor) -> Tensor:
    """E4M3 byte (uint8) -> fp32, exactly."""
    return b.view(FP8_DTYPE).float()


def e2m1_code(v: Tensor) -> Tensor:
    """fp32 -> E2M1 code (uint8 in 0..15): round to nearest even, |v| > 6 saturates to 6, NaN gives +6
    (0x7), and a negative value that rounds to zero keeps its sign (0x8)."""
    av = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for boundary, tie_up in _E2M1_BOUNDARIES:  # 7 boundaries, not a loop over elements
        code += (av >= boundary if tie_up else av > boundary).to(torch.uint8)
    code = code | (torch.signbit(v).to(torch.uint8) << 3)
    return torch.where(torch.isnan(v), torch.full_like(code, 0x7), code)


def e2m1_value(code: Tensor) -> Tensor:
    """E2M1 code (uint8) -> fp32 value (E2M1_VALUES, signed by bit 3).

    By arithmetic, not a table on the device: no host-to-device copy, so it can be captured in a CUDA graph
    (gemm.py dequantizes with it)."""
    e = ((code >> 1) & 0x3).to(torch.float32)
    m = (code & 0x1).to(torch.float32)
    # code & 7 -> 0, 0.5, 1, 1.5, 2, 3, 4, 6: 0.5 * m for e = 0, else 2^(e-1) * (1 + m/2), where
    # 2^(e-1) = 1, 2, 4 for e = 1, 2, 3 is e + (e == 3) (exact small integers, no pow)
    mag = torch.where(e == 0, m * 0.5, (e + (e == 3).to(torch.float32)) * (1.0 + 0.5 * m))
    return torch.where((code & 0x8) != 0, -mag, mag)


def _ieee_rcp(t: Tensor) -> Tensor:
    return torch.tensor(1.0, dtype=torch.float32, device=t.device) / t


def _nvfp4_standard_blocks(blocks: Tensor, amax: Tensor, g: Tensor, fast_math: bool, rcp, code: int = 0
                           ) -> Tuple[Tensor, Tensor]:
    """The standard recipe on [rows, K, 16] fp32 blocks: returns (codes uint8 like blocks, scale bytes [rows, K])."""
    f32 = lambda v: torch.tensor(v, dtype=torch.float32, device=blocks.device)  # noqa: E731
    if fast_math:
        sf = e4m3_satfinite(g * (amax * rcp(f32(E2M1_MAX))))
        sf_f = e4m3_to_float(sf)
        out_scale = torch.where(sf != 0, rcp(sf_f * rcp(g)), torch.zeros_like(sf_f))
    else:
        nonzero = amax != 0
        sf = torch.where(nonzero, e4m3_satfinite(amax * (g * (f32(1.0) / f32(E2M1_MAX)))),
                         torch.zeros_like(amax, dtype=torch.uint8))
        sf_f = e4m3_to_float(sf)
        enc = torch.fmin(f32(1.0) / (sf_f * (f32(1.0) / g)), f32(FLT_MAX))
        out_scale = torch.where(nonzero, enc, torch.zeros_like(enc))
    return e2m1_code(blocks * out_scale.unsqueeze(-1)), sf


def _block_errors(blocks: Tensor, codes: Tensor, scale_value: Tensor, g: Tensor, g_decode: Tensor, fp16_form: bool,
                  mse: bool) -> Tensor:
    """4over6 step 4: one candidate's error per block. p = e2m1 * S (exact), d = p * g_decode - y, or
    p - y * G in the fp16 form; |d| (MAE) or d * d (MSE) summed in the kernel's order: each half-block's 8
    elements in order (a lane's), then the two halves' sums added."""
    p = e2m1_value(codes) * scale_value.unsqueeze(-1)
    d = p - blocks * g if fp16_form else p * g_decode - blocks
    err = d * d if mse else d.abs()
    halves = [torch.zeros_like(err[..., 0]), torch.zeros_like(err[..., 0])]
    for j in range(NVFP4_BLOCK // 2):  # one fp32 addition at a time, as the kernel's: not torch.sum
        halves[0] = halves[0] + err[..., j]
        halves[1] = halves[1] + err[..., NVFP4_BLOCK // 2 + j]
    return halves[0] + halves[1]


def _nvfp4_4over6_blocks(blocks: Tensor, amax: Tensor, g: Tensor, fast_math: bool, rcp, code: int
                         ) -> Tuple[Tensor, Tensor]:
    """The 4over6 recipe on [rows, K, 16] fp32 blocks (docs/numerics.md, "The 4over6 recipe"): returns
    (codes [rows, K, 16] uint8, scale bytes [rows, K] uint8)."""
    f32 = lambda v: torch.tensor(v, dtype=torch.float32, device=blocks.device)  # noqa: E731
    # 1. the two candidate scales: amax -> 6 and amax -> 4
    s6 = g * (amax * rcp(f32(E2M1_MAX))) if fast_math else (amax / f32(E2M1_MAX)) * g
    s4 = s6 * f32(1.5)
    candidates = []
    for s in (s4, s6):
        # 2. each candidate's scale byte, its value and its encode scale (fast: no zero-scale guard)
        sf = e4m3_satfinite(s)
        sv = e4m3_to_float(sf)
        g_decode = rcp(g) if fast_math else f32(1.0) / g
        o = rcp(sv * g_decode) if fast_math else torch.fmin(f32(1.0) / (sv * g_decode), f32(FLT_MAX))
        # 3. its codes
        codes = e2m1_code(blocks * o.unsqueeze(-1))
        # 4. its error
        err = _block_errors(blocks, codes, sv, g, g_decode, bool(code & NVFP4_4OVER6_ERR_FAST_MATH),
                            (code >> NVFP4_4OVER6_ERR_MODE_SHIFT) & 3 == 1)
        candidates.append((codes, sf, err))
    (codes4, sf4, err4), (codes6, sf6, err6) = candidates
    # 5. candidate 4 where its error is smaller (ties, NaN: 6); an all-zero block: byte 0, codes 0
    take4 = err4 < err6
    zero = amax == 0
    sf = torch.where(zero, torch.zeros_like(sf6), torch.where(take4, sf4, sf6))
    codes = torch.where(take4.unsqueeze(-1), codes4, codes6)
    return torch.where(zero.unsqueeze(-1), torch.zeros_like(codes), codes), sf


def nvfp4_quantize(y: Tensor, global_scale: Tensor, fast_math: bool, nvfp4_4over6_code: int = 0, *,
                   rcp: Optional[Callable[[Tensor], Tensor]] = None) -> Tuple[Tensor, Tensor]:
    """Contract step 8: NVFP4 of ``y`` ([..., D] bf16) with the production recipe.

    Returns ``packed`` uint8 [M, D/2] (two E2M1 codes a byte, even element in the low nibble) and
    ``scales`` uint8 [round_up(M, 128), D/16] holding E4M3 block scales in the 128x4 swizzled layout,
    padding rows zero. ``rcp`` is the reciprocal used in fast mode (default: IEEE 1/x).
    ``nvfp4_4over6_code``: 0, the standard recipe, or a 4over6 recipe (qwen_resnorm_fp4/recipe.py).
    """
    d = y.shape[-1]
    rows = y.numel() // d if d else 0
    blocks = y.reshape(rows, d // NVFP4_BLOCK, NVFP4_BLOCK).float()
    g = global_scale.reshape(()).float()
    nan = torch.isnan(blocks)
    # amax ignores NaN (fmax semantics) and is NaN only for an all-NaN block, as in the production kernel.
    amax = torch.where(nan, torch.zeros_like(blocks), blocks.abs()).amax(-1)
    amax = torch.where(nan.all(-1), torch.full_like(amax, float("nan")), amax)
    recipe = _nvfp4_4over6_blocks if nvfp4_4over6_code & NVFP4_4OVER6_ON else _nvfp4_standard_blocks
    codes, sf = recipe(blocks, amax, g, fast_math, rcp or _ieee_rcp, nvfp4_4over6_code)
    codes = codes.reshape(rows, d)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)

    return packed, swizzle_scales_128x4(sf, rows, d)


def resnorm_quant(residual: Tensor, x: Tensor, bias: Optional[Tensor], gate: Tensor, scale: Tensor, shift: Tensor,
                  global_scale: Tensor, eps: float, fast_math: bool, weight: Optional[Tensor] = None,
                  norm_bias: Optional[Tensor] = None, modulate_index: Optional[Tensor] = None,
                  nvfp4_4over6_code: int = 0, *, rcp: Optional[Callable[[Tensor], Tensor]] = None
                  ) -> Tuple[Tensor, Tensor, Tensor]:
    """Steps 1-8: (packed, scales, residual_out) == nvfp4_quantize(resnorm(...)) by definition."""
    y, residual_out = resnorm(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index)
    packed, scales = nvfp4_quantize(y, global_scale, fast_math, nvfp4_4over6_code, rcp=rcp)
    return packed, scales, residual_out


def dequantize_nvfp4(packed: Tensor, scales: Tensor, global_scale: Tensor, rows: int) -> Tensor:
    """Back to fp32: value = e2m1 * float(scale) / global_scale, for the first ``rows`` rows."""
    d = packed.shape[-1] * 2
    packed = packed.reshape(-1, d // 2)[:rows]
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(rows, d)
    sf = e4m3_to_float(scales.reshape(-1).view(torch.uint8)[sf_offsets(rows, d, packed.device)])  # [rows, D/16]
    vals = e2m1_value(codes).reshape(rows, d // NVFP4_BLOCK, NVFP4_BLOCK) * sf.unsqueeze(-1)
    return (vals / global_scale.reshape(()).float()).reshape(rows, d)


def nvfp4_dequantize_bf16(packed: Tensor, scales: Tensor) -> Tensor:
    """bf16 [rows, K] of ``e2m1 * float(e4m3 block scale)`` (no global scale): :func:`dequantize_nvfp4` with a
    global scale of 1 (exact), cast to bf16 (exact: at most 6 significant bits in [2^-10, 2688]), NaN written
    as :data:`CANONICAL_NAN_BF16` as the CUDA kernel writes it."""
    rows = packed.shape[0]
    one = torch.ones((1,), dtype=torch.float32, device=packed.device)
    vals = dequantize_nvfp4(packed, scales, one, rows)
    bits = vals.to(torch.bfloat16).view(torch.int16)
    return bits.masked_fill(torch.isnan(vals), CANONICAL_NAN_BF16).view(torch.bfloat16)


# ---------------------------------------------------------------------------------------------------
# FP8 (E4M3) output (docs/numerics.md, "FP8 (E4M3) output") and the no-residual ops
# ---------------------------------------------------------------------------------------------------

#: The E4M3 byte of every element when input_scale is refused (not a positive normal finite fp32): NaN.
FP8_REFUSED_SCALE_BYTE = 0x7F


def fp8_scale_valid(input_scale: Tensor) -> Tensor:
    """Whether each scale is one the FP8 ops accept: a positive, normal, finite fp32 (bool tensor)."""
    return is_fp8_input_scale(input_scale.float())


def fp8_inverse_scale(input_scale: Tensor) -> Tensor:
    """inv = div.full.f32(1, s), the GPU's (and SGLang's) inverse of each fp32 scale, on its device: the
    measured model of :func:`qwen_resnorm_fp4.rcp_approx.rcp_approx_f32` (div.full.f32(1, s) equals
    rcp.approx.f32(s) for every positive finite s). Scales the ops refuse (:func:`fp8_scale_valid` false)
    give NaN. Returns fp32 of input_scale's shape."""
    s = input_scale.float()
    valid = fp8_scale_valid(s)
    inv = rcp_approx_f32(torch.where(valid, s, torch.ones_like(s)))
    return torch.where(valid, inv, torch.full_like(inv, float("nan")))


def fp8_quantize(y: Tensor, input_scale: Tensor, *, inverse: Optional[Callable[[Tensor], Tensor]] = None) -> Tensor:
    """FP8 step 9 on bf16 ``y`` of any shape: q = e4m3_rn_satfinite(fminf(fmaxf(y * inv, -448), 448)),
    element-wise, with inv = ``inverse``(input_scale) (default :func:`fp8_inverse_scale`) and one fp32
    multiply. fmax/fmin drop NaN: a NaN product gives -448 (0xFE), +-inf +-448. A refused input_scale
    (:func:`fp8_scale_valid` false) makes every byte 0x7F. Returns float8_e4m3fn of y's shape."""
    s = input_scale.reshape(1).float()
    inv = (inverse or fp8_inverse_scale)(s).reshape(())
    f32 = lambda v: torch.tensor(v, dtype=torch.float32, device=y.device)  # noqa: E731
    v = torch.fmin(torch.fmax(y.float() * inv, f32(-E4M3_MAX)), f32(E4M3_MAX))
    q = e4m3_satfinite(v)
    q = torch.where(fp8_scale_valid(s).reshape(()), q, torch.full_like(q, FP8_REFUSED_SCALE_BYTE))
    return q.view(FP8_DTYPE)


def resnorm_quant_fp8(residual: Tensor, x: Tensor, bias: Optional[Tensor], gate: Tensor, scale: Tensor,
                      shift: Tensor, input_scale: Tensor, eps: float, weight: Optional[Tensor] = None,
                      norm_bias: Optional[Tensor] = None, modulate_index: Optional[Tensor] = None, *,
                      inverse: Optional[Callable[[Tensor], Tensor]] = None) -> Tuple[Tensor, Tensor]:
    """Steps 1-7 and FP8: (y float8_e4m3fn like x, residual_out) == (fp8_quantize(resnorm(...)[0]), ...)."""
    y, residual_out = resnorm(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index)
    return fp8_quantize(y, input_scale, inverse=inverse), residual_out


def norm_modulate(x: Tensor, scale: Tensor, shift: Tensor, eps: float, weight: Optional[Tensor] = None,
                  norm_bias: Optional[Tensor] = None, modulate_index: Optional[Tensor] = None) -> Tensor:
    """Steps 3-7 on r = bf16(fma(0, 0, x)) (x itself, except that -0 reads as +0), no residual update:
    resnorm's y for residual x, x = 0 and gate = 0, which is how the kernels compute it. Returns bf16 like x."""
    zeros = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    gate = torch.zeros(scale.shape, dtype=scale.dtype, device=scale.device)
    return resnorm(x, zeros, None, gate, scale, shift, eps, weight, norm_bias, modulate_index)[0]


def norm_modulate_quant(x: Tensor, scale: Tensor, shift: Tensor, global_scale: Tensor, eps: float, fast_math: bool,
                        weight: Optional[Tensor] = None, norm_bias: Optional[Tensor] = None,
                        modulate_index: Optional[Tensor] = None, nvfp4_4over6_code: int = 0, *,
                        rcp: Optional[Callable[[Tensor], Tensor]] = None) -> Tuple[Tensor, Tensor]:
    """:func:`norm_modulate` and NVFP4 (step 8): (packed, scales) as :func:`nvfp4_quantize` returns them."""
    y = norm_modulate(x, scale, shift, eps, weight, norm_bias, modulate_index)
    return nvfp4_quantize(y, global_scale, fast_math, nvfp4_4over6_code, rcp=rcp)


def norm_modulate_quant_fp8(x: Tensor, scale: Tensor, shift: Tensor, input_scale: Tensor, eps: float,
                            weight: Optional[Tensor] = None, norm_bias: Optional[Tensor] = None,
                            modulate_index: Optional[Tensor] = None, *,
                            inverse: Optional[Callable[[Tensor], Tensor]] = None) -> Tensor:
    """:func:`norm_modulate` and FP8: float8_e4m3fn like x."""
    return fp8_quantize(norm_modulate(x, scale, shift, eps, weight, norm_bias, modulate_index), input_scale,
                        inverse=inverse)


#: GELU(tanh) of every bf16 bit pattern as PyTorch's CUDA kernel computes it (an LZMA stream of 65536
#: little-endian uint16: entry i is F.gelu(bf16 bits i, approximate="tanh") on the GPU, written by
#: tools/gelu_tanh_probe.py). CPU torch differs from it at a few inputs (its own tanh), so the CPU reference
#: reads the GPU's values.
GELU_TANH_TABLE_PATH = Path(__file__).parent / "data" / "gelu_tanh_bf16.xz"


@functools.lru_cache(maxsize=1)
def _gelu_tanh_table_cpu() -> Tensor:
    raw = bytearray(lzma.decompress(GELU_TANH_TABLE_PATH.read_bytes()))
    return torch.frombuffer(raw, dtype=torch.int16).to(torch.int32) & 0xFFFF


@functools.lru_cache(maxsize=8)
def _gelu_tanh_table_on(device: torch.device) -> Tensor:
    return _gelu_tanh_table_cpu().to(device)


def gelu_tanh_bf16(y: Tensor) -> Tensor:
    """bf16 ``F.gelu(y, approximate="tanh")`` bit for bit as PyTorch's CUDA kernel computes it (fp32 opmath,
    ``tanhf``, rounded to bf16), on any device: a lookup of y's bits in :data:`GELU_TANH_TABLE_PATH`.
    Returns bf16 of y's shape."""
    table = _gelu_tanh_table_on(y.device)
    idx = y.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    return table[idx.reshape(-1).long()].to(torch.int16).view(torch.bfloat16).reshape(y.shape)


def gelu_tanh_fp8_quantize(y: Tensor, input_scale: Tensor, *,
                           inverse: Optional[Callable[[Tensor], Tensor]] = None) -> Tensor:
    """FP8 of the FFN's GELU output: :func:`fp8_quantize` of :func:`gelu_tanh_bf16` (y), the bytes of
    ``fp8_quantize(F.gelu(y, approximate="tanh"), input_scale)`` on the GPU. Returns float8_e4m3fn like y."""
    return fp8_quantize(gelu_tanh_bf16(y), input_scale, inverse=inverse)
