// The 128x4 swizzled layout of NVFP4 block scales (what the FP4 GEMMs read). Mirrors layout.py.
#pragma once

#include <cstdint>

namespace qwen_fp4 {

// Byte offset of the scale of row m, 16-element block k, in rows of `cols` elements:
// sf_row_offset_128x4(m, cols) + sf_block_offset_128x4(k). 512-byte tiles of 128 rows x 4 blocks, the
// tiles of a 128-row group side by side; inside a tile row m sits at (m % 32) * 16 + ((m % 128) / 32) * 4
// and block k at k % 4. Split in the part that depends on the row only and the part that depends on the
// block only, so that a kernel computes the row's part once.
__host__ __device__ __forceinline__ int64_t sf_row_offset_128x4(int64_t m, int32_t cols) {
  return (m / 128) * (int64_t(cols / 64) * 512) + (m % 32) * 16 + ((m % 128) / 32) * 4;
}
__host__ __device__ __forceinline__ int32_t sf_block_offset_128x4(int32_t k) { return (k / 4) * 512 + (k % 4); }

}  // namespace qwen_fp4
