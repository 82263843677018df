// Software equivalents of the Blackwell-only E2M1 conversions in FlashInfer's quantization_utils.cuh, for the
// emulation build only (QWEN_FP4_EMULATE_BLACKWELL=1, sm_90a, never shipped): the copy of that header that
// tools/emulated_flashinfer_header.py writes calls these where the original has its asm blocks. Each gives
// the asm block's exact result (bits), so FlashInfer's cvt_warp_fp16_to_fp4 runs unchanged on sm_90.
#pragma once

#if !QWEN_FP4_EMULATE_BLACKWELL
#error "blackwell_emulation.cuh belongs to the emulation build only (QWEN_FP4_EMULATE_BLACKWELL=1)"
#endif

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "nvfp4_portable.cuh"

namespace qwen_fp4_emulation {

// cvt.rn.satfinite.e2m1x2.f32 d, hi, lo: lo's code in bits 0-3, hi's in bits 4-7. e2m1_code gives
// cuda_fp4.h's bits for every fp32 input (the exhaustive GPU test), which are the instruction's.
__device__ __forceinline__ uint32_t e2m1x2(float lo, float hi) {
  return qwen_fp4::e2m1_code(lo) | (qwen_fp4::e2m1_code(hi) << 4);
}

// Element 2i into bits 8i..8i+3 and element 2i + 1 into bits 8i+4..8i+7, as the header's asm orders them.
__device__ __forceinline__ uint32_t fp32_vec_to_e2m1(float (&array)[8]) {
  uint32_t val = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) val |= e2m1x2(array[2 * i], array[2 * i + 1]) << (8 * i);
  return val;
}

__device__ __forceinline__ uint32_t fp32_vec_to_e2m1(float2 (&array)[4]) {
  uint32_t val = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) val |= e2m1x2(array[i].x, array[i].y) << (8 * i);
  return val;
}

__device__ __forceinline__ uint64_t fp32_vec_to_e2m1(float2 (&array)[8]) {
  uint64_t val = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) val |= static_cast<uint64_t>(e2m1x2(array[i].x, array[i].y)) << (8 * i);
  return val;
}

// cvt.rn.f16x2.e2m1x2 of the low byte widened to fp32 (exact: E2M1 values are f16 values), -0.0 for 0x8.
__device__ __forceinline__ float2 e2m1x2_byte_to_float2(uint32_t byteVal) {
  return make_float2(qwen_fp4::e2m1_value(byteVal & 0xFu), qwen_fp4::e2m1_value((byteVal >> 4) & 0xFu));
}

// The header's f16 product of each E2M1 value of the low byte and the E4M3 scale, widened to fp32. It is
// exact in f16 (at most 2 x 4 significant bits; magnitudes 2^-10 .. 2688, all f16 normals), so the fp32
// product of the exact values is the same number, signed zeros included.
__device__ __forceinline__ float2 e2m1x2_byte_scaled_e4m3_to_float2(uint32_t byteVal, uint8_t scaleVal) {
  __nv_fp8_e4m3 scale;
  scale.__x = scaleVal;
  const float s = static_cast<float>(scale);
  const float2 q = e2m1x2_byte_to_float2(byteVal);
  return make_float2(__fmul_rn(q.x, s), __fmul_rn(q.y, s));
}

}  // namespace qwen_fp4_emulation
