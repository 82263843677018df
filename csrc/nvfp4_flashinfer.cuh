// NVFP4 conversion through FlashInfer's shipped TensorRT-LLM helpers (cvt_warp_fp16_to_fp4, the
// hardware cvt.rn.satfinite.e2m1x2.f32): the Blackwell path, bytes identical to flashinfer.fp4_quantize
// by construction. Included only by launch_blackwell.cu; see third_party/README.md for how it is found.
#pragma once

#include <cfloat>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "tensorrt_llm/kernels/quantization_utils.cuh"
#include "launch.h"
#include "vec.cuh"

namespace qwen_fp4 {

template <bool kFast>
struct FlashInferNvfp4 {
  // Same contract as PortableNvfp4::quantize.
  static __device__ __forceinline__ uint32_t quantize(const uint4& y_bf16, float global_scale, uint8_t* sf_out) {
    tensorrt_llm::kernels::PackedVec<__nv_bfloat16, kVecElems> vec;
    *reinterpret_cast<uint4*>(&vec) = y_bf16;
    // <type, SF vector size, elements per thread, UE8M0 scales, DISABLE_FP4_QUANT_FAST_MATH>
    return tensorrt_llm::kernels::cvt_warp_fp16_to_fp4<__nv_bfloat16, 16, kVecElems, false, !kFast>(
        vec, global_scale, sf_out);
  }
};

// The 4over6 recipe through the same helper with FlashInfer's config type; same contract as
// Portable4Over6Nvfp4::quantize. The config's E4M3 max enters only the per-row-amax error (rowAmax > 0),
// never the per-tensor one, so 448 serves both codes; the error mode and form pick one of four configs
// (a warp-uniform switch).
template <bool kFast>
struct FlashInfer4Over6Nvfp4 {
  static constexpr bool kTakesRecipeCode = true;

  template <tensorrt_llm::common::NVFP44Over6ErrMode kErrMode, bool kErrFastMath>
  using Config = tensorrt_llm::common::NVFP44Over6Config<448, kErrMode, kErrFastMath>;

  template <class RecipeConfig>
  static __device__ __forceinline__ uint32_t convert(const uint4& y_bf16, float global_scale, uint8_t* sf_out) {
    tensorrt_llm::kernels::PackedVec<__nv_bfloat16, kVecElems> vec;
    *reinterpret_cast<uint4*>(&vec) = y_bf16;
    return tensorrt_llm::kernels::cvt_warp_fp16_to_fp4<__nv_bfloat16, 16, kVecElems, false, !kFast, RecipeConfig>(
        vec, global_scale, sf_out);
  }

  static __device__ __forceinline__ uint32_t quantize(const uint4& y_bf16, float global_scale, uint8_t* sf_out,
                                                      int32_t recipe_code) {
    using tensorrt_llm::common::NVFP44Over6ErrMode;
    const bool fp16_form = recipe_error_fast_math(recipe_code);
    if (recipe_error_is_mse(recipe_code)) {
      return fp16_form ? convert<Config<NVFP44Over6ErrMode::MSE, true>>(y_bf16, global_scale, sf_out)
                       : convert<Config<NVFP44Over6ErrMode::MSE, false>>(y_bf16, global_scale, sf_out);
    }
    return fp16_form ? convert<Config<NVFP44Over6ErrMode::MAE, true>>(y_bf16, global_scale, sf_out)
                     : convert<Config<NVFP44Over6ErrMode::MAE, false>>(y_bf16, global_scale, sf_out);
  }
};

}  // namespace qwen_fp4
