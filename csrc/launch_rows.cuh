// The one launch path of the row kernels, shared by the portable and Blackwell translation units: one CTA
// per row (two for few rows of the fused op, split_rows), plus (the quantizing kernels, quantize_grid)
// CTAs that zero the scale tensor's padding rows, with the first-wave stagger where the configuration
// (row_config.cuh) takes it. A launch is a programmatic dependent launch (pdl.cuh) when the launch
// options say so (pdl_enabled, launch.h).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <type_traits>

#include "dispatch.cuh"
#include "launch.h"
#include "pdl.cuh"
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

// Sets a's first-wave stagger (stagger_first_wave) for kKernel's launch by Config's stagger policy and
// returns true, or returns false (no stagger). Same policy for the fused kernels and the bf16 row kernel.
template <auto kKernel, class Config>
bool set_first_wave_stagger(ResnormArgs& a, int device, int threads) {
  if (!has_device_cache(device)) return false;  // stagger_ns stays 0
  if (!Config::stagger_width(a.cols)) return false;
  const int ctas_per_sm = resident_ctas_per_sm<kKernel>(device, threads);
  const int sms = device_sms(device);
  if (sms <= 0 || ctas_per_sm < Config::kStaggerMinResidentCtas) return false;
  if (!Config::kStaggerOneWave && a.rows <= int64_t(sms) * ctas_per_sm) return false;  // one wave
  a.sms = sms;
  a.first_wave_ctas = sms * ctas_per_sm;
  a.stagger_ns = Config::stagger_ns(a.cols);
  return true;
}

// Two CTAs per row (resnorm_quant_split_kernel) while there is at most one row per SM, in the
// configurations that have it: with more rows, each SM would hold several rows' CTAs, each computing its
// row's statistics again. Never in place (residual_out == residual, an out-variant's in-place residual
// update): each of a row's two CTAs reads the whole row while the other stores half of it.
inline bool split_rows(const ResnormArgs& a, int device) {
  return a.residual_out != a.residual && has_device_cache(device) && a.rows <= device_sms(device);
}

template <auto kKernel>
using KernelConstant = std::integral_constant<decltype(kKernel), kKernel>;

// The row kernels of one op, named by configuration: Row<Config, kPlainParams, kStagger> and, where the op
// has one (kQuantizes), the split kernel Split<Config, kPlainParams>.
struct ResnormKernels {
  static constexpr bool kQuantizes = false;
  template <class Config, bool kPlainParams, bool kStagger>
  using Row = KernelConstant<resnorm_kernel<Config, kPlainParams, kStagger>>;
  template <class Config, bool kPlainParams>
  struct Split;  // none: declared for launch_row_kernels' discarded branch, never defined
};

template <class Quantizer>
struct ResnormQuantKernels {
  static constexpr bool kQuantizes = true;
  template <class Config, bool kPlainParams, bool kStagger>
  using Row = KernelConstant<resnorm_quant_kernel<Quantizer, Config, kPlainParams, kStagger>>;
  template <class Config, bool kPlainParams>
  using Split = KernelConstant<resnorm_quant_split_kernel<Quantizer, Config, kPlainParams>>;
};

// Launches Kernels' kernel for args: the split kernel where split_rows says so, else the row kernel of the
// call's configuration, its staggered variant where set_first_wave_stagger sets a stagger.
template <class Kernels>
void launch_row_kernels(const ResnormArgs& args, const LaunchTarget& on) {
  const auto s = static_cast<cudaStream_t>(on.stream);
  const bool pdl = pdl_enabled();
  dispatch_row_kernel(args, [&](auto config, auto plain_params) {
    // (std::decay_t: nvcc's launch rewriting sees the lambda's parameters as references)
    using Config = std::decay_t<decltype(config)>;
    constexpr bool kPlainParams = std::decay_t<decltype(plain_params)>::value;
    const int threads = Config::threads_for(args.cols);
    if constexpr (Kernels::kQuantizes && Config::kHasSplitKernel) {
      if (split_rows(args, on.device)) {
        constexpr auto split = Kernels::template Split<Config, kPlainParams>::value;
        launch_kernel(split, quantize_grid(args.rows, Config::kVectorsPerThread), threads, s, pdl,
                      args);  // a CTA per slot
        return;
      }
    }
    const int64_t grid = Kernels::kQuantizes ? quantize_grid(args.rows) : args.rows;
    if constexpr (Config::kStaggerable) {
      constexpr auto staggered = Kernels::template Row<Config, kPlainParams, true>::value;
      ResnormArgs a = args;
      if (set_first_wave_stagger<staggered, Config>(a, on.device, threads)) {
        launch_kernel(staggered, grid, threads, s, pdl, a);
        return;
      }
    }
    constexpr auto kernel = Kernels::template Row<Config, kPlainParams, Config::kStaggerOneWave>::value;
    launch_kernel(kernel, grid, threads, s, pdl, args);
  });
}

// The configurations of the 4over6 recipe's standalone quantizer kernels: the three generic shapes (any width up
// to their capacity). A quantizer's bytes do not depend on the shape, so three kernels per mode bound what
// the recipe adds to the build.
template <class F>
void dispatch_generic_row_config(int32_t cols, F&& f) {
  const int vecs = cols / kVecElems;
  if (vecs <= 256) return f(RowConfig<2, 0, 1, false>{});   // D <= 2048
  if (vecs <= 1024) return f(RowConfig<4, 0, 1, false>{});  // D <= 8192
  return f(RowConfig<8, 0, 1, false>{});                    // D <= 16384
}

// The 4over6 recipe's fused launch: the call's configuration (dispatch_row_config, as the bf16 row kernel takes it: the
// LayerNorm's sums, hence y, depend on the shape) with its row kernel for general parameters, without the
// split, plain or staggered variants (they compute the same bits; the recipe keeps to one kernel a shape).
template <class Kernels>
void launch_general_row_kernel(const ResnormArgs& args, const LaunchTarget& on) {
  dispatch_row_config(args.cols, args.rows, [&](auto config) {
    using Config = std::decay_t<decltype(config)>;
    constexpr auto kernel = Kernels::template Row<Config, false, false>::value;
    launch_kernel(kernel, quantize_grid(args.rows), Config::threads_for(args.cols),
                  static_cast<cudaStream_t>(on.stream), pdl_enabled(), args);
  });
}

// Fast and exact mode are template parameters of the quantizer; the recipe code picks the standard
// Quantizer or FourOverSix (which reads the rest of the code at run time).
template <template <bool> class Quantizer, template <bool> class FourOverSix>
void launch_resnorm_quant_mode(const ResnormArgs& args, bool fast_math, const LaunchTarget& on, const char* what) {
  if (args.rows == 0) return;
  if (recipe_uses_4over6(args.nvfp4_4over6_code)) {
    if (fast_math)
      launch_general_row_kernel<ResnormQuantKernels<FourOverSix<true>>>(args, on);
    else
      launch_general_row_kernel<ResnormQuantKernels<FourOverSix<false>>>(args, on);
  } else if (fast_math) {
    launch_row_kernels<ResnormQuantKernels<Quantizer<true>>>(args, on);
  } else {
    launch_row_kernels<ResnormQuantKernels<Quantizer<false>>>(args, on);
  }
  check_launch(what);
}

template <class Quantizer>
void launch_nvfp4_quantize_rows(const QuantizeArgs& args, cudaStream_t s) {
  auto launch = [&](auto config) {
    using Shape = typename std::decay_t<decltype(config)>::Shape;
    launch_kernel(nvfp4_quantize_kernel<Quantizer, Shape>, quantize_grid(args.rows), Shape::threads_for(args.cols), s,
                  pdl_enabled(), args);
  };
  if constexpr (TakesRecipeCode<Quantizer>::value)
    dispatch_generic_row_config(args.cols, launch);  // 4over6
  else
    dispatch_row_config(args.cols, args.rows, launch);
}

template <template <bool> class Quantizer, template <bool> class FourOverSix>
void launch_nvfp4_quantize_mode(const QuantizeArgs& args, bool fast_math, const LaunchTarget& on, const char* what) {
  if (args.rows == 0) return;
  auto s = static_cast<cudaStream_t>(on.stream);
  if (recipe_uses_4over6(args.nvfp4_4over6_code)) {
    if (fast_math)
      launch_nvfp4_quantize_rows<FourOverSix<true>>(args, s);
    else
      launch_nvfp4_quantize_rows<FourOverSix<false>>(args, s);
  } else if (fast_math) {
    launch_nvfp4_quantize_rows<Quantizer<true>>(args, s);
  } else {
    launch_nvfp4_quantize_rows<Quantizer<false>>(args, s);
  }
  check_launch(what);
}

}  // namespace qwen_fp4
