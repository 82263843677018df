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

#include "formats.h"
#include "vec.cuh"

namespace qwen_fp4 {

__device__ __forceinline__ float rcp_approx_ftz(float a) {
  float b;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(b) : "f"(a));
  return b;
}

// E2M1 magnitude of one fp32 value, as the bits of an fp32 number: returns kE2M1Bias + code, code 0..7;
// round to nearest, ties to the even code; |x| > 6 saturates to 6 (code 7); NaN gives 6 (code 7).
// The E2M1 grid has step 0.5 on [0, 2), 1 on [2, 4) and 2 on [4, 6]. With a = min(|x|, 6):
//   lo = 2^24 - 6 + 2a: below 2^24 fp32 spacing is 1, so this rounds 2a to an integer (ties to even):
//        the code of a on [0, 2);
//   hi = 2^24 - 4 + a: spacing 1 below 2^24 (a < 4) and 2 above (a >= 4): a rounded to the grid of
//        [2, 6], which is also the code (consecutive fp32 numbers have consecutive bit patterns).
// Both carry the code on the same bias, and lo <= hi exactly where a <= 2 (2a - 6 <= a - 4; rounding
// keeps the order), so min(lo, hi) is lo on [0, 2] and hi above: bits(min) = kE2M1Bias + code.
// Four instructions; the GPU tests check all 2^32 inputs against cuda_fp4.h.
constexpr uint32_t kE2M1Bias = 0x4B7FFFFAu;  // bits of 2^24 - 6

__device__ __forceinline__ uint32_t e2m1_magnitude_biased(float x) {
  const float a = fminf(fabsf(x), kE2m1Max);         // saturate; NaN becomes 6
  const float lo = __fmaf_rn(a, 2.0f, 16777210.0f);  // 2^24 - 6
  const float hi = __fadd_rn(a, 16777212.0f);        // 2^24 - 4
  return __float_as_uint(fminf(lo, hi));
}

// Bit 3 of the E2M1 code: the sign of x, kept when x rounds to zero; 0 for NaN.
__device__ __forceinline__ uint32_t e2m1_sign_bit(float x) { return x != x ? 0u : (__float_as_uint(x) >> 28) & 0x8u; }

// E2M1 code of one fp32 value (magnitude and sign); the same bits as cuda_fp4.h's conversion.
__device__ __forceinline__ uint32_t e2m1_code(float x) {
  return (e2m1_magnitude_biased(x) - kE2M1Bias) | e2m1_sign_bit(x);
}

// E2M1 code (0..15) -> its fp32 value, exactly, from the bits: magnitude m = code & 7 is 0, 0.5 (m = 1:
// exponent field 126) or, for m >= 2, exponent field 126 + m / 2 with mantissa bit m & 1 (1, 1.5, 2, 3, 4,
// 6); the sign from bit 3 (code 0x8 is -0.0).
__device__ __forceinline__ float e2m1_value(uint32_t code) {
  const uint32_t m = code & 7u;
  const uint32_t magnitude = m == 0 ? 0u : m == 1 ? 0x3F000000u : ((126u + (m >> 1)) << 23) | ((m & 1u) << 22);
  return __uint_as_float(magnitude | ((code & 8u) << 28));
}

// sum_j (kE2M1Bias << 4j) mod 2^32: what packing eight biased magnitudes by shift-adds leaves on top
// of the eight codes.
constexpr uint32_t kPackedE2M1Bias = kE2M1Bias + (kE2M1Bias << 4) + (kE2M1Bias << 8) + (kE2M1Bias << 12) +
                                     (kE2M1Bias << 16) + (kE2M1Bias << 20) + (kE2M1Bias << 24) + (kE2M1Bias << 28);

// The sign bits (bit 3 of each nibble) of eight bf16 values, element j in nibble j: the bf16 sign bits
// gathered by byte permutes (high bytes of the halves), then moved to bit 3 / bit 7 of each byte.
__device__ __forceinline__ uint32_t bf16x8_sign_nibbles(const uint4& u) {
  const uint32_t a = __byte_perm(u.x, u.y, 0x7351);  // bytes: e0, e1 | e2, e3 -> [e0, e2, e1, e3]
  const uint32_t b = __byte_perm(u.z, u.w, 0x7351);  // [e4, e6, e5, e7]
  const uint32_t even = __byte_perm(a, b, 0x5410);   // [e0, e2, e4, e6]: sign at bit 7 of byte k = e_2k
  const uint32_t odd = __byte_perm(a, b, 0x7632);    // [e1, e3, e5, e7]
  return ((even >> 4) & 0x08080808u) | (odd & 0x80808080u);
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
    const float sf = __fmul_rn(global_scale, __fmul_rn(amax, rcp_approx_ftz(kE2m1Max)));
    sf_byte = __nv_cvt_float_to_fp8(sf, __NV_SATFINITE, __NV_E4M3);
    const float sf_value = static_cast<float>(*reinterpret_cast<const __nv_fp8_e4m3*>(&sf_byte));
    return sf_byte != 0 ? rcp_approx_ftz(__fmul_rn(sf_value, inv_global)) : 0.0f;
  } else {
    constexpr float kInvE2M1Max = 1.0f / kE2m1Max;
    const float sf = amax != 0.0f ? __fmul_rn(amax, __fmul_rn(global_scale, kInvE2M1Max)) : 0.0f;
    sf_byte = __nv_cvt_float_to_fp8(sf, __NV_SATFINITE, __NV_E4M3);
    const float sf_value = static_cast<float>(*reinterpret_cast<const __nv_fp8_e4m3*>(&sf_byte));
    return amax != 0.0f ? fminf(__fdiv_rn(1.0f, __fmul_rn(sf_value, __fdiv_rn(1.0f, global_scale))), FLT_MAX) : 0.0f;
  }
}

// max that propagates NaN (max.NaN.f32, sm_80+): a NaN in the block shows in its amax.
__device__ __forceinline__ float fmax_propagate_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// max |f[j]| over eight values by a tree (depth 3, not a chain of 7), NaN propagating (max.NaN) or
// ignored (fmaxf). Either max is associative and commutative on these non-negative values, so the tree
// gives the chain's bits.
template <bool kPropagateNaN>
__device__ __forceinline__ float max8_abs(const float (&f)[kVecElems]) {
  auto max = [](float a, float b) { return kPropagateNaN ? fmax_propagate_nan(a, b) : fmaxf(a, b); };
  const float a = max(fabsf(f[0]), fabsf(f[1])), b = max(fabsf(f[2]), fabsf(f[3]));
  const float c = max(fabsf(f[4]), fabsf(f[5])), d = max(fabsf(f[6]), fabsf(f[7]));
  return max(max(a, b), max(c, d));
}

// Quantizes the 8 bf16 values this thread holds; the lane pair (lane, lane ^ 1) holds one 16-element
// block. All 32 lanes of the warp must call it. Returns 8 E2M1 codes (element 0 in the low nibble) and
// writes the block's scale byte to sf_out unless it is null.
// Cost per element: one multiply, the four-instruction magnitude and one multiply-add to pack it. The
// signs come from the bf16 sign bits, eight at a time, whenever sign(y * o) = sign(y) for sure (y and
// o finite, o >= +0: o's bits <= FLT_MAX's); otherwise (NaN or inf in the block, odd global scales)
// from each product, as e2m1_code does.
template <bool kFast>
struct PortableNvfp4 {
  static __device__ __forceinline__ uint32_t quantize(const uint4& y_bf16, float global_scale, uint8_t* sf_out) {
    float y[kVecElems];
    bf16x8_to_float(y_bf16, y);
    float amax = max8_abs<true>(y);
    amax = fmax_propagate_nan(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    const bool finite_block = amax <= FLT_MAX;  // false for inf or NaN anywhere in the block
    // The contract's amax ignores NaN (fmax). Only a block with a NaN needs it recomputed; warp-uniform
    // branch because of the shuffle.
    if (__any_sync(0xffffffffu, amax != amax)) {
      amax = max8_abs<false>(y);
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    }

    uint8_t sf_byte;
    const float out_scale = nvfp4_block_scale<kFast>(amax, global_scale, sf_byte);
    if (sf_out != nullptr) *sf_out = sf_byte;

    float v[kVecElems];
    uint32_t packed = 0;
#pragma unroll
    for (int j = 0; j < kVecElems; ++j) {
      v[j] = __fmul_rn(y[j], out_scale);
      packed += e2m1_magnitude_biased(v[j]) << (4 * j);  // a multiply-add each; the bias is removed below
    }
    uint32_t signs;
    if (finite_block && __float_as_uint(out_scale) <= 0x7F7FFFFFu) {
      signs = bf16x8_sign_nibbles(y_bf16);
    } else {
      signs = 0;
#pragma unroll
      for (int j = 0; j < kVecElems; ++j) signs |= e2m1_sign_bit(v[j]) << (4 * j);
    }
    return packed - kPackedE2M1Bias + signs;
  }
};

}  // namespace qwen_fp4
