"""Diagnostic only (docs/performance.md, "Why 90% of copy does not hold"): edits a *copy* of the source tree
so that resnorm_quant_kernel keeps its grid, block shapes, loads and stores (residual_out, packed codes,
scale bytes) but does none of the op's arithmetic. The wheel built from it is timed by
scripts/shape_sweep.sh (SKIP_TESTS=1: its outputs are meaningless by design).

    git archive HEAD | tar -x -C /tmp/skel && python scripts/arithmetic_free_patch.py /tmp/skel
    cd /tmp/skel && QWEN_FP4_CUDA_ARCHS=90a pip wheel --no-build-isolation --no-deps -w dist .
"""
from pathlib import Path

from kernel_patch import edit_kernel, main  # scripts/ is on sys.path when this script runs


def patch(root: Path) -> None:
    edit_kernel(root, [
        ("""  uint4 y[VPT];
  resnorm_row<VPT, Shape, kPlain>(args, row, y);
  quantize_row_and_store""",
         """  uint4 y[VPT], rv[VPT];
  load_row<VPT, Shape>(args, row, y, rv);
  for (int i = 0; i < VPT; ++i)
    store_stream(reinterpret_cast<uint4*>(args.residual_out) + row * Shape::vecs(cols) + i * Shape::threads() +
                     threadIdx.x, rv[i]);
  quantize_row_and_store""", 1),
        ("""    const uint32_t codes = Quantizer::quantize(y[i], global_scale, sf);""",
         """    const uint32_t codes = y[i].x ^ y[i].w;
    if (sf) *sf = uint8_t(y[i].y);""", 1),
    ])


if __name__ == "__main__":
    main(patch, "arithmetic_free_patch.py")
