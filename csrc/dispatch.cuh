// Picks the block shape for a row width and row count and calls f(VPT, kFixedCols, kMinBlocks, kFewRows,
// threads), the first four at compile time. Fast paths: D = 3072 (Qwen-Image) and 5120 (FLUX-class / video
// DiTs), exact fits. kFewRows: fewer than kManyRows rows (RowShape::kFewRows says what it changes).
#pragma once

#include <cstdint>
#include <type_traits>

#include "launch.h"

namespace qwen_fp4 {

template <int N>
using Int = std::integral_constant<int, N>;

// Shapes measured on an H200 (docs/perf/tuning_history.md): few rows want many threads per row (short latency
// chains); many rows want fewer threads per row with a register cap (more rows resident per SM).
template <class F>
void dispatch_row_shape(int32_t cols, int64_t rows, F&& f) {
  constexpr int64_t kManyRows = 2048;
  using Few = std::true_type;
  using Many = std::false_type;
  const bool few = rows < kManyRows;
  if (cols == 3072) {
    if (few) return f(Int<2>{}, Int<3072>{}, Int<1>{}, Few{}, 192);
    return f(Int<3>{}, Int<3072>{}, Int<6>{}, Many{}, 128);
  }
  if (cols == 5120) {
    if (few) return f(Int<2>{}, Int<5120>{}, Int<1>{}, Few{}, 320);
    return f(Int<4>{}, Int<5120>{}, Int<4>{}, Many{}, 160);
  }
  const int vecs = cols / 8;
  auto threads_for = [vecs](int vpt) { return ((vecs + vpt - 1) / vpt + 31) / 32 * 32; };
  // The generic shapes of up to four vectors per thread come twice, the few-rows copy differing only in
  // its loads; the eight-vector shape (D > 8192) once, measured at neither.
  auto generic = [&](auto vpt) {
    if (few) return f(vpt, Int<0>{}, Int<1>{}, Few{}, threads_for(vpt));
    return f(vpt, Int<0>{}, Int<1>{}, Many{}, threads_for(vpt));
  };
  if (vecs <= 256) return generic(Int<2>{});   // D <= 2048: <= 128 threads
  if (vecs <= 1024) return generic(Int<4>{});  // D <= 8192: <= 256 threads
  return f(Int<8>{}, Int<0>{}, Int<1>{}, Many{}, threads_for(8));  // D <= 16384: <= 256 threads
}

// Calls f(std::true_type) for the plain case (no bias, no LayerNorm affine, gate/scale/shift bf16: what
// DiT blocks pass), f(std::false_type) otherwise.
template <class F>
void dispatch_plain(const ResnormArgs& args, F&& f) {
  const bool plain = args.bias.ptr == nullptr && args.weight.ptr == nullptr && args.norm_bias.ptr == nullptr &&
                     !args.gate.fp32 && !args.scale.fp32 && !args.shift.fp32;
  if (plain) return f(std::true_type{});
  return f(std::false_type{});
}

}  // namespace qwen_fp4
