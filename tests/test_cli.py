"""CPU tests of the command line (info, demo, bench, --version), of its option checks, of the install
description it prints (qwen_resnorm_fp4.info) and of the benchmark's pure helpers.

The subprocesses run from the repository root with CUDA hidden, so they import this source tree and take
the CPU paths on any machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import qwen_resnorm_fp4 as q
from qwen_resnorm_fp4 import bench, cli, env, info
from qwen_resnorm_fp4.layout import round_up

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "qwen_resnorm_fp4", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_info_text():
    p = run_cli("info")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for key in ("qwen_resnorm_fp4", "torch:", "compiled library:", "GPU targets:", "FlashInfer:", "path:",
                "switches:", "kernel path:      QWEN_FP4_KERNEL_PATH="):
        assert key in out, (key, out)
    assert torch.__version__ in out
    assert info.PATH_CPU in out
    line = next(ln for ln in out.splitlines() if ln.startswith("compiled library:"))
    want = "compiled library: loaded " if _library_loaded() else "compiled library: not loaded: "
    assert line.startswith(want), line


def test_info_json():
    p = run_cli("info", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    for key in ("version", "torch", "torch_cuda", "library_loaded", "library", "cuda_archs", "flashinfer",
                "gpus", "path", "switches", "blackwell_emulation", "kernel_path_switch"):
        assert key in doc
    assert doc["torch"] == torch.__version__
    assert doc["gpus"] == []
    assert doc["path"].startswith(info.PATH_CPU)
    assert doc["library_loaded"] is _library_loaded()


def _library_loaded() -> bool:
    from qwen_resnorm_fp4 import _library

    return _library.cuda_available()


def test_info_shows_switches(monkeypatch):
    monkeypatch.setenv("QWEN_FP4_DISABLE", "1")
    monkeypatch.setenv("FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH", "1")
    doc = info.collect_info()
    assert doc["switches"].get("QWEN_FP4_DISABLE") == "1"
    assert doc["fast_math_default"] is False


def test_demo_cpu():
    p = run_cli("demo", "--device", "cpu", "--rows-image", "64", "--rows-text", "17", "--dim", "256", "--reps", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "image stream" in p.stdout and "text  stream" in p.stdout
    assert p.stdout.count("byte-exact: yes") == 2, p.stdout


def test_demo_default_runs_as_the_readme_says():
    """`python -m qwen_resnorm_fp4 demo` with no arguments (the README's quickstart line)."""
    p = run_cli("demo")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("byte-exact: yes") == 2, p.stdout


def test_demo_cpu_json():
    p = run_cli("demo", "--device", "cpu", "--rows-image", "32", "--rows-text", "5", "--dim", "128", "--reps", "1",
                "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(p.stdout)
    assert [s["stream"] for s in doc["streams"]] == ["image", "text"]
    for s in doc["streams"]:
        assert s["byte_exact"]
        assert 0 < s["dequant_rel_rms"] < 0.2  # NVFP4 of Gaussian-like data: ~0.1


def test_demo_cuda_unavailable(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["demo", "--device", "cuda", "--dim", "128"]) == 2
    assert "cuda" in capsys.readouterr().err.lower()


@pytest.mark.parametrize("dim", ["0", "100", "16448"])
def test_demo_rejects_unsupported_width(dim, capsys):
    """The kernels' width rule (a positive multiple of 64, at most 16384), as a clean exit 2 naming --dim."""
    assert cli.main(["demo", "--device", "cpu", "--dim", dim, "--reps", "1"]) == 2
    err = capsys.readouterr().err
    assert "--dim must be a positive multiple of 64, at most 16384, got " + dim in err


@pytest.mark.parametrize("argv", [
    ["demo", "--reps", "0"], ["demo", "--reps", "-1"], ["demo", "--rows-text", "0"], ["demo", "--rows-image", "-5"],
    ["demo", "--reps", "two"], ["bench", "--reps", "0"], ["bench", "--reps", "-3"], ["bench", "--rows", "17,0"],
    ["bench", "--dims", "-64"],
])
def test_counts_must_be_positive(argv, capsys):
    """A count of zero, a negative one or a non-number is refused by argparse (exit 2, the option named in
    the message), before anything is printed on stdout."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"argument {argv[1]}: expected" in err and "positive integer" in err, err


def test_demo_refused_count_prints_only_the_error():
    """`demo --reps -1` prints the usage error and nothing else (no banner)."""
    p = run_cli("demo", "--reps", "-1")
    assert p.returncode == 2
    assert p.stdout == ""
    assert "argument --reps: expected a positive integer, got -1" in p.stderr
    assert "on CPU" not in p.stderr and "device:" not in p.stderr


def test_demo_refused_width_prints_no_banner(capsys):
    """A refused --dim is reported before the demo's banner lines."""
    assert cli.main(["demo", "--device", "cpu", "--dim", "100"]) == 2
    assert capsys.readouterr().out == ""


def test_version(capsys):
    from qwen_resnorm_fp4 import __version__

    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"qwen_resnorm_fp4 {__version__}"
    p = run_cli("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"qwen_resnorm_fp4 {__version__}", p.stdout + p.stderr


def test_console_script_entry_point():
    """pyproject's console script names a callable that exists: qwen_resnorm_fp4.cli:main."""
    text = (ROOT / "pyproject.toml").read_text() if (ROOT / "pyproject.toml").exists() else None
    if text is None:
        pytest.skip("pyproject.toml not in this checkout")
    assert 'qwen-resnorm-fp4 = "qwen_resnorm_fp4.cli:main"' in text
    assert callable(cli.main)


def test_bench_does_not_import_cli():
    """The benchmark and the command line do not import each other's modules: bench imports info."""
    code = "import sys, qwen_resnorm_fp4.bench; print('qwen_resnorm_fp4.cli' in sys.modules)"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stdout + p.stderr


def test_check_targets_help_names_the_published_goals(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "performance goals (docs/performance.md)" in out
    assert "issue" not in out


@pytest.mark.parametrize("dims", ["16448", "3072,96"])
def test_bench_rejects_unsupported_width_before_needing_a_gpu(dims, capsys):
    assert bench.main(["--dims", dims]) == 2
    assert "--dims: D must be a positive multiple of 64, at most 16384, got " in capsys.readouterr().err


def test_bench_on_cpu_exits_2():
    p = run_cli("bench", "--quick")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "GPU only" in p.stderr


def test_bench_help(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--check-targets" in out and "--quick" in out


def test_bench_in_process_without_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["bench", "--quick", "--out", "/nonexistent/never-written"]) == 2
    assert "GPU only" in capsys.readouterr().err


def test_bench_script_on_cpu_exits_2():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_resnorm_quant.py")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "GPU only" in p.stderr


def test_bytes_moved_formula():
    d = 3072
    # Per row: residual + x read (2 * D * 2) + residual_out (D * 2) + packed (D / 2) + scales (D / 16).
    per_row = 2 * d * 2 + d * 2 + d // 2 + d // 16
    assert per_row == 20_160
    for m in (128, 4096, 32768):
        assert bench.bytes_moved(m, d) == per_row * m
    # Scale rows are padded to a multiple of 128.
    for m in (1, 17, 4097, 6889):
        assert bench.bytes_moved(m, d) == (2 * d * 2 + d * 2 + d // 2) * m + d // 16 * round_up(m, 128)
    assert bench.bytes_moved(256, 5120) == 256 * (4 * 5120 + 2 * 5120 + 2560 + 320)


@pytest.mark.parametrize("cap,archs,expected", [
    ((10, 0), ["90a", "100f", "120f", "compute_90"], info.PATH_BLACKWELL),
    ((10, 3), ["90a", "100f", "120f", "compute_90"], info.PATH_BLACKWELL),
    ((12, 0), ["90a", "100f", "120f", "compute_90"], info.PATH_BLACKWELL),
    ((12, 1), ["90a", "100f", "120f", "compute_90"], info.PATH_BLACKWELL),
    ((9, 0), ["90a", "100f", "120f", "compute_90"], info.PATH_PORTABLE),
    ((11, 0), ["90a", "100f", "120f", "compute_90"], info.PATH_PORTABLE_JIT),  # no sm_110 cubin: PTX
    ((10, 3), ["90a", "100a", "compute_90"], info.PATH_PORTABLE_JIT),  # an 'a' cubin does not run on a sibling
    ((12, 0), ["90a", "compute_90"], info.PATH_PORTABLE_JIT),
])
def test_kernel_path(cap, archs, expected):
    assert info.kernel_path(cap, archs, library_loaded=True, choice="auto", emulation=False) == expected


ARCHS = ["90a", "100f", "120f", "compute_90"]


@pytest.mark.parametrize("cap,archs,choice,emulation,expected", [
    ((10, 0), ARCHS, "portable", False, info.PATH_PORTABLE),
    ((10, 0), ARCHS, "blackwell", False, info.PATH_BLACKWELL),
    ((12, 0), ["90a", "compute_90"], "portable", False, info.PATH_PORTABLE_JIT),
    ((9, 0), ["90a"], "auto", True, info.PATH_BLACKWELL_EMULATED),
    ((9, 0), ["90a"], "blackwell", True, info.PATH_BLACKWELL_EMULATED),
    ((9, 0), ["90a"], "portable", True, info.PATH_PORTABLE),
])
def test_kernel_path_switch(cap, archs, choice, emulation, expected):
    assert info.kernel_path(cap, archs, library_loaded=True, choice=choice, emulation=emulation) == expected


def test_kernel_path_switch_blackwell_unusable_and_unknown(monkeypatch):
    for cap, archs, emulation in (((9, 0), ARCHS, False), ((12, 0), ["90a", "compute_90"], False),
                                  ((10, 0), ["90a"], True)):
        path = info.kernel_path(cap, archs, library_loaded=True, choice="blackwell", emulation=emulation)
        assert path.startswith("error: kernel path blackwell"), path
    monkeypatch.setenv("QWEN_FP4_KERNEL_PATH", "Blackwell")
    with pytest.raises(ValueError, match="QWEN_FP4_KERNEL_PATH must be one of auto, portable, blackwell"):
        env.kernel_path_from_env()
    path = info.kernel_path((10, 0), ARCHS, library_loaded=True, choice="Blackwell", emulation=False)
    assert path.startswith("error: QWEN_FP4_KERNEL_PATH must be one of"), path
    monkeypatch.setenv("QWEN_FP4_KERNEL_PATH", "")
    assert env.kernel_path_from_env() == "auto"


def test_info_reports_the_launch_options_in_force():
    before = q.launch_options()
    try:
        q.set_launch_options(kernel_path="portable")
        assert info.kernel_path((10, 0), ARCHS, library_loaded=True, emulation=False) == info.PATH_PORTABLE
        assert info.collect_info()["kernel_path_switch"] == "portable"
        q.set_launch_options(kernel_path="auto")
        assert info.kernel_path((10, 0), ARCHS, library_loaded=True, emulation=False) == info.PATH_BLACKWELL
        assert info.collect_info()["kernel_path_switch"] == "auto"
    finally:
        q.set_launch_options(*before)


def test_kernel_path_no_kernel_or_no_library():
    assert info.kernel_path((8, 9), ["90a", "compute_90"], library_loaded=True).startswith("none")
    assert info.kernel_path(None, ["90a"], library_loaded=False) == info.PATH_CPU
    assert info.kernel_path((9, 0), ["90a"], library_loaded=False).startswith(info.PATH_CPU)


def test_eager_chain_peer_on_cpu():
    """The benchmark's eager chain is a speed peer: right shapes, residual exact, quantization close."""
    from qwen_resnorm_fp4 import reference

    g = torch.Generator().manual_seed(0)
    rows, d = 130, 256
    res = torch.randn(1, rows, d, generator=g).bfloat16()
    x = torch.randn(1, rows, d, generator=g).bfloat16()
    gate, scale, shift = ((torch.randn(1, d, generator=g) * 0.3).bfloat16() for _ in range(3))
    y, r = reference.resnorm(res, x, None, gate, scale, shift, bench.EPS)
    gs = (448.0 * 6.0 / y.float().abs().amax()).reshape(1)
    p0, s0 = reference.nvfp4_quantize(y, gs, False)
    bounds = torch.tensor(bench._E2M1_BOUNDS)
    p1, s1, r1 = bench.eager_chain(res, x, gate, scale, shift, gs, bench.sf_index(rows, d, "cpu"), bounds)
    assert p1.shape == p0.shape and s1.shape == s0.shape and p1.dtype == s1.dtype == torch.uint8
    assert torch.equal(r1, r)
    assert (p1 == p0).float().mean() > 0.95
    assert (s1 == s0).float().mean() > 0.95
    used = torch.zeros(s1.numel(), dtype=torch.bool)
    used[bench.sf_index(rows, d, "cpu")] = True
    assert not s1.reshape(-1)[~used].any()  # the padding rows' scales (swizzled) stay zero


def test_check_targets_logic():
    def row(m, frac, su, sc, exact=True):
        return {"dim": 3072, "rows": m, "fused_frac_copy": frac, "speedup_vs_unfused": su,
                "speedup_vs_compiled": sc, "compiled_us": 1.0, "byte_exact": exact}

    rows = [row(17, 0.1, 1.6, 2.0), row(1024, 0.8, 1.3, 3.0), row(4096, 0.92, 1.25, 6.0)]
    res = {n: v for n, v, _ in bench.check_targets(rows, {(3072, 17): {"fused": 3.5, "unfused": 6.0}})}
    assert set(res.values()) == {"PASS"}, res
    rows[2] = row(4096, 0.85, 1.1, 4.0, exact=False)
    res = {n: v for n, v, _ in bench.check_targets(rows, {(3072, 17): {"fused": 4.5, "unfused": 7.0}})}
    assert list(res.values()).count("FAIL") == 5, res
    assert res["fused >= 1.5x unfused at rows <= 256"] == "PASS", res


def test_check_targets_small_rows_use_graph_replay():
    """Rows <= 256: the graph-replay speedup decides where measured (the goals' rule: small-row GPU times
    come from CUDA-graph replay), the eager one elsewhere; the detail names both."""
    rows = [{"dim": 3072, "rows": m, "fused_frac_copy": 0.1, "speedup_vs_unfused": 1.2, "speedup_vs_compiled": 2.0,
             "compiled_us": 1.0, "byte_exact": True} for m in (17, 256)]
    name = "fused >= 1.5x unfused at rows <= 256"
    good = {(3072, 17): {"fused": 2.0, "unfused": 3.2}, (3072, 256): {"fused": 4.0, "unfused": 6.0}}
    verdicts = {n: (v, d) for n, v, d in bench.check_targets(rows, good)}
    assert verdicts[name][0] == "PASS" and "1.60x" in verdicts[name][1] and "eager events: min 1.20x" in verdicts[name][1]
    slow_256 = {**good, (3072, 256): {"fused": 4.0, "unfused": 5.6}}
    assert {n: v for n, v, _ in bench.check_targets(rows, slow_256)}[name] == "FAIL"
    only_17 = {(3072, 17): good[(3072, 17)]}  # 256 rows falls back to its eager 1.2x
    assert {n: v for n, v, _ in bench.check_targets(rows, only_17)}[name] == "FAIL"


def test_write_reports_without_gpu(tmp_path):
    """CSV, markdown table and (when matplotlib exists) the plot, from synthetic rows."""
    nan = float("nan")
    rows = [{"dim": 3072, "rows": m, "bytes": bench.bytes_moved(m, 3072), "n_sets": 1, "fused_us": 10.0,
             "fused_gbps": 4000.0, "fused_frac_copy": 0.9, "unfused_us": 15.0, "unfused_gbps": 2600.0,
             "eager_us": 200.0, "eager_gbps": 200.0, "compiled_us": nan, "compiled_gbps": nan,
             "speedup_vs_unfused": 1.5, "speedup_vs_eager": 20.0, "speedup_vs_compiled": nan, "byte_exact": True}
            for m in (17, 4096)]
    bench.write_csv(tmp_path / "results.csv", rows)
    assert (tmp_path / "results.csv").read_text().splitlines()[0].startswith("dim,rows,bytes")
    lines = bench.table_lines(rows)
    assert len(lines) == 4 and "n/a" in lines[2]
    msg = bench.write_png(tmp_path / "results.png", rows, 4400.0, "test")
    assert (msg is None) == (tmp_path / "results.png").exists()


def test_graph_table_and_big_rows_detail():
    """Graph-replay figures of many-row cases are reported (their own table, the 90% target's detail) but
    the 90% verdict stays on the per-call figures."""
    rows = [{"dim": 3072, "rows": 4096, "fused_frac_copy": 0.85, "speedup_vs_unfused": 1.5, "speedup_vs_compiled": 8.0,
             "compiled_us": 1.0, "byte_exact": True, "graph_fused_us": 21.0, "graph_fused_frac_copy": 0.95,
             "graph_copy_same_bytes_us": 20.5, "graph_copy_same_bytes_frac": 0.97, "graph_unfused_us": 35.0,
             "graph_speedup_vs_unfused": 35.0 / 21.0, "graph_calls": 20, "graph_resnorm_us": 26.0,
             "graph_quantize_us": 10.0},
            {"dim": 3072, "rows": 17, "fused_frac_copy": 0.02, "speedup_vs_unfused": 1.3, "speedup_vs_compiled": 2.0,
             "compiled_us": 1.0, "byte_exact": True}]
    lines = bench.graph_table_lines(rows)
    assert len(lines) == 3 and "| 3072 | 4096 | 20 | 21.00 | 95.0 | 20.50 | 97.0 | 35.00 | 1.67 |" in lines[2]
    verdicts = {n: (v, d) for n, v, d in bench.check_targets(rows, {})}
    v, detail = verdicts["fused >= 90% of copy bandwidth at rows >= 4096"]
    assert v == "FAIL" and "per-call events: 4096 rows 85.0%" in detail and "graph replay (not judged): 4096 rows 95.0%" in detail
    assert "copy of the same bytes" not in detail  # not measured in these rows: nothing claimed
    rows[0]["copy_same_bytes_frac"] = 0.86
    v, detail = {n: (v, d) for n, v, d in bench.check_targets(rows, {})}["fused >= 90% of copy bandwidth at rows >= 4096"]
    assert v == "FAIL" and "a copy of the same bytes, per call (not judged): 4096 rows 86.0%" in detail


def test_bench_names_the_commit_the_build_recorded(monkeypatch):
    """The benchmark's header names the commit setup.py recorded in the build (a wheel run on a machine
    without the checkout still names its code), or n/a when none was recorded."""
    monkeypatch.setattr(bench, "build_info", lambda: {"build_commit": "abc1234-dirty"})
    assert bench.git_commit() == "abc1234-dirty"
    monkeypatch.setattr(bench, "build_info", lambda: {"build_commit": None})
    assert bench.git_commit() == "n/a"


def test_copy_ceiling_is_the_best_pair(monkeypatch):
    """The ceiling is the highest of the buffer pairs' figures, each pair timed on its own buffers."""
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    seen = []

    def fake_measure(src, dst, reps):
        seen.append((src.data_ptr(), dst.data_ptr(), src.numel(), reps))
        return [4051.0, 4178.0, 4100.0][len(seen) - 1]

    ceiling, per_pair = bench.copy_ceiling_gbps(nbytes=4096, reps=7, pairs=3, measure=fake_measure)
    assert ceiling == 4178.0 and per_pair == [4051.0, 4178.0, 4100.0]
    assert len({ptr for s, d, _, _ in seen for ptr in (s, d)}) == 6  # six distinct buffers, all alive together
    assert all(n == 4096 and reps == 7 for _, _, n, reps in seen)


def test_copy_ceiling_uses_fewer_pairs_when_memory_runs_out(monkeypatch):
    """Where a third pair does not fit, the ceiling comes from the two that do."""
    monkeypatch.setattr(bench, "DEVICE", "cpu")
    real_empty, calls = torch.empty, []

    def empty(*args, **kwargs):  # the third source buffer does not fit
        calls.append(1)
        if len(calls) == 3:
            raise torch.cuda.OutOfMemoryError("out of memory")
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty)
    ceiling, per_pair = bench.copy_ceiling_gbps(nbytes=64, pairs=3, measure=lambda s, d, r: 1000.0)
    assert per_pair == [1000.0, 1000.0] and ceiling == 1000.0


def test_copy_ceiling_needs_one_pair(monkeypatch):
    """Not even one pair fits: the out-of-memory error reaches the caller."""
    monkeypatch.setattr(bench, "DEVICE", "cpu")

    def empty(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("out of memory")

    monkeypatch.setattr(torch, "empty", empty)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        bench.copy_ceiling_gbps(nbytes=64, pairs=3, measure=lambda s, d, r: 1.0)
