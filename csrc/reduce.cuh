// Block-wide fp32 sum: warp butterflies, then one warp over the per-warp partials.
// The order is fixed by the block shape, so every kernel with the same shape sums identically.
#pragma once

namespace qwen_fp4 {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// `scratch` holds 32 floats in shared memory; every thread gets the total. blockDim.x % 32 == 0.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

}  // namespace qwen_fp4
