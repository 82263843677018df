// NVFP4 conversion of 16-element blocks for GPUs without the hardware E2M1 conversion: the portable path
// (sm_90a and the compute_90 PTX). Scales use cuda_fp8.h's E4M3 conversion; codes use e2m1_code below,
// which gives the same bits as cuda_fp4.h's __nv_cvt_float_to_fp4 for every one of the 2^32 fp32 inputs
// (checked exhaustively on the GPU by the tests) at a fraction of its cost. The recipe is the production quantizer's
// (FlashInfer / TensorRT-LLM fp4_quantize, 0.7.4), both modes; docs/numerics.md step 8:
//   amax  = max |y| over the block, NaN ignored (fmax), so NaN only for an all-NaN block
//   fast:  SF = e4m3_satfinite(G * (amax * rcp(6)));  o = SF != 0 ? rcp(float(SF) * rcp(G)) : 0
//   exact: SF = amax != 0 ? e4m3_satfinite(amax * (G * (1/6))) : 0;
//          o  = amax != 0 ? min(1 / (float(SF) * (1/G)), FLT_MAX) : 0        (IEEE divisions)
//   code  = e2m1_rn_satfinite(y * o)
// rcp is rcp.approx.ftz.f32, as in production. Every operation is an explicit intrinsic so the compiler
// cannot contract or reorder it differently in different kernels.
#pragma once

#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <cfloat>
#include <cstdint>

#include "vec.cuh"

namespace qwen_fp4 {

__device__ __forceinline__ float rcp_approx_ftz(float a) {
  float b;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(b) : "f"(a));
  return b;
}

// E2M1 code of one fp32 value: round to nearest, ties to the even code; |x| > 6 saturates to 6;
// NaN gives +6 (0x7); the sign bit is kept, also when x rounds to zero (0x8).
// The E2M1 grid has step 0.5 on [0, 2), 1 on [2, 4) and 2 on [4, 6]. Scaling |x| by 2, 1 or 0.5 (picked
// by its exponent) makes the step 1; one fma with 2^23 + (code of the region's first value - its scaled
// value) then rounds to the nearest integer, ties to even, and leaves the code in the low bits.
__device__ __forceinline__ uint32_t e2m1_code(float x) {
  const float a = fminf(fabsf(x), 6.0f);  // saturate; NaN becomes 6, whose code 0x7 is NaN's
  // Biased exponent, clamped below at 1.0 (127); a <= 6 keeps it <= 129: [0,2) -> 127, [2,4) -> 128, [4,6] -> 129.
  const uint32_t e = __float_as_uint(fmaxf(a, 1.0f)) >> 23;
  const float inv_step = __uint_as_float((255u - e) << 23);            // 2, 1, 0.5
  const float t = __fmaf_rn(a, inv_step, __uint_as_float(0x4B000000u + 2u * (e - 127u)));  // 2^23 + 0, 2, 4
  const uint32_t sign = x != x ? 0u : (__float_as_uint(x) >> 28) & 0x8u;
  return (__float_as_uint(t) & 0x7u) | sign;
}

// The toolkit's software conversion, kept for the exhaustive equality check (csrc/ops.cpp _e2m1_codes).
__device__ __forceinline__ uint32_t e2m1_code_toolkit(float x) {
  return __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest);
}

// Scale byte and encode scale of one block from its amax.
template <bool kFast>
__device__ __forceinline__ float nvfp4_block_scale(float amax, float global_scale, uint8_t& sf_byte) {
  if constexpr (kFast) {
    const float inv_global = rcp_approx_ftz(global_scale);
    const float sf = __fmul_rn(global_scale, __fmul_rn(amax, rcp_approx_ftz(6.0f)));
    sf_byte = __nv_cvt_float_to_fp8(sf, __NV_SATFINITE, __NV_E4M3);
    const float sf_value = static_cast<float>(*reinterpret_cast<const __nv_fp8_e4m3*>(&sf_byte));
    return sf_byte != 0 ? rcp_approx_ftz(__fmul_rn(sf_value, inv_global)) : 0.0f;
  } else {
    constexpr float kInvE2M1Max = 1.0f / 6.0f;
    const float sf = amax != 0.0f ? __fmul_rn(amax, __fmul_rn(global_scale, kInvE2M1Max)) : 0.0f;
    sf_byte = __nv_cvt_float_to_fp8(sf, __NV_SATFINITE, __NV_E4M3);
    const float sf_value = static_cast<float>(*reinterpret_cast<const __nv_fp8_e4m3*>(&sf_byte));
    return amax != 0.0f ? fminf(__fdiv_rn(1.0f, __fmul_rn(sf_value, __fdiv_rn(1.0f, global_scale))), FLT_MAX)
                        : 0.0f;
  }
}

// Quantizes the 8 bf16 values this thread holds; the lane pair (lane, lane ^ 1) holds one 16-element
// block. All 32 lanes of the warp must call it. Returns 8 E2M1 codes (element 0 in the low nibble) and
// writes the block's scale byte to sf_out unless it is null.
template <bool kFast>
struct PortableNvfp4 {
  static __device__ __forceinline__ uint32_t quantize(const uint4& y_bf16, float global_scale, uint8_t* sf_out) {
    float y[kVecElems];
    bf16x8_to_float(y_bf16, y);
    float amax = fabsf(y[0]);
#pragma unroll
    for (int j = 1; j < kVecElems; ++j) amax = fmaxf(amax, fabsf(y[j]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));

    uint8_t sf_byte;
    const float out_scale = nvfp4_block_scale<kFast>(amax, global_scale, sf_byte);
    if (sf_out != nullptr) *sf_out = sf_byte;

    uint32_t codes = 0;
#pragma unroll
    for (int j = 0; j < kVecElems; ++j) codes |= e2m1_code(__fmul_rn(y[j], out_scale)) << (4 * j);
    return codes;
  }
};

}  // namespace qwen_fp4
