// The row kernels. One CTA per row; each thread holds VPT 16-byte vectors of the row in registers, so
// the row is read from memory once and both LayerNorm passes run on chip. Numerics (docs/numerics.md):
//   1. a = bf16(x + bias)                   2. r = bf16(fma(a, gate, residual))   -> residual_out
//   3. mu = sum(r) * (1/D)                   4. var = sum((r - mu)^2) * (1/D)       (two passes, on chip)
//   5. rstd = rsqrt(var + eps)  (rsqrtf: the GPU's approximate rsqrt)
//   6. n = bf16((r - mu) * rstd)  or, affine, bf16(fma((r - mu) * rstd, weight, norm_bias))
//   7. y = bf16(fma(n, 1 + scale, shift))
//   8. NVFP4 of y (the Quantizer), or y itself.
// All arithmetic is explicit __f*_rn intrinsics: the compiler may not contract or reorder it, so the
// fused kernel and resnorm + nvfp4_quantize produce the same bits.
//
// Grid of the quantizing kernels: quantize_grid(rows) CTAs, one per row, then one per
// kPaddingRowsPerCta padding rows of the scale tensor, which it zeroes. resnorm (no scales) launches one
// CTA per row.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

#include "launch.h"
#include "reduce.cuh"
#include "sf_layout.cuh"
#include "vec.cuh"

namespace qwen_fp4 {

// Block shape for a row: VPT vectors per thread. kFixedCols != 0 specialises one width exactly
// (threads = kFixedCols / 8 / VPT, no bounds checks); 0 handles any multiple of 64 at run time.
template <int VPT, int kFixedCols>
struct RowShape {
  static constexpr int kFixedVecs = kFixedCols / kVecElems;
  static constexpr int kFixedThreads = kFixedVecs / VPT;
  static constexpr int kMaxThreads = kFixedCols ? kFixedThreads : 256;
  static constexpr int kWarps = kFixedCols ? kFixedThreads / 32 : 0;  // 0: known at run time only
  static_assert(kFixedCols == 0 || (kFixedVecs % VPT == 0 && kFixedThreads % 32 == 0), "bad fixed shape");
  static __device__ __forceinline__ int32_t cols(int32_t runtime_cols) { return kFixedCols ? kFixedCols : runtime_cols; }
  static __device__ __forceinline__ int vecs(int32_t cols) { return kFixedCols ? kFixedVecs : cols / kVecElems; }
  static __device__ __forceinline__ int threads() { return kFixedCols ? kFixedThreads : blockDim.x; }
  static __device__ __forceinline__ bool valid(int vec, int vecs) { return kFixedCols != 0 || vec < vecs; }
};

// The quantizing kernels' CTAs past the row CTAs (quantize_grid) are padding CTAs: padding CTA `index`
// (CTA rows + index) zeroes the scale tensor's padding rows rows + index * kPaddingRowsPerCta onwards,
// kPaddingRowsPerCta of them or up to round_up_128(rows), and the function returns true; for a row CTA
// it returns false. A row's four scales of one 64-column tile are four aligned bytes of the 128x4 layout:
// one 32-bit store each. (Before, each padding row took a CTA of its own, one byte store per scale: 111
// CTAs at 17 rows; sharing the padding out over the row CTAs instead made few-row calls slower on the H200.)
template <class Shape>
__device__ __forceinline__ bool zero_scales_if_padding_cta(uint8_t* scales, int64_t rows, int32_t cols) {
  const int64_t cta = blockIdx.x;
  if (cta < rows) return false;
  const int64_t first = rows + (cta - rows) * kPaddingRowsPerCta;
  const int64_t end = min(first + kPaddingRowsPerCta, round_up_128(rows));
  const int tiles = cols / 64;  // <= threads (VPT <= 8)
  const int rows_per_pass = Shape::threads() / tiles;
  const int pass_row = threadIdx.x / tiles, tile = threadIdx.x % tiles;
  if (pass_row >= rows_per_pass) return true;
  for (int64_t m = first + pass_row; m < end; m += rows_per_pass) {
    *reinterpret_cast<uint32_t*>(scales + sf_row_offset_128x4(m, cols) + sf_block_offset_128x4(4 * tile)) = 0u;
  }
  return true;
}

// The first wave of the many-rows shapes. With every resident CTA starting at once, the whole first wave
// loads at once and then computes at once while DRAM idles: on the H200 (D = 3072, 6 CTAs per SM) no row
// of the first wave finished in the first 5 us of the call and first-wave rows lived 6.1-6.4 us, later ones
// 3.6 us (scripts/cta_timeline.py). CTA slot k of the first wave (blockIdx / SMs, the order the CTAs are
// handed to the SMs) sleeps k * stagger_ns before its loads, so each SM computes its early rows while the
// later ones' bytes arrive. Later waves start as rows finish, already spread out.
__device__ __forceinline__ void stagger_first_wave(const ResnormArgs& args) {
  const int64_t cta = blockIdx.x;
  if (args.stagger_ns > 0 && cta >= args.sms && cta < args.first_wave_ctas) {
    __nanosleep(static_cast<unsigned>(cta / args.sms) * static_cast<unsigned>(args.stagger_ns));
  }
}

// Quantizes the row's vectors and stores packed codes and scales. All lanes take part (shuffles).
// Vector v = i * threads + tid holds half of block v / 2; the even lane of each pair writes its scale.
// threads % 32 == 0, so block v / 2 = i * threads / 2 + tid / 2 sits at sf_block_offset(tid / 2) +
// i * threads * 64 in the 128x4 layout: one address per thread, a constant step per vector.
template <class Quantizer, int VPT, class Shape>
__device__ __forceinline__ void quantize_row_and_store(const uint4 (&y)[VPT], int64_t row, int32_t cols, int vecs,
                                                       float global_scale, uint8_t* packed, uint8_t* scales) {
  uint32_t* packed_row = reinterpret_cast<uint32_t*>(packed + row * (cols / 2));
  uint8_t* sf_lane = scales + sf_row_offset_128x4(row, cols) + sf_block_offset_128x4(threadIdx.x / 2);
  const bool writes_scales = threadIdx.x % 2 == 0;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = i * Shape::threads() + threadIdx.x;
    const bool valid = Shape::valid(v, vecs);
    uint8_t* sf = (valid && writes_scales) ? sf_lane + i * Shape::threads() * 64 : nullptr;
    const uint32_t codes = Quantizer::quantize(y[i], global_scale, sf);
    if (valid) store_stream(packed_row + v, codes);
  }
}

// Loads this thread's vectors of x and residual for one row (zeros past the row's end).
template <int VPT, class Shape>
__device__ __forceinline__ void load_row(const ResnormArgs& args, int64_t row, uint4 (&xv)[VPT], uint4 (&rv)[VPT]) {
  const int vecs = Shape::vecs(Shape::cols(args.cols));
  const uint4* x_row = reinterpret_cast<const uint4*>(args.x) + row * vecs;
  const uint4* res_row = reinterpret_cast<const uint4*>(args.residual) + row * vecs;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = i * Shape::threads() + threadIdx.x;
    if (Shape::valid(v, vecs)) {
      xv[i] = load_stream(x_row + v);
      rv[i] = load_stream(res_row + v);
    } else {
      xv[i] = rv[i] = make_uint4(0, 0, 0, 0);
    }
  }
}

// Which row of gate/scale/shift row `row` uses.
__device__ __forceinline__ int64_t modulation_row(const ResnormArgs& args, int64_t row) {
  if (args.form == ModulationForm::kShared) return 0;
  const int64_t batch = row / args.rows_per_batch;
  if (args.form != ModulationForm::kIndexed) return batch;
  bool second;
  switch (args.index_dtype) {
    case IndexDtype::kInt32: second = reinterpret_cast<const int32_t*>(args.modulate_index)[row] != 0; break;
    case IndexDtype::kInt64: second = reinterpret_cast<const int64_t*>(args.modulate_index)[row] != 0; break;
    default: second = reinterpret_cast<const uint8_t*>(args.modulate_index)[row] != 0; break;
  }
  return second ? args.num_batches + batch : batch;
}

// Steps 1-7 for one row from its x and residual vectors; returns y (bf16x8 per vector) and writes
// residual_out. kPlain: no bias, no LayerNorm affine, gate/scale/shift bf16 (the common DiT case):
// the parameters stay packed until used and no dtype or presence tests are compiled in.
template <int VPT, class Shape, bool kPlain>
__device__ __forceinline__ void resnorm_row_from(const ResnormArgs& args, int64_t row, const uint4 (&xv)[VPT],
                                                 const uint4 (&rv)[VPT], uint4 (&y_out)[VPT]) {
  const int32_t cols = Shape::cols(args.cols);
  const int vecs = Shape::vecs(cols);
  __shared__ __align__(16) float scratch[2][32];  // one per reduction: no barrier before either's writes
  using Param = ParamRow<!kPlain>;
  const int64_t mod_row = modulation_row(args, row);
  const Param gate_row(args.gate, mod_row, cols), scale_row(args.scale, mod_row, cols),
      shift_row(args.shift, mod_row, cols);

  // Narrow shapes (few rows, short latency chains) load scale and shift before the reductions, so their
  // latency hides behind them (ptxas issues these loads after the first barrier, ahead of the second, in
  // the sm_90a build); wide shapes (many rows) only after the reductions, to save registers.
  constexpr bool kHoistParams = VPT <= 2;
  uint4 scale_bf16[VPT], shift_bf16[VPT];
  if constexpr (kPlain && kHoistParams) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = i * Shape::threads() + threadIdx.x;
      if (Shape::valid(v, vecs)) {
        scale_bf16[i] = scale_row.load_bf16x8(v);
        shift_bf16[i] = shift_row.load_bf16x8(v);
      }
    }
  }

  // Steps 1-2 and the row sum. d holds r now and r - mu after the mean.
  float d[VPT][kVecElems];
  float sum = 0.0f;
  uint4* res_out_row = reinterpret_cast<uint4*>(args.residual_out) + row * vecs;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = i * Shape::threads() + threadIdx.x;
    const bool valid = Shape::valid(v, vecs);
    float xf[kVecElems], resf[kVecElems], gate[kVecElems];
    bf16x8_to_float(xv[i], xf);
    bf16x8_to_float(rv[i], resf);
    if (valid) {
      gate_row.load8(v, gate);
      if constexpr (!kPlain) {
        const Param bias_row(args.bias, 0, cols);
        if (bias_row.present()) {
          float bias[kVecElems];
          bias_row.load8(v, bias);
#pragma unroll
          for (int j = 0; j < kVecElems; ++j) xf[j] = __fadd_rn(xf[j], bias[j]);
          bf16_round8(xf);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < kVecElems; ++j) gate[j] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kVecElems; ++j) d[i][j] = __fmaf_rn(xf[j], gate[j], resf[j]);
    const uint4 r_bf16 = bf16_round8(d[i]);
#pragma unroll
    for (int j = 0; j < kVecElems; ++j) sum = __fadd_rn(sum, d[i][j]);
    if (valid) store_stream(res_out_row + v, r_bf16);
  }

  // Steps 3-5: two passes over the values held in registers.
  const float inv_cols = args.inv_cols;
  const float mu = __fmul_rn(block_sum<Shape::kWarps>(sum, scratch[0]), inv_cols);
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const bool valid = Shape::valid(i * Shape::threads() + threadIdx.x, vecs);
#pragma unroll
    for (int j = 0; j < kVecElems; ++j) {
      d[i][j] = valid ? __fsub_rn(d[i][j], mu) : 0.0f;
      sq = __fmaf_rn(d[i][j], d[i][j], sq);
    }
  }
  const float var = __fmul_rn(block_sum<Shape::kWarps>(sq, scratch[1]), inv_cols);
  const float rstd = rsqrtf(__fadd_rn(var, args.eps));

  // Steps 6-7.
  const Param weight_row(kPlain ? ParamRef{} : args.weight, 0, cols),
      norm_bias_row(kPlain ? ParamRef{} : args.norm_bias, 0, cols);
  const bool affine = !kPlain && (weight_row.present() || norm_bias_row.present());
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = i * Shape::threads() + threadIdx.x;
    if (Shape::valid(v, vecs)) {
      float scale[kVecElems], shift[kVecElems];
      if constexpr (kPlain) {
        if constexpr (kHoistParams) {
          bf16x8_to_float(scale_bf16[i], scale);
          bf16x8_to_float(shift_bf16[i], shift);
        } else {  // plain loads: they stay after the barriers (read-only loads may be hoisted above them)
          bf16x8_to_float(reinterpret_cast<const uint4*>(scale_row.base)[v], scale);
          bf16x8_to_float(reinterpret_cast<const uint4*>(shift_row.base)[v], shift);
        }
      } else {
        scale_row.template load8<kHoistParams>(v, scale);
        shift_row.template load8<kHoistParams>(v, shift);
      }
      float n[kVecElems];
#pragma unroll
      for (int j = 0; j < kVecElems; ++j) n[j] = __fmul_rn(d[i][j], rstd);
      if (affine) {
        float w[kVecElems], nb[kVecElems];
        if (weight_row.present()) weight_row.template load8<kHoistParams>(v, w);
        if (norm_bias_row.present()) norm_bias_row.template load8<kHoistParams>(v, nb);
#pragma unroll
        for (int j = 0; j < kVecElems; ++j) {
          n[j] = __fmaf_rn(n[j], weight_row.present() ? w[j] : 1.0f, norm_bias_row.present() ? nb[j] : 0.0f);
        }
      }
      bf16_round8(n);
      float y[kVecElems];
#pragma unroll
      for (int j = 0; j < kVecElems; ++j) y[j] = __fmaf_rn(n[j], __fadd_rn(1.0f, scale[j]), shift[j]);
      y_out[i] = bf16_round8(y);
    } else {
      y_out[i] = make_uint4(0, 0, 0, 0);
    }
  }
}

// Steps 1-7 for one row, loading it first.
template <int VPT, class Shape, bool kPlain>
__device__ __forceinline__ void resnorm_row(const ResnormArgs& args, int64_t row, uint4 (&y_out)[VPT]) {
  uint4 xv[VPT], rv[VPT];
  load_row<VPT, Shape>(args, row, xv, rv);
  resnorm_row_from<VPT, Shape, kPlain>(args, row, xv, rv, y_out);
}

// resnorm: writes y. No scales, so no padding rows: grid = rows.
template <int VPT, int kFixedCols, int kMinBlocks, bool kPlain>
__global__ void __launch_bounds__(RowShape<VPT, kFixedCols>::kMaxThreads, kMinBlocks) resnorm_kernel(const ResnormArgs args) {
  using Shape = RowShape<VPT, kFixedCols>;
  const int64_t row = blockIdx.x;
  uint4 y[VPT];
  resnorm_row<VPT, Shape, kPlain>(args, row, y);
  const int vecs = Shape::vecs(args.cols);
  uint4* y_row = reinterpret_cast<uint4*>(args.y) + row * vecs;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = i * Shape::threads() + threadIdx.x;
    if (Shape::valid(v, vecs)) y_row[v] = y[i];
  }
}

// resnorm_quant: steps 1-8 in one pass; y never leaves registers.
template <class Quantizer, int VPT, int kFixedCols, int kMinBlocks, bool kPlain>
__global__ void __launch_bounds__(RowShape<VPT, kFixedCols>::kMaxThreads, kMinBlocks) resnorm_quant_kernel(const ResnormArgs args) {
  using Shape = RowShape<VPT, kFixedCols>;
  const int32_t cols = Shape::cols(args.cols);
  if (zero_scales_if_padding_cta<Shape>(args.scales, args.rows, cols)) return;
  if constexpr (kMinBlocks > 1) stagger_first_wave(args);  // the many-rows shapes only
  const int64_t row = blockIdx.x;
  const float global_scale = __ldg(args.global_scale);  // now, not after the reductions: one latency less
  uint4 y[VPT];
  resnorm_row<VPT, Shape, kPlain>(args, row, y);
  quantize_row_and_store<Quantizer, VPT, Shape>(y, row, cols, Shape::vecs(cols), global_scale, args.packed,
                                                args.scales);
}

// nvfp4_quantize: the standalone quantizer over bf16 rows.
template <class Quantizer, int VPT, int kFixedCols, int kMinBlocks>
__global__ void __launch_bounds__(RowShape<VPT, kFixedCols>::kMaxThreads, kMinBlocks) nvfp4_quantize_kernel(const QuantizeArgs args) {
  using Shape = RowShape<VPT, kFixedCols>;
  const int32_t cols = Shape::cols(args.cols);
  if (zero_scales_if_padding_cta<Shape>(args.scales, args.rows, cols)) return;
  const int64_t row = blockIdx.x;
  const float global_scale = __ldg(args.global_scale);
  const int vecs = Shape::vecs(cols);
  const uint4* y_row = reinterpret_cast<const uint4*>(args.y) + row * vecs;
  uint4 y[VPT];
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = i * Shape::threads() + threadIdx.x;
    y[i] = Shape::valid(v, vecs) ? load_stream(y_row + v) : make_uint4(0, 0, 0, 0);
  }
  quantize_row_and_store<Quantizer, VPT, Shape>(y, row, cols, vecs, global_scale, args.packed, args.scales);
}

}  // namespace qwen_fp4
