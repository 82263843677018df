#!/usr/bin/env python
"""Benchmark: a converted Qwen-Image's forward time per step under diffusers' context parallelism (Ulysses and
ring over N GPUs) against one GPU, with the correctness checks of scripts/context_parallel_check.py, which
it launches through torchrun:

    python benchmarks/bench_context_parallel.py                   # 2 GPUs, results in benchmarks/results/
    python benchmarks/bench_context_parallel.py --nproc 4 --out DIR -- --layers 4 --iters 50

Arguments after ``--`` go to the check script (its ``--help``). Results: DIR/context_parallel.{json,md}; the
markdown table is printed. The exit status is the check's.

The timing is the check script's own (CUDA events around each forward, median, warm L2), not timing.py's:
the script runs under torchrun on every rank, outside this directory.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "scripts" / "context_parallel_check.py"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="GPUs (processes), one host")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc),
           str(CHECK), "--out", str(args.out), *extra]
    print(" ".join(cmd), flush=True)
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
