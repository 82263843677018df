"""CPU tests of the benchmarks in benchmarks/ (not part of the wheel: imported here by path): their option
parsing, byte models, tables, the one results writer, the correctness checks (a missing check fails), the
timing helpers that need no GPU, the FlashInfer peer's skip paths, and that each refuses cleanly without a
GPU. The benchmarks print measurements and grade no goal: a poor figure never fails a run, a byte check does."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

from helpers.paths import REPO_ROOT

ROOT = REPO_ROOT
BENCH = ROOT / "benchmarks"
if not (BENCH / "timing.py").is_file():
    pytest.skip("benchmarks/ not in this copy of the tests", allow_module_level=True)
sys.path.insert(0, str(BENCH))

import bench_fp8  # noqa: E402,F401
import bench_fp8_linear  # noqa: E402,F401
import bench_fused  # noqa: E402
import bench_gemm  # noqa: E402
import bench_model  # noqa: E402
import bench_pdl  # noqa: E402
import bench_per_token  # noqa: E402
import harness  # noqa: E402
import results  # noqa: E402
import run_all  # noqa: E402
import timing  # noqa: E402
from peers import flashinfer_dit  # noqa: E402
from qwen_resnorm_fp4 import reference  # noqa: E402
from qwen_resnorm_fp4.constants import FP4_AMAX_SCALE  # noqa: E402
from qwen_resnorm_fp4.layout import round_up  # noqa: E402

SCRIPTS = ("bench_fused", "bench_fp8", "bench_pdl", "bench_per_token", "bench_gemm", "bench_fp8_linear", "bench_model")


# ----------------------------------------------------------------------------------------------------
# Structure: one timer and one writer, no cycles, nothing of the package imports a benchmark
# ----------------------------------------------------------------------------------------------------


def _imports(path: Path) -> set:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_every_benchmark_times_and_writes_through_the_shared_modules():
    """Each benchmark imports timing and results, and none imports another benchmark (no cycles)."""
    for name in SCRIPTS:
        imported = _imports(BENCH / f"{name}.py")
        assert {"timing", "results", "harness"} <= imported, (name, imported)
        assert not imported & (set(SCRIPTS) - {name}), (name, imported)
    for shared in ("timing", "results"):
        assert not _imports(BENCH / f"{shared}.py") & (set(SCRIPTS) | {"harness"})


def test_no_timing_loop_or_csv_writer_outside_the_shared_modules():
    """CUDA events, graph capture and csv writing appear only in timing.py / results.py."""
    for name in SCRIPTS:
        text = (BENCH / f"{name}.py").read_text()
        for needle in ("torch.cuda.Event", "torch.cuda.graph(", "perf_counter() - t0) /", "import csv"):
            assert needle not in text, (name, needle)


def test_the_package_imports_no_benchmark():
    pkg = ROOT / "qwen_resnorm_fp4"
    assert not list(pkg.glob("bench*.py")) and not (pkg / "peers").exists()
    for path in pkg.rglob("*.py"):
        text = path.read_text()
        for name in SCRIPTS + ("timing", "harness", "peers"):
            assert f"import {name}" not in text and f"from {name}" not in text and f"from .{name}" not in text, \
                (path, name)


# ----------------------------------------------------------------------------------------------------
# results: writer and correctness checks
# ----------------------------------------------------------------------------------------------------


def test_check_failures_fails_a_missing_check():
    rows = [{"dim": 3072, "rows": 17, "byte_exact": True}, {"dim": 3072, "rows": 256},
            {"dim": 3072, "rows": 4096, "byte_exact": False}, {"dim": 3072, "rows": 8192, "byte_exact": 1}]
    failures = results.check_failures(rows, ["byte_exact"], lambda r: f"rows={r['rows']}")
    assert failures == ["rows=256: byte_exact not checked", "rows=4096: byte_exact failed",
                        "rows=8192: byte_exact failed"]
    assert results.check_failures(rows[:1], ["byte_exact"], str) == []


def test_exit_status_says_which_check_failed(capsys):
    assert results.exit_status([], "x") == 0
    assert capsys.readouterr().err == ""
    assert results.exit_status(["D=3072 rows=17: byte_exact failed"], "outputs differ") == 1
    err = capsys.readouterr().err
    assert err.startswith("check failed: outputs differ:\n  D=3072 rows=17: byte_exact failed\n")
    assert "exit status 1: a correctness check failed" in err


def test_outputs_equal_compares_bytes():
    a = torch.tensor([1.0, float("nan"), -0.0])
    assert results.outputs_equal((a, a.clone()), (a.clone(), a))
    assert not results.outputs_equal(a, torch.tensor([1.0, float("nan"), 0.0]))  # -0.0 vs 0.0: other bytes
    assert not results.outputs_equal((a,), (a, a))
    assert not results.outputs_equal(a, a.to(torch.float64))
    assert not results.outputs_equal(a, a[:2])


def test_write_report(tmp_path):
    rows = [{"dim": 3072, "rows": m, "fused_gbps": 100.0 * m, "peer_gbps": float("nan"), "ok": True}
            for m in (17, 4096)]
    plot = results.Plot(x="rows", panel="dim", series={"fused": "fused_gbps", "peer": "peer_gbps"}, xlabel="rows",
                        ylabel="GB/s", title="t", hline=(4000.0, "ceiling"))
    written = results.write_report(tmp_path / "sub", "b", rows, ["# b", "line"], plot=plot)
    assert (tmp_path / "sub" / "b.csv").read_text().splitlines()[0] == "dim,rows,fused_gbps,peer_gbps,ok"
    assert (tmp_path / "sub" / "b.md").read_text() == "# b\nline\n"
    assert ((tmp_path / "sub" / "b.png") in written) == (tmp_path / "sub" / "b.png").exists()
    results.write_csv(tmp_path / "f.csv", rows, ["rows", "missing"])
    assert (tmp_path / "f.csv").read_text().splitlines() == ["rows,missing", "17,", "4096,"]


def test_fmt_and_table():
    assert results.fmt(float("nan"), ".2f") == "n/a" and results.fmt(None, ".2f") == "n/a"
    assert results.fmt(1.234, ".2f") == "1.23"
    assert results.yes_no(True) == "yes" and results.yes_no(None) == "NO" and results.yes_no(False) == "NO"
    assert results.markdown_table(("a", "b"), [(1, 2)]) == ["| a | b |", "|---|---|", "| 1 | 2 |"]


# ----------------------------------------------------------------------------------------------------
# timing helpers that need no GPU
# ----------------------------------------------------------------------------------------------------


def test_sets_and_reps():
    l2 = 60 * 2 ** 20
    assert timing.sets_for_cold_l2(1, l2) == timing.MAX_SETS
    assert timing.sets_for_cold_l2(l2, l2) == 2
    assert timing.sets_for_cold_l2(l2, l2, minimum=timing.GRAPH_CALLS) == timing.GRAPH_CALLS
    assert timing.sets_for_cold_l2(3 * l2, l2) == 1
    with pytest.raises(ValueError, match="bytes_per_set"):
        timing.sets_for_cold_l2(0, l2)
    assert timing.adaptive_reps(float("nan"), 100, 0.25) == 100
    assert timing.adaptive_reps(1e6, 100, 0.25) == 10
    assert timing.adaptive_reps(10.0, 100, 0.25) == 100
    assert timing.gbps(4_000_000, 1000.0) == pytest.approx(4.0)


def test_copy_ceiling_is_the_best_pair(monkeypatch):
    """The ceiling is the highest of the buffer pairs' figures, each pair timed on its own buffers."""
    monkeypatch.setattr(timing, "DEVICE", "cpu")
    seen = []

    def fake_measure(src, dst, reps):
        seen.append((src.data_ptr(), dst.data_ptr(), src.numel(), reps))
        return [4051.0, 4178.0, 4100.0][len(seen) - 1]

    ceiling, per_pair = timing.copy_ceiling_gbps(nbytes=4096, reps=7, pairs=3, measure=fake_measure)
    assert ceiling == 4178.0 and per_pair == [4051.0, 4178.0, 4100.0]
    assert len({ptr for s, d, _, _ in seen for ptr in (s, d)}) == 6  # six distinct buffers, all alive together
    assert all(n == 4096 and reps == 7 for _, _, n, reps in seen)
    assert "4178 GB/s" in timing.ceiling_note(ceiling, per_pair) and "3 buffer pairs" in \
        timing.ceiling_note(ceiling, per_pair)


def test_copy_ceiling_uses_fewer_pairs_when_memory_runs_out(monkeypatch):
    monkeypatch.setattr(timing, "DEVICE", "cpu")
    real_empty, calls = torch.empty, []

    def empty(*args, **kwargs):  # the third source buffer does not fit
        calls.append(1)
        if len(calls) == 3:
            raise torch.cuda.OutOfMemoryError("out of memory")
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty)
    ceiling, per_pair = timing.copy_ceiling_gbps(nbytes=64, pairs=3, measure=lambda s, d, r: 1000.0)
    assert per_pair == [1000.0, 1000.0] and ceiling == 1000.0


def test_copy_ceiling_needs_one_pair(monkeypatch):
    monkeypatch.setattr(timing, "DEVICE", "cpu")

    def empty(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("out of memory")

    monkeypatch.setattr(torch, "empty", empty)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        timing.copy_ceiling_gbps(nbytes=64, pairs=3, measure=lambda s, d, r: 1.0)


def test_same_bytes_copy(monkeypatch):
    monkeypatch.setattr(timing, "DEVICE", "cpu")
    fn, copied = timing.same_bytes_copy(1001, 3)
    assert copied == 1000
    out = fn(2)
    assert out.numel() == 500 and bool((out == 1).all())


# ----------------------------------------------------------------------------------------------------
# harness
# ----------------------------------------------------------------------------------------------------


def test_bytes_moved_formula():
    d = 3072
    per_row = 2 * d * 2 + d * 2 + d // 2 + d // 16  # residual + x read, residual_out, packed, scales
    assert per_row == 20_160
    for m in (128, 4096, 32768):
        assert harness.bytes_moved(m, d) == per_row * m
    for m in (1, 17, 4097, 6889):  # scale rows padded to a multiple of 128
        assert harness.bytes_moved(m, d) == (2 * d * 2 + d * 2 + d // 2) * m + d // 16 * round_up(m, 128)
    assert harness.bytes_moved(256, 5120) == 256 * (4 * 5120 + 2 * 5120 + 2560 + 320)


def test_global_scale_for():
    y = torch.tensor([[1.0, -4.0], [2.0, 0.5]]).bfloat16()
    assert harness.global_scale_for(y).tolist() == [FP4_AMAX_SCALE / 4.0]


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("argv", [["--help"]])
def test_each_benchmark_has_help(script, argv, capsys):
    module = sys.modules[script]
    with pytest.raises(SystemExit) as exc:
        module.main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--out" in out and "--check-targets" not in out  # measurements only: no option grades them


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_benchmark_refuses_without_a_gpu(script, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert sys.modules[script].main(["--out", str(tmp_path / "never")]) == 2
    assert "GPU only, and no CUDA GPU is available" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("script, argv", [
    ("bench_fused", ["--reps", "0"]), ("bench_fused", ["--rows", "17,0"]), ("bench_fused", ["--dims", "-64"]),
    ("bench_pdl", ["--rows", "0"]), ("bench_per_token", ["--replays", "-1"]), ("bench_gemm", ["--rows", "x"]),
    ("bench_model", ["--layers", "0"]), ("bench_model", ["--tokens", "6889,0"]), ("bench_model", ["--batches", "x"]),
    ("bench_fp8", ["--rows", "0"]), ("bench_fp8", ["--replays", "-2"]), ("bench_fp8_linear", ["--tokens", "0"]),
    ("bench_fp8_linear", ["--reps", "0"]),
])
def test_counts_must_be_positive(script, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        sys.modules[script].main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and f"argument {argv[0]}: expected" in err


# ----------------------------------------------------------------------------------------------------
# bench_fused
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dims", ["16448", "3072,96"])
def test_fused_rejects_unsupported_width_before_needing_a_gpu(dims, capsys):
    assert bench_fused.main(["--dims", dims]) == 2
    assert "--dims: D must be a positive multiple of 64, at most 16384, got " in capsys.readouterr().err


def test_e2m1_bounds_are_the_midpoints():
    assert bench_fused.e2m1_bounds() == (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def test_eager_chain_peer_on_cpu():
    """The eager chain is a speed peer: right shapes, residual exact, quantization close."""
    g = torch.Generator().manual_seed(0)
    rows, d = 130, 256
    res = torch.randn(1, rows, d, generator=g).bfloat16()
    x = torch.randn(1, rows, d, generator=g).bfloat16()
    gate, scale, shift = ((torch.randn(1, d, generator=g) * 0.3).bfloat16() for _ in range(3))
    y, r = reference.resnorm(res, x, None, gate, scale, shift, harness.EPS)
    gs = (FP4_AMAX_SCALE / y.float().abs().amax()).reshape(1)
    p0, s0 = reference.nvfp4_quantize(y, gs, False)
    bounds = torch.tensor(bench_fused.e2m1_bounds())
    index = bench_fused.sf_index(rows, d, "cpu")
    p1, s1, r1 = bench_fused.eager_chain(res, x, gate, scale, shift, gs, index, bounds)
    assert p1.shape == p0.shape and s1.shape == s0.shape and p1.dtype == s1.dtype == torch.uint8
    assert torch.equal(r1, r)
    assert (p1 == p0).float().mean() > 0.95
    assert (s1 == s0).float().mean() > 0.95
    used = torch.zeros(s1.numel(), dtype=torch.bool)
    used[index] = True
    assert not s1.reshape(-1)[~used].any()  # the padding rows' scales stay zero


def _row(m, exact=True):
    return {"dim": 3072, "rows": m, "byte_exact": exact}


def _graph(rows=17, exact=True):
    return {"dim": 3072, "rows": rows, "fused": 1.0, "unfused": 2.0, "byte_exact": exact}


def test_fused_byte_check_failures():
    rows = [_row(17), {"dim": 3072, "rows": 256}]
    graph = {(3072, 17): _graph(), (3072, 32): {"dim": 3072, "rows": 32, "fused": 1.0, "unfused": 2.0}}
    assert bench_fused.byte_check_failures(rows, graph) == [
        "D=3072 rows=256: byte_exact not checked", "D=3072 rows=32 (graph replay): byte_exact not checked"]
    assert bench_fused.byte_check_failures(rows[:1], {(3072, 17): _graph()}) == []
    assert bench_fused.byte_check_failures([_row(4096, exact=False)], {(3072, 17): _graph(exact=False)}) == [
        "D=3072 rows=4096: byte_exact failed", "D=3072 rows=17 (graph replay): byte_exact failed"]


def test_fused_tables():
    nan = float("nan")
    rows = [{"dim": 3072, "rows": m, "bytes": harness.bytes_moved(m, 3072), "n_sets": 1, "fused_us": 10.0,
             "fused_gbps": 4000.0, "fused_frac_copy": 0.9, "unfused_us": 15.0, "unfused_gbps": 2600.0,
             "eager_us": 200.0, "eager_gbps": 200.0, "compiled_us": nan, "compiled_gbps": nan,
             "speedup_vs_unfused": 1.5, "speedup_vs_eager": 20.0, "speedup_vs_compiled": nan, "byte_exact": True}
            for m in (17, 4096)]
    lines = bench_fused.table_lines(rows)
    assert len(lines) == 4 and "n/a" in lines[2] and lines[2].endswith("| yes |")
    g = {"calls": 20, "fused": 21.0, "unfused": 35.0, "resnorm": 26.0, "quantize": 10.0, "copy": 20.5,
         "copy_bytes": rows[1]["bytes"], "byte_exact": True}
    bench_fused.merge_graph(rows[1], g, 4000.0)
    glines = bench_fused.graph_table_lines(rows)
    assert len(glines) == 3 and glines[2].startswith("| 3072 | 4096 | 20 | 21.00 |") and glines[2].endswith("| yes |")


# ----------------------------------------------------------------------------------------------------
# bench_per_token, bench_pdl
# ----------------------------------------------------------------------------------------------------


def test_per_token_judges_fused_equals_unfused_even_when_missing():
    """A row of this build's ops without the fused == unfused check fails (it was never made)."""
    row = {"dim": 3072, "rows": 256, "ours_supported": True, "flashinfer_measured": False}
    assert bench_per_token.byte_check_failures([row]) == ["D=3072 rows=256: fused_equals_unfused not checked"]
    row["fused_equals_unfused"] = True
    assert bench_per_token.byte_check_failures([row]) == []


def test_per_token_judges_flashinfer_residual_out():
    """FlashInfer's residual_out must equal ours where both ran (its check was computed and never judged)."""
    row = {"dim": 3072, "rows": 256, "ours_supported": True, "flashinfer_measured": True,
           "fused_equals_unfused": True, "flashinfer_residual_out_equal": False}
    assert bench_per_token.byte_check_failures([row]) == ["D=3072 rows=256: flashinfer_residual_out_equal failed"]
    del row["flashinfer_residual_out_equal"]
    assert bench_per_token.byte_check_failures([row]) == [
        "D=3072 rows=256: flashinfer_residual_out_equal not checked"]
    assert bench_per_token.byte_check_failures([{"dim": 3072, "rows": 256, "ours_supported": False}]) == []


def test_per_token_byte_model():
    rows, dim = 4096, 3072
    mod = 3 * rows * dim * 2
    b = bench_per_token.impl_bytes(rows, dim)
    assert b["resnorm"] == b["flashinfer_dit"] == (2 + 2 + 2 + 2) * rows * dim + mod
    assert b["resnorm_quant"] == harness.bytes_moved(rows, dim) + mod


def test_per_token_table_marks_what_was_not_measured():
    row = {"dim": 3072, "rows": 256, "calls": 20, "ours_supported": False}
    for name, n in bench_per_token.impl_bytes(256, 3072).items():
        row[f"{name}_bytes"] = n
    row.update(flashinfer_dit_us=5.0, flashinfer_dit_gbps=800.0, flashinfer_dit_frac_copy=0.2,
               flashinfer_dit_frac_own_copy=0.85)
    lines = bench_per_token.table_lines([row])
    assert len(lines) == 2 + len(bench_per_token.IMPLS)
    assert "| flashinfer_dit | " in lines[2] and "| 85.0 |" in lines[2]
    assert "resnorm (not measured)" in lines[3] and "resnorm_quant (not measured)" in lines[4]
    assert bench_per_token.check_lines([row]) == ["rows=256: nothing of this build's to check"]


def test_pdl_table_and_checks():
    row = {"dim": 3072, "rows": 256, "calls": 20, "pair_pdl_us": 9.0, "pair_no_pdl_us": 10.0, "pdl_saves_us": 1.0,
           "pdl_saves_frac": 0.1, "gemm_us": 6.0, "op_pdl_us": 3.5, "op_no_pdl_us": 4.0, "byte_exact": True}
    lines = bench_pdl.table_lines([row])
    assert lines[2].startswith("| 3072 | 256 | 20 | 9.00 | 10.00 | 1.00 | 10.0 | 6.00 | 3.50 | 4.00 | yes |")
    assert bench_pdl.byte_check_failures([row]) == []
    assert bench_pdl.byte_check_failures([{"dim": 3072, "rows": 256}]) == ["D=3072 rows=256: byte_exact not checked"]
    assert bench_pdl.pair_bytes(32768, 3072) == harness.bytes_moved(32768, 3072) + 2 * 32768 * 3072 * 2


@pytest.mark.parametrize("before", [False, True])
def test_pdl_setting_sets_and_restores(before):
    import qwen_resnorm_fp4 as q

    previous = q.set_launch_options(pdl=before)
    try:
        for on in (True, False):
            with bench_pdl.pdl_setting(on):
                assert q.launch_options().pdl is on
            assert q.launch_options().pdl is before
    finally:
        q.set_launch_options(*previous)


# ----------------------------------------------------------------------------------------------------
# bench_gemm, bench_model, run_all
# ----------------------------------------------------------------------------------------------------


def test_gemm_and_model_checks():
    assert bench_gemm.byte_check_failures([{"M": 256, "K": 3072, "N": 12288}]) == [
        "256 x 3072 x 12288: operands_exact not checked"]
    row = {"tokens": 4096, "zero_cond_t": False, "batch": 1, "format": "nvfp4", "linears": "fc1",
           "fused_equals_unfused": False, "no_fallback": True}
    assert bench_model.byte_check_failures([row]) == [
        "4096 tokens batch 1 format=nvfp4 linears=fc1: fused_equals_unfused failed",
        "4096 tokens batch 1 format=nvfp4 linears=fc1: restored_equals_bf16 not checked"]


def test_gemm_table_prints_the_measured_ratios():
    row = {"M": 256, "K": 3072, "N": 12288, "tensor_core_ms": 0.068, "tensor_core_cached_ms": 0.037,
           "bf16_mm_ms": 0.034, "bf16_linear_ms": 0.034, "ratio": 2.0, "ratio_cached": 1.088, "reference_ms": None,
           "flashinfer_ms": None, "rel_err_vs_reference": 1.66e-3, "operands_exact": True}
    lines = bench_gemm.gemm_table([row, dict(row, M=4096, operands_exact=False)])
    assert lines[0] == ("| M x K x N | tensor_core ms | tensor_core cached ms | bf16 mm ms | bf16 linear ms | ratio | "
                        "ratio cached | reference ms | FlashInfer ms | rel err vs reference | operands exact |")
    assert lines[2] == ("| 256 x 3072 x 12288 | 0.068 | 0.037 | 0.034 | 0.034 | 2.00x | 1.09x | n/a | n/a | 1.66e-03 "
                        "| yes |")
    assert lines[3].startswith("| 4096 x 3072 x 12288 |") and lines[3].endswith("| NO |")


def test_model_inputs_token_counts():
    # 1328x1328 and 1024x1024 images: 6889 and 4096 tokens after the VAE (/8) and the 2x2 patchify
    assert [bench_model.image_shapes(t, False) for t in (6889, 4096)] == [[(1, 83, 83)], [(1, 64, 64)]]


def test_run_all_commands(tmp_path):
    args = run_all.build_parser().parse_args(["--out", str(tmp_path), "--quick"])
    cmds = dict(run_all.commands(args))
    assert list(cmds) == list(run_all.BENCHMARKS)
    assert cmds["fused"][1:] == [str(BENCH / "bench_fused.py"), "--out", str(tmp_path), "--quick"]
    assert cmds["model"][-1] == "--quick" and cmds["fp8"][-1] == "--quick"
    assert cmds["pdl"][-2:] == cmds["fp8_linear"][-2:] == ["--out", str(tmp_path)]
    args = run_all.build_parser().parse_args(["--out", str(tmp_path)])
    assert all(argv[-2:] == ["--out", str(tmp_path)] for _, argv in run_all.commands(args))  # no --quick: none passed
    args = run_all.build_parser().parse_args(["--only", "pdl,gemm"])
    assert [n for n, _ in run_all.commands(args)] == ["pdl", "gemm"]
    with pytest.raises(ValueError, match="unknown benchmark 'nope'"):
        run_all.commands(run_all.build_parser().parse_args(["--only", "nope"]))


# ----------------------------------------------------------------------------------------------------
# The FlashInfer DiT peer
# ----------------------------------------------------------------------------------------------------


def test_peer_skipped_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    module, reason = flashinfer_dit.load()
    assert module is None and reason == "no CUDA GPU is available"


def test_peer_skipped_without_the_header(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(flashinfer_dit, "include_roots", lambda: [tmp_path])
    module, reason = flashinfer_dit.load()
    assert module is None
    assert str(flashinfer_dit.HEADER) in reason and str(tmp_path) in reason


def test_peer_skipped_without_nvcc(monkeypatch, tmp_path):
    (tmp_path / flashinfer_dit.HEADER).parent.mkdir(parents=True)
    (tmp_path / flashinfer_dit.HEADER).write_text("// stand-in\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(flashinfer_dit, "include_roots", lambda: [tmp_path])
    monkeypatch.setattr(flashinfer_dit, "nvcc_path", lambda: None)
    module, reason = flashinfer_dit.load()
    assert module is None and "nvcc" in reason


def test_peer_header_found_by_the_build_variable(monkeypatch, tmp_path):
    (tmp_path / "include" / flashinfer_dit.HEADER).parent.mkdir(parents=True)
    (tmp_path / "include" / flashinfer_dit.HEADER).write_text("// stand-in\n")
    monkeypatch.setenv("QWEN_FP4_FLASHINFER_DIR", str(tmp_path))
    assert flashinfer_dit.find_include_root() == tmp_path / "include"


def test_peer_roots_include_the_repositorys_third_party(monkeypatch):
    monkeypatch.delenv("QWEN_FP4_FLASHINFER_DIR", raising=False)
    assert ROOT / "third_party" / "flashinfer" / "include" in flashinfer_dit.include_roots()


def test_peer_source_is_next_to_its_loader():
    text = flashinfer_dit.SOURCE.read_text()
    assert flashinfer_dit.SOURCE.parent == BENCH / "peers"
    assert "#include <flashinfer/norm/fused_dit_layernorm.cuh>" in text and "launchFusedLayerNorm" in text


# ----------------------------------------------------------------------------------------------------
# bench_fused's main with the measurements faked: the rows reach the report and the byte check decides the exit
# ----------------------------------------------------------------------------------------------------


def _fake_measurements(monkeypatch, exact_rows=(), graph_exact=True, speedup=1.5):
    nan = float("nan")

    class Timer:
        def clock_note(self):
            return "SM clock: fake"

    def run_case(rows, dim, timer, l2, ceiling, compiled, max_reps, budget_s):
        nbytes = harness.bytes_moved(rows, dim)
        return {"dim": dim, "rows": rows, "bytes": nbytes, "n_sets": 2, "byte_exact": rows not in exact_rows,
                "fused_us": 10.0, "fused_gbps": 100.0, "fused_frac_copy": 0.5, "unfused_us": 10.0 * speedup,
                "unfused_gbps": 1.0,
                "resnorm_us": 8.0, "quantize_us": 6.0, "eager_us": 100.0, "eager_gbps": 1.0, "compiled_us": nan,
                "compiled_gbps": nan, "copy_same_bytes_us": 9.0, "copy_same_bytes_frac": 0.6,
                "speedup_vs_unfused": speedup, "speedup_vs_eager": 10.0, "speedup_vs_compiled": nan}

    def graph_case(rows, dim, l2):
        return {"dim": dim, "rows": rows, "calls": 20, "byte_exact": graph_exact, "fused": 2.0, "unfused": 3.0,
                "resnorm": 2.0, "quantize": 1.5, "copy": 1.8, "copy_bytes": harness.bytes_moved(rows, dim)}

    monkeypatch.setattr(harness, "refuse_without_gpu", lambda prog: None)
    monkeypatch.setattr(harness, "run_header", lambda: ["GPU: fake"])
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")
    monkeypatch.setattr(timing, "l2_bytes", lambda: 50 << 20)
    monkeypatch.setattr(timing, "copy_ceiling_gbps", lambda: (4000.0, [4000.0]))
    monkeypatch.setattr(timing, "EventTimer", Timer)
    monkeypatch.setattr(timing, "host_us_per_call", lambda cases: {n: (1.0, 1.0, 1.0) for n in
                                                                   ("wrapper", "raw_op", "fused_path", "layer_norm")})
    monkeypatch.setattr(bench_fused, "host_overhead_cases", lambda: {})
    monkeypatch.setattr(bench_fused, "run_case", run_case)
    monkeypatch.setattr(bench_fused, "graph_case", graph_case)


def test_fused_main_reports_and_passes_when_every_check_holds(monkeypatch, tmp_path, capsys):
    _fake_measurements(monkeypatch)
    assert bench_fused.main(["--rows", "256,4096", "--no-compile", "--out", str(tmp_path)]) == 0
    csv_lines = (tmp_path / "bench_fused.csv").read_text().splitlines()
    assert csv_lines[0].split(",") == bench_fused.CSV_FIELDS and len(csv_lines) == 1 + 2 * 2  # 2 rows x 2 D
    first = dict(zip(bench_fused.CSV_FIELDS, csv_lines[1].split(",")))
    assert (first["dim"], first["rows"], first["fused_us"], first["unfused_us"]) == ("3072", "256", "10.0", "15.0")
    assert (first["graph_fused_us"], first["graph_speedup_vs_unfused"], first["graph_byte_exact"]) == (
        "2.0", "1.5", "True")
    md = (tmp_path / "bench_fused.md").read_text()
    assert "| 3072 | 256 | 10.00 |" in md and "17 rows, D=3072, CUDA-graph replay" in md  # 17 rows always graphed
    out, err = capsys.readouterr()
    assert "D=5120 rows=4096: fused 10.00 us" in out and err == ""


def test_fused_main_prints_a_slow_figure_without_failing(monkeypatch, tmp_path, capsys):
    """A fused op slower than the unfused pair is a measurement, not a failed run."""
    _fake_measurements(monkeypatch, speedup=0.5)
    assert bench_fused.main(["--rows", "4096", "--dims", "3072", "--no-compile", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "bench_fused.md").read_text()
    assert "| 3072 | 4096 | 10.00 | 100 | 50.0 | 60.0 | 5.00 |" in md and "| 0.50 |" in md
    assert "PASS" not in md and "FAIL" not in md and capsys.readouterr().err == ""


@pytest.mark.parametrize("exact_rows, graph_exact", [((4096,), True), ((), False)])
def test_fused_main_fails_loudly_on_a_byte_difference(monkeypatch, tmp_path, capsys, exact_rows, graph_exact):
    _fake_measurements(monkeypatch, exact_rows, graph_exact)
    assert bench_fused.main(["--rows", "256,4096", "--dims", "3072", "--no-compile", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "check failed: fused and unfused outputs differ" in err
    assert ("D=3072 rows=4096: byte_exact failed" in err) if exact_rows else ("(graph replay)" in err)
    assert (tmp_path / "bench_fused.csv").is_file()  # the measurements are written all the same
