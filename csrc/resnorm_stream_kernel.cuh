// The streaming form of the fused kernel, for many rows of the fixed widths: a persistent grid (as many
// CTAs as fit on the GPU at once), each CTA walking rows blockIdx.x, blockIdx.x + gridDim.x, ... with
// kStages rows in flight. One thread issues a row's x and residual as two bulk copies (bulk_copy.cuh)
// into a shared-memory stage; the CTA computes on the oldest stage while the younger ones arrive, and
// refills a stage as soon as its row has been read (after the row's reductions, whose barriers say every
// thread has its vectors). DRAM sees a steady stream of requests from the first microsecond to the last
// row, instead of one CTA per row, where the whole first wave loads at once, then computes at once while
// DRAM idles, and the last wave drains for a whole CTA lifetime (docs/performance.md, the timeline).
//
// Numerics: each thread reads from shared memory exactly the vectors v = i * threads + tid it would load
// from global memory in resnorm_quant_kernel, and runs the same resnorm_row_from and
// quantize_row_and_store on them, with the same block shape: the same bits as the one-CTA-per-row kernel
// and as resnorm + nvfp4_quantize.
#pragma once

#include <cstdint>

#include "bulk_copy.cuh"
#include "resnorm_kernel.cuh"

namespace qwen_fp4 {

template <class Quantizer, int VPT, int kFixedCols, int kMinBlocks, int kStages, bool kPlain>
__global__ void __launch_bounds__(RowShape<VPT, kFixedCols>::kMaxThreads, kMinBlocks)
    resnorm_quant_stream_kernel(const ResnormArgs args) {
  using Shape = RowShape<VPT, kFixedCols>;
  static_assert(kFixedCols != 0 && kStages >= 1, "the streaming kernel serves the fixed widths");
  constexpr int kVecs = Shape::kFixedVecs;
  constexpr uint32_t kRowBytes = kFixedCols * 2;  // bf16; a multiple of 16, as bulk copies need
  __shared__ __align__(128) uint4 x_stage[kStages][kVecs];
  __shared__ __align__(128) uint4 res_stage[kStages][kVecs];
  __shared__ __align__(8) uint64_t arrived[kStages];  // phase k / kStages of stage s: row k's bytes are in

  const int64_t rows = args.rows, step = gridDim.x;
  const char* x = static_cast<const char*>(args.x);
  const char* residual = static_cast<const char*>(args.residual);
  auto fetch = [&](int64_t row, int s) {  // one thread
    mbarrier_arrive_expect_bytes(&arrived[s], 2 * kRowBytes);
    bulk_copy_to_shared(x_stage[s], x + row * kRowBytes, kRowBytes, &arrived[s]);
    bulk_copy_to_shared(res_stage[s], residual + row * kRowBytes, kRowBytes, &arrived[s]);
  };
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) mbarrier_init(&arrived[s], 1);
    fence_barrier_init();
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      if (blockIdx.x + s * step < rows) fetch(blockIdx.x + s * step, s);
    }
  }
  __syncthreads();  // the barriers are initialized before anyone waits on them

  // The scale tensor's padding rows (fewer than 128): chunks shared out over the first CTAs, while their
  // first rows arrive.
  const int64_t padding_chunks = (round_up_128(rows) - rows + kPaddingRowsPerCta - 1) / kPaddingRowsPerCta;
  for (int64_t chunk = blockIdx.x; chunk < padding_chunks; chunk += step) {
    zero_scale_padding_chunk<Shape>(args.scales, rows, kFixedCols, chunk);
  }

  const float global_scale = __ldg(args.global_scale);
  int s = 0;
  uint32_t parity = 0;
  for (int64_t row = blockIdx.x; row < rows; row += step) {
    mbarrier_wait(&arrived[s], parity);
    uint4 xv[VPT], rv[VPT];
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = i * Shape::kFixedThreads + threadIdx.x;
      xv[i] = x_stage[s][v];
      rv[i] = res_stage[s][v];
    }
    uint4 y[VPT];
    resnorm_row_from<VPT, Shape, kPlain>(args, row, xv, rv, y);
    // resnorm_row_from's barriers come after every thread's reads of stage s: refill it.
    if (threadIdx.x == 0 && row + kStages * step < rows) {
      fence_proxy_async_shared();
      fetch(row + kStages * step, s);
    }
    quantize_row_and_store<Quantizer, VPT, Shape>(y, row, kFixedCols, kVecs, global_scale, args.packed,
                                                  args.scales);
    if (++s == kStages) {
      s = 0;
      parity ^= 1u;
    }
  }
}

}  // namespace qwen_fp4
