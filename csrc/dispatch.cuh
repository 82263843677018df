// Picks the block shape for a row width and calls f(VPT, kFixedCols, threads) with compile-time VPT and
// kFixedCols. Fast paths: D = 3072 (Qwen-Image) and 5120 (FLUX-class / video DiTs), exact fits.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <type_traits>

namespace qwen_fp4 {

template <int N>
using Int = std::integral_constant<int, N>;

// TUNING ONLY (temporary): QWEN_FP4_TUNE=1..4 forces one shape of the fast paths.
inline int tune_variant() {
  const char* v = std::getenv("QWEN_FP4_TUNE");
  return v ? std::atoi(v) : 0;
}

template <class F>
void dispatch_row_shape(int32_t cols, int64_t rows, F&& f) {
  if (cols == 3072) {
    int variant = tune_variant();
    if (variant == 0) variant = rows < 2048 ? 1 : 2;
    switch (variant) {
      case 1: return f(Int<2>{}, Int<3072>{}, Int<1>{}, 192);
      case 2: return f(Int<3>{}, Int<3072>{}, Int<6>{}, 128);
      case 3: return f(Int<4>{}, Int<3072>{}, Int<8>{}, 96);
      default: return f(Int<6>{}, Int<3072>{}, Int<10>{}, 64);
    }
  }
  if (cols == 5120) {
    int variant = tune_variant();
    if (variant == 0) variant = rows < 2048 ? 1 : 3;
    switch (variant) {
      case 1: return f(Int<2>{}, Int<5120>{}, Int<1>{}, 320);
      case 2: return f(Int<4>{}, Int<5120>{}, Int<4>{}, 160);
      case 3: return f(Int<5>{}, Int<5120>{}, Int<4>{}, 128);
      default: return f(Int<10>{}, Int<5120>{}, Int<4>{}, 64);
    }
  }
  const int vecs = cols / 8;
  auto threads_for = [vecs](int vpt) { return ((vecs + vpt - 1) / vpt + 31) / 32 * 32; };
  if (vecs <= 256) return f(Int<2>{}, Int<0>{}, Int<1>{}, threads_for(2));  // D <= 2048: <= 128 threads
  if (vecs <= 1024) return f(Int<4>{}, Int<0>{}, Int<1>{}, threads_for(4)); // D <= 8192: <= 256 threads
  return f(Int<8>{}, Int<0>{}, Int<1>{}, threads_for(8));                    // D <= 16384: <= 256 threads
}

}  // namespace qwen_fp4
