#!/usr/bin/env python
"""Benchmark of the fused resnorm_quant op (GPU only). The logic lives in qwen_resnorm_fp4.bench so that an
installed wheel runs the same thing: ``python -m qwen_resnorm_fp4 bench [options]``.

    python benchmarks/bench_resnorm_quant.py                 # full set, D = 3072 and 5120 (~3-4 min on H200)
    python benchmarks/bench_resnorm_quant.py --quick         # a subset at D = 3072
    python benchmarks/bench_resnorm_quant.py --check-targets # PASS/FAIL per target at D = 3072

Results: benchmarks/results/results.{csv,md,png} (--out DIR to change).

Which package it imports: this checkout's when it was built in place (``_C*.so`` next to it), or when no
installed qwen_resnorm_fp4 has the benchmark module; otherwise the installed one (e.g. a wheel, whose
kernels a non-built checkout lacks).
"""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _use_checkout() -> bool:
    src = ROOT / "qwen_resnorm_fp4"
    if not (src / "__init__.py").is_file():
        return False
    if any(src.glob("_C*.so")):
        return True
    spec = importlib.util.find_spec("qwen_resnorm_fp4")  # top level only: imports nothing
    if spec is None or spec.origin is None:
        return True
    return not (Path(spec.origin).parent / "bench.py").is_file()


if _use_checkout():
    sys.path.insert(0, str(ROOT))

from qwen_resnorm_fp4.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
