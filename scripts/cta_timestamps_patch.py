"""Diagnostic only (docs/perf/tuning_history.md, "Where a call's time goes"): edits a *copy* of the source tree so that
each row CTA of resnorm_quant_kernel writes (SM id, start %globaltimer, end %globaltimer) into the first 24
bytes of its row's packed output, after all of its stores. The wheel built from it is read by
scripts/cta_timeline.py; its outputs are wrong by design.

    git archive HEAD | tar -x -C /tmp/ts && python scripts/cta_timestamps_patch.py /tmp/ts
    cd /tmp/ts && QWEN_FP4_CUDA_ARCHS=90a pip wheel --no-build-isolation --no-deps -w dist .
"""
from pathlib import Path

from kernel_patch import edit_kernel, main  # scripts/ is on sys.path when this script runs

OLD = """  const int64_t row = blockIdx.x;
  const float global_scale = __ldg(args.global_scale);  // now, not after the reductions: one latency less
  uint4 y[VPT];
  resnorm_row<VPT, Shape, kPlain>(args, row, y);
  quantize_row_and_store<Quantizer, VPT, Shape>(y, row, cols, Shape::vecs(cols), global_scale, args.packed,
                                                args.scales);
}"""
NEW = """  const int64_t row = blockIdx.x;
  uint64_t t_start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_start));
  const float global_scale = __ldg(args.global_scale);  // now, not after the reductions: one latency less
  uint4 y[VPT];
  resnorm_row<VPT, Shape, kPlain>(args, row, y);
  quantize_row_and_store<Quantizer, VPT, Shape>(y, row, cols, Shape::vecs(cols), global_scale, args.packed,
                                                args.scales);
  __syncthreads();  // DIAGNOSTIC BUILD: the row's first 24 packed bytes become (smid, start ns, end ns)
  if (threadIdx.x == 0) {
    uint64_t t_end;
    uint32_t smid;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_end));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    uint64_t* out = reinterpret_cast<uint64_t*>(args.packed + row * (cols / 2));
    out[0] = smid; out[1] = t_start; out[2] = t_end;
  }
}"""


def patch(root: Path) -> None:
    edit_kernel(root, [(OLD, NEW, 1)])


if __name__ == "__main__":
    main(patch, "cta_timestamps_patch.py")
