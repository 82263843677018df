// 16-byte vectors of 8 bf16 and the fp32 views the kernels compute on.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "launch.h"

namespace qwen_fp4 {

constexpr int kVecElems = 8;  // one 16-byte load of bf16

// bf16 -> fp32 is placing the 16 bits on top of a zero mantissa tail: one shift or one mask per value
// (cheaper than __bfloat1622float2, which spends a PRMT and an IMAD on the high half).
__device__ __forceinline__ void bf16x2_to_float(uint32_t w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}

__device__ __forceinline__ void bf16x8_to_float(const uint4& u, float (&f)[kVecElems]) {
  bf16x2_to_float(u.x, f[0], f[1]);
  bf16x2_to_float(u.y, f[2], f[3]);
  bf16x2_to_float(u.z, f[4], f[5]);
  bf16x2_to_float(u.w, f[6], f[7]);
}

// bf16(v) on eight values in place, two per conversion instruction; returns them packed.
__device__ __forceinline__ uint4 bf16_round8(float (&f)[kVecElems]) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int j = 0; j < kVecElems / 2; ++j) h[j] = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
  bf16x8_to_float(u, f);
  return u;
}

// bf16(v) on eight values in place where only the rounded fp32 values are needed (not the packed bf16):
// one conversion per value, into the high half over a zero low half, which is the rounded value's fp32
// bits (fewer instructions than bf16_round8's packing then unpacking).
__device__ __forceinline__ void bf16_round8_values(float (&f)[kVecElems]) {
#pragma unroll
  for (int j = 0; j < kVecElems; ++j) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(0.0f, f[j]);  // .x (low half) = 0, .y (high half) = bf16(f)
    f[j] = __uint_as_float(*reinterpret_cast<const uint32_t*>(&h));
  }
}

// Activations are read once and written once: plain loads (evict-first loads, __ldcs, slow the many-rows
// calls down) and evict-first (streaming) stores, the pair that moves the most bytes per second.
__device__ __forceinline__ uint4 load_stream(const uint4* p) { return *p; }
template <class T>
__device__ __forceinline__ void store_stream(T* p, const T& v) {
  __stcs(p, v);
}

// load_stream without allocating in L1 (the data is used once, from registers); RowConfig::kRowLoadsSkipL1
// says where it is used.
__device__ __forceinline__ uint4 load_stream_no_l1(const uint4* p) {
  uint4 v;
  asm("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// Which row of a modulation parameter a row of x uses (ParamRef's batch and token index); {0, 0} for the
// shared form and the [D] parameters.
struct ModulationRow {
  int64_t batch = 0;
  int64_t token = 0;
};

// One row of a per-column parameter (bf16 or fp32), located once per row so that the per-vector loads
// need only 32-bit offsets. kMaybeFp32 = false: known to be bf16 (the plain kernels), no dtype test.
template <bool kMaybeFp32 = true>
struct ParamRow {
  const char* base;  // nullptr: absent
  bool fp32;
  __device__ __forceinline__ ParamRow(const ParamRef& p, ModulationRow row = {})
      : base(p.ptr == nullptr ? nullptr : static_cast<const char*>(p.ptr) + offset_bytes(p, row)),
        fp32(kMaybeFp32 && p.fp32) {}
  __device__ __forceinline__ static int64_t offset_bytes(const ParamRef& p, ModulationRow row) {
    return (row.batch * p.batch_stride + row.token * p.token_stride) * (kMaybeFp32 && p.fp32 ? 4 : 2);
  }
  __device__ __forceinline__ bool present() const { return base != nullptr; }

  // The 8 bf16 entries starting at column 8 * vec, still packed (bf16 rows only). kReadOnly as in load8:
  // __ldg, which ptxas may move across barriers, or a plain load, which stays where it is written.
  template <bool kReadOnly = true>
  __device__ __forceinline__ uint4 load_bf16x8(int vec) const {
    const uint4* q = reinterpret_cast<const uint4*>(base) + vec;
    return kReadOnly ? __ldg(q) : *q;
  }

  // Eight consecutive entries starting at column 8 * vec. kReadOnly uses the non-coherent path (__ldg),
  // which the compiler may hoist across __syncthreads; plain loads stay where they are (fewer registers
  // live during the reductions).
  template <bool kReadOnly = true>
  __device__ __forceinline__ void load8(int vec, float (&out)[kVecElems]) const {
    if (kMaybeFp32 && fp32) {
      const float4* q = reinterpret_cast<const float4*>(base) + 2 * vec;
      const float4 a = kReadOnly ? __ldg(q) : q[0], b = kReadOnly ? __ldg(q + 1) : q[1];
      out[0] = a.x;
      out[1] = a.y;
      out[2] = a.z;
      out[3] = a.w;
      out[4] = b.x;
      out[5] = b.y;
      out[6] = b.z;
      out[7] = b.w;
    } else {
      bf16x8_to_float(load_bf16x8<kReadOnly>(vec), out);
    }
  }
};

}  // namespace qwen_fp4
