"""Helpers shared by the reliability tests (test_special_values.py, test_properties.py,
test_gpu_reliability.py) and the GPU kernel tests: device-independent inputs, NaN-aware bitwise comparison,
the logical (de-swizzled) view of the 128x4 scale layout, CUDA-graph capture, the kernels a call launches
(``kernel_names``, ``count_named``).

Written from the contract (docs/numerics.md) and the layout module; they do not call the reference.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch

from helpers.inputs import make_inputs
from qwen_resnorm_fp4 import _library
from qwen_resnorm_fp4.layout import round_up, sf_offset_128x4

CUDA_OK = torch.cuda.is_available() and _library.cuda_available()


def capture_graph(fn: Callable, *static) -> Tuple[torch.cuda.CUDAGraph, object]:
    """fn(*static) warmed up once off the default stream, then captured: returns (graph, its outputs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(*static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static)
    return graph, out


def ulp_bf16(m: torch.Tensor) -> torch.Tensor:
    """One bf16 ulp at the magnitude of each element (the tiniest normal's at zero)."""
    m = m.float().abs().clamp(min=torch.finfo(torch.float32).tiny)
    return torch.exp2(torch.floor(torch.log2(m)) - 7)


# How far the GPU's y may be from the reference's, in bf16 ulps of y_ulps's magnitude. Why 3:
# mu and rstd differ by a few fp32 ulps (reduction order, rsqrt.approx), so n = bf16(...) differs by at
# most one bf16 ulp, and only near a rounding boundary. Step 7, y = bf16(fma(n, 1 + scale, shift)),
# moves that step by |1 + scale|: ulp(n) * |1 + scale| <= 2^-7 * |n * (1 + scale)|, which is below 2
# ulps of |n * (1 + scale)| (a bf16 ulp at magnitude m exceeds 2^-8 * m) -- not 1 ulp: |1 + scale| up to
# 2 keeps the product in n's binade or moves it one up. Each y's own rounding adds at most half an ulp of
# its |y|. Measured in ulps of the largest of |y|, |y_ref| and their distances from shift, that is below
# 3. tests/ops/test_y_tolerance.py checks step 7 alone on adjacent n: above 2 (2.5), never above 3.
Y_ULPS_BOUND = 3.0


def y_ulps(y: torch.Tensor, y_ref: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """|y - y_ref| per element in bf16 ulps of max(|y|, |y_ref|, |y - shift|, |y_ref - shift|), fp32.

    The magnitude includes |y - shift| = |n * (1 + scale)| because that product, not y, carries n's
    difference (y is small where shift cancels it). NaN where either is NaN; callers compare NaN patterns
    separately."""
    a, b, sh = y.float(), y_ref.float(), shift.float()
    mag = torch.stack([a.abs(), b.abs(), (a - sh).abs(), (b - sh).abs()]).amax(0)
    return (a - b).abs() / ulp_bf16(mag)


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """||a - ref|| / ||ref||, in fp32."""
    return ((a.float() - ref.float()).norm() / ref.float().norm()).item()


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view of the same bytes (bf16 -> int16, fp32 -> int32, uint8 stays)."""
    view = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
            torch.float64: torch.int64}.get(t.dtype)
    return t.contiguous().view(view) if view is not None else t


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality, except that any NaN equals any NaN (payload and sign are not part of the contract:
    the GPU writes the canonical bf16 NaN 0x7FFF, the CPU reference may write 0x7FC0 or 0xFFFF)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    if not a.is_floating_point():
        return torch.equal(a, b)
    na, nb = torch.isnan(a), torch.isnan(b)
    if not torch.equal(na, nb):
        return False
    zero_nan = lambda t, n: torch.where(n, torch.zeros_like(t), t)  # noqa: E731
    return torch.equal(as_bits(zero_nan(a, na)), as_bits(zero_nan(b, nb)))


def first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    """A short description of where two tensors of one shape differ (for assertion messages)."""
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.shape != b.shape:
        return f"shapes {tuple(a.shape)} vs {tuple(b.shape)}"
    if a.is_floating_point():
        diff = ~((a == b) | (torch.isnan(a) & torch.isnan(b)))
    else:
        diff = a != b
    idx = diff.nonzero()
    if idx.numel() == 0:
        return "bitwise difference only (signed zero)"
    i = tuple(idx[0].tolist())
    return f"{idx.shape[0]} elements differ, first at {i}: {a[i].item()!r} vs {b[i].item()!r}"


def logical_scales(scales: torch.Tensor, rows: int, cols: int, first_row: int = 0) -> torch.Tensor:
    """[rows, cols/16] scale bytes of rows first_row .. first_row + rows - 1, read from the 128x4 layout."""
    m = torch.arange(first_row, first_row + rows, device=scales.device).unsqueeze(1)
    k = torch.arange(cols // 16, device=scales.device).unsqueeze(0)
    return scales.reshape(-1)[sf_offset_128x4(m, k, cols)]


def padding_scale_bytes(scales: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The bytes of the padding rows rows .. round_up(rows, 128) - 1 of the scale tensor."""
    return logical_scales(scales, round_up(rows, 128) - rows, cols, first_row=rows)


#: block_inputs' modulation forms, by index dtype for "indexed": make_inputs' form names.
_INDEXED_FORMS = {torch.int32: "indexed_int32", torch.int64: "indexed_int64", torch.bool: "indexed_bool"}


def block_inputs(rows: int, cols: int, *, batches: int = 1, form: str = "batch", param_dtype=torch.bfloat16,
                 bias: bool = True, affine: bool = False, index_dtype=torch.int32, seed: int = 0,
                 device="cpu", x_std: float = 1.0, residual_std: float = 4.0,
                 generate_on_device: bool = False) -> Dict[str, object]:
    """Op arguments by rows and columns: ``helpers.inputs.make_inputs`` (same values for the same seed on every
    device unless ``generate_on_device``) for ``batches`` x rows / batches x cols.
    form "shared" ([D]), "batch" ([B, D]) or "indexed" ([2B, D] + modulate_index [B, S] of index_dtype).
    Keys: residual, x, bias, gate, scale, shift, weight, norm_bias, modulate_index."""
    assert rows % batches == 0
    full_form = _INDEXED_FORMS[index_dtype] if form == "indexed" else form
    inp = make_inputs(batches, rows // batches, cols, full_form, param_dtype, seed, device=device, bias=bias,
                      affine=affine, x_std=x_std, residual_std=residual_std, generate_on_device=generate_on_device)
    return {k: inp[k] for k in ("residual", "x", "bias", "gate", "scale", "shift", "weight", "norm_bias",
                                "modulate_index")}


def resnorm_args(kw: Dict[str, object]):
    return (kw["residual"], kw["x"], kw["bias"], kw["gate"], kw["scale"], kw["shift"])


def extra_kwargs(kw: Dict[str, object]):
    return dict(weight=kw["weight"], norm_bias=kw["norm_bias"], modulate_index=kw["modulate_index"])


def reference_rcp(device) -> Optional[object]:
    """The reciprocal that makes the reference's fast mode byte-exact on ``device``."""
    from qwen_resnorm_fp4.testing import reference_rcp_for

    return reference_rcp_for(torch.device(device))


def special_values_y(rows: int, cols: int, seed: int, device="cuda") -> torch.Tensor:
    """bf16 [rows, cols] over the whole exponent range with 5% replaced by zeros, signed zeros, subnormals, huge,
    inf and NaN; row 0 all zero, an all-NaN block, a -NaN and an all-(-NaN) block, half a block of -0."""
    g = torch.Generator(device=device).manual_seed(seed)
    base = torch.randn(rows, cols, generator=g, device=device)
    scale = torch.exp2(torch.randint(-130, 120, (rows, 1), generator=g, device=device).float())
    y = (base * scale).to(torch.bfloat16)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -1e-40, 3.0e38],
                           device=device).to(torch.bfloat16)
    pick = torch.randint(0, special.numel(), (rows, cols), generator=g, device=device)
    mask = torch.rand(rows, cols, generator=g, device=device) < 0.05
    y = torch.where(mask, special[pick], y)
    y[0] = 0  # an all-zero row
    y[1, :16] = float("nan")  # an all-NaN block
    neg_nan = torch.tensor([-1], dtype=torch.int16, device=device).view(torch.bfloat16)  # 0xFFFF: sign set
    y[2, 5] = neg_nan  # NaN with the sign bit set: code 0x7 like any NaN
    y[2, 40:56] = neg_nan  # an all-(-NaN) block
    y[3, :8] = -0.0  # half a block of -0 next to finite values
    return y


def kernel_names(fn) -> List[str]:
    """The CUDA kernels one call of ``fn`` launches (after a warm-up call), copies and fills left out."""
    from torch.profiler import ProfilerActivity, profile

    fn()  # warm-up (allocator, cuBLAS handles, lazy caches)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [n for n in names if not n.startswith(("Memcpy", "Memset"))]


def count_named(names: List[str], part: str) -> int:
    """How many kernel names contain ``part``."""
    return sum(part in n for n in names)
