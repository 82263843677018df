// Block-wide fp32 sums: row_sum, the LayerNorm's, adds in an order fixed by the row's width alone.
#pragma once

namespace qwen_fp4 {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The sum of a row's per-vector partials part[i] (vector slot i of this thread is the row's vector
// i * threads + threadIdx.x; slots at or past `vecs` hold none), in an order that depends on the number of
// vectors only, not on the block shape, so the same row sums to the same bits whatever configuration its
// call's row count selects (a shard of rows gives the rows of the whole call): lane l of every warp folds
// part[l], part[l + 32], part[l + 64], ... left to right from 0, then the warp butterfly. `parts` holds
// kMaxVecs floats in shared memory that no other reduction of this CTA uses. Every thread gets the total.
template <int kMaxVecs, int kFixedVecs, int kVectors>
__device__ __forceinline__ float row_sum(const float (&part)[kVectors], int threads, int vecs, float* parts) {
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int v = i * threads + threadIdx.x;
    if (kFixedVecs != 0 || v < vecs) parts[v] = part[i];
  }
  __syncthreads();
  float acc = 0.0f;
  if constexpr (kFixedVecs != 0) {
#pragma unroll
    for (int v = 0; v < kFixedVecs; v += 32) {
      if (kFixedVecs % 32 == 0 || v + int(threadIdx.x % 32) < kFixedVecs)
        acc = __fadd_rn(acc, parts[v + threadIdx.x % 32]);
    }
  } else {
    for (int v = threadIdx.x % 32; v < vecs; v += 32) acc = __fadd_rn(acc, parts[v]);
  }
  static_assert(kMaxVecs >= kFixedVecs, "parts holds every vector of the row");
  return warp_sum(acc);
}

}  // namespace qwen_fp4
