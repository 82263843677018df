#!/usr/bin/env python
"""Every benchmark of docs/performance.md in one go, each in its own process (as when run alone), each
writing into ``--out``; prints one summary line per benchmark and exits with the highest exit status.

    python benchmarks/run_all.py --out DIR [--quick] [--only fused,pdl]

``--quick`` goes to the benchmarks that take it (``bench_fused``, ``bench_fp8`` and ``bench_model``). The
benchmarks print measurements; a benchmark exits 1 when one of its correctness checks fails (bytes that should
be equal differ, or a check was not made), 2 when it cannot run here (no GPU, or a build without the FP8 ops for
the FP8 benchmarks).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
#: name -> (script, options it takes from this command line)
BENCHMARKS: Dict[str, tuple] = {
    "fused": ("bench_fused.py", ("--quick",)),
    "fp8": ("bench_fp8.py", ("--quick",)),
    "pdl": ("bench_pdl.py", ()),
    "per_token": ("bench_per_token.py", ()),
    "gemm": ("bench_gemm.py", ()),
    "fp8_linear": ("bench_fp8_linear.py", ()),
    "model": ("bench_model.py", ("--quick",)),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run_all", description="Run every benchmark (GPU only), each into --out.")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="output directory")
    p.add_argument("--quick", action="store_true", help="the short variants where a benchmark has one")
    p.add_argument("--only", type=lambda s: [n for n in s.split(",") if n], default=None,
                   help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    return p


def commands(args: argparse.Namespace) -> List[tuple]:
    """(name, argv) of each benchmark to run."""
    names = args.only or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ValueError(f"--only: unknown benchmark {unknown[0]!r} (known: {', '.join(BENCHMARKS)})")
    out = []
    for name in names:
        script, takes = BENCHMARKS[name]
        argv = [sys.executable, str(HERE / script), "--out", str(args.out)]
        argv += [opt for opt in takes if getattr(args, opt.lstrip("-").replace("-", "_"))]
        out.append((name, argv))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        todo = commands(args)
    except ValueError as exc:
        parser.error(str(exc))
    summary = []
    for name, cmd in todo:
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd)
        summary.append((name, rc, time.perf_counter() - t0))
    print("\nsummary:")
    for name, rc, s in summary:
        print(f"  {name}: exit {rc} ({s:.0f} s)")
    return max(rc for _, rc, _ in summary)


if __name__ == "__main__":
    sys.exit(main())
