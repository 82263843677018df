// The row kernels, one template per op, each taking its configuration (row_config.cuh) as its one shape
// parameter. One CTA per row (two for few rows of the fused op: resnorm_quant_split_kernel); each thread
// holds its 16-byte vectors of the row in registers, so the row is read from memory once (per CTA) and both
// LayerNorm passes run on chip. Numerics (docs/numerics.md):
//   1. a = bf16(x + bias)                   2. r = bf16(fma(a, gate, residual))   -> residual_out
//   3. mu = sum(r) * (1/D)                   4. var = sum((r - mu)^2) * (1/D)       (two passes, on chip)
//   5. rstd = rsqrt(var + eps)  (rsqrtf: the GPU's approximate rsqrt)
//   6. n = bf16((r - mu) * rstd)  or, affine, bf16(fma((r - mu) * rstd, weight, norm_bias))
//   7. y = bf16(fma(n, 1 + scale, shift))
//   8. NVFP4 of y (the Quantizer), or y itself.
// All arithmetic is explicit __f*_rn intrinsics: the compiler may not contract or reorder it, so the
// fused kernel and the bf16 row kernel + the standalone quantizer produce the same bits.
//
// Grid of the quantizing kernels: quantize_grid(rows) CTAs, one per row, then one per
// kPaddingRowsPerCta padding rows of the scale tensor, which it zeroes; the fused op's split kernel (few
// rows) has two CTAs per row, then the same padding CTAs. The bf16 row kernel (no scales) launches one CTA per row.
//
// Programmatic dependent launch (pdl.cuh): every kernel starts with begin_after_predecessor, before its
// first global load or store (the padding CTAs' scale stores and the global scale included), so only the
// launch and the CTAs' start overlap the kernel before it.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>
#include <type_traits>

#include "launch.h"
#include "pdl.cuh"
#include "reduce.cuh"
#include "row_config.cuh"
#include "sf_layout.cuh"
#include "vec.cuh"

namespace qwen_fp4 {

// The quantizing kernels' CTAs past the row CTAs (quantize_grid) are padding CTAs: padding CTA `index`
// (CTA row_ctas + index) zeroes the scale tensor's padding rows rows + index * kPaddingRowsPerCta onwards,
// kPaddingRowsPerCta of them or up to scale_rows(rows), and the function returns true; for a row CTA
// it returns false. A row's four scales of one 64-column tile are four aligned bytes of the 128x4 layout:
// one 32-bit store each. Padding CTAs of their own, several rows each: few-row calls then launch few extra
// CTAs and the row CTAs carry no padding work.
template <class Shape>
__device__ __forceinline__ bool zero_scales_if_padding_cta(uint8_t* scales, int64_t rows, int32_t cols,
                                                           int64_t row_ctas) {
  const int64_t cta = blockIdx.x;
  if (cta < row_ctas) return false;
  const int64_t first = rows + (cta - row_ctas) * kPaddingRowsPerCta;
  const int64_t end = min(first + kPaddingRowsPerCta, scale_rows(rows));
  const int tiles = cols / 64;  // <= threads (at most 8 vectors per thread)
  const int rows_per_pass = Shape::threads() / tiles;
  const int pass_row = threadIdx.x / tiles, tile = threadIdx.x % tiles;
  if (pass_row >= rows_per_pass) return true;
  for (int64_t m = first + pass_row; m < end; m += rows_per_pass) {
    *reinterpret_cast<uint32_t*>(scales + sf_row_offset_128x4(m, cols) + sf_block_offset_128x4(4 * tile)) = 0u;
  }
  return true;
}

// Waits for the predecessor grid (a no-op unless launched with PDL), then lets a PDL-launched successor
// start launching: it waits for this grid's completion on its own griddepcontrol.wait, and by the time every
// CTA of this grid has got here none is left to place, so its CTAs take only the SM slots ours free.
__device__ __forceinline__ void begin_after_predecessor() {
  wait_for_predecessor_grid();
  allow_dependent_launch();
}

// The first wave (kernels with kStagger; RowConfig's stagger policy says which, set_first_wave_stagger
// when). With every resident CTA starting at once, the whole first wave loads at once and then computes at
// once while DRAM idles, so first-wave rows live much longer than later ones. CTA slot k of the first wave
// (blockIdx / SMs, the order the CTAs are handed to the SMs) sleeps k * stagger_ns before its loads, so
// each SM computes its early rows while the later ones' bytes arrive. Later waves start as rows finish,
// already spread out. Called after begin_after_predecessor: a sleep before the wait would end inside it
// and leave the whole first wave to start at once when the predecessor completes.
__device__ __forceinline__ void stagger_first_wave(const ResnormArgs& args) {
  const int64_t cta = blockIdx.x;
  if (args.stagger_ns > 0 && cta >= args.sms && cta < args.first_wave_ctas) {
    __nanosleep(static_cast<unsigned>(cta / args.sms) * static_cast<unsigned>(args.stagger_ns));
  }
}

// Whether Quantizer::quantize takes the recipe code as a fourth argument (the 4over6 quantizers:
// kTakesRecipeCode); the standard ones take three.
template <class Quantizer, class = void>
struct TakesRecipeCode : std::false_type {};
template <class Quantizer>
struct TakesRecipeCode<Quantizer, std::void_t<decltype(Quantizer::kTakesRecipeCode)>>
    : std::bool_constant<Quantizer::kTakesRecipeCode> {};

// Quantizes the row's vectors and stores packed codes and scales. All lanes take part (shuffles).
// Vector v = i * threads + tid holds half of block v / 2; the even lane of each pair writes its scale.
// threads % 32 == 0, so block v / 2 = i * threads / 2 + tid / 2 sits at sf_block_offset(tid / 2) +
// i * threads * 64 in the 128x4 layout: one address per thread, a constant step per vector.
// y[i] is vector slot first_slot + i of the thread (the split kernel passes one slot).
template <class Quantizer, class Shape, int kVectors>
__device__ __forceinline__ void quantize_row_and_store(const uint4 (&y)[kVectors], int64_t row, int32_t cols, int vecs,
                                                       float global_scale, uint8_t* packed, uint8_t* scales,
                                                       int32_t recipe_code, int first_slot = 0) {
  uint32_t* packed_row = reinterpret_cast<uint32_t*>(packed + row * (cols / 2));
  uint8_t* sf_lane = scales + sf_row_offset_128x4(row, cols) + sf_block_offset_128x4(threadIdx.x / 2);
  const bool writes_scales = threadIdx.x % 2 == 0;
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int v = (first_slot + i) * Shape::threads() + threadIdx.x;
    const bool valid = Shape::valid(v, vecs);
    uint8_t* sf = (valid && writes_scales) ? sf_lane + (first_slot + i) * Shape::threads() * 64 : nullptr;
    uint32_t codes;
    if constexpr (TakesRecipeCode<Quantizer>::value)
      codes = Quantizer::quantize(y[i], global_scale, sf, recipe_code);
    else
      codes = Quantizer::quantize(y[i], global_scale, sf);
    if (valid) store_stream(packed_row + v, codes);
  }
}

// Loads this thread's vectors of x and residual for one row (zeros past the row's end), by Config's load
// policy.
template <class Config>
__device__ __forceinline__ void load_row(const ResnormArgs& args, int64_t row, uint4 (&xv)[Config::kVectorsPerThread],
                                         uint4 (&rv)[Config::kVectorsPerThread]) {
  const int vecs = Config::vecs(Config::cols(args.cols));
  const uint4* x_row = reinterpret_cast<const uint4*>(args.x) + row * vecs;
  const uint4* res_row = reinterpret_cast<const uint4*>(args.residual) + row * vecs;
  auto load = [](const uint4* p) { return Config::kRowLoadsSkipL1 ? load_stream_no_l1(p) : load_stream(p); };
#pragma unroll
  for (int i = 0; i < Config::kVectorsPerThread; ++i) {
    const int v = i * Config::threads() + threadIdx.x;
    if (Config::valid(v, vecs)) {
      xv[i] = load(x_row + v);
      rv[i] = load(res_row + v);
    } else {
      xv[i] = rv[i] = make_uint4(0, 0, 0, 0);
    }
  }
}

// Which row of gate/scale/shift row `row` uses. Per token with rows_per_batch == rows (the [B, S] dimensions
// addressed as one row index): token `row`, no division.
__device__ __forceinline__ ModulationRow modulation_row(const ResnormArgs& args, int64_t row) {
  if (args.form == ModulationForm::kShared) return {};
  if (args.form == ModulationForm::kPerToken && args.rows_per_batch == args.rows) return {0, row};
  const int64_t batch = row / args.rows_per_batch;
  if (args.form == ModulationForm::kPerToken) return {batch, row - batch * args.rows_per_batch};
  if (args.form != ModulationForm::kIndexed) return {batch, 0};
  bool second;
  switch (args.index_dtype) {
    case IndexDtype::kInt32: second = reinterpret_cast<const int32_t*>(args.modulate_index)[row] != 0; break;
    case IndexDtype::kInt64: second = reinterpret_cast<const int64_t*>(args.modulate_index)[row] != 0; break;
    default: second = reinterpret_cast<const uint8_t*>(args.modulate_index)[row] != 0; break;
  }
  return {second ? args.num_batches + batch : batch, 0};
}

// A row's per-column parameters, located once per row. kPlainParams: no bias, no LayerNorm affine,
// gate/scale/shift bf16 (the common DiT case, dispatch.cuh's plain_params): they stay packed until used
// and no dtype or presence tests are compiled in.
template <bool kPlainParams>
struct RowParams {
  using Param = ParamRow<!kPlainParams>;
  Param gate, scale, shift, weight, norm_bias;
  bool affine;
  __device__ __forceinline__ RowParams(const ResnormArgs& args, ModulationRow mod_row)
      : gate(args.gate, mod_row),
        scale(args.scale, mod_row),
        shift(args.shift, mod_row),
        weight(kPlainParams ? ParamRef{} : args.weight),
        norm_bias(kPlainParams ? ParamRef{} : args.norm_bias),
        affine(!kPlainParams && (weight.present() || norm_bias.present())) {}
};

// A plain row's parameters (gate, scale, shift) for this thread's vectors, packed bf16, loaded in one group
// by plain loads, which ptxas keeps where they are written (Config::kGroupedParams says for which shapes).
// Narrow shapes (kHoistParams) load x and residual first (their DRAM latency is the time), then the
// parameters, the shared modulation row (the common call) in a branch of its own so that nothing between
// the two groups waits on x; wide ones load the parameters first, then x and residual.
template <class Config>
struct PlainParams {
  static constexpr int kVectors = Config::kVectorsPerThread;
  uint4 gate[kVectors], scale[kVectors], shift[kVectors];

  // gate for every vector slot of the thread; scale and shift for one slot only when slot >= 0 (the split
  // kernel: into scale[0], shift[0]).
  __device__ __forceinline__ void load(const ResnormArgs& args, ModulationRow mod_row, int vecs, int slot) {
    const RowParams<true> p(args, mod_row);
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const int v = i * Config::threads() + threadIdx.x;
      const bool valid = Config::valid(v, vecs);
      gate[i] = valid ? p.gate.template load_bf16x8<false>(v) : zero;
      if (slot < 0) {
        scale[i] = valid ? p.scale.template load_bf16x8<false>(v) : zero;
        shift[i] = valid ? p.shift.template load_bf16x8<false>(v) : zero;
      }
    }
    if (slot >= 0) {
      const int v = slot * Config::threads() + threadIdx.x;  // fixed shapes: always valid
      scale[0] = p.scale.template load_bf16x8<false>(v);
      shift[0] = p.shift.template load_bf16x8<false>(v);
    }
  }

  // Loads them and the row's x and residual in the order above.
  __device__ __forceinline__ void load_with_row(const ResnormArgs& args, int64_t row, int vecs, uint4 (&xv)[kVectors],
                                                uint4 (&rv)[kVectors], int slot = -1) {
    if constexpr (!Config::kHoistParams) {
      load(args, modulation_row(args, row), vecs, slot);
      load_row<Config>(args, row, xv, rv);
    } else {
      load_row<Config>(args, row, xv, rv);
      if (args.form == ModulationForm::kShared) {
        load(args, ModulationRow{}, vecs, slot);
      } else {
        load(args, modulation_row(args, row), vecs, slot);
      }
    }
  }
};

// Steps 1-5 for one row from its x and residual vectors: d = r, residual_out stored (only vector slot
// `stored_slot` when >= 0: the split kernel; none when >= kVectors: the no-residual ops), then the two passes; returns
// rstd with d = r - mu. The plain kernels of the grouped shapes pass their gate vectors loaded (kGateGiven: gate_bf16);
// the others load them from p.
template <class Config, bool kPlainParams, bool kGateGiven, int kVectors = Config::kVectorsPerThread>
__device__ __forceinline__ float residual_and_rstd(const ResnormArgs& args, const RowParams<kPlainParams>& p,
                                                   int64_t row, const uint4 (&xv)[kVectors],
                                                   const uint4 (&rv)[kVectors], const uint4 (&gate_bf16)[kVectors],
                                                   float (&d)[kVectors][kVecElems], int stored_slot = -1) {
  const int32_t cols = Config::cols(args.cols);
  const int vecs = Config::vecs(cols);
  // One buffer per reduction: no barrier before either's writes.
  __shared__ __align__(16) float parts[2][Config::kMaxRowVecs];

  // Steps 1-2 and the per-vector sums. d holds r now and r - mu after the mean.
  float sum[kVectors];
  uint4* res_out_row = reinterpret_cast<uint4*>(args.residual_out) + row * vecs;
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int v = i * Config::threads() + threadIdx.x;
    const bool valid = Config::valid(v, vecs);
    float xf[kVecElems], resf[kVecElems], gate[kVecElems];
    bf16x8_to_float(xv[i], xf);
    bf16x8_to_float(rv[i], resf);
    if (valid) {
      if constexpr (kGateGiven) {
        bf16x8_to_float(gate_bf16[i], gate);
      } else {
        p.gate.load8(v, gate);
      }
      if constexpr (!kPlainParams) {
        const ParamRow<true> bias_row(args.bias);
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
    sum[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < kVecElems; ++j) sum[i] = __fadd_rn(sum[i], d[i][j]);
    if (valid && (stored_slot < 0 || stored_slot == i)) store_stream(res_out_row + v, r_bf16);
  }

  // Steps 3-5: two passes over the values held in registers.
  const float inv_cols = args.inv_cols;
  constexpr int kMaxVecs = Config::kMaxRowVecs, kFixedVecs = Config::kFixedVecs;
  const float mu = __fmul_rn(row_sum<kMaxVecs, kFixedVecs>(sum, Config::threads(), vecs, parts[0]), inv_cols);
  float sq[kVectors];
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const bool valid = Config::valid(i * Config::threads() + threadIdx.x, vecs);
    sq[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < kVecElems; ++j) {
      d[i][j] = valid ? __fsub_rn(d[i][j], mu) : 0.0f;
      sq[i] = __fmaf_rn(d[i][j], d[i][j], sq[i]);
    }
  }
  const float var = __fmul_rn(row_sum<kMaxVecs, kFixedVecs>(sq, Config::threads(), vecs, parts[1]), inv_cols);
  return rsqrtf(__fadd_rn(var, args.eps));
}

// Steps 6-7 for vector v of the row, d = its r - mu: y = bf16(fma(n, 1 + scale, shift)). kHoist: the
// plain kernels' scale and shift were loaded before the reductions (scale_bf16, shift_bf16).
template <bool kPlainParams, bool kHoist>
__device__ __forceinline__ uint4 modulate_vec(const RowParams<kPlainParams>& p, int v, const float (&d)[kVecElems],
                                              float rstd, const uint4& scale_bf16, const uint4& shift_bf16) {
  float scale[kVecElems], shift[kVecElems];
  if constexpr (kPlainParams) {
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
template <class Config, bool kPlainParams>
__device__ __forceinline__ void resnorm_row(const ResnormArgs& args, int64_t row,
                                            uint4 (&y_out)[Config::kVectorsPerThread]) {
  constexpr int kVectors = Config::kVectorsPerThread;
  const int32_t cols = Config::cols(args.cols);
  const int vecs = Config::vecs(cols);
  // The plain kernels of the grouped shapes load their parameters in one group (PlainParams); the others
  // through p: the gate in the first pass, scale and shift before (kHoistParams, __ldg) or after the
  // reductions.
  constexpr bool kGrouped = kPlainParams && Config::kGroupedParams;
  constexpr bool kHoist = Config::kHoistParams;
  uint4 xv[kVectors], rv[kVectors];
  PlainParams<Config> pp;  // the parameters where kGrouped (scale and shift also where plain and kHoist)
  if constexpr (kGrouped) {
    pp.load_with_row(args, row, vecs, xv, rv);
  } else {
    load_row<Config>(args, row, xv, rv);
  }
  const RowParams<kPlainParams> p(args, kGrouped ? ModulationRow{} : modulation_row(args, row));
  if constexpr (kPlainParams && kHoist && !kGrouped) {
#pragma unroll
    for (int i = 0; i < kVectors; ++i) {
      const int v = i * Config::threads() + threadIdx.x;
      if (Config::valid(v, vecs)) {
        pp.scale[i] = p.scale.load_bf16x8(v);
        pp.shift[i] = p.shift.load_bf16x8(v);
      }
    }
  }
  float d[kVectors][kVecElems];
  const float rstd = residual_and_rstd<Config, kPlainParams, kGrouped>(args, p, row, xv, rv, pp.gate, d);
#pragma unroll
  for (int i = 0; i < kVectors; ++i) {
    const int v = i * Config::threads() + threadIdx.x;
    y_out[i] = Config::valid(v, vecs)
                   ? modulate_vec<kPlainParams, (kHoist || kGrouped)>(p, v, d[i], rstd, pp.scale[i], pp.shift[i])
                   : make_uint4(0, 0, 0, 0);
  }
}

// The bf16 row kernel: writes y. No scales, so no padding rows: grid = rows. kStagger: stagger_first_wave compiled in.
template <class Config, bool kPlainParams, bool kStagger>
__global__ void __launch_bounds__(Config::kMaxThreads, Config::kMinCtasPerSm) resnorm_kernel(const ResnormArgs args) {
  begin_after_predecessor();
  if constexpr (kStagger) stagger_first_wave(args);
  const int64_t row = blockIdx.x;
  uint4 y[Config::kVectorsPerThread];
  resnorm_row<Config, kPlainParams>(args, row, y);
  const int vecs = Config::vecs(args.cols);
  uint4* y_row = reinterpret_cast<uint4*>(args.y) + row * vecs;
#pragma unroll
  for (int i = 0; i < Config::kVectorsPerThread; ++i) {
    const int v = i * Config::threads() + threadIdx.x;
    if (Config::valid(v, vecs)) y_row[v] = y[i];
  }
}

// The fused NVFP4 row kernel: steps 1-8 in one pass; y never leaves registers. kStagger as in resnorm_kernel.
template <class Quantizer, class Config, bool kPlainParams, bool kStagger>
__global__ void __launch_bounds__(Config::kMaxThreads, Config::kMinCtasPerSm)
    resnorm_quant_kernel(const ResnormArgs args) {
  const int32_t cols = Config::cols(args.cols);
  begin_after_predecessor();
  if (zero_scales_if_padding_cta<Config>(args.scales, args.rows, cols, args.rows)) return;
  if constexpr (kStagger) stagger_first_wave(args);
  const int64_t row = blockIdx.x;
  const float global_scale = __ldg(args.global_scale);  // now, not after the reductions: one latency less
  uint4 y[Config::kVectorsPerThread];
  resnorm_row<Config, kPlainParams>(args, row, y);
  quantize_row_and_store<Quantizer, Config>(y, row, cols, Config::vecs(cols), global_scale, args.packed, args.scales,
                                            args.nvfp4_4over6_code);
}

// The fused NVFP4 row kernel for few rows, two CTAs per row (Config::kHasSplitKernel: two vectors per
// thread, a fixed width). CTA 2m + h reads all of row m and computes its statistics exactly as the one-CTA
// kernel and the bf16 row kernel do (same shape, same sums, so the same bits), then modulates, quantizes and stores
// only vector slot h of each thread: half the columns. So a row's modulation, quantization and stores are spread over
// two SMs (the same split inside one CTA, on one SM, gains nothing); the price is a second read of the row
// and the statistics computed twice, which pays only while every CTA has an SM to itself (split_rows in
// launch_rows.cuh).
template <class Quantizer, class Config, bool kPlainParams>
__global__ void __launch_bounds__(Config::kMaxThreads, 1) resnorm_quant_split_kernel(const ResnormArgs args) {
  constexpr int kSlots = Config::kVectorsPerThread;
  static_assert(Config::kHasSplitKernel && kSlots == 2 && Config::kMinCtasPerSm == 1,
                "the few-rows shapes of the fixed widths only");
  constexpr int32_t cols = Config::kFixedCols;
  begin_after_predecessor();
  if (zero_scales_if_padding_cta<Config>(args.scales, args.rows, cols, kSlots * args.rows)) return;
  const int64_t row = blockIdx.x / kSlots;  // one CTA per vector slot: quantize_grid(rows, kSlots)
  const int slot = blockIdx.x % kSlots;
  const float global_scale = __ldg(args.global_scale);
  uint4 xv[kSlots], rv[kSlots];
  PlainParams<Config> pp;  // the plain kernels' parameters: both slots' gate, this slot's scale and shift
  if constexpr (kPlainParams) {
    static_assert(Config::kGroupedParams, "the split kernel's shapes load their parameters grouped");
    pp.load_with_row(args, row, Config::kFixedVecs, xv, rv, slot);
  } else {
    load_row<Config>(args, row, xv, rv);
  }
  const RowParams<kPlainParams> p(args, kPlainParams ? ModulationRow{} : modulation_row(args, row));
  const int v = slot * Config::threads() + threadIdx.x;
  float d[kSlots][kVecElems];
  const float rstd = residual_and_rstd<Config, kPlainParams, kPlainParams>(args, p, row, xv, rv, pp.gate, d, slot);
  float mine[kVecElems];
#pragma unroll
  for (int j = 0; j < kVecElems; ++j) mine[j] = slot ? d[1][j] : d[0][j];
  const uint4 y[1] = {modulate_vec<kPlainParams, true>(p, v, mine, rstd, pp.scale[0], pp.shift[0])};
  quantize_row_and_store<Quantizer, Config>(y, row, cols, Config::kFixedVecs, global_scale, args.packed, args.scales,
                                            args.nvfp4_4over6_code, slot);
}

// The standalone quantizer over bf16 rows. Shape: a BlockShape (no RowConfig policy
// applies), so both row-count classes of a shape share this kernel.
template <class Quantizer, class Shape>
__global__ void __launch_bounds__(Shape::kMaxThreads, Shape::kMinCtasPerSm)
    nvfp4_quantize_kernel(const QuantizeArgs args) {
  const int32_t cols = Shape::cols(args.cols);
  begin_after_predecessor();
  if (zero_scales_if_padding_cta<Shape>(args.scales, args.rows, cols, args.rows)) return;
  const int64_t row = blockIdx.x;
  const float global_scale = __ldg(args.global_scale);
  const int vecs = Shape::vecs(cols);
  const uint4* y_row = reinterpret_cast<const uint4*>(args.y) + row * vecs;
  uint4 y[Shape::kVectorsPerThread];
#pragma unroll
  for (int i = 0; i < Shape::kVectorsPerThread; ++i) {
    const int v = i * Shape::threads() + threadIdx.x;
    y[i] = Shape::valid(v, vecs) ? load_stream(y_row + v) : make_uint4(0, 0, 0, 0);
  }
  quantize_row_and_store<Quantizer, Shape>(y, row, cols, vecs, global_scale, args.packed, args.scales,
                                           args.nvfp4_4over6_code);
}

}  // namespace qwen_fp4
