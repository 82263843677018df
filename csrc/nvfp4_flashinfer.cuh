// NVFP4 conversion through FlashInfer's shipped TensorRT-LLM helpers (cvt_warp_fp16_to_fp4, the
// hardware cvt.rn.satfinite.e2m1x2.f32): the Blackwell path, bytes identical to flashinfer.fp4_quantize
// by construction. Included only by launch_blackwell.cu; see third_party/README.md for how it is found.
#pragma once

#include <cfloat>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "tensorrt_llm/kernels/quantization_utils.cuh"
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

}  // namespace qwen_fp4
