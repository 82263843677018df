"""What the test suite's fixed costs are on this machine: the wall time of a fresh interpreter (bare, importing
torch, importing this package; CUDA hidden, as the tests' subprocesses run; and with the bytecode cache moved to
a writable directory, ``PYTHONPYCACHEPREFIX``) and of a first CPU inductor
compilation with an empty cache (with inductor's default compile workers, and with one), and the CPU threads
torch uses. One line each; ``scripts/gpu_check.sh startup`` runs it.

    python scripts/startup_times.py
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from typing import Tuple

COLD_INDUCTOR = """
import time, torch
t = time.perf_counter()
f = torch.compile(lambda x: (x.float() * 2 + 1).relu().sum(-1), fullgraph=True)
f(torch.randn(64, 256).bfloat16())
print(f"{time.perf_counter() - t:.2f}")
"""


def child(code: str, **env: str) -> Tuple[float, str]:
    """(seconds from start to exit, stdout) of ``python -c code`` with CUDA hidden and ``env`` set."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, CUDA_VISIBLE_DEVICES="", **env),
                         check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - t, out


def first_compile(**env: str) -> str:
    """The seconds of a small CPU inductor compilation's first call and of its whole process, empty cache."""
    with tempfile.TemporaryDirectory() as cache:
        seconds, out = child(COLD_INDUCTOR, TORCHINDUCTOR_CACHE_DIR=cache, **env)
        return f"{out.strip().splitlines()[-1]} s first call, {seconds:.2f} s process"


def main() -> int:
    import torch

    cached = os.path.exists(importlib.util.cache_from_source(torch.__file__))  # helpers.session's rule
    print(f"cpu count {os.cpu_count()}, torch threads {torch.get_num_threads()}, PYTHONDONTWRITEBYTECODE="
          f"{os.environ.get('PYTHONDONTWRITEBYTECODE', '(unset)')}, torch's bytecode cached beside it: {cached}")
    for label, code in (("bare", "pass"), ("import torch", "import torch"),
                        ("import qwen_resnorm_fp4", "import qwen_resnorm_fp4")):
        print(f"{label}: {child(code)[0]:.2f} s (second run {child(code)[0]:.2f} s)")
    with tempfile.TemporaryDirectory() as prefix:  # where site-packages' bytecode cannot be written, it can here
        first, second = (child("import qwen_resnorm_fp4", PYTHONPYCACHEPREFIX=prefix, PYTHONDONTWRITEBYTECODE="")[0]
                         for _ in range(2))
        print(f"import qwen_resnorm_fp4 with PYTHONPYCACHEPREFIX: {first:.2f} s, then {second:.2f} s")
    print(f"CPU inductor, cold cache, default workers: {first_compile()}")
    one = first_compile(TORCHINDUCTOR_COMPILE_THREADS="1")
    print(f"CPU inductor, cold cache, TORCHINDUCTOR_COMPILE_THREADS=1: {one}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
