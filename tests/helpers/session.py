"""What this session can run and how it runs it: the machine rules behind the markers, the session guard, the
seed, and the hang guard of subprocesses. tests/conftest.py's hooks and fixture apply them.

- ``gpu_skip_reason()``, ``marker_skip_reasons()``: why tests marked ``gpu`` / ``blackwell`` /
  ``blackwell_emulation`` cannot run here (None: they can); ``CPU_ONLY_VAR`` (``QWEN_FP4_TEST_CPU_ONLY=1``) skips
  them deliberately on a GPU machine.
- ``what_runs()``: (the line saying what this session tests, the reason to refuse the session or None): a GPU
  machine that cannot load the compiled kernels is refused rather than passing by skipping.
- ``draw_seed()``: the ``seed`` fixture's value: fresh, or ``QWEN_FP4_TEST_SEED`` (``SEED_VAR``).
- ``HANG_GUARD_S``: the timeout of the suite's subprocesses: a guard against a hang, never a time budget.
- ``cache_child_bytecode()``: where the installed torch has no bytecode cached beside its sources, one writable
  bytecode cache for every child interpreter of the session (``PYTHONPYCACHEPREFIX``).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Dict, Optional

import pytest
import torch

#: The timeout of every subprocess the tests start: a guard that turns a hang into a failure, not a time limit
#: (a loaded machine may take minutes where an idle one takes seconds).
HANG_GUARD_S = 1800

#: The bytecode cache of the session's child interpreters where torch has none beside its sources (kept between
#: sessions: Python checks each entry against its source).
CHILD_BYTECODE_CACHE = Path(tempfile.gettempdir()) / "qwen_fp4_test_pycache"


def cache_child_bytecode() -> Optional[Path]:
    """Where the installed torch has no cached bytecode beside its sources (an install without compiled bytecode
    in a directory Python does not write to, or PYTHONDONTWRITEBYTECODE set), every interpreter the suite starts
    (the command line's, the fresh-interpreter tests', inductor's compile workers) compiles torch's sources again,
    seconds each: point the children at one writable cache (PYTHONPYCACHEPREFIX, and bytecode writing on), which
    the first fills and the others read. Changes this process's environment only for its children; returns the
    directory, or None where torch's bytecode is cached already or the environment names a cache (nothing
    changed)."""
    if os.environ.get("PYTHONPYCACHEPREFIX") or os.path.exists(importlib.util.cache_from_source(torch.__file__)):
        return None
    CHILD_BYTECODE_CACHE.mkdir(exist_ok=True)
    os.environ["PYTHONPYCACHEPREFIX"] = str(CHILD_BYTECODE_CACHE)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return CHILD_BYTECODE_CACHE


#: Set to an integer to rerun tests with that seed (a failing test's report names its seed).
SEED_VAR = "QWEN_FP4_TEST_SEED"


def draw_seed() -> int:
    """A fresh random 32-bit seed, or the value of ``QWEN_FP4_TEST_SEED`` (a UsageError if not an integer)."""
    text = os.environ.get(SEED_VAR, "").strip()
    if not text:
        return int.from_bytes(os.urandom(4), "little")
    try:
        return int(text, 0)
    except ValueError:
        raise pytest.UsageError(f"{SEED_VAR} must be an integer, got {text!r}") from None


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


def marker_skip_reasons() -> Dict[str, Optional[str]]:
    """Why each of the markers gpu, blackwell, blackwell_emulation skips here, by marker (None: it runs)."""
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


def what_runs() -> tuple:
    """(one-line description of what this session tests, reason to refuse it or None)."""
    import qwen_resnorm_fp4
    from qwen_resnorm_fp4 import _library

    where = f"qwen_resnorm_fp4 from {os.path.dirname(qwen_resnorm_fp4.__file__)}: {_library.status()}"
    if os.environ.get("PYTHONPYCACHEPREFIX") == str(CHILD_BYTECODE_CACHE):
        where += f" (child interpreters cache bytecode in {CHILD_BYTECODE_CACHE}: torch has none cached)"
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
