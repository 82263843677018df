// The limits of the ops' arguments, checked through op_checks.h by ops.cpp and ops_fp8.cpp before any
// launch (qwen_resnorm_fp4/validation.py has the same values; tests/ops/test_validation.py holds them equal).
// Not named limits.h: csrc/ is on the include path, where that name would hide the C header <limits.h>.
#pragma once

#include <cstdint>

namespace qwen_fp4 {

// Widest row D: the widest block shape holds 8 vectors of 8 elements in each of 256 threads.
constexpr int64_t kMaxCols = 16384;
// D is a whole number of 64-column scale tiles (four 16-element NVFP4 blocks; 16-byte vectors).
constexpr int64_t kColsMultiple = 64;
// D of the bf16 row op and the FP8 ops: whole 16-byte vectors of bf16 and whole 16-byte rows of E4M3 (the FP8 GEMM's
// K multiple), no NVFP4 scale tiles.
constexpr int64_t kRowColsMultiple = 16;
// Most rows (x.numel() / D): the grid (a CTA per row and at most 16 padding CTAs) stays below gridDim.x's
// limit of 2^31 - 1, and round_up(rows, 128) below 2^31.
constexpr int64_t kMaxRows = (int64_t(1) << 31) - 128;

// The bf16 dequantization: K (2 x the packed row length) is a positive multiple of kColsMultiple, at most
// this: the 128x4 scale offsets are 32-bit, so K / 64 tiles of 512 bytes stay below 2^31.
constexpr int64_t kMaxDequantizeCols = int64_t(1) << 27;

}  // namespace qwen_fp4
