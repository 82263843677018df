"""GPU tests of the CUDA kernels against the reference (skipped without a GPU and the compiled library).

What is exact where (docs/numerics.md):
- residual_out: bit-exact against the reference (steps 1-2 involve no reduction).
- y: the reference sums in another order and uses a correctly rounded rsqrt where the GPU uses
  rsqrt.approx (<= 2 ulp). mu and rstd therefore differ by a few fp32 ulps (relative ~1e-6), far below
  half a bf16 ulp (2^-9), so bf16(n) can differ by at most 1 ulp, and only for the few elements whose
  exact value lies within ~1e-6 of a bf16 rounding boundary. y = fma(n, 1 + scale, shift) carries that
  step scaled by |1 + scale|, which is under 2 ulps of |n * (1 + scale)| = |y - shift| (not 1, as this
  docstring said when the bound was 2; one seed then measured 2.5), plus each y's own rounding: bound
  helpers.reliability.Y_ULPS_BOUND = 3 ulps of max(|y|, |y_ref|, |y - shift|, |y_ref - shift|)
  (helpers.reliability.y_ulps; the derivation is there, and tests/ops/test_y_tolerance.py checks it on step 7
  alone), and a small fraction of differing elements.
- packed/scales: bit-exact against the reference quantizer applied to the GPU's own y (fast mode with
  the GPU's approximate reciprocal, qwen_resnorm_fp4.testing.gpu_rcp).
- fused == nvfp4_quantize(resnorm(...)) bit-exact always.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import reference, testing
from qwen_resnorm_fp4.layout import round_up
from qwen_resnorm_fp4.linear import FP4_AMAX_SCALE
from qwen_resnorm_fp4.testing import gpu_rcp
from helpers.paths import PACKAGE_PARENT, package_env
from helpers.session import HANG_GUARD_S
from helpers.tiers import sweep
from helpers.reliability import (Y_ULPS_BOUND, block_inputs, capture_graph, logical_scales, padding_scale_bytes,
                                 special_values_y, y_ulps)

pytestmark = pytest.mark.gpu

ROWS = (1, 17, 127, 128, 129, 1024, 4096, 4608, 6889)
DIMS = (64, 1024, 3072, 5120, 16384)
# The default run's representative subset (the rest: the exhaustive sweep, helpers.tiers.sweep): one row, the split
# kernel with a partial scale tile (129 <= SMs on an H200), the one-CTA few-rows kernels (1024), the many-rows
# kernels at 4096 and at an odd count (6889); the smallest width, the two tuned widths, the largest.
DEFAULT_ROWS = (1, 129, 1024, 4096, 6889)
DEFAULT_DIMS = (64, 3072, 5120, 16384)
RESULTS = []  # (case, differing fraction, max ulps) for the report printed when the module's tests end


@pytest.fixture(scope="module", autouse=True)
def _report_y_differences(request):
    """Prints the measured y differences (fraction of elements, max ulps) of the cases that ran, after them:
    a report, not a test (each case asserts its own bound)."""
    yield
    if RESULTS:
        worst = max(r[2] for r in RESULTS)
        mean_frac = sum(r[1] for r in RESULTS) / len(RESULTS)
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"[y vs reference] {len(RESULTS)} cases: mean differing fraction {mean_frac:.5%}, "
                                f"max differing fraction {max(r[1] for r in RESULTS):.5%}, max {worst:.1f} ulps")



def gpu_block_inputs(rows: int, cols: int, *, bias: bool = False, **opts):
    """Random block inputs drawn on the GPU (``block_inputs``; no bias unless asked). form: "shared" ([D]),
    "batch" ([B, D]) or "indexed" ([2B, D] + index)."""
    return block_inputs(rows, cols, bias=bias, device="cuda", generate_on_device=True, **opts)


def _global_scale(y: torch.Tensor) -> torch.Tensor:
    amax = y.float().abs().amax().clamp(min=1e-6)
    return (FP4_AMAX_SCALE / amax).reshape(1).float()


def _y_bound_check(name: str, y_gpu: torch.Tensor, y_ref: torch.Tensor, shift_rows: torch.Tensor):
    cols = y_ref.shape[-1]
    ulps = y_ulps(y_gpu.reshape(-1, cols), y_ref.reshape(-1, cols), shift_rows)
    frac = (ulps != 0).float().mean().item() if ulps.numel() else 0.0
    max_ulps = ulps.max().item() if ulps.numel() else 0.0
    RESULTS.append((name, frac, max_ulps))
    assert max_ulps <= Y_ULPS_BOUND, f"{name}: y differs by {max_ulps} ulps (> {Y_ULPS_BOUND})"
    assert frac <= 0.01, f"{name}: {frac:.4%} of y differs from the reference (> 1%)"


def _shift_rows(kw, rows):
    cols = kw["x"].shape[-1]
    sh = kw["shift"]
    num_batches = 1 if sh.dim() == 1 else (sh.shape[0] // 2 if kw["modulate_index"] is not None else sh.shape[0])
    return reference._modulation_rows(sh, rows, max(rows // num_batches, 1), kw["modulate_index"]).reshape(rows, cols)


def run_case(rows, cols, fast, seed: int, **opts):
    kw = gpu_block_inputs(rows, cols, seed=seed, **opts)
    name = f"rows={rows} D={cols} fast={fast} {opts} seed={seed}"
    args = (kw["residual"], kw["x"], kw["bias"], kw["gate"], kw["scale"], kw["shift"])
    extra = dict(weight=kw["weight"], norm_bias=kw["norm_bias"], modulate_index=kw["modulate_index"])

    y, r_out = q.resnorm(*args, 1e-6, **extra)
    G = _global_scale(y) if rows else torch.ones(1, device="cuda")
    packed, scales, r_out_fused = q.resnorm_quant(*args, G, 1e-6, fast, **extra)
    packed_u, scales_u = q.nvfp4_quantize(y, G, fast)

    # fused == unfused, byte for byte
    assert torch.equal(packed, packed_u), name
    assert torch.equal(scales, scales_u), name
    assert torch.equal(r_out_fused, r_out), name

    y_ref, r_ref = reference.resnorm(*args, 1e-6, **extra)
    assert torch.equal(r_out, r_ref), f"{name}: residual_out differs from the reference"
    _y_bound_check(name, y, y_ref, _shift_rows(kw, rows))

    # quantization of the GPU's own y: bit-exact against the reference quantizer
    p_ref, s_ref = reference.nvfp4_quantize(y, G, fast, rcp=gpu_rcp if fast else None)
    assert torch.equal(packed, p_ref), f"{name}: packed differs from the reference quantizer"
    assert torch.equal(scales, s_ref), f"{name}: scales differ from the reference quantizer"
    return kw


@sweep("cols", DIMS, DEFAULT_DIMS)
@sweep("rows", ROWS, DEFAULT_ROWS)
@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
def test_rows_and_widths(rows, cols, fast, seed):
    if cols == 16384 and rows not in (1, 129, 4096):
        pytest.skip("D=16384: a subset of the row counts keeps the suite short")
    run_case(rows, cols, fast, seed)


def _sms() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


# 4 x 13 rows: the two-CTAs-per-row kernel on any GPU with 52+ SMs; 4 x 513 rows: the many-rows kernels.
# Default: every kernel, form and parameter dtype, plain and with bias + affine, fast mode (exact mode: the
# quantizer's other branch, independent of the modulation, in test_rows_and_widths); the rest in the sweep.
@pytest.mark.parametrize("rows,cols", ((4 * 13, 3072), (4 * 13, 5120), (4 * 513, 3072)), ids=("split", "split5120",
                                                                                              "many"))
@pytest.mark.parametrize("form", ("shared", "batch", "indexed"))
@pytest.mark.parametrize("param_dtype", (torch.bfloat16, torch.float32), ids=("bf16", "fp32"))
@sweep("bias,affine", ((False, False), (True, False), (False, True), (True, True)), ((False, False), (True, True)))
@sweep("fast", (True, False), (True,), ids=("fast", "exact"))
def test_modulation_forms_and_options(rows, cols, form, param_dtype, bias, affine, fast, seed):
    run_case(rows, cols, fast, seed, batches=4, form=form, param_dtype=param_dtype, bias=bias, affine=affine)


# Most plain kernels of the tuned widths load a row's gate, scale and shift in one group (PlainParams and
# RowConfig::kGroupedParams in csrc/row_config.cuh; here resnorm's at both widths and the fused op's at D = 5120),
# the shared modulation row in a branch of its own: every form on the one-CTA few-rows kernels (more rows
# than SMs, fewer than 2048), which the cases above do not reach.
@pytest.mark.parametrize("rows,cols", ((4 * 65, 3072), (4 * 65, 5120)), ids=("one3072", "one5120"))
@pytest.mark.parametrize("form", ("shared", "batch", "indexed"))
def test_plain_modulation_forms_one_cta_rows(rows, cols, form, seed):
    if rows <= _sms():
        pytest.skip("needs more rows than SMs (the one-CTA-per-row kernels)")
    run_case(rows, cols, True, seed, batches=4, form=form)


@pytest.mark.parametrize("cols", (3072, 5120))
@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
def test_split_kernel_boundary(cols, fast, seed):
    """The fused op takes two CTAs per row while rows <= SMs (csrc/launch_rows.cuh, split_rows): SMs - 1
    and SMs rows take it, SMs + 1 does not; each fused == unfused and against the reference."""
    for rows in (_sms() - 1, _sms(), _sms() + 1):
        run_case(rows, cols, fast, seed)


@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64, torch.bool))
def test_modulate_index_dtypes(index_dtype, seed):
    run_case(2 * 4113, 3072, True, seed, batches=2, form="indexed", index_dtype=index_dtype)


@sweep("cols", (128, 192, 2048, 4096, 8192, 8256, 12288), (192, 4096, 8256, 12288))
def test_other_widths(cols, seed):
    run_case(257, cols, True, seed)


@sweep("fast", (True, False), (True,), ids=("fast", "exact"))
@pytest.mark.parametrize("rows, cols", ((2048, 1536), (2048, 2048), (1024, 4096), (4096, 2112)))
def test_generic_widths_above_one_wave(rows, cols, fast, seed):
    """Rows of the generic widths 1536-4096 beyond one wave of resident CTAs take the staggered kernels
    (csrc/launch_rows.cuh, set_first_wave_stagger; a wave on a 132-SM GPU is 1320 rows at D = 1536, 1056 at
    2048, 924 at 4096); fused == unfused and against the reference."""
    run_case(rows, cols, fast, seed)


@sweep("fast", (True, False), (True,), ids=("fast", "exact"))
@pytest.mark.parametrize("plain", (True, False), ids=("plain", "options"))
@pytest.mark.parametrize("cols", (1536, 4096))
@pytest.mark.parametrize("rows", (2047, 2048))
def test_generic_widths_few_rows_switch(rows, cols, plain, fast, seed):
    """A generic width's shape comes twice, the copy below 2048 rows loading x and residual without L1
    (csrc/row_config.cuh, RowConfig::kFewRows): both sides of the switch, plain and with every option (bias,
    LayerNorm affine, fp32 parameters); fused == unfused and against the reference."""
    opts = {} if plain else dict(bias=True, affine=True, param_dtype=torch.float32)
    run_case(rows, cols, fast, seed, **opts)


def test_zero_rows():
    x = torch.empty(0, 3072, dtype=torch.bfloat16, device="cuda")
    p = torch.zeros(3072, dtype=torch.bfloat16, device="cuda")
    G = torch.ones(1, device="cuda")
    packed, scales, r = q.resnorm_quant(x, x, None, p, p, p, G)
    assert packed.shape == (0, 1536) and scales.shape == (0, 192) and r.shape == (0, 3072)


@pytest.mark.parametrize("cols", (64, 3072, 5120, 16384))
@sweep("rows", (1, 2, 13, 14, 15, 16, 17, 64, 100, 127, 129, 6889), (1, 16, 17, 127, 6889))
def test_padding_scales_zero_on_dirty_memory(rows, cols):
    """The padding rows of the scale tensor (rows .. round_up(rows, 128) - 1) are zeroed by the kernels
    (CTAs after the row CTAs, 8 padding rows each, the last one fewer), whatever the allocator hands out:
    its blocks of that size are filled with 0xFF first."""
    n_scale_bytes = round_up(rows, 128) * cols // 16
    dirty = [torch.full((n_scale_bytes,), 0xFF, dtype=torch.uint8, device="cuda") for _ in range(4)]
    del dirty  # back to the caching allocator, dirty
    kw = gpu_block_inputs(rows, cols, form="shared", seed=rows)
    args = (kw["residual"], kw["x"], None, kw["gate"], kw["scale"], kw["shift"])
    G = torch.full((1,), 100.0, device="cuda")
    _, scales, _ = q.resnorm_quant(*args, G)
    y, _ = q.resnorm(*args)
    _, scales_u = q.nvfp4_quantize(y, G)
    torch.cuda.synchronize()
    for name, sc in (("resnorm_quant", scales), ("nvfp4_quantize", scales_u)):
        pad = padding_scale_bytes(sc, rows, cols)
        assert pad.numel() == (round_up(rows, 128) - rows) * cols // 16
        assert not pad.any(), f"{name}: {int((pad != 0).sum())} padding scale bytes not zero"
    assert torch.equal(scales, scales_u)
    assert logical_scales(scales, rows, cols).any()  # the real rows were written too


def test_quantizer_special_values(seed):
    """The standalone quantizer on hard values (zeros, signed zeros, subnormals, huge, inf, NaN, ties)."""
    y = special_values_y(1000, 1024, seed)
    for fast in (True, False):
        for gs in (1.0, 448 * 6 / 3.0, 1e-20, 1e20, -2.0, 0.0):
            G = torch.tensor([gs], device="cuda")
            packed, scales = q.nvfp4_quantize(y, G, fast)
            p_ref, s_ref = reference.nvfp4_quantize(y, G, fast, rcp=gpu_rcp if fast else None)
            assert torch.equal(scales, s_ref), f"fast={fast} G={gs}: scales"
            assert torch.equal(packed, p_ref), f"fast={fast} G={gs}: packed"


@pytest.mark.parametrize("rows,kernel", ((4096, "resnorm_quant_kernel"), (17, "resnorm_quant_split_kernel")))
def test_one_launch_per_fused_call(rows, kernel):
    """One launch per call, and the kernel the row count calls for: two CTAs per row for few rows
    (csrc/launch_rows.cuh, split_rows)."""
    kw = gpu_block_inputs(rows, 3072, seed=1)
    G = torch.ones(1, device="cuda")
    args = (kw["residual"], kw["x"], None, kw["gate"], kw["scale"], kw["shift"], G)
    q.resnorm_quant(*args)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        q.resnorm_quant(*args)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    names = [e.name for e in kernels]
    assert len(kernels) == 1, names
    assert kernel in names[0], names


def _fused(residual, x, gate, scale, shift, G):
    return q.resnorm_quant(residual, x, None, gate, scale, shift, G, 1e-6, True)


def test_torch_compile_fullgraph_matches_eager():
    kw = gpu_block_inputs(2 * 1000, 3072, batches=2, seed=2)
    G = torch.tensor([100.0], device="cuda")
    args = (kw["residual"], kw["x"], kw["gate"], kw["scale"], kw["shift"], G)
    eager = _fused(*args)
    compiled = torch.compile(_fused, fullgraph=True)(*args)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def test_cuda_graph_replay_matches_eager():
    kw = gpu_block_inputs(4608, 3072, seed=3)
    G = torch.tensor([100.0], device="cuda")
    static = [kw["residual"].clone(), kw["x"].clone(), kw["gate"].clone(), kw["scale"].clone(),
              kw["shift"].clone(), G.clone()]
    graph, out = capture_graph(_fused, *static)
    fresh = gpu_block_inputs(4608, 3072, seed=4)
    for dst, src in zip(static, (fresh["residual"], fresh["x"], fresh["gate"], fresh["scale"], fresh["shift"],
                                 torch.tensor([50.0], device="cuda"))):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    eager = _fused(*static)
    for a, b in zip(out, eager):
        assert torch.equal(a, b)


# a fresh process each: by default few rows above one wave (occupancy and stagger) and below (the split)
@sweep("rows", (4096, 1024, 17), (1024, 17))
def test_first_launch_inside_graph_capture(rows):
    """The fused and resnorm launches ask the device's SM count and, for many rows or few rows above one wave
    (1024 rows), their kernel's occupancy on their first call and cache them (the split of few rows and the
    first-wave stagger, csrc/launch_rows.cuh). In a fresh process that first call may be inside a CUDA-graph
    capture: the captured calls must replay to the eager bytes."""
    code = textwrap.dedent("""
        import torch
        import qwen_resnorm_fp4  # noqa: F401  (registers the ops)
        gen = torch.Generator(device="cuda").manual_seed(0)
        r = torch.randn(1, ROWS, 3072, device="cuda", generator=gen).bfloat16()
        x = torch.randn(1, ROWS, 3072, device="cuda", generator=gen).bfloat16()
        gate, scale, shift = (torch.randn(1, 3072, device="cuda", generator=gen).bfloat16() * 0.3 for _ in range(3))
        G = torch.tensor([100.0], device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = torch.ops.qwen_fp4.resnorm_quant(r, x, None, gate, scale, shift, G, 1e-6, True)
            captured += torch.ops.qwen_fp4.resnorm(r, x, None, gate, scale, shift, 1e-6)
        graph.replay()
        torch.cuda.synchronize()
        eager = torch.ops.qwen_fp4.resnorm_quant(r, x, None, gate, scale, shift, G, 1e-6, True)
        eager += torch.ops.qwen_fp4.resnorm(r, x, None, gate, scale, shift, 1e-6)
        assert len(captured) == 5 and all(torch.equal(a, b) for a, b in zip(captured, eager)), "graph replay differs"
        print("same bytes")
    """).replace("ROWS", str(rows))
    proc = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE_PARENT, capture_output=True, text=True,
                          env=package_env(), timeout=HANG_GUARD_S)
    assert proc.returncode == 0 and "same bytes" in proc.stdout, proc.stdout + proc.stderr


def test_opcheck_cuda():
    kw = gpu_block_inputs(2 * 130, 256, batches=2, form="indexed", bias=True, affine=True, seed=5)
    G = torch.tensor([10.0], device="cuda")
    common = (kw["residual"], kw["x"], kw["bias"], kw["gate"], kw["scale"], kw["shift"])
    extra = (kw["weight"], kw["norm_bias"], kw["modulate_index"])
    torch.library.opcheck(torch.ops.qwen_fp4.resnorm_quant.default, (*common, G, 1e-6, True, *extra))
    torch.library.opcheck(torch.ops.qwen_fp4.resnorm.default, (*common, 1e-6, *extra))
    y, _ = q.resnorm(*common, 1e-6)
    torch.library.opcheck(torch.ops.qwen_fp4.nvfp4_quantize.default, (y, G, False))


def test_e2m1_matches_cuda_fp4_exhaustively(seed):
    """The kernels' E2M1 conversion equals cuda_fp4.h's __nv_cvt_float_to_fp4 for all 2^32 fp32 inputs,
    and the reference's e2m1_code agrees on a random sample of bit patterns."""
    chunk = 1 << 28
    for start in range(0, 1 << 32, chunk):
        bits = torch.arange(start, start + chunk, device="cuda", dtype=torch.int64)
        x = (bits - (1 << 32) * (bits >= (1 << 31))).to(torch.int32).view(torch.float32)
        ours = testing.e2m1_codes(x, False)
        toolkit = testing.e2m1_codes(x, True)
        bad = (ours != toolkit).nonzero()
        assert bad.numel() == 0, f"{bad.numel()} mismatches from bits {start:#x}, first {x[bad[0]].item()!r}"
        del bits, ours
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randint(-(1 << 31), 1 << 31, (1 << 24,), generator=g, device="cuda", dtype=torch.int64)
    x = x.to(torch.int32).view(torch.float32)
    assert torch.equal(reference.e2m1_code(x), testing.e2m1_codes(x, True))


def test_rcp_approx_is_close_to_ieee():
    x = torch.rand(1 << 16, device="cuda") * 100 + 1e-3
    r = gpu_rcp(x)
    assert torch.allclose(r, 1.0 / x, rtol=2e-7, atol=0)


@pytest.mark.blackwell
@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
def test_matches_flashinfer_fp4_quantize(fast, monkeypatch, seed):
    flashinfer = pytest.importorskip("flashinfer")
    if not fast:
        monkeypatch.setenv("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "1")
    kw = gpu_block_inputs(4113, 3072, seed=seed)
    args = (kw["residual"], kw["x"], None, kw["gate"], kw["scale"], kw["shift"])
    y, _ = q.resnorm(*args)
    G = _global_scale(y)
    packed, scales, _ = q.resnorm_quant(*args, G, 1e-6, fast)
    fi_packed, fi_scales = flashinfer.fp4_quantize(y.reshape(-1, 3072), G, 16, False, True)
    assert torch.equal(packed, fi_packed.view(torch.uint8).reshape(packed.shape))
    assert torch.equal(scales.reshape(-1), fi_scales.view(torch.uint8).reshape(-1)[: scales.numel()])
