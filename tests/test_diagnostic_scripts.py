"""The diagnostic tools under scripts/ that docs/performance.md and docs/perf/tuning_history.md cite stay
usable as the kernels change: the patch scripts still find the code they edit (on a copy of csrc/), and the
memory-pattern benchmark still compiles (where nvcc is installed). CPU only; nothing here runs on a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
if not (SCRIPTS / "kernel_patch.py").is_file() or not (REPO / "csrc").is_dir():
    pytest.skip("scripts/ or csrc/ not present (tests copied without them)", allow_module_level=True)


def copy_of_sources(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(REPO / "csrc", root / "csrc")
    return root


@pytest.mark.parametrize("script,env", [
    ("arithmetic_free_patch.py", {}),
    ("cta_timestamps_patch.py", {}),
    ("cta_phases_patch.py", {}),
    ("cta_phases_patch.py", {"CTA_PHASES_NO_SPLIT": "1"}),
    ("load_policy_patch.py", {"LOAD_ROW_NO_L1": "none"}),
    ("load_policy_patch.py", {"LOAD_ROW_NO_L1": "all", "LOAD_QUALIFIER": "L1::evict_first"}),
])
def test_patch_script_applies_to_a_copy(tmp_path: Path, script: str, env: dict) -> None:
    root = copy_of_sources(tmp_path)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    run = subprocess.run([sys.executable, str(SCRIPTS / script), str(root)], capture_output=True, text=True,
                         env={**os.environ, **env})
    assert run.returncode == 0, run.stdout + run.stderr
    changed = [p for p, b in before.items() if p.read_bytes() != b]
    assert changed, f"{script} changed nothing"
    assert (REPO / "csrc" / "resnorm_kernel.cuh").read_bytes() != (root / "csrc" / "resnorm_kernel.cuh").read_bytes()


def test_patch_script_refuses_the_checkout() -> None:
    run = subprocess.run([sys.executable, str(SCRIPTS / "arithmetic_free_patch.py"), str(REPO)],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "never the checkout" in run.stdout + run.stderr


def test_memory_pattern_bench_compiles(tmp_path: Path) -> None:
    sys.path.insert(0, str(SCRIPTS))
    try:
        from check_wheel import find_tool  # the wheel check's search for CUDA tools
    finally:
        sys.path.remove(str(SCRIPTS))
    nvcc = find_tool("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc (CUDA toolkit)")
    out = tmp_path / "memory_pattern_bench"
    run = subprocess.run([nvcc, "-O3", "-std=c++17", "-arch=sm_90a", "-o", str(out),
                          str(SCRIPTS / "memory_pattern_bench.cu")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert out.stat().st_size > 0


def test_ncu_traffic_script_names_existing_patterns() -> None:
    """scripts/ncu_traffic.sh is valid bash and its default PATTERNS are variants the pattern program has
    (the program refuses unknown names in ONLY; this catches a rename here, on the CPU)."""
    script = SCRIPTS / "ncu_traffic.sh"
    run = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    default = next(line for line in script.read_text().splitlines() if line.startswith("PATTERNS="))
    names = default.split(":-", 1)[1].rstrip("}").split(",")
    bench = (SCRIPTS / "memory_pattern_bench.cu").read_text()
    assert len(names) >= 2
    for name in names:
        assert f'("{name}"' in bench, f"{name} is not a variant of memory_pattern_bench.cu"


def test_placement_probe_help_and_gpu_check() -> None:
    """The placement probe parses its options on any machine and refuses to run without a GPU."""
    run = subprocess.run([sys.executable, str(SCRIPTS / "placement_probe.py"), "--help"], capture_output=True,
                         text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert "--gemm-between" in run.stdout and "--before" in run.stdout and "--hold" in run.stdout
    run = subprocess.run([sys.executable, str(SCRIPTS / "placement_probe.py"), "--hold", "-1"], capture_output=True,
                         text=True, cwd=REPO)
    assert run.returncode == 2 and "--hold must be 0 or more" in run.stderr
    import torch

    if torch.cuda.is_available():
        return
    run = subprocess.run([sys.executable, str(SCRIPTS / "placement_probe.py"), "--first-only"], capture_output=True,
                         text=True, cwd=REPO)
    assert run.returncode != 0 and "CUDA GPU" in run.stderr
