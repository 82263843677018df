// The 4over6 NVFP4 recipe in software, for the portable path (sm_90a and the compute_90 PTX): the bytes of
// FlashInfer 0.7.4's cvt_warp_fp16_to_fp4 with an NVFP44Over6Config and a per-tensor global scale
// (rowAmax = 0), both modes; docs/numerics.md, "The 4over6 recipe". Per 16-element block, amax as in the
// standard recipe (NaN ignored):
//   amax == 0: scale byte 0, codes 0 (also for -0 elements)
//   fast:  s6 = G * (amax * rcp(6))               exact: s6 = (amax / 6) * G
//          s4 = s6 * 1.5
//          SF_c = e4m3_satfinite(s_c), S_c = float(SF_c)                       (c = 4, 6)
//   fast:  g = rcp(G), o_c = rcp(S_c * g)          exact: g = 1 / G, o_c = min(1 / (S_c * g), FLT_MAX)
//          codes_c = e2m1_rn_satfinite(y * o_c)
//   per element, p = e2m1_value(code_c) * S_c (exact in fp32):
//          d = p * g - y  (exact error form)  or  d = p - y * G  (err_use_fast_math: FlashInfer's fp16
//          product e2m1 * e4m3 is exact, so it equals p)
//          E_c = sum over the lane's 8 elements in order of |d| (MAE) or d * d (MSE), then the lane pair's
//          two sums added
//   the block takes candidate 4 if E_4 < E_6, else 6 (ties, NaN, inf: 6).
// The fast mode has no zero-scale guard: S_c = 0 gives o_c = rcp(0) = inf, as in FlashInfer. rcp is
// rcp.approx.ftz.f32; every other operation an explicit round-to-nearest intrinsic. The error mode and
// form are a run-time argument (the recipe code, warp-uniform), so one instance serves all four.
#pragma once

#include <cuda_fp8.h>
#include <cfloat>
#include <cstdint>

#include "formats.h"
#include "launch.h"
#include "nvfp4_portable.cuh"
#include "vec.cuh"

namespace qwen_fp4 {

// The scale byte of a candidate block scale s (e4m3, round to nearest even, saturating) and its value.
__device__ __forceinline__ uint8_t e4m3_byte_and_value(float s, float& value) {
  const uint8_t byte = __nv_cvt_float_to_fp8(s, __NV_SATFINITE, __NV_E4M3);
  value = static_cast<float>(*reinterpret_cast<const __nv_fp8_e4m3*>(&byte));
  return byte;
}

// One candidate's per-element error term: |d| (MAE) or d * d (MSE), d by the error form.
__device__ __forceinline__ float candidate_error(uint32_t code, float scale_value, float y, float global_scale,
                                                 float global_decode_scale, bool fp16_form, bool mse) {
  const float p = __fmul_rn(e2m1_value(code), scale_value);  // exact: at most 6 significant bits
  const float d =
      fp16_form ? __fsub_rn(p, __fmul_rn(y, global_scale)) : __fsub_rn(__fmul_rn(p, global_decode_scale), y);
  return mse ? __fmul_rn(d, d) : fabsf(d);
}

// Same contract as PortableNvfp4::quantize (8 bf16 values of this thread, the lane pair one block, all 32
// lanes calling), plus the recipe code (kNvfp4Recipe* bits: the error mode and form).
template <bool kFast>
struct Portable4Over6Nvfp4 {
  static constexpr bool kTakesRecipeCode = true;

  static __device__ __forceinline__ uint32_t quantize(const uint4& y_bf16, float global_scale, uint8_t* sf_out,
                                                      int32_t recipe_code) {
    float y[kVecElems];
    bf16x8_to_float(y_bf16, y);
    float amax = max8_abs<false>(y);
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));

    float s6;
    if constexpr (kFast) {
      s6 = __fmul_rn(global_scale, __fmul_rn(amax, rcp_approx_ftz(kE2m1Max)));
    } else {
      s6 = __fmul_rn(__fdiv_rn(amax, kE2m1Max), global_scale);
    }
    const float s4 = __fmul_rn(s6, 1.5f);
    float sv4, sv6;
    const uint8_t sf4 = e4m3_byte_and_value(s4, sv4);
    const uint8_t sf6 = e4m3_byte_and_value(s6, sv6);
    float g, o4, o6;
    if constexpr (kFast) {
      g = rcp_approx_ftz(global_scale);
      o4 = rcp_approx_ftz(__fmul_rn(sv4, g));
      o6 = rcp_approx_ftz(__fmul_rn(sv6, g));
    } else {
      g = __fdiv_rn(1.0f, global_scale);
      o4 = fminf(__fdiv_rn(1.0f, __fmul_rn(sv4, g)), FLT_MAX);
      o6 = fminf(__fdiv_rn(1.0f, __fmul_rn(sv6, g)), FLT_MAX);
    }

    const bool fp16_form = recipe_error_fast_math(recipe_code);
    const bool mse = recipe_error_is_mse(recipe_code);
    uint32_t codes4 = 0, codes6 = 0;
    float e4 = 0.0f, e6 = 0.0f;
#pragma unroll
    for (int j = 0; j < kVecElems; ++j) {
      const uint32_t c4 = e2m1_code(__fmul_rn(y[j], o4));
      const uint32_t c6 = e2m1_code(__fmul_rn(y[j], o6));
      codes4 |= c4 << (4 * j);
      codes6 |= c6 << (4 * j);
      e4 = __fadd_rn(e4, candidate_error(c4, sv4, y[j], global_scale, g, fp16_form, mse));
      e6 = __fadd_rn(e6, candidate_error(c6, sv6, y[j], global_scale, g, fp16_form, mse));
    }
    // Every lane shuffles (no early exit for zero blocks): the pair's two sums, the same in both lanes.
    e4 = __fadd_rn(e4, __shfl_xor_sync(0xffffffffu, e4, 1));
    e6 = __fadd_rn(e6, __shfl_xor_sync(0xffffffffu, e6, 1));

    const bool zero_block = amax == 0.0f;
    const bool take4 = e4 < e6;
    if (sf_out != nullptr) *sf_out = zero_block ? uint8_t(0) : (take4 ? sf4 : sf6);
    return zero_block ? 0u : (take4 ? codes4 : codes6);
  }
};

}  // namespace qwen_fp4
