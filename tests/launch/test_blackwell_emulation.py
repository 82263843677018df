"""The Blackwell path (FlashInfer 0.7.4's cvt_warp_fp16_to_fp4) run on sm_90 by the emulation build
(QWEN_FP4_EMULATE_BLACKWELL=1: only its Blackwell-only E2M1 instructions are software): for the cases the
portable-path GPU tests cover, its packed, scales and residual_out equal the portable path's byte for byte,
for resnorm_quant and nvfp4_quantize, the path switched per call with set_launch_options in one process.
Every call runs after the caching allocator was filled with 0xFF blocks of the outputs' sizes, so a byte a
path leaves unwritten shows. Skipped unless the emulation build is loaded on a GPU."""

from __future__ import annotations


import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import info
from qwen_resnorm_fp4.layout import round_up
from helpers.tiers import sweep
from helpers.reliability import (as_bits, block_inputs, capture_graph, extra_kwargs, first_difference, kernel_names,
                                 resnorm_args, special_values_y)

pytestmark = [pytest.mark.gpu, pytest.mark.blackwell_emulation]


@pytest.fixture(autouse=True)
def _restore_launch_options():
    """Every test leaves the launch options as it found them."""
    before = q.launch_options()
    yield
    q.set_launch_options(*before)

DIMS = (64, 1536, 2048, 3072, 4096, 5120, 8192, 16384)
ROWS = (1, 17, 127, 128, 129, 255, 2048, 4113)
# The default run's subset (the rest: the exhaustive sweep, which scripts/gpu_check.sh's emulation stage runs):
# the smallest width, a generic one, the tuned widths and the largest; one row, the split kernel with a partial
# scale tile, the many-rows threshold and an odd many-rows count.
DEFAULT_DIMS = (64, 1536, 3072, 5120, 16384)
DEFAULT_ROWS = (1, 129, 2048, 4113)



def _sms() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _dirty_allocator(rows: int, cols: int) -> None:
    """Hand the caching allocator 0xFF blocks of each output's size (packed, scales, residual_out)."""
    sizes = (rows * cols // 2, round_up(rows, 128) * cols // 16, rows * cols * 2)
    dirty = [torch.full((n,), 0xFF, dtype=torch.uint8, device="cuda") for n in sizes if n for _ in range(2)]
    del dirty


def _on_path(monkeypatch, path: str, fn, rows: int, cols: int):
    q.set_launch_options(kernel_path=path)
    _dirty_allocator(rows, cols)
    return fn()


def assert_paths_agree(monkeypatch, fn, rows: int, cols: int, what: str, names=("packed", "scales", "residual_out")):
    """fn() on the portable and on the Blackwell path: every output the same bytes."""
    portable = _on_path(monkeypatch, "portable", fn, rows, cols)
    blackwell = _on_path(monkeypatch, "blackwell", fn, rows, cols)
    for name, a, b in zip(names, portable, blackwell):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {name} shape/dtype"
        assert torch.equal(as_bits(a), as_bits(b)), f"{what}: {name} differs: {first_difference(a, b)}"
    return portable


def _global_scale(y: torch.Tensor) -> torch.Tensor:
    return (448.0 * 6.0 / y.float().abs().amax().clamp(min=1e-6)).reshape(1).float()


def run_case(monkeypatch, rows: int, cols: int, fast: bool, seed: int, **opts):
    """resnorm_quant and nvfp4_quantize(resnorm(...)) on both paths, compared byte for byte."""
    kw = block_inputs(rows, cols, device="cuda", generate_on_device=True, seed=seed, **opts)
    what = f"rows={rows} D={cols} fast={fast} {opts} seed={seed}"
    args, extra = resnorm_args(kw), extra_kwargs(kw)
    y, _ = q.resnorm(*args, 1e-6, **extra)
    G = _global_scale(y)
    assert_paths_agree(monkeypatch, lambda: q.resnorm_quant(*args, G, 1e-6, fast, **extra), rows, cols,
                       f"resnorm_quant {what}")
    assert_paths_agree(monkeypatch, lambda: q.nvfp4_quantize(y, G, fast), rows, cols, f"nvfp4_quantize {what}",
                       names=("packed", "scales"))


def test_switch_selects_the_kernels(monkeypatch):
    """The switch really changes the kernels: FlashInferNvfp4 instances on blackwell and auto (the emulation
    build makes the Blackwell path usable on sm_90), PortableNvfp4 on portable; info says the same."""
    kw = block_inputs(256, 3072, device="cuda", seed=1)
    G = torch.tensor([100.0], device="cuda")
    y, _ = q.resnorm(*resnorm_args(kw))
    calls = {"resnorm_quant": lambda: q.resnorm_quant(*resnorm_args(kw), G),
             "nvfp4_quantize": lambda: q.nvfp4_quantize(y, G)}
    for path, conversion in (("blackwell", "FlashInferNvfp4"), ("auto", "FlashInferNvfp4"), ("portable",
                                                                                             "PortableNvfp4")):
        q.set_launch_options(kernel_path=path)
        for op, fn in calls.items():
            names = kernel_names(fn)
            assert len(names) == 1 and conversion in names[0], f"{path} {op}: {names}"
    cap = torch.cuda.get_device_capability()
    q.set_launch_options(kernel_path="auto")
    assert info.kernel_path(cap) == info.PATH_BLACKWELL_EMULATED
    q.set_launch_options(kernel_path="portable")
    assert info.kernel_path(cap) == info.PATH_PORTABLE


@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
@sweep("cols", DIMS, DEFAULT_DIMS)
@sweep("rows", ROWS, DEFAULT_ROWS)
def test_rows_and_widths(monkeypatch, rows, cols, fast, seed):
    if cols >= 8192 and rows not in (1, 129, 2048):
        pytest.skip("D >= 8192: a subset of the row counts keeps the suite short")
    run_case(monkeypatch, rows, cols, fast, seed, form="shared", bias=False)


@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
@pytest.mark.parametrize("cols", (3072, 5120))
def test_split_kernel_boundary(monkeypatch, cols, fast, seed):
    """SMs - 1 and SMs rows take the two-CTAs-per-row kernel, SMs + 1 the one-CTA kernels."""
    for rows in (_sms() - 1, _sms(), _sms() + 1):
        run_case(monkeypatch, rows, cols, fast, seed, form="shared", bias=False)


# 4 x 13 rows: the split kernel; 4 x 65: one CTA per row, fewer than 2048 rows; 4 x 513: the many-rows kernels.
@sweep("fast", (True, False), (True,), ids=("fast", "exact"))
@sweep("bias,affine", ((False, False), (True, False), (False, True), (True, True)), ((False, False), (True, True)))
@pytest.mark.parametrize("param_dtype", (torch.bfloat16, torch.float32), ids=("bf16", "fp32"))
@pytest.mark.parametrize("form", ("shared", "batch", "indexed"))
@pytest.mark.parametrize("rows,cols", ((4 * 13, 3072), (4 * 65, 5120), (4 * 513, 3072), (4 * 513, 5120)),
                         ids=("split3072", "one5120", "many3072", "many5120"))
def test_modulation_forms_and_options(monkeypatch, rows, cols, form, param_dtype, bias, affine, fast, seed):
    run_case(monkeypatch, rows, cols, fast, seed, batches=4, form=form, param_dtype=param_dtype, bias=bias,
             affine=affine)


@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64, torch.bool))
def test_modulate_index_dtypes(monkeypatch, index_dtype, seed):
    run_case(monkeypatch, 2 * 1031, 3072, True, seed, batches=2, form="indexed", index_dtype=index_dtype)


GLOBAL_SCALES = (1.0, 448 * 6 / 3.0, 1e-20, 1e20, -2.0, 0.0, 1e-40, float("inf"), 3.0e38)


@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
@pytest.mark.parametrize("gs", GLOBAL_SCALES)
def test_quantizer_special_values_and_global_scales(monkeypatch, gs, fast, seed):
    rows, cols = 1000, 1024
    y = special_values_y(rows, cols, seed)
    G = torch.tensor([gs], device="cuda")
    assert_paths_agree(monkeypatch, lambda: q.nvfp4_quantize(y, G, fast), rows, cols, f"nvfp4_quantize G={gs}",
                       names=("packed", "scales"))


@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
@pytest.mark.parametrize("gs", (1.0, 1e-20, 1e20, 0.0))
def test_fused_special_values(monkeypatch, gs, fast, seed):
    """x and residual with the special values: NaN, inf, huge and subnormal rows through the LayerNorm too."""
    rows, cols = 1000, 3072
    kw = block_inputs(rows, cols, device="cuda", seed=7, form="batch", batches=4)
    kw["x"] = special_values_y(rows, cols, seed).reshape(kw["x"].shape)
    kw["residual"][:, 5] = float("nan")
    G = torch.tensor([gs], device="cuda")
    assert_paths_agree(monkeypatch, lambda: q.resnorm_quant(*resnorm_args(kw), G, 1e-6, fast, **extra_kwargs(kw)),
                       rows, cols, f"resnorm_quant specials G={gs}")


def _fused(residual, x, gate, scale, shift, G):
    return q.resnorm_quant(residual, x, None, gate, scale, shift, G, 1e-6, True)


def test_cuda_graph_replay_through_the_blackwell_path(monkeypatch):
    kw = block_inputs(4608, 3072, device="cuda", seed=3, form="shared", bias=False)
    static = [kw["residual"].clone(), kw["x"].clone(), kw["gate"].clone(), kw["scale"].clone(), kw["shift"].clone(),
              torch.tensor([100.0], device="cuda")]
    q.set_launch_options(kernel_path="blackwell")
    graph, captured = capture_graph(_fused, *static)
    fresh = block_inputs(4608, 3072, device="cuda", seed=4, form="shared", bias=False)
    for dst, src in zip(static, (fresh["residual"], fresh["x"], fresh["gate"], fresh["scale"], fresh["shift"],
                                 torch.tensor([50.0], device="cuda"))):
        dst.copy_(src)
    q.set_launch_options(kernel_path="portable")  # the graph keeps the kernels it captured
    graph.replay()
    torch.cuda.synchronize()
    portable = _fused(*static)
    for name, a, b in zip(("packed", "scales", "residual_out"), captured, portable):
        assert torch.equal(as_bits(a), as_bits(b)), f"graph {name}: {first_difference(a, b)}"


def test_torch_compile_fullgraph_through_the_blackwell_path(monkeypatch):
    kw = block_inputs(2 * 1000, 3072, device="cuda", batches=2, seed=2, bias=False)
    args = (kw["residual"], kw["x"], kw["gate"], kw["scale"], kw["shift"], torch.tensor([100.0], device="cuda"))
    q.set_launch_options(kernel_path="portable")
    portable = _fused(*args)
    q.set_launch_options(kernel_path="blackwell")
    compiled = torch.compile(_fused, fullgraph=True)(*args)
    for name, a, b in zip(("packed", "scales", "residual_out"), portable, compiled):
        assert torch.equal(as_bits(a), as_bits(b)), f"compiled {name}: {first_difference(a, b)}"


# The 4over6 recipe: FlashInfer's helper with its NVFP44Over6Config (the Blackwell path) against the portable
# software quantizer. Codes: MAE and MSE, each with the exact and the fp16 error form (e4m3_max does not
# reach the kernels with a per-tensor global scale; code 3 checks that too).
FOUR_OVER_SIX_CODES = (1, 3, 5, 17, 21)


@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
@pytest.mark.parametrize("code", FOUR_OVER_SIX_CODES)
@sweep("rows,cols", ((1, 64), (17, 3072), (129, 5120), (2048, 3072), (4113, 16384)), ((129, 5120), (4113, 16384)))
def test_4over6_rows_and_widths(monkeypatch, rows, cols, code, fast, seed):
    config = q.recipe.nvfp4_4over6_from_code(code)
    kw = block_inputs(rows, cols, device="cuda", generate_on_device=True, seed=seed, form="batch",
                      batches=1, bias=True)
    args, extra = resnorm_args(kw), extra_kwargs(kw)
    y, _ = q.resnorm(*args, 1e-6, **extra)
    G = _global_scale(y)
    what = f"4over6 code={code} rows={rows} D={cols} fast={fast}"
    assert_paths_agree(monkeypatch, lambda: q.resnorm_quant(*args, G, 1e-6, fast, nvfp4_4over6=config, **extra),
                       rows, cols, f"resnorm_quant {what}")
    assert_paths_agree(monkeypatch, lambda: q.nvfp4_quantize(y, G, fast, nvfp4_4over6=config), rows, cols,
                       f"nvfp4_quantize {what}", names=("packed", "scales"))


@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
@pytest.mark.parametrize("code", FOUR_OVER_SIX_CODES)
@sweep("gs", (1.0, 448 * 6 / 3.0, 1e-20, 1e20, 0.0, float("inf")), (448 * 6 / 3.0, 1e-20, 0.0, float("inf")))
def test_4over6_special_values_and_global_scales(monkeypatch, gs, code, fast, seed):
    rows, cols = 600, 1024
    y = special_values_y(rows, cols, seed)
    G = torch.tensor([gs], device="cuda")
    config = q.recipe.nvfp4_4over6_from_code(code)
    assert_paths_agree(monkeypatch, lambda: q.nvfp4_quantize(y, G, fast, nvfp4_4over6=config), rows, cols,
                       f"nvfp4_quantize 4over6 code={code} G={gs}", names=("packed", "scales"))


@pytest.mark.parametrize("fast", (True, False), ids=("fast", "exact"))
@pytest.mark.parametrize("rows,cols", ((17, 3072), (129, 5120), (2304, 3072), (4096, 5120), (300, 1536)))
def test_per_token_chunk_views(monkeypatch, rows, cols, fast, seed):
    """Per-token modulation from temb.chunk(6, dim=-1) views (row stride 6D) through both paths."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(1, rows, cols, generator=g, device="cuda").bfloat16()
    residual = (2 * torch.randn(1, rows, cols, generator=g, device="cuda")).bfloat16()
    temb = (0.5 * torch.randn(1, rows, 6 * cols, generator=g, device="cuda")).bfloat16()
    _, _, _, gate, scale, shift = temb.chunk(6, dim=-1)
    y, _ = q.resnorm(residual, x, None, gate, scale, shift)
    G = _global_scale(y)
    assert_paths_agree(monkeypatch, lambda: q.resnorm_quant(residual, x, None, gate, scale, shift, G, 1e-6, fast),
                       rows, cols, f"per-token rows={rows} D={cols} fast={fast}")
