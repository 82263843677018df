"""Diagnostic only (docs/perf/tuning_history.md, "Where a few-rows CTA's time goes"): edits a *copy* of the source tree
so that every row CTA of resnorm_kernel and of resnorm_quant_kernel (the one-CTA-per-row kernels, not the split
kernel) records, in thread 0, its SM, its start and end %globaltimer and three SM clock readings: at its start,
after the first block reduction's barrier (the row's loads, the first pass and the mean) and after the second
(the variance), and its end (after every store of the CTA and a barrier). It writes them over the first 48
bytes of its row of residual_out, so outputs are wrong by design. scripts/cta_phases.py reads them.

    git archive HEAD | tar -x -C /tmp/ph && python scripts/cta_phases_patch.py /tmp/ph
    (CTA_PHASES_NO_SPLIT=1 python scripts/cta_phases_patch.py /tmp/ph: also no split kernel, see below)
    cd /tmp/ph && QWEN_FP4_CUDA_ARCHS=90a pip wheel --no-build-isolation --no-deps -w dist .
"""
import os
from pathlib import Path

from kernel_patch import edit_kernel, main  # scripts/ is on sys.path when this script runs

HELPER_AT = "// Block shape for a row: VPT vectors per thread."
HELPER = """// DIAGNOSTIC BUILD (scripts/cta_phases_patch.py): thread 0's clock readings of this CTA.
__device__ __forceinline__ uint64_t* phase_clock() {
  __shared__ uint64_t clocks[4];
  return clocks;
}
__device__ __forceinline__ uint64_t phase_globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Thread 0 writes (smid, start ns, end ns, cycles to the mean, to the variance, to the end) over the row's
// first 48 bytes of residual_out, after a barrier that follows every store of the CTA.
__device__ __forceinline__ void phase_write(const ResnormArgs& args, int64_t row, uint64_t start_ns) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint64_t end_clock = clock64();
    const uint64_t end_ns = phase_globaltimer();
    uint32_t smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    const uint64_t* c = phase_clock();
    uint64_t* out = reinterpret_cast<uint64_t*>(static_cast<char*>(args.residual_out) + row * args.cols * 2);
    out[0] = smid; out[1] = start_ns; out[2] = end_ns;
    out[3] = c[1] - c[0]; out[4] = c[2] - c[0]; out[5] = end_clock - c[0];
  }
}

"""

ROW = "  const int64_t row = blockIdx.x;\n"
START = """  uint64_t start_ns = 0;
  if (threadIdx.x == 0) { start_ns = phase_globaltimer(); phase_clock()[0] = clock64(); }
"""


def start_readings(next_line: str):
    """The edit that puts the start readings right after `row` in the kernel whose next line starts so."""
    return (ROW + next_line, ROW + START + next_line, 1)


EDITS = [
    (HELPER_AT, HELPER + HELPER_AT, 1),
    ("""  const float mu = __fmul_rn(block_sum<Shape::kWarps>(sum, scratch[0]), inv_cols);
""", """  const float mu = __fmul_rn(block_sum<Shape::kWarps>(sum, scratch[0]), inv_cols);
  if (threadIdx.x == 0) phase_clock()[1] = clock64();
""", 1),
    ("""  const float var = __fmul_rn(block_sum<Shape::kWarps>(sq, scratch[1]), inv_cols);
""", """  const float var = __fmul_rn(block_sum<Shape::kWarps>(sq, scratch[1]), inv_cols);
  if (threadIdx.x == 0) phase_clock()[2] = clock64();
""", 1),
    # the two one-CTA row kernels: the start readings, then (after their stores) the end and the write-out
    start_readings("  uint4 y[VPT];\n"),  # resnorm_kernel
    start_readings("  const float global_scale = __ldg(args.global_scale);  // now"),  # resnorm_quant_kernel
    ("""    if (Shape::valid(v, vecs)) y_row[v] = y[i];
  }
""", """    if (Shape::valid(v, vecs)) y_row[v] = y[i];
  }
  phase_write(args, row, start_ns);
""", 1),  # resnorm_kernel
    ("""                                                args.scales);
}
""", """                                                args.scales);
  phase_write(args, row, start_ns);
}
""", 1),  # resnorm_quant_kernel
]


# CTA_PHASES_NO_SPLIT=1: no split kernel either, so that rows <= SMs run the one-CTA kernel too (one row CTA
# per SM: docs/perf/tuning_history.md, "Issue or latency?").
NO_SPLIT = [("  return has_device_cache(a.device) && a.rows <= device_sms(a.device);",
             "  return false;  // DIAGNOSTIC BUILD (CTA_PHASES_NO_SPLIT): no split kernel", 1)]


def patch(root: Path) -> None:
    edit_kernel(root, EDITS)
    if os.environ.get("CTA_PHASES_NO_SPLIT") == "1":
        edit_kernel(root, NO_SPLIT, "csrc/launch_rows.cuh")


if __name__ == "__main__":
    main(patch, "cta_phases_patch.py")
