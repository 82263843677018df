// The one configuration of the row kernels: a block shape (how a row maps onto a CTA) and, per shape and
// row-count class, the tuning policies. dispatch_row_config (dispatch.cuh) picks one per call; every row
// kernel takes it as its one shape parameter.
#pragma once

#include <cstdint>

#include "launch.h"
#include "vec.cuh"

namespace qwen_fp4 {

// How a row maps onto a CTA: each thread holds kVectorsPerThread 16-byte vectors, vector slot i of thread t
// holding the row's vector i * threads + t, so the row is read from memory once and both LayerNorm passes
// run on registers. kFixedCols != 0 specialises one width exactly (threads = kFixedCols / 8 /
// kVectorsPerThread, no bounds checks); 0 handles any multiple of 8 at run time (the ops take D % 16 == 0).
// kMinCtasPerSm is __launch_bounds__' minimum of resident CTAs: above 1 it caps the registers so that more
// rows fit per SM.
template <int VectorsPerThread, int FixedCols, int MinCtasPerSm>
struct BlockShape {
  static constexpr int kVectorsPerThread = VectorsPerThread;
  static constexpr int kFixedCols = FixedCols;
  static constexpr int kMinCtasPerSm = MinCtasPerSm;
  static constexpr int kFixedVecs = kFixedCols / kVecElems;
  static constexpr int kFixedThreads = kFixedVecs / kVectorsPerThread;
  static constexpr int kMaxThreads = kFixedCols ? kFixedThreads : 256;  // D <= 16384 at 8 vectors per thread
  // Vectors of the widest row this shape serves: the LayerNorm sums' shared buffer (reduce.cuh row_sum).
  static constexpr int kMaxRowVecs = kFixedCols ? kFixedVecs : kMaxThreads * kVectorsPerThread;
  static_assert(kFixedCols == 0 || (kFixedVecs % kVectorsPerThread == 0 && kFixedThreads % 32 == 0),
                "a fixed width is whole warps of whole vector slots");

  // Threads of a CTA for rows of `cols` columns (host): whole warps, kVectorsPerThread vectors each.
  static int threads_for(int32_t cols) {
    if (kFixedCols) return kFixedThreads;
    return static_cast<int>(round_up(ceil_div(cols / kVecElems, kVectorsPerThread), 32));
  }

  static __device__ __forceinline__ int32_t cols(int32_t runtime_cols) {
    return kFixedCols ? kFixedCols : runtime_cols;
  }
  static __device__ __forceinline__ int vecs(int32_t cols) { return kFixedCols ? kFixedVecs : cols / kVecElems; }
  static __device__ __forceinline__ int threads() { return kFixedCols ? kFixedThreads : blockDim.x; }
  static __device__ __forceinline__ bool valid(int vec, int vecs) { return kFixedCols != 0 || vec < vecs; }
};

// The configuration of the row kernels for one block shape and row-count class (kFewRows: fewer than
// dispatch_row_config's kManyRows rows). Each policy below is a rule with its reason.
template <int VectorsPerThread, int FixedCols, int MinCtasPerSm, bool FewRows>
struct RowConfig : BlockShape<VectorsPerThread, FixedCols, MinCtasPerSm> {
  // The block shape alone, for the kernels no policy below applies to (the standalone quantizer): one kernel serves
  // both row-count classes of a shape.
  using Shape = BlockShape<VectorsPerThread, FixedCols, MinCtasPerSm>;
  static constexpr bool kFewRows = FewRows;
  static_assert(FixedCols == 0 || kFewRows == (VectorsPerThread == 2),
                "a fixed width's few-rows shape has two vectors per thread, its many-rows shape more");

  // Loads: x and residual skip L1 with few rows (used once, from registers; the one-CTA-per-row kernels
  // then wait less on DRAM), not with many rows, where L1 allocation keeps DRAM streaming faster.
  static constexpr bool kRowLoadsSkipL1 = kFewRows;

  // Parameters: the narrow shapes (two vectors per thread) load scale and shift before the reductions, so
  // their latency hides behind them; the wider ones after, to save registers.
  static constexpr bool kHoistParams = VectorsPerThread <= 2;
  // Plain calls of the fixed widths' few-rows shapes and of D = 3072's many-rows shape load gate, scale and
  // shift in one group of plain loads next to the row's loads (PlainParams), so no L2 round trip is left on
  // the row's latency chain; elsewhere (D = 5120's many-rows shape, the generic widths) the group's
  // registers cost more than the latency it hides.
  static constexpr bool kGroupedParams = FixedCols == 3072 || (FixedCols != 0 && VectorsPerThread <= 2);

  // The fused op's split kernel (two CTAs per row while rows <= SMs) exists for the few-rows shapes of the
  // fixed widths: it pays only while every CTA has an SM to itself.
  static constexpr bool kHasSplitKernel = FixedCols != 0 && kFewRows;

  // First-wave stagger (stagger_first_wave; launch_rows.cuh applies it):
  // - the register-capped shapes (kMinCtasPerSm > 1) stagger every call, with at least
  //   kStaggerMinResidentCtas CTAs resident per SM: their one kernel carries the stagger code;
  // - the one-CTA shapes up to four vectors per thread stagger only calls of more than one wave, so they
  //   have a second kernel without the code for calls of one wave (where the code alone costs time);
  // - the eight-vector shape (D > 8192) never (not tuned).
  static constexpr bool kStaggerOneWave = MinCtasPerSm > 1;
  static constexpr bool kStaggerable = kStaggerOneWave || FixedCols != 0 || VectorsPerThread <= 4;
  static constexpr int kStaggerMinResidentCtas = kStaggerOneWave ? 4 : 1;
  // Generic widths are staggered only within the range the sleep was tuned on.
  static bool stagger_width(int32_t cols) { return FixedCols != 0 || (cols >= 1536 && cols <= 4096); }
  // Sleep per first-wave slot: about the time DRAM takes to deliver one slot's loads, so it scales with D;
  // a flat 300 ns in the one-CTA fixed-width shapes (the best of the sleeps tried there).
  static int32_t stagger_ns(int32_t cols) { return MinCtasPerSm == 1 && FixedCols != 0 ? 300 : 300 * cols / 3072; }
};

}  // namespace qwen_fp4
