// The one dispatch site of the row kernels: the configuration (row_config.cuh) for a row width and row
// count, and whether the call's parameters are plain.
#pragma once

#include <cstdint>
#include <type_traits>

#include "launch.h"
#include "row_config.cuh"

namespace qwen_fp4 {

// Calls f(RowConfig<...>{}) for rows of `cols` columns, `rows` of them. The fixed widths are D = 3072
// (Qwen-Image) and 5120 (FLUX-class and video DiTs), exact fits; every other multiple of 64 up to kMaxCols
// takes a generic shape. Few rows want many threads per row (short latency chains); many rows want fewer
// threads per row with a register cap (more rows resident per SM).
template <class F>
void dispatch_row_config(int32_t cols, int64_t rows, F&& f) {
  constexpr int64_t kManyRows = 2048;  // the smallest row count of the many-rows configurations
  const bool few = rows < kManyRows;
  if (cols == 3072) {
    if (few) return f(RowConfig<2, 3072, 1, true>{});  // 192 threads
    return f(RowConfig<3, 3072, 6, false>{});          // 128 threads, 6 CTAs per SM
  }
  if (cols == 5120) {
    if (few) return f(RowConfig<2, 5120, 1, true>{});  // 320 threads
    return f(RowConfig<4, 5120, 4, false>{});          // 160 threads, 4 CTAs per SM
  }
  // The generic shapes up to four vectors per thread come in both row-count classes; the eight-vector
  // shape (D > 8192) in one, the many-rows one (its loads not tuned for few rows).
  auto generic = [&](auto vectors_per_thread) {
    constexpr int kVectors = decltype(vectors_per_thread)::value;
    if (few) return f(RowConfig<kVectors, 0, 1, true>{});
    return f(RowConfig<kVectors, 0, 1, false>{});
  };
  const int vecs = cols / kVecElems;
  if (vecs <= 256) return generic(std::integral_constant<int, 2>{});   // D <= 2048: <= 128 threads
  if (vecs <= 1024) return generic(std::integral_constant<int, 4>{});  // D <= 8192: <= 256 threads
  return f(RowConfig<8, 0, 1, false>{});                               // D <= 16384: <= 256 threads
}

// Whether a call's parameters are plain: no bias, no LayerNorm affine, gate/scale/shift bf16 (what DiT
// blocks pass). Its kernels keep them packed until used and test no dtype or presence.
inline bool plain_params(const ResnormArgs& args) {
  return args.bias.ptr == nullptr && args.weight.ptr == nullptr && args.norm_bias.ptr == nullptr && !args.gate.fp32 &&
         !args.scale.fp32 && !args.shift.fp32;
}

// Calls f(RowConfig<...>{}, std::bool_constant<kPlainParams>{}) for a call of a row kernel (bf16 or NVFP4 output).
template <class F>
void dispatch_row_kernel(const ResnormArgs& args, F&& f) {
  const bool plain = plain_params(args);
  dispatch_row_config(args.cols, args.rows, [&](auto config) {
    if (plain) return f(config, std::true_type{});
    return f(config, std::false_type{});
  });
}

}  // namespace qwen_fp4
