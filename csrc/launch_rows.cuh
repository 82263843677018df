// Launch helpers shared by the portable and Blackwell translation units: one CTA per row, plus (the
// quantizing kernels, quantize_grid) CTAs that zero the scale tensor's padding rows.
#pragma once

#include <cuda_runtime.h>

#include "dispatch.cuh"
#include "launch.h"
#include "resnorm_kernel.cuh"

namespace qwen_fp4 {

template <class Quantizer>
void launch_resnorm_quant_rows(const ResnormArgs& args, cudaStream_t s) {
  dispatch_plain(args, [&](auto plain) {
    dispatch_row_shape(args.cols, args.rows, [&](auto vpt, auto fixed, auto min_blocks, int threads) {
      resnorm_quant_kernel<Quantizer, decltype(vpt)::value, decltype(fixed)::value, decltype(min_blocks)::value,
                           decltype(plain)::value><<<quantize_grid(args.rows), threads, 0, s>>>(args);
    });
  });
}

template <class Quantizer>
void launch_nvfp4_quantize_rows(const QuantizeArgs& args, cudaStream_t s) {
  dispatch_row_shape(args.cols, args.rows, [&](auto vpt, auto fixed, auto min_blocks, int threads) {
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
