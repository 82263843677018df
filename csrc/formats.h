// The number formats' facts, once for the C++ side (qwen_resnorm_fp4/constants.py states them for Python;
// tests/ops/test_constants.py holds the two equal).
#pragma once

namespace qwen_fp4 {

constexpr float kE4m3Max = 448.0f;  // largest finite E4M3 magnitude: FP8 activations and NVFP4 block scales
constexpr float kE2m1Max = 6.0f;    // largest E2M1 magnitude: an NVFP4 element

}  // namespace qwen_fp4
