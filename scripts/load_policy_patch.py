"""Diagnostic only (docs/perf/tuning_history.md, items 14 and 15): edits a *copy* of the source tree to change
which row kernels load x and residual without allocating in L1, and with which PTX qualifier, for same-run
A/B by scripts/shape_sweep.sh. The output bytes do not change (only the cache policy of the loads).

    LOAD_ROW_NO_L1=all|none   every row kernel (the many-rows shapes too) / none of them
                              (default: keep the shipped rule, kLoadRowNoL1)
    LOAD_QUALIFIER=...        the qualifier of load_stream_no_l1's ld.global (default: keep
                              "L1::no_allocate"; e.g. "L1::evict_first", "L2::256B")

    git archive HEAD | tar -x -C /tmp/skel && LOAD_ROW_NO_L1=none python scripts/load_policy_patch.py /tmp/skel
    cd /tmp/skel && QWEN_FP4_CUDA_ARCHS=90a pip wheel --no-build-isolation --no-deps -w dist .
"""
import os
import sys
from pathlib import Path

from kernel_patch import edit_kernel, main  # scripts/ is on sys.path when this script runs

RULE = "constexpr bool kLoadRowNoL1 = Shape::kFewRows;"
QUALIFIER = 'asm("ld.global.L1::no_allocate.v4.u32'


def patch(root: Path) -> None:
    which = os.environ.get("LOAD_ROW_NO_L1", "")
    qualifier = os.environ.get("LOAD_QUALIFIER", "")
    if which not in ("", "all", "none"):
        sys.exit(f"LOAD_ROW_NO_L1 must be all or none (got {which!r})")
    if not which and not qualifier:
        sys.exit("nothing to do: set LOAD_ROW_NO_L1 and/or LOAD_QUALIFIER")
    if which:
        edit_kernel(root, [(RULE, RULE.replace("Shape::kFewRows", "true" if which == "all" else "false"), 1)])
    if qualifier:
        edit_kernel(root, [(QUALIFIER, f'asm("ld.global.{qualifier}.v4.u32', 1)], file="csrc/vec.cuh")


if __name__ == "__main__":
    main(patch, "load_policy_patch.py")
