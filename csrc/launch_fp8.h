// Host-side interface of the FP8 ops and the no-residual (norm_modulate) ops, between their host wrappers
// (ops_fp8.cpp) and their kernel translation units (launch_fp8.cu, launch_norm_modulate.cu). Only plain
// types cross it; the row ops take ResnormArgs (launch.h) with fp8_out / input_scale (FP8) or packed /
// scales / global_scale (NVFP4) set.
#pragma once

#include <cstdint>

#include "launch.h"

namespace qwen_fp4 {

// What the element-wise FP8 kernel applies to each bf16 value before E4M3: nothing, or PyTorch's GELU(tanh)
// rounded to bf16 (the FFN's second Linear input).
enum class Fp8Activation : int { kNone = 0, kGeluTanh = 1 };

// The element-wise kernel: n contiguous bf16 values at y (16-byte aligned) to n E4M3 bytes at
// out (16-byte aligned).
struct Fp8QuantizeArgs {
  const void* y;
  uint8_t* out;
  int64_t n;
  const float* input_scale;  // one fp32 element on the device
  Fp8Activation activation;
};

// The FP8 row kernel: steps 1-7 and E4M3 (args.fp8_out, args.input_scale; args.y optional bf16 y).
void launch_resnorm_fp8(const ResnormArgs& args, const LaunchTarget& on);
// The no-residual FP8 kernel: steps 3-7 on x and E4M3 (args.residual and args.residual_out unused).
void launch_norm_modulate_fp8(const ResnormArgs& args, const LaunchTarget& on);
// The no-residual NVFP4 kernel: steps 3-7 on x and NVFP4 with the portable conversion (the same bytes as FlashInfer's
// on every GPU), standard or 4over6 recipe (args.nvfp4_4over6_code), fast or exact mode.
void launch_norm_modulate_quant_portable(const ResnormArgs& args, bool fast_math, const LaunchTarget& on);
void launch_fp8_quantize(const Fp8QuantizeArgs& args, const LaunchTarget& on);

}  // namespace qwen_fp4
