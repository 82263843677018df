"""CPU tests of the command line (info, demo, the bench commands, --version), of its option checks and of the
install description it prints (qwen_resnorm_fp4.info). The benchmarks themselves: tests/package/test_benchmarks.py.

The command line runs in this process (``cli.main``, CUDA reported absent) wherever what is checked is its
output; a process of its own is started only where the process is the subject: ``python -m`` itself
(test_info_text), the modules a fresh interpreter loads, and a benchmark's child process importing the package
the command came from. The subprocesses run with CUDA hidden, importing the package under test, and take the CPU
paths on any machine. Their timeout is the suite's hang guard (helpers.session.HANG_GUARD_S), not a time budget:
nothing here depends on how fast a (possibly loaded) machine runs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
import torch

import qwen_resnorm_fp4 as q
from helpers.paths import PACKAGE_PARENT, REPO_ROOT, package_env
from helpers.session import HANG_GUARD_S
from helpers.tiers import sweep
from qwen_resnorm_fp4 import cli, env, info

ROOT = REPO_ROOT
#: Whether the package under test is this checkout's (the command line then finds the checkout's benchmarks/).
TESTING_THE_CHECKOUT = PACKAGE_PARENT == ROOT.resolve()
needs_the_checkout = pytest.mark.skipif(not TESTING_THE_CHECKOUT, reason=f"the package under test ({PACKAGE_PARENT}) "
                                        "is installed, not this checkout's: it has no benchmarks/ beside it")


def run_cli(*args: str, timeout: float = HANG_GUARD_S) -> subprocess.CompletedProcess:
    """``python -m qwen_resnorm_fp4 *args`` with CUDA hidden, importing the package under test (run from its
    directory: ``-m`` puts the working directory first on sys.path, where a checkout's own package would win)."""
    return subprocess.run([sys.executable, "-m", "qwen_resnorm_fp4", *args], cwd=PACKAGE_PARENT,
                          env=package_env(CUDA_VISIBLE_DEVICES=""),
                          capture_output=True, text=True, timeout=timeout)


def cli_here(monkeypatch, capfd, *args: str):
    """(exit status, stdout, stderr) of the command line run in this process (no process of its own to start)
    as on a machine without a GPU (CUDA reported absent here, hidden from a benchmark's child process), a
    benchmark command running this checkout's benchmarks/ whether the package imported here is the checkout's
    or an installed one."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv(cli.BENCHMARKS_DIR_VAR, str(ROOT / "benchmarks"))
    status = cli.main(list(args))
    out, err = capfd.readouterr()
    return status, out, err


def test_info_text():
    """``python -m qwen_resnorm_fp4 info`` in a process of its own with CUDA hidden: the module entry point."""
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


def test_info_json(monkeypatch, capfd):
    status, out, err = cli_here(monkeypatch, capfd, "info", "--json")
    assert status == 0, err
    doc = json.loads(out)
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


def test_demo_cpu(monkeypatch, capfd):
    status, out, err = cli_here(monkeypatch, capfd, "demo", "--device", "cpu", "--rows-image", "64", "--rows-text",
                                "17", "--dim", "256", "--reps", "1")
    assert status == 0, out + err
    assert "image stream" in out and "text  stream" in out
    assert out.count("byte-exact: yes") == 2, out


def test_demo_default_runs_as_the_readme_says(monkeypatch, capsys):
    """`python -m qwen_resnorm_fp4 demo` with no arguments (the README's quickstart line), as on a machine without
    a GPU (the CPU reference at its default size); the demo's time per call is printed, never checked."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert f"{cli.CPU_DEFAULT_IMAGE_ROWS} image rows instead of 4096" in out, out
    assert out.count("byte-exact: yes") == 2, out


def test_demo_cpu_json(monkeypatch, capfd):
    status, out, err = cli_here(monkeypatch, capfd, "demo", "--device", "cpu", "--rows-image", "32", "--rows-text",
                                "5", "--dim", "128", "--reps", "1", "--json")
    assert status == 0, out + err
    doc = json.loads(out)  # --json: the JSON document alone on stdout
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
    ["demo", "--reps", "two"],
])
def test_counts_must_be_positive(argv, monkeypatch, capsys):
    """A count of zero, a negative one or a non-number is refused by argparse (exit 2, the option named in
    the message) before anything else is printed: no banner (its device line), nothing on stdout."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"argument {argv[1]}: expected" in err and "positive integer" in err, err
    assert "on CPU" not in err and "device:" not in err, err


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


def test_console_script_entry_point():
    """pyproject's console script names a callable that exists: qwen_resnorm_fp4.cli:main."""
    text = (ROOT / "pyproject.toml").read_text() if (ROOT / "pyproject.toml").exists() else None
    if text is None:
        pytest.skip("pyproject.toml not in this checkout")
    assert 'qwen-resnorm-fp4 = "qwen_resnorm_fp4.cli:main"' in text
    assert callable(cli.main)


def run_from(cwd: Path, pythonpath: Optional[str], *args: str, extra_env=None) -> subprocess.CompletedProcess:
    """``python -m qwen_resnorm_fp4 *args`` in ``cwd`` with CUDA hidden, PYTHONPATH (None: unset) and no
    QWEN_FP4_BENCHMARKS unless ``extra_env`` sets it."""
    env = {k: v for k, v in os.environ.items() if k not in (cli.BENCHMARKS_DIR_VAR, "PYTHONPATH")}
    env.update(CUDA_VISIBLE_DEVICES="", **(extra_env or {}))
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-m", "qwen_resnorm_fp4", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=HANG_GUARD_S)


def test_the_cli_imports_no_benchmark():
    """Running the command line (info --json) in a fresh interpreter loads none of the benchmark modules, and
    its stdout is the JSON document alone (nothing printed when the package loads)."""
    code = ("import sys, qwen_resnorm_fp4.cli as c; c.main(['info', '--json']); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('bench_fused', 'timing', 'results', 'harness', 'peers') or '.bench' in m))")
    p = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE_PARENT, env=package_env(CUDA_VISIBLE_DEVICES=""),
                       capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert p.returncode == 0 and p.stdout.strip().splitlines()[-1] == "[]", p.stdout + p.stderr
    assert json.loads("\n".join(p.stdout.strip().splitlines()[:-1]))["gpus"] == [], p.stdout


@needs_the_checkout
@pytest.mark.parametrize("command, script", sorted(cli.BENCHMARKS.items()))
def test_bench_commands_find_the_checkouts_benchmarks(command, script):
    directory, why = cli.find_benchmarks()
    assert directory == ROOT / "benchmarks" and why == ""
    assert (directory / script).is_file()


@needs_the_checkout
def test_bench_help_from_the_checkout():
    p = run_cli("bench", "--help")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "--no-compile" in p.stdout and "--quick" in p.stdout and "--check-targets" not in p.stdout


@pytest.mark.parametrize("command", sorted(cli.BENCHMARKS))
def test_each_bench_command_runs_its_script(command, monkeypatch):
    """Each benchmark command runs its own script of the checkout's benchmarks/ in a child process of this
    interpreter, with the arguments as given and this package importable there, and exits with the child's
    status. (Each script's --help: tests/package/test_benchmarks.py; the whole command as processes, the child
    included: test_bench_help_from_the_checkout and the tests below.)"""
    calls = []

    def child(argv, env):
        calls.append((argv, env))
        return 7

    monkeypatch.setattr(cli.subprocess, "call", child)
    monkeypatch.setenv(cli.BENCHMARKS_DIR_VAR, str(ROOT / "benchmarks"))
    assert cli.main([command, "--help", "--out", "x"]) == 7
    ((argv, env),) = calls
    script = (ROOT / "benchmarks" / cli.BENCHMARKS[command]).resolve()
    assert argv == [sys.executable, str(script), "--help", "--out", "x"]
    package_parent = str(Path(cli.__file__).resolve().parent.parent)
    on_path = env.get("PYTHONPATH", "").split(os.pathsep) + [str(Path(p or ".").resolve()) for p in sys.path[1:]]
    assert package_parent in on_path  # the child imports the package this command line runs


def test_bench_on_cpu_exits_2(monkeypatch, capfd):
    status, out, err = cli_here(monkeypatch, capfd, "bench", "--quick")
    assert status == 2, out + err
    assert "GPU only" in err


@pytest.mark.exhaustive  # a second benchmark child process; what it composes is checked in-process by default
def test_bench_option_errors_are_the_benchmarks(monkeypatch, capfd):
    """The benchmark's child process parses its own options: a refused option is its usage error and exit
    status (the forwarding: test_each_bench_command_runs_its_script; every script's option rules:
    tests/package/test_benchmarks.py)."""
    status, out, err = cli_here(monkeypatch, capfd, "bench", "--reps", "0")
    assert status == 2 and "argument --reps: expected a positive integer" in err, err


@pytest.fixture
def package_copy(tmp_path):
    """This package copied alone into a directory with no checkout around it (as an installed wheel sits)."""
    import shutil

    shutil.copytree(PACKAGE_PARENT / "qwen_resnorm_fp4", tmp_path / "site" / "qwen_resnorm_fp4",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "site"


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The command line in this process as an installed package sees itself: its directory in a site directory
    with no checkout around it, and no QWEN_FP4_BENCHMARKS."""
    site = tmp_path / "site"
    (site / "qwen_resnorm_fp4").mkdir(parents=True)
    monkeypatch.setattr(cli, "_PACKAGE_DIR", site / "qwen_resnorm_fp4")
    monkeypatch.delenv(cli.BENCHMARKS_DIR_VAR, raising=False)
    return site


@pytest.mark.parametrize("command", ["bench", "bench-gemm"])
def test_bench_outside_a_checkout_says_how(installed, command, capsys):
    assert cli.main([command, "--help"]) == 2
    out, err = capsys.readouterr()
    assert "the benchmarks are not part of the installed package" in err
    assert f"python benchmarks/{cli.BENCHMARKS[command]} --help" in err
    assert cli.BENCHMARKS_DIR_VAR in err and out == ""


def test_bench_outside_a_checkout_with_the_variable(installed, monkeypatch, capsys):
    """QWEN_FP4_BENCHMARKS points an installed package at a checkout's benchmarks/; a directory without the
    scripts is refused by name."""
    monkeypatch.setenv(cli.BENCHMARKS_DIR_VAR, str(ROOT / "benchmarks"))
    assert cli.find_benchmarks() == ((ROOT / "benchmarks").resolve(), "")
    monkeypatch.setenv(cli.BENCHMARKS_DIR_VAR, str(installed))
    assert cli.main(["bench", "--help"]) == 2
    assert f"has no {cli.BENCHMARKS['bench']}" in capsys.readouterr().err


#: How the command line's process found the installed package: on PYTHONPATH, or as the working directory of
#: ``python -m`` (sys.path[0], which the child does not inherit).
FOUND_BY = {"pythonpath": lambda site: (site.parent, str(site)), "cwd": lambda site: (site, None)}


# by default the working directory: only there does the command line itself put the package on the child's path
@sweep("found_by", list(FOUND_BY), ["cwd"])
def test_benchmark_imports_the_package_the_cli_ran(package_copy, tmp_path, found_by):
    """An installed package's ``bench`` command (its own process, QWEN_FP4_BENCHMARKS set): the benchmark's
    child process imports the qwen_resnorm_fp4 the command line came from."""
    bench_dir = tmp_path / "bench"
    bench_dir.mkdir()
    (bench_dir / "bench_fused.py").write_text("import qwen_resnorm_fp4, sys; print(qwen_resnorm_fp4.__file__)\n")
    want = str(package_copy / "qwen_resnorm_fp4" / "__init__.py")
    cwd, pythonpath = FOUND_BY[found_by](package_copy)
    p = run_from(cwd, pythonpath, "bench", extra_env={cli.BENCHMARKS_DIR_VAR: str(bench_dir)})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == want, (cwd, p.stdout)


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


def test_kernel_path_without_build_info(monkeypatch):
    """A loaded library without its build info (an in-place build copied without _build_info.py) is not
    reported as one without GPU targets."""
    monkeypatch.setattr(info, "build_info", lambda: {"cuda_archs": None, "blackwell_emulation": False})
    assert info.kernel_path((9, 0), library_loaded=True, choice="auto") == info.PATH_UNRECORDED
    assert info.kernel_path((9, 0), [], library_loaded=True, choice="auto").startswith("none: this build")


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
