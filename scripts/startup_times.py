"""What the test suite's fixed costs are on this machine: the wall time of a fresh interpreter (bare, importing
torch, importing this package; CUDA hidden, as the tests' subprocesses run; and with the bytecode cache moved to
a writable directory, ``PYTHONPYCACHEPREFIX``) and of a first CPU inductor
compilation with an empty cache (with inductor's default compile workers, and with one), and the CPU threads
torch uses. One line each; ``scripts/gpu_check.sh startup`` runs it.

    python scripts/startup_times.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

COLD_INDUCTOR = """
import time, torch
t = time.perf_counter()
f = torch.compile(lambda x: (x.float() * 2 + 1).relu().sum(-1), fullgraph=True)
f(torch.randn(64, 256).bfloat16())
print(f"{time.perf_counter() - t:.2f}")
"""


def wall(code: str, **env: str) -> float:
    """Seconds of ``python -c code`` with CUDA hidden and ``env`` set, from start to exit."""
    child = dict(os.environ, CUDA_VISIBLE_DEVICES="", **env)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=child, check=True, capture_output=True, text=True)
    return time.perf_counter() - t


def first_compile(**env: str) -> str:
    """The seconds of a small CPU inductor compilation's first call and of its whole process, empty cache."""
    with tempfile.TemporaryDirectory() as cache:
        child = dict(os.environ, CUDA_VISIBLE_DEVICES="", TORCHINDUCTOR_CACHE_DIR=cache, **env)
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", COLD_INDUCTOR], env=child, check=True, capture_output=True,
                             text=True).stdout.strip().splitlines()[-1]
        return f"{out} s first call, {time.perf_counter() - t:.2f} s process"


def main() -> int:
    import torch

    print(f"cpu count {os.cpu_count()}, torch threads {torch.get_num_threads()}, PYTHONDONTWRITEBYTECODE="
          f"{os.environ.get('PYTHONDONTWRITEBYTECODE', '(unset)')}, torch's bytecode cached beside it: "
          f"{os.path.isdir(os.path.join(os.path.dirname(torch.__file__), '__pycache__'))}")
    for label, code in (("bare", "pass"), ("import torch", "import torch"),
                        ("import qwen_resnorm_fp4", "import qwen_resnorm_fp4")):
        print(f"{label}: {wall(code):.2f} s (second run {wall(code):.2f} s)")
    with tempfile.TemporaryDirectory() as prefix:  # where site-packages' bytecode cannot be written, it can here
        first, second = (wall("import qwen_resnorm_fp4", PYTHONPYCACHEPREFIX=prefix, PYTHONDONTWRITEBYTECODE="")
                         for _ in range(2))
        print(f"import qwen_resnorm_fp4 with PYTHONPYCACHEPREFIX: {first:.2f} s, then {second:.2f} s")
    print(f"CPU inductor, cold cache, default workers: {first_compile()}")
    one = first_compile(TORCHINDUCTOR_COMPILE_THREADS="1")
    print(f"CPU inductor, cold cache, TORCHINDUCTOR_COMPILE_THREADS=1: {one}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
