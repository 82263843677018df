// The FP8 (E4M3) kernels and the no-residual ("norm_modulate") row kernels, built on the row kernels'
// machinery (resnorm_kernel.cuh: resnorm_row, residual_and_rstd, modulate_vec; one configuration per (D,
// rows) from dispatch_row_config, the one the bf16 row kernel takes), so their bf16 y is that kernel's bit
// for bit:
// - resnorm_fp8_kernel: steps 1-7 as the bf16 row kernel, then the E4M3 rule of fp8_e4m3.cuh on y;
// - norm_modulate_*_kernel: steps 3-7 on r = bf16(fma(0, 0, x)) (x itself, -0 read as +0), which is
//   the bf16 row with x = 0, gate = 0 and the residual x, through the same code (the same sums); then
//   NVFP4 (the Quantizer, as the fused NVFP4 kernel) or E4M3; no residual_out;
// Every kernel starts with begin_after_predecessor (programmatic dependent launch, pdl.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "fp8_e4m3.cuh"
#include "launch.h"
#include "launch_rows.cuh"
#include "resnorm_kernel.cuh"

namespace qwen_fp4 {

// Stores a row's E4M3 bytes (and its bf16 y where args.y is set): vector v of the row is 8 bytes at
// byte 8 * v of the row's cols bytes.
template <class Config>
__device__ __forceinline__ void store_fp8_row(const ResnormArgs& args, int64_t row,
                                              const uint4 (&y)[Config::kVectorsPerThread], float input_scale) {
  const int32_t cols = Config::cols(args.cols);
  const int vecs = Config::vecs(cols);
  const bool valid = fp8_scale_valid(input_scale);
  const float inv = div_full_rcp(input_scale);
  uint2* q_row = reinterpret_cast<uint2*>(args.fp8_out + row * cols);
  uint4* y_row = args.y == nullptr ? nullptr : reinterpret_cast<uint4*>(args.y) + row * vecs;
#pragma unroll
  for (int i = 0; i < Config::kVectorsPerThread; ++i) {
    const int v = i * Config::threads() + threadIdx.x;
    if (!Config::valid(v, vecs)) continue;
    if (y_row != nullptr) store_stream(y_row + v, y[i]);
    store_stream(q_row + v, e4m3x8_from_bf16x8(y[i], inv, valid));
  }
}

// The FP8 row kernel: steps 1-7 (resnorm_row), then E4M3 of y. kStagger as in resnorm_kernel: the same
// launch policy (launch_row_kernels with ResnormFp8Kernels).
template <class Config, bool kPlainParams, bool kStagger>
__global__ void __launch_bounds__(Config::kMaxThreads, Config::kMinCtasPerSm)
    resnorm_fp8_kernel(const ResnormArgs args) {
  begin_after_predecessor();
  if constexpr (kStagger) stagger_first_wave(args);
  const int64_t row = blockIdx.x;
  const float input_scale = __ldg(args.input_scale);  // now, not after the reductions: one latency less
  uint4 y[Config::kVectorsPerThread];
  resnorm_row<Config, kPlainParams>(args, row, y);
  store_fp8_row<Config>(args, row, y, input_scale);
}

// The FP8 row kernels for launch_row_kernels (launch_rows.cuh): one CTA per row, no scale
// padding, no split kernel.
struct ResnormFp8Kernels {
  static constexpr bool kQuantizes = false;
  template <class Config, bool kPlainParams, bool kStagger>
  using Row = KernelConstant<resnorm_fp8_kernel<Config, kPlainParams, kStagger>>;
  template <class Config, bool kPlainParams>
  struct Split;  // none: declared for launch_row_kernels' discarded branch, never defined
};

// x of one row into this thread's vectors (zeros past the row's end), by Config's load policy (load_row's).
template <class Config>
__device__ __forceinline__ void load_x_row(const ResnormArgs& args, int64_t row,
                                           uint4 (&xv)[Config::kVectorsPerThread]) {
  const int vecs = Config::vecs(Config::cols(args.cols));
  const uint4* x_row = reinterpret_cast<const uint4*>(args.x) + row * vecs;
#pragma unroll
  for (int i = 0; i < Config::kVectorsPerThread; ++i) {
    const int v = i * Config::threads() + threadIdx.x;
    xv[i] = !Config::valid(v, vecs)   ? make_uint4(0, 0, 0, 0)
            : Config::kRowLoadsSkipL1 ? load_stream_no_l1(x_row + v)
                                      : load_stream(x_row + v);
  }
}

// Steps 3-7 of one row with r = bf16(fma(0, 0, x)): residual_and_rstd on x = 0, gate = 0 and the residual
// x, storing no residual_out (stored slot kVectorsPerThread: none), then modulate_vec; general parameters
// (args.bias is null: no step 1).
template <class Config>
__device__ __forceinline__ void norm_modulate_row(const ResnormArgs& args, int64_t row,
                                                  uint4 (&y_out)[Config::kVectorsPerThread]) {
  constexpr int kVectors = Config::kVectorsPerThread;
  const int vecs = Config::vecs(Config::cols(args.cols));
  uint4 xv[kVectors], zero[kVectors];
  load_x_row<Config>(args, row, xv);
#pragma unroll
  for (int i = 0; i < kVectors; ++i) zero[i] = make_uint4(0, 0, 0, 0);
  const RowParams<false> p(args, modulation_row(args, row));
  float d[kVectors][kVecElems];
  const float rstd = residual_and_rstd<Config, false, true>(args, p, row, zero, xv, zero, d, kVectors);
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int v = i * Config::threads() + threadIdx.x;
    y_out[i] = Config::valid(v, vecs) ? modulate_vec<false, Config::kHoistParams>(p, v, d[i], rstd, zero[i], zero[i])
                                      : make_uint4(0, 0, 0, 0);
  }
}

// The no-residual FP8 kernel: steps 3-7 on x, then E4M3. One CTA per row.
template <class Config>
__global__ void __launch_bounds__(Config::kMaxThreads, Config::kMinCtasPerSm)
    norm_modulate_fp8_kernel(const ResnormArgs args) {
  begin_after_predecessor();
  const int64_t row = blockIdx.x;
  const float input_scale = __ldg(args.input_scale);
  uint4 y[Config::kVectorsPerThread];
  norm_modulate_row<Config>(args, row, y);
  store_fp8_row<Config>(args, row, y, input_scale);
}

// The no-residual NVFP4 kernel: steps 3-7 on x, then NVFP4 (the Quantizer, as resnorm_quant_kernel), with the
// quantizing kernels' grid (quantize_grid: padding CTAs zero the scale tensor's padding rows).
template <class Quantizer, class Config>
__global__ void __launch_bounds__(Config::kMaxThreads, Config::kMinCtasPerSm)
    norm_modulate_quant_kernel(const ResnormArgs args) {
  const int32_t cols = Config::cols(args.cols);
  begin_after_predecessor();
  if (zero_scales_if_padding_cta<Config>(args.scales, args.rows, cols, args.rows)) return;
  const int64_t row = blockIdx.x;
  const float global_scale = __ldg(args.global_scale);
  uint4 y[Config::kVectorsPerThread];
  norm_modulate_row<Config>(args, row, y);
  quantize_row_and_store<Quantizer, Config>(y, row, cols, Config::vecs(cols), global_scale, args.packed, args.scales,
                                            args.nvfp4_4over6_code);
}

}  // namespace qwen_fp4
