// Launch helpers shared by the portable and Blackwell translation units: one CTA per row (two for few rows
// of the fused op, split_rows), plus (the quantizing kernels, quantize_grid) CTAs that zero the scale
// tensor's padding rows.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <type_traits>

#include "dispatch.cuh"
#include "launch.h"
#include "resnorm_kernel.cuh"

namespace qwen_fp4 {

// SMs of `device` (0 .. kMaxCachedDevices - 1), asked once per device.
inline int device_sms(int device) {
  static std::atomic<int> cached[kMaxCachedDevices];
  int sms = cached[device].load(std::memory_order_relaxed);
  if (sms == 0) {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cached[device].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

// CTAs of kKernel resident per SM of `device` at `threads` threads, asked once per kernel and device (a
// template argument, not a function-pointer type: every row kernel has the same type; per device, since
// GPUs of one machine may differ). The cache holds the count + 1.
template <auto kKernel>
int resident_ctas_per_sm(int device, int threads) {
  static std::atomic<int> cached[kMaxCachedDevices];  // zero: not asked yet
  int ctas = cached[device].load(std::memory_order_relaxed) - 1;
  if (ctas < 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kKernel, threads, 0) != cudaSuccess) {
      cudaGetLastError();  // clear this query's own error only: no stagger is the answer
      ctas = 0;
    }
    cached[device].store(ctas + 1, std::memory_order_relaxed);
  }
  return ctas;
}

// Sets a's first-wave stagger (stagger_first_wave) for kKernel's launch and returns true, or returns false
// (no stagger). Same policy for the fused op and resnorm. Measured by same-run A/B on the H200
// (docs/perf/tuning_history.md, items 6, 10 and 11):
// - the many-rows shapes (kMinBlocks > 1: 6 resident CTAs per SM at D = 3072, 4 at 5120): always, 300 ns
//   per slot at D = 3072, about the time DRAM takes to deliver one slot's loads (SMs x 12 KB at 4 TB/s),
//   scaled with D (500 ns at 5120). The fused op 1-2% faster at 4096-16384 rows (D = 3072, 250-600 ns
//   alike), 2-3% at 2048 rows and 0.5-1.2% at 4096-6889 and 16384 (D = 5120, 500 ns), none at 8192;
//   resnorm (graph replay, 4096 rows) unchanged at D = 3072, 1% faster at 5120;
// - the one-CTA shapes (kMinBlocks == 1: the few-rows shapes of the fixed widths, every row count of the
//   generic widths): only when the rows fill more than one wave (rows > SMs x resident CTAs per SM: 792
//   rows at D = 3072, 396 at 5120, 1320 at 1536, 1056 at 2048, 924 at 4096). Within one wave it did not
//   pay (D = 3072, 512 rows, 300 ns: 5.58-5.70 -> 5.84-5.96 us).
//   - fixed widths: 300 ns at either (the best of 150 / 300 / 500). Graph replay, the fused op: D = 3072
//     8.75 -> 8.58-8.60 us at 1024 rows, 11.70 -> 11.16-11.18 at 1536; D = 5120 8.33 -> 7.46-7.48 at 512,
//     12.91 -> 12.04-12.06 at 1024; resnorm about as much (7.90 -> 7.45 us at 1024 rows, D = 3072);
//   - generic widths 1536-4096 (those measured): 300 ns x D / 3072, which beat a flat 300 ns at 1536 and
//     2048. Graph replay, the fused op: D = 1536 9.36-9.49 -> 8.96-9.03 us at 2048 rows; D = 2048 11.09-11.10
//     -> 10.72 at 2048; D = 4096 20.41-20.43 -> 19.67-19.78 at 2048, 35.45-35.48 -> 34.78-34.81 at 4096.
template <auto kKernel, int kFixedCols, int kMinBlocks>
bool set_first_wave_stagger(ResnormArgs& a, int threads) {
  const int device = a.device;  // the op's device, current under its device guard
  if (!has_device_cache(device)) return false;  // stagger_ns stays 0
  if (kFixedCols == 0 && (a.cols < 1536 || a.cols > 4096)) return false;  // not measured
  const int ctas_per_sm = resident_ctas_per_sm<kKernel>(device, threads);
  const int sms = device_sms(device);
  if (sms <= 0 || ctas_per_sm < 1) return false;
  if constexpr (kMinBlocks > 1) {
    if (ctas_per_sm < 4) return false;
  } else {
    if (a.rows <= int64_t(sms) * ctas_per_sm) return false;
  }
  a.sms = sms;
  a.first_wave_ctas = sms * ctas_per_sm;
  a.stagger_ns = kMinBlocks == 1 && kFixedCols != 0 ? 300 : 300 * a.cols / 3072;
  return true;
}

// The shapes that can take the stagger: the many-rows ones (their kernels always have its code) and the
// one-CTA shapes up to four vectors per thread (the few-rows shapes of D = 3072 and 5120, and the generic
// shapes of the widths up to 8192, of which set_first_wave_stagger staggers 1536-4096), whose kernels come
// twice, with and without it: calls within one wave run the one without, since its code alone cost
// 0.06-0.11 us at 400-512 rows (D = 3072, graph replay, in both the fused op and resnorm).
template <int kVpt, int kFixedCols, int kMinBlocks>
constexpr bool kStaggerable = kMinBlocks > 1 || kFixedCols != 0 || kVpt <= 4;

// Launches kStaggered with the stagger where set_first_wave_stagger sets one, kKernel otherwise (the same
// kernel for the many-rows shapes).
template <auto kKernel, auto kStaggered, int kFixedCols, int kMinBlocks>
void launch_row_kernel(const ResnormArgs& args, int64_t grid, int threads, cudaStream_t s) {
  ResnormArgs a = args;
  if (set_first_wave_stagger<kStaggered, kFixedCols, kMinBlocks>(a, threads)) {
    kStaggered<<<grid, threads, 0, s>>>(a);
  } else {
    kKernel<<<grid, threads, 0, s>>>(a);
  }
}

// Two CTAs per row (resnorm_quant_split_kernel) while there is at most one row per SM, in the shapes that
// have it (the few-rows shapes of D = 3072 and 5120). Same-run A/B on the H200 (132 SMs), graph replay,
// D = 3072: 2.92 -> 2.73 us at 17 rows, 3.08 -> 2.91 at 64, 3.39 -> 3.30 at 128, but 3.64 -> 3.73 at 160
// and 4.03 -> 4.25 at 256, where each SM holds two rows' four CTAs, each computing its row's statistics;
// D = 5120: 3.34 -> 2.98 at 17 rows, 3.59 -> 3.31 at 64, within 0.02 us at 96-128, slower from 160 on.
inline bool split_rows(const ResnormArgs& a) {
  return has_device_cache(a.device) && a.rows <= device_sms(a.device);
}

template <class Quantizer>
void launch_resnorm_quant_rows(const ResnormArgs& args, cudaStream_t s) {
  dispatch_plain(args, [&](auto plain) {
    dispatch_row_shape(args.cols, args.rows, [&](auto vpt, auto fixed, auto min_blocks, auto few, int threads) {
      // (std::decay_t: nvcc's launch rewriting sees the captured `plain` as a reference)
      constexpr int kVpt = decltype(vpt)::value, kFixedCols = decltype(fixed)::value;
      constexpr int kMinBlocks = decltype(min_blocks)::value;
      constexpr bool kPlain = std::decay_t<decltype(plain)>::value, kFew = decltype(few)::value;
      if constexpr (RowShape<kVpt, kFixedCols, kFew>::kFixedFewRows) {
        if (split_rows(args)) {
          constexpr auto split = resnorm_quant_split_kernel<Quantizer, kFixedCols, kPlain>;
          split<<<quantize_grid(args.rows, kVpt), threads, 0, s>>>(args);  // one CTA per vector slot
          return;
        }
      }
      constexpr auto kernel =
          resnorm_quant_kernel<Quantizer, kVpt, kFixedCols, kMinBlocks, kPlain, (kMinBlocks > 1), kFew>;
      if constexpr (kStaggerable<kVpt, kFixedCols, kMinBlocks>) {
        constexpr auto staggered = resnorm_quant_kernel<Quantizer, kVpt, kFixedCols, kMinBlocks, kPlain, true, kFew>;
        launch_row_kernel<kernel, staggered, kFixedCols, kMinBlocks>(args, quantize_grid(args.rows), threads, s);
      } else {
        kernel<<<quantize_grid(args.rows), threads, 0, s>>>(args);
      }
    });
  });
}

template <class Quantizer>
void launch_nvfp4_quantize_rows(const QuantizeArgs& args, cudaStream_t s) {
  // (one kernel for both row-count copies of a generic shape: only load_row, which this kernel does not use,
  // tells them apart)
  dispatch_row_shape(args.cols, args.rows, [&](auto vpt, auto fixed, auto min_blocks, auto, int threads) {
    nvfp4_quantize_kernel<Quantizer, decltype(vpt)::value, decltype(fixed)::value, decltype(min_blocks)::value>
        <<<quantize_grid(args.rows), threads, 0, s>>>(args);
  });
}

// Fast and exact mode are template parameters of the quantizer.
template <template <bool> class Quantizer>
void launch_resnorm_quant_mode(const ResnormArgs& args, bool fast_math, void* stream, const char* what) {
  if (args.rows == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (fast_math) launch_resnorm_quant_rows<Quantizer<true>>(args, s);
  else launch_resnorm_quant_rows<Quantizer<false>>(args, s);
  check_launch(what);
}

template <template <bool> class Quantizer>
void launch_nvfp4_quantize_mode(const QuantizeArgs& args, bool fast_math, void* stream, const char* what) {
  if (args.rows == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (fast_math) launch_nvfp4_quantize_rows<Quantizer<true>>(args, s);
  else launch_nvfp4_quantize_rows<Quantizer<false>>(args, s);
  check_launch(what);
}

}  // namespace qwen_fp4
