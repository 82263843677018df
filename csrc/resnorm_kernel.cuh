// The row kernels. One CTA per row (two for few rows of the fused op: resnorm_quant_split_kernel); each
// thread holds VPT 16-byte vectors of the row in registers, so the row is read from memory once (per CTA)
// and both LayerNorm passes run on chip. Numerics (docs/numerics.md):
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
// kPaddingRowsPerCta padding rows of the scale tensor, which it zeroes; the fused op's split kernel (few
// rows) has two CTAs per row, then the same padding CTAs. resnorm (no scales) launches one CTA per row.
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
// kFewRowsShape: the shape dispatch_row_shape picks below kManyRows rows (a fixed width's two-vector shape;
// a generic shape's few-rows copy).
template <int VPT, int kFixedCols, bool kFewRowsShape = (kFixedCols != 0 && VPT == 2)>
struct RowShape {
  static constexpr int kFixedWidth = kFixedCols;
  static constexpr int kFixedVecs = kFixedCols / kVecElems;
  static constexpr int kFixedThreads = kFixedVecs / VPT;
  static constexpr int kMaxThreads = kFixedCols ? kFixedThreads : 256;
  static constexpr int kWarps = kFixedCols ? kFixedThreads / 32 : 0;  // 0: known at run time only
  static constexpr bool kFewRows = kFewRowsShape;  // loads x and residual without L1 (kLoadRowNoL1)
  // The few-rows shape of a fixed width (two vectors per thread), the one with the split kernel.
  static constexpr bool kFixedFewRows = kFixedCols != 0 && kFewRows;
  static_assert(kFixedCols == 0 || (kFixedVecs % VPT == 0 && kFixedThreads % 32 == 0), "bad fixed shape");
  static_assert(kFixedCols == 0 || kFewRows == (VPT == 2), "a fixed width's few-rows shape has two vectors");
  static __device__ __forceinline__ int32_t cols(int32_t runtime_cols) { return kFixedCols ? kFixedCols : runtime_cols; }
  static __device__ __forceinline__ int vecs(int32_t cols) { return kFixedCols ? kFixedVecs : cols / kVecElems; }
  static __device__ __forceinline__ int threads() { return kFixedCols ? kFixedThreads : blockDim.x; }
  static __device__ __forceinline__ bool valid(int vec, int vecs) { return kFixedCols != 0 || vec < vecs; }
};

// The quantizing kernels' CTAs past the row CTAs (quantize_grid) are padding CTAs: padding CTA `index`
// (CTA row_ctas + index) zeroes the scale tensor's padding rows rows + index * kPaddingRowsPerCta onwards,
// kPaddingRowsPerCta of them or up to round_up_128(rows), and the function returns true; for a row CTA
// it returns false. A row's four scales of one 64-column tile are four aligned bytes of the 128x4 layout:
// one 32-bit store each. (Before, each padding row took a CTA of its own, one byte store per scale: 111
// CTAs at 17 rows; sharing the padding out over the row CTAs instead made few-row calls slower on the H200.)
template <class Shape>
__device__ __forceinline__ bool zero_scales_if_padding_cta(uint8_t* scales, int64_t rows, int32_t cols,
                                                           int64_t row_ctas) {
  const int64_t cta = blockIdx.x;
  if (cta < row_ctas) return false;
  const int64_t first = rows + (cta - row_ctas) * kPaddingRowsPerCta;
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

// The first wave (kernels with kStagger; launch_rows.cuh, set_first_wave_stagger says when). With every
// resident CTA starting at once, the whole first wave loads at once and then computes at once while DRAM
// idles: on the H200 (D = 3072, 6 CTAs per SM) no row of the first wave finished in the first 5 us of the
// call and first-wave rows lived 6.1-6.4 us, later ones 3.6 us (scripts/cta_timeline.py). CTA slot k of
// the first wave (blockIdx / SMs, the order the CTAs are handed to the SMs) sleeps k * stagger_ns before its
// loads, so each SM computes its early rows while the later ones' bytes arrive. Later waves start as rows
// finish, already spread out.
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
// y[i] is vector slot first_slot + i of the thread (the split kernel passes one slot).
template <class Quantizer, int VPT, class Shape>
__device__ __forceinline__ void quantize_row_and_store(const uint4 (&y)[VPT], int64_t row, int32_t cols, int vecs,
                                                       float global_scale, uint8_t* packed, uint8_t* scales,
                                                       int first_slot = 0) {
  uint32_t* packed_row = reinterpret_cast<uint32_t*>(packed + row * (cols / 2));
  uint8_t* sf_lane = scales + sf_row_offset_128x4(row, cols) + sf_block_offset_128x4(threadIdx.x / 2);
  const bool writes_scales = threadIdx.x % 2 == 0;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = (first_slot + i) * Shape::threads() + threadIdx.x;
    const bool valid = Shape::valid(v, vecs);
    uint8_t* sf = (valid && writes_scales) ? sf_lane + (first_slot + i) * Shape::threads() * 64 : nullptr;
    const uint32_t codes = Quantizer::quantize(y[i], global_scale, sf);
    if (valid) store_stream(packed_row + v, codes);
  }
}

// The few-rows shapes (rows < kManyRows) load x and residual without allocating in L1. Same-run A/B on
// the H200 (docs/perf/tuning_history.md, items 14 and 15), graph replay, the fused op: D = 3072
// 2.64 -> 2.43-2.45 us at 17 rows, 4.11 -> 3.86-3.96 at 256, 8.15 -> 7.78-7.93 at 1024; D = 5120 2.92 ->
// 2.70-2.72 at 17 rows, 16.8-17.1 -> 15.8-16.0 at 1536; resnorm alike (3.51 -> 3.23-3.34 us at 256 rows,
// D = 3072); the generic widths 3-6% at 17 rows and up to 9% (D = 1536 2.85-2.87 -> 2.69 us at 17 rows,
// 8192 22.20-22.25 -> 20.25-20.27 at 1024). Not the many-rows shapes: faster in places (D = 3072, 3072-4608
// rows, 2-8%) but slower with the most rows: the fused op 3-7% at 16384 rows (D = 3072), resnorm 3-8% from
// 8192 rows on at every generic width (also when only the first waves' rows skip L1); nor nvfp4_quantize
// (slower at 256 rows).
template <class Shape>
constexpr bool kLoadRowNoL1 = Shape::kFewRows;

// Loads this thread's vectors of x and residual for one row (zeros past the row's end).
template <int VPT, class Shape>
__device__ __forceinline__ void load_row(const ResnormArgs& args, int64_t row, uint4 (&xv)[VPT], uint4 (&rv)[VPT]) {
  const int vecs = Shape::vecs(Shape::cols(args.cols));
  const uint4* x_row = reinterpret_cast<const uint4*>(args.x) + row * vecs;
  const uint4* res_row = reinterpret_cast<const uint4*>(args.residual) + row * vecs;
  auto load = [](const uint4* p) { return kLoadRowNoL1<Shape> ? load_stream_no_l1(p) : load_stream(p); };
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = i * Shape::threads() + threadIdx.x;
    if (Shape::valid(v, vecs)) {
      xv[i] = load(x_row + v);
      rv[i] = load(res_row + v);
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

// A row's per-column parameters, located once per row. kPlain: no bias, no LayerNorm affine,
// gate/scale/shift bf16 (the common DiT case): they stay packed until used and no dtype or presence tests
// are compiled in.
template <bool kPlain>
struct RowParams {
  using Param = ParamRow<!kPlain>;
  Param gate, scale, shift, weight, norm_bias;
  bool affine;
  __device__ __forceinline__ RowParams(const ResnormArgs& args, int64_t mod_row, int32_t cols)
      : gate(args.gate, mod_row, cols), scale(args.scale, mod_row, cols), shift(args.shift, mod_row, cols),
        weight(kPlain ? ParamRef{} : args.weight, 0, cols), norm_bias(kPlain ? ParamRef{} : args.norm_bias, 0, cols),
        affine(!kPlain && (weight.present() || norm_bias.present())) {}
};

// The shapes outside kGroupedParams (below): narrow ones (few rows, short latency chains) load scale and
// shift before the reductions, so their latency hides behind them; wide ones (many rows) only after the
// reductions, to save registers.
template <int VPT>
constexpr bool kHoistParams = VPT <= 2;

// A plain row's parameters (gate, scale, shift) for this thread's vectors, packed bf16, loaded in one group
// by plain loads, which ptxas keeps where they are written. Before, the gate's __ldg was issued only after
// the first x unpack, which waits for the row's DRAM loads: an L2 round trip added to every row's latency
// chain (and the wide shapes loaded scale and shift after the reductions: a second one). Where it pays, by
// same-run A/B on the H200 (docs/perf/tuning_history.md, item 9):
// - narrow fixed shapes (few rows): x and residual first (their DRAM latency is the time), then the
//   parameters, the shared modulation row (the common call) in a branch of its own so that nothing between
//   the two groups waits on x (modulation_row's switch ahead of the x loads cost 0.06 us at 17 rows).
//   Graph replay, D = 3072: resnorm 2.57 -> 2.39-2.43 us at 17 rows, the fused op 2.77 -> 2.66-2.70; D = 5120:
//   resnorm 2.91 -> 2.70, fused 3.01 -> 2.95. The fused op's one-CTA-per-row kernel of D = 3072 (133-2047
//   rows) too, since the first-wave stagger above one wave (item 10): the group costs it 11 registers and a
//   resident CTA (5 per SM, not 6), which made it slower at 768-1024 rows without the stagger (9.16 against
//   8.76 us at 1024), but with it the group is faster at every row count measured: graph replay 4.07-4.09
//   -> 4.00-4.04 us at 256 rows, 7.17-7.19 -> 6.72-6.87 at 768, 8.74 -> 7.99 at 1024, 11.20-11.27 -> 10.45
//   at 1536 (item 12); resnorm's kernel of that shape was grouped already;
// - the wide D = 3072 shape (2048+ rows): the parameters first, then x and residual: 27.6-27.9 -> 26.9-27.2
//   us at 4096 rows, 48.0 -> 47.2-47.5 at 8192. Not the wide D = 5120 shape (76.5 -> 77.8 us at 8192 rows in
//   the eleventh pass; in item 12's round 0.5-2.5% faster at 2048-4096 rows but 1-2% slower at 16384-32768),
//   nor the generic widths (item 12: at D = 4096 10% faster at 17 rows but 2-6% slower at 4096-8192, at
//   1536 and 2048 slower at most row counts).
template <int VPT, int kFixedCols>
constexpr bool kGroupedParams = kFixedCols == 3072 || (kFixedCols != 0 && VPT <= 2);

template <int VPT, class Shape>
struct PlainParams {
  uint4 gate[VPT], scale[VPT], shift[VPT];

  // gate for every vector slot of the thread; scale and shift for one slot only when slot >= 0 (the split
  // kernel: into scale[0], shift[0]).
  __device__ __forceinline__ void load(const ResnormArgs& args, int64_t mod_row, int32_t cols, int vecs, int slot) {
    const RowParams<true> p(args, mod_row, cols);
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = i * Shape::threads() + threadIdx.x;
      const bool valid = Shape::valid(v, vecs);
      gate[i] = valid ? p.gate.template load_bf16x8<false>(v) : zero;
      if (slot < 0) {
        scale[i] = valid ? p.scale.template load_bf16x8<false>(v) : zero;
        shift[i] = valid ? p.shift.template load_bf16x8<false>(v) : zero;
      }
    }
    if (slot >= 0) {
      const int v = slot * Shape::threads() + threadIdx.x;  // fixed shapes: always valid
      scale[0] = p.scale.template load_bf16x8<false>(v);
      shift[0] = p.shift.template load_bf16x8<false>(v);
    }
  }

  // Loads them and the row's x and residual in the order above.
  __device__ __forceinline__ void load_with_row(const ResnormArgs& args, int64_t row, int32_t cols, int vecs,
                                                uint4 (&xv)[VPT], uint4 (&rv)[VPT], int slot = -1) {
    if constexpr (!kHoistParams<VPT>) {
      load(args, modulation_row(args, row), cols, vecs, slot);
      load_row<VPT, Shape>(args, row, xv, rv);
    } else {
      load_row<VPT, Shape>(args, row, xv, rv);
      if (args.form == ModulationForm::kShared) {
        load(args, 0, cols, vecs, slot);
      } else {
        load(args, modulation_row(args, row), cols, vecs, slot);
      }
    }
  }
};

// Steps 1-5 for one row from its x and residual vectors: d = r, residual_out stored (only vector slot
// `stored_slot` when >= 0: the split kernel), then the two passes; returns rstd with d = r - mu. The plain
// kernels of the tuned widths pass their gate vectors loaded (kGateGiven: gate_bf16); the others load them
// from p.
template <int VPT, class Shape, bool kPlain, bool kGateGiven>
__device__ __forceinline__ float residual_and_rstd(const ResnormArgs& args, const RowParams<kPlain>& p, int64_t row,
                                                   const uint4 (&xv)[VPT], const uint4 (&rv)[VPT],
                                                   const uint4 (&gate_bf16)[VPT], float (&d)[VPT][kVecElems],
                                                   int stored_slot = -1) {
  const int32_t cols = Shape::cols(args.cols);
  const int vecs = Shape::vecs(cols);
  __shared__ __align__(16) float scratch[2][32];  // one per reduction: no barrier before either's writes

  // Steps 1-2 and the row sum. d holds r now and r - mu after the mean.
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
      if constexpr (kGateGiven) {
        bf16x8_to_float(gate_bf16[i], gate);
      } else {
        p.gate.load8(v, gate);
      }
      if constexpr (!kPlain) {
        const ParamRow<true> bias_row(args.bias, 0, cols);
        if (bias_row.present()) {
          float bias[kVecElems];
          bias_row.load8(v, bias);
#pragma unroll
          for (int j = 0; j < kVecElems; ++j) xf[j] = __fadd_rn(xf[j], bias[j]);
          bf16_round8_values(xf);
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
    if (valid && (stored_slot < 0 || stored_slot == i)) store_stream(res_out_row + v, r_bf16);
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
  return rsqrtf(__fadd_rn(var, args.eps));
}

// Steps 6-7 for vector v of the row, d = its r - mu: y = bf16(fma(n, 1 + scale, shift)). kHoist: the
// plain kernels' scale and shift were loaded before the reductions (scale_bf16, shift_bf16).
template <bool kPlain, bool kHoist>
__device__ __forceinline__ uint4 modulate_vec(const RowParams<kPlain>& p, int v, const float (&d)[kVecElems],
                                              float rstd, const uint4& scale_bf16, const uint4& shift_bf16) {
  float scale[kVecElems], shift[kVecElems];
  if constexpr (kPlain) {
    if constexpr (kHoist) {
      bf16x8_to_float(scale_bf16, scale);
      bf16x8_to_float(shift_bf16, shift);
    } else {  // plain loads: they stay after the barriers (read-only loads may be hoisted above them)
      bf16x8_to_float(p.scale.template load_bf16x8<false>(v), scale);
      bf16x8_to_float(p.shift.template load_bf16x8<false>(v), shift);
    }
  } else {
    p.scale.template load8<kHoist>(v, scale);
    p.shift.template load8<kHoist>(v, shift);
  }
  float n[kVecElems];
#pragma unroll
  for (int j = 0; j < kVecElems; ++j) n[j] = __fmul_rn(d[j], rstd);
  if (p.affine) {
    float w[kVecElems], nb[kVecElems];
    if (p.weight.present()) p.weight.template load8<kHoist>(v, w);
    if (p.norm_bias.present()) p.norm_bias.template load8<kHoist>(v, nb);
#pragma unroll
    for (int j = 0; j < kVecElems; ++j) {
      n[j] = __fmaf_rn(n[j], p.weight.present() ? w[j] : 1.0f, p.norm_bias.present() ? nb[j] : 0.0f);
    }
  }
  bf16_round8_values(n);
  float y[kVecElems];
#pragma unroll
  for (int j = 0; j < kVecElems; ++j) y[j] = __fmaf_rn(n[j], __fadd_rn(1.0f, scale[j]), shift[j]);
  return bf16_round8(y);
}

// Steps 1-7 for one row, loading it; returns y (bf16x8 per vector) and writes residual_out.
template <int VPT, class Shape, bool kPlain>
__device__ __forceinline__ void resnorm_row(const ResnormArgs& args, int64_t row, uint4 (&y_out)[VPT]) {
  const int32_t cols = Shape::cols(args.cols);
  const int vecs = Shape::vecs(cols);
  // The plain kernels of the shapes in kGroupedParams load their parameters in one group (PlainParams); the
  // others through p: the gate in the first pass, scale and shift before (narrow shapes, __ldg) or after
  // (wide) the reductions.
  constexpr bool kGrouped = kPlain && kGroupedParams<VPT, Shape::kFixedWidth>;
  constexpr bool kHoist = kHoistParams<VPT>;
  uint4 xv[VPT], rv[VPT];
  PlainParams<VPT, Shape> pp;  // the parameters where kGrouped (scale and shift also where kPlain && kHoist)
  if constexpr (kGrouped) {
    pp.load_with_row(args, row, cols, vecs, xv, rv);
  } else {
    load_row<VPT, Shape>(args, row, xv, rv);
  }
  const RowParams<kPlain> p(args, kGrouped ? 0 : modulation_row(args, row), cols);
  if constexpr (kPlain && kHoist && !kGrouped) {
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int v = i * Shape::threads() + threadIdx.x;
      if (Shape::valid(v, vecs)) {
        pp.scale[i] = p.scale.load_bf16x8(v);
        pp.shift[i] = p.shift.load_bf16x8(v);
      }
    }
  }
  float d[VPT][kVecElems];
  const float rstd = residual_and_rstd<VPT, Shape, kPlain, kGrouped>(args, p, row, xv, rv, pp.gate, d);
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int v = i * Shape::threads() + threadIdx.x;
    y_out[i] = Shape::valid(v, vecs) ? modulate_vec<kPlain, kHoist || kGrouped>(p, v, d[i], rstd, pp.scale[i], pp.shift[i])
                                     : make_uint4(0, 0, 0, 0);
  }
}

// resnorm: writes y. No scales, so no padding rows: grid = rows. kStagger: stagger_first_wave compiled in;
// kFewRows: the few-rows shape (RowShape).
template <int VPT, int kFixedCols, int kMinBlocks, bool kPlain, bool kStagger, bool kFewRows>
__global__ void __launch_bounds__(RowShape<VPT, kFixedCols>::kMaxThreads, kMinBlocks) resnorm_kernel(const ResnormArgs args) {
  using Shape = RowShape<VPT, kFixedCols, kFewRows>;
  if constexpr (kStagger) stagger_first_wave(args);
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

// resnorm_quant: steps 1-8 in one pass; y never leaves registers. kStagger and kFewRows as in resnorm_kernel.
template <class Quantizer, int VPT, int kFixedCols, int kMinBlocks, bool kPlain, bool kStagger, bool kFewRows>
__global__ void __launch_bounds__(RowShape<VPT, kFixedCols>::kMaxThreads, kMinBlocks) resnorm_quant_kernel(const ResnormArgs args) {
  using Shape = RowShape<VPT, kFixedCols, kFewRows>;
  const int32_t cols = Shape::cols(args.cols);
  if (zero_scales_if_padding_cta<Shape>(args.scales, args.rows, cols, args.rows)) return;
  if constexpr (kStagger) stagger_first_wave(args);
  const int64_t row = blockIdx.x;
  const float global_scale = __ldg(args.global_scale);  // now, not after the reductions: one latency less
  uint4 y[VPT];
  resnorm_row<VPT, Shape, kPlain>(args, row, y);
  quantize_row_and_store<Quantizer, VPT, Shape>(y, row, cols, Shape::vecs(cols), global_scale, args.packed,
                                                args.scales);
}

// resnorm_quant for few rows, two CTAs per row (the two-vectors-per-thread shapes of a fixed width).
// CTA 2m + h reads all of row m and computes its statistics exactly as the one-CTA kernel and resnorm do
// (same shape, same sums, so the same bits), then modulates, quantizes and stores only vector slot h of
// each thread: half the columns. So a row's modulation, quantization and stores are spread over two SMs
// (the same split inside one CTA, on one SM, gained nothing: docs/perf/tuning_history.md); the price is a second
// read of the row and the statistics computed twice, which pays only while every CTA has an SM to itself
// (split_rows in launch_rows.cuh).
template <class Quantizer, int kFixedCols, bool kPlain>
__global__ void __launch_bounds__(RowShape<2, kFixedCols>::kMaxThreads, 1)
    resnorm_quant_split_kernel(const ResnormArgs args) {
  constexpr int VPT = 2;
  using Shape = RowShape<VPT, kFixedCols>;
  static_assert(Shape::kFixedFewRows, "the few-rows shapes of the fixed widths only");
  constexpr int32_t cols = kFixedCols;
  if (zero_scales_if_padding_cta<Shape>(args.scales, args.rows, cols, VPT * args.rows)) return;
  const int64_t row = blockIdx.x / VPT;  // one CTA per vector slot: quantize_grid(rows, VPT)
  const int slot = blockIdx.x % VPT;
  const float global_scale = __ldg(args.global_scale);
  uint4 xv[VPT], rv[VPT];
  PlainParams<VPT, Shape> pp;  // the plain kernels' parameters: both slots' gate, this slot's scale and shift
  if constexpr (kPlain) {
    static_assert(kGroupedParams<VPT, kFixedCols>, "the split kernel's shapes load their parameters grouped");
    pp.load_with_row(args, row, cols, Shape::kFixedVecs, xv, rv, slot);
  } else {
    load_row<VPT, Shape>(args, row, xv, rv);
  }
  const RowParams<kPlain> p(args, kPlain ? 0 : modulation_row(args, row), cols);
  const int v = slot * Shape::threads() + threadIdx.x;
  float d[VPT][kVecElems];
  const float rstd = residual_and_rstd<VPT, Shape, kPlain, kPlain>(args, p, row, xv, rv, pp.gate, d, slot);
  float mine[kVecElems];
#pragma unroll
  for (int j = 0; j < kVecElems; ++j) mine[j] = slot ? d[1][j] : d[0][j];
  const uint4 y[1] = {modulate_vec<kPlain, true>(p, v, mine, rstd, pp.scale[0], pp.shift[0])};
  quantize_row_and_store<Quantizer, 1, Shape>(y, row, cols, Shape::kFixedVecs, global_scale, args.packed,
                                              args.scales, slot);
}

// nvfp4_quantize: the standalone quantizer over bf16 rows.
template <class Quantizer, int VPT, int kFixedCols, int kMinBlocks>
__global__ void __launch_bounds__(RowShape<VPT, kFixedCols>::kMaxThreads, kMinBlocks) nvfp4_quantize_kernel(const QuantizeArgs args) {
  using Shape = RowShape<VPT, kFixedCols>;
  const int32_t cols = Shape::cols(args.cols);
  if (zero_scales_if_padding_cta<Shape>(args.scales, args.rows, cols, args.rows)) return;
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
