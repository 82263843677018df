// NVFP4 -> the exact bf16 operand of a tensor-core GEMM: value = e2m1 * float(e4m3 block scale), no global
// scale. The product has at most 6 significant bits and lies in [2^-10, 2688] (or is zero), so it is exact in
// bf16: no rounding anywhere, the bytes equal the pure-PyTorch dequantization's.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "launch.h"
#include "sf_layout.cuh"

namespace qwen_fp4 {

namespace {

constexpr int kThreads = 256;
constexpr int kCodesPerThread = 8;                     // one 32-bit word of packed codes -> one 16-byte store
constexpr uint32_t kCanonicalNanBf16x2 = 0x7FC07FC0u;  // what torch's fp32 -> bf16 cast writes for NaN

// Two E2M1 codes (one packed byte in bits 0-7, even element in the low nibble) as a half2 whose lanes are
// the codes' values times 2^-14, exactly: the three magnitude bits go to the top of the fp16 exponent and
// mantissa fields (bit 9 = mantissa, bits 10-11 = exponent), so code 1 (0.5) is the subnormal 2^-15 and
// code e.m (e > 0) is 2^(e-15) * (1 + m/2); the sign bit goes to bit 15.
__device__ __forceinline__ uint32_t e2m1x2_to_half2_bits(uint32_t byte) {
  return ((byte & 0x8u) << 12) | ((byte & 0x7u) << 9) | ((byte & 0x80u) << 24) | ((byte & 0x70u) << 21);
}

// bf16 bits of an fp32 value whose low 16 bits are zero (exact): the high half.
__device__ __forceinline__ uint32_t pack_bf16x2_exact(float lo, float hi) {
  return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

// Eight codes (a 32-bit word of packed bytes) times one block scale -> four words of bf16 pairs.
__device__ __forceinline__ void dequantize_word(uint32_t word, float scale_times_2p14, bool scale_is_nan,
                                                uint32_t (&out)[4]) {
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const uint32_t h2_bits = e2m1x2_to_half2_bits((word >> (8 * b)) & 0xFFu);
    const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&h2_bits));  // exact, subnormals too
    // code value * 2^-14 * (scale * 2^14): the product of two exact fp32 values with <= 6 significant bits
    out[b] = scale_is_nan ? kCanonicalNanBf16x2 : pack_bf16x2_exact(v.x * scale_times_2p14, v.y * scale_times_2p14);
  }
}

__device__ __forceinline__ float e4m3_to_float(uint8_t byte) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3);
  return __half2float(__half(h));
}

// One thread: 4 packed bytes (8 codes, half of a 16-element block) -> one 16-byte store, so a warp reads 128
// contiguous bytes and writes 512: both fully coalesced, which is what a memory-bound kernel needs.
__global__ void __launch_bounds__(kThreads)
    nvfp4_dequantize_bf16_kernel(const uint32_t* __restrict__ packed, const uint8_t* __restrict__ scales,
                                 uint4* __restrict__ out, int64_t rows, int32_t cols) {
  const int32_t words_per_row = cols / kCodesPerThread;
  const int64_t total = rows * words_per_row;
  // grid-stride: the grid is capped (launch below), so any tensor size runs
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t row = i / words_per_row;
    const int32_t word_in_row = static_cast<int32_t>(i - row * words_per_row);
    const uint32_t codes = packed[i];
    const float sf = e4m3_to_float(scales[sf_row_offset_128x4(row, cols) + sf_block_offset_128x4(word_in_row / 2)]);
    uint32_t v[4];
    dequantize_word(codes, sf * 16384.0f, isnan(sf), v);
    out[i] = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

}  // namespace

void launch_nvfp4_dequantize_bf16(const uint8_t* packed, const uint8_t* scales, void* out, int64_t rows, int32_t cols,
                                  void* stream) {
  const int64_t threads_total = rows * (cols / kCodesPerThread);
  if (threads_total == 0) return;
  constexpr int64_t kMaxBlocks = int64_t(1) << 20;  // far more than resident at once; beyond, threads loop
  const int64_t blocks = std::min<int64_t>((threads_total + kThreads - 1) / kThreads, kMaxBlocks);
  nvfp4_dequantize_bf16_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const uint32_t*>(packed), scales, static_cast<uint4*>(out), rows, cols);
  check_launch("nvfp4_dequantize_bf16_kernel");
}

}  // namespace qwen_fp4
