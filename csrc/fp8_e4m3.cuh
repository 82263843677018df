// The FP8 (E4M3) quantization rule of the FP8 ops (docs/numerics.md, "FP8 (E4M3) output"), element by
// element, as SGLang's fused FP8 kernel (norm_scale_shift.cuh) and its Triton reference compute it:
//   inv = div.full.f32(1, input_scale)                      (once per thread, from the one-element scale)
//   q   = e4m3_rn_satfinite(fminf(fmaxf(float(y) * inv, -448), 448))
// fmaxf/fminf return the non-NaN operand, so a NaN product becomes -448 (byte 0xFE), +inf 448 (0x7E) and
// -inf -448 (0xFE); the conversion then never sees a NaN. An input_scale that is not a positive normal
// finite fp32 (NaN, inf, <= 0, subnormal) makes every byte 0x7F (E4M3 NaN): the kernels cannot raise
// without a host sync, so they poison the output instead (the CPU op raises).
#pragma once

#include <cuda_bf16.h>

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "formats.h"
#include "vec.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
#error "the FP8 kernels need cvt.rn.satfinite.e4m3x2.f32 (sm_89 and later)"
#endif

namespace qwen_fp4 {

constexpr uint32_t kE4m3NanX4 = 0x7F7F7F7Fu;  // four E4M3 NaN bytes: the output of a refused input_scale

// 1 / s as SGLang computes it (Triton lowers its fp32 `1.0 / scale` to div.full.f32): not IEEE division;
// it equals rcp.approx.f32 (non-ftz) for every positive finite s (measured: rcp_approx.py), and one ulp of
// inv changes bytes at E4M3 midpoints. reference.fp8_inverse_scale is its CPU twin.
__device__ __forceinline__ float div_full_rcp(float s) {
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(1.0f), "f"(s));
  return r;
}

// Whether input_scale is one the ops accept: positive, normal, finite (NaN fails both comparisons).
__device__ __forceinline__ bool fp8_scale_valid(float s) { return s >= FLT_MIN && s <= FLT_MAX; }

// Two fp32 values to two E4M3 bytes (lo in the low byte), round to nearest even, saturating to +-448.
__device__ __forceinline__ uint16_t e4m3x2_rn_satfinite(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// One value's clamped, scaled input to the conversion: fminf(fmaxf(y * inv, -448), 448).
__device__ __forceinline__ float fp8_clamped(float y, float inv) {
  return fminf(fmaxf(__fmul_rn(y, inv), -kE4m3Max), kE4m3Max);
}

// Eight bf16 (one 16-byte vector) to eight E4M3 bytes (element j in byte j), or eight NaN bytes when the
// scale was refused (valid == false).
__device__ __forceinline__ uint2 e4m3x8_from_bf16x8(const uint4& y, float inv, bool valid) {
  float f[kVecElems];
  bf16x8_to_float(y, f);
  uint32_t w[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const uint32_t lo = e4m3x2_rn_satfinite(fp8_clamped(f[4 * k], inv), fp8_clamped(f[4 * k + 1], inv));
    const uint32_t hi = e4m3x2_rn_satfinite(fp8_clamped(f[4 * k + 2], inv), fp8_clamped(f[4 * k + 3], inv));
    w[k] = valid ? (lo | (hi << 16)) : kE4m3NanX4;
  }
  return make_uint2(w[0], w[1]);
}

// One bf16 to its E4M3 byte (the element-wise kernel's tail).
__device__ __forceinline__ uint8_t e4m3_from_bf16(uint16_t y, float inv, bool valid) {
  const float f = __uint_as_float(static_cast<uint32_t>(y) << 16);
  return valid ? static_cast<uint8_t>(e4m3x2_rn_satfinite(fp8_clamped(f, inv), 0.0f) & 0xFF) : 0x7F;
}

// GELU(tanh) of one bf16 value, rounded to bf16, bit for bit PyTorch's CUDA F.gelu(approximate="tanh") on
// bf16: its opmath expression in fp32 with ::tanhf, x * x * x and the inner fma contracted the same way
// (checked for all 65536 inputs: tests/ops/test_gpu_fp8.py; the CPU twin is reference.gelu_tanh_bf16's table).
__device__ __forceinline__ uint16_t gelu_tanh_bf16(uint16_t bits) {
  constexpr float kBeta = M_SQRT2 * M_2_SQRTPI * 0.5f;
  constexpr float kKappa = 0.044715f;
  const float x = __uint_as_float(static_cast<uint32_t>(bits) << 16);
  const float x_cube = x * x * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  return __bfloat16_as_ushort(__float2bfloat16_rn(0.5f * x * (1.0f + tanhf(inner))));
}

// gelu_tanh_bf16 on each of the eight bf16 of a 16-byte vector.
__device__ __forceinline__ uint4 gelu_tanh_bf16x8(const uint4& v) {
  uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    w[k] = static_cast<uint32_t>(gelu_tanh_bf16(static_cast<uint16_t>(w[k] & 0xFFFF))) |
           (static_cast<uint32_t>(gelu_tanh_bf16(static_cast<uint16_t>(w[k] >> 16))) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

}  // namespace qwen_fp4
