// Block-wide fp32 sum: warp butterflies, then every thread adds the per-warp partials in one fixed tree.
// The order is fixed by the block shape, so every kernel with the same shape sums identically.
#pragma once

namespace qwen_fp4 {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Pairwise sum of s[0 .. N-1] (compile-time N): depth log2(N) instead of a chain, and the reads of the
// shared partials become broadcast vector loads.
template <int N>
__device__ __forceinline__ float tree_sum(const float* s) {
  if constexpr (N == 1) {
    return s[0];
  } else {
    return __fadd_rn(tree_sum<N / 2>(s), tree_sum<N - N / 2>(s + N / 2));
  }
}

// `scratch` holds 32 floats in shared memory, not used by any other reduction of this CTA (no barrier
// before the writes). kWarps = blockDim.x / 32 when known at compile time, 0 when not. Every thread gets
// the total.
template <int kWarps>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if constexpr (kWarps > 0) {
    return tree_sum<kWarps>(scratch);
  } else {
    const int warps = blockDim.x / 32;
    float total = scratch[0];
    for (int w = 1; w < warps; ++w) total = __fadd_rn(total, scratch[w]);
    return total;
  }
}

}  // namespace qwen_fp4
