// Host-side interface between the op wrappers (ops.cpp, plain C++ against the LibTorch stable ABI) and
// the kernel translation units (*.cu). Only plain types cross it.
#pragma once

#include <cstdint>

namespace qwen_fp4 {

// A per-column parameter: bf16 or fp32, or absent (ptr == nullptr). A modulation parameter's row of
// (batch b, token s) starts b * batch_stride + s * token_stride elements past ptr (ModulationForm says
// which b and s a row of x uses); both strides are 0 for [D] parameters.
struct ParamRef {
  const void* ptr = nullptr;
  bool fp32 = false;
  int64_t batch_stride = 0;
  int64_t token_stride = 0;
};

enum class ModulationForm : int32_t {
  kShared = 0,    // [D]
  kPerBatch = 1,  // [B, D]: row m uses row m / rows_per_batch
  kIndexed = 2,   // [2B, D] + modulate_index [B, S]: row b or B + b by the index
  kPerToken = 3,  // [M, D] or [B, S, D]: row m uses batch m / rows_per_batch, token m % rows_per_batch
};

enum class IndexDtype : int32_t { kInt32 = 0, kInt64 = 1, kBool = 2 };

struct ResnormArgs {
  const void* residual;  // bf16 [rows, cols]
  const void* x;         // bf16 [rows, cols]
  ParamRef bias, gate, scale, shift, weight, norm_bias;
  ModulationForm form;
  const void* modulate_index;  // [B, S] when form == kIndexed
  IndexDtype index_dtype;
  int64_t rows;
  int32_t cols;
  int64_t rows_per_batch;
  int32_t num_batches;
  float eps;
  float inv_cols;      // 1.0f / cols, rounded once (IEEE division on the host)
  void* residual_out;  // bf16 [rows, cols]
  void* y;             // bf16 [rows, cols]    (the bf16 row kernel only)
  uint8_t* packed;     // [rows, cols / 2]       (the NVFP4 kernels only)
  uint8_t* scales;     // [round_up(rows, 128), cols / 16], 128x4 swizzled
  const float* global_scale;
  int32_t nvfp4_4over6_code;  // the block-scale recipe, kNvfp4Recipe* bits below; 0: the standard recipe
  // First-wave stagger of the row kernels (launch_rows.cuh, set_first_wave_stagger); 0: none.
  int32_t sms;              // SMs of the device
  int32_t first_wave_ctas;  // row CTAs resident at once: sms x CTAs per SM
  int32_t stagger_ns;       // first-wave CTA in slot k = blockIdx / sms waits k * stagger_ns
  // The FP8 ops (launch_fp8.h): the E4M3 output [rows, cols] and the one-element fp32 input_scale; y above,
  // when not null, receives the bf16 y as well.
  uint8_t* fp8_out;
  const float* input_scale;
};

// Where a launcher launches (host side only, never a kernel argument): the op's device, current under its
// device guard (it keys the per-device caches), and its stream.
struct LaunchTarget {
  int32_t device;
  void* stream;
};

// Per-device host caches (launch_rows.cuh, blackwell_kernels_usable) cover devices 0 .. kMaxCachedDevices - 1;
// a device beyond that gets no cache: no first-wave stagger, no Blackwell path.
constexpr int kMaxCachedDevices = 64;
inline bool has_device_cache(int device) { return device >= 0 && device < kMaxCachedDevices; }

#if defined(__CUDACC__)
#define QWEN_FP4_HOST_DEVICE __host__ __device__
#else
#define QWEN_FP4_HOST_DEVICE
#endif

// value / divisor rounded up, and value rounded up to a multiple of `multiple`; value >= 0, divisor > 0.
QWEN_FP4_HOST_DEVICE constexpr int64_t ceil_div(int64_t value, int64_t divisor) {
  return (value + divisor - 1) / divisor;
}
QWEN_FP4_HOST_DEVICE constexpr int64_t round_up(int64_t value, int64_t multiple) {
  return ceil_div(value, multiple) * multiple;
}

// Rows of the scale tensor for `rows` rows: whole 128-row tiles of the 128x4 layout (the op's output
// shape). Rows `rows` .. scale_rows(rows) - 1 are padding, their scales zero.
QWEN_FP4_HOST_DEVICE constexpr int64_t scale_rows(int64_t rows) { return round_up(rows, 128); }

// Padding rows one padding CTA of the quantizing kernels zeroes.
constexpr int64_t kPaddingRowsPerCta = 8;

// CTAs of the quantizing kernels: ctas_per_row per row (2 in the fused op's split kernel), then one per
// kPaddingRowsPerCta padding rows (17 rows: 17 + 14 CTAs, not 128).
inline int64_t quantize_grid(int64_t rows, int64_t ctas_per_row = 1) {
  return rows * ctas_per_row + ceil_div(scale_rows(rows) - rows, kPaddingRowsPerCta);
}

struct QuantizeArgs {
  const void* y;  // bf16 [rows, cols]
  int64_t rows;
  int32_t cols;
  uint8_t* packed;
  uint8_t* scales;
  const float* global_scale;
  int32_t nvfp4_4over6_code;  // as in ResnormArgs
};

// The NVFP4 block-scale recipe code, FlashInfer's packing of NVFP44Over6Config (ops.cpp refuses other
// values): bit 0 the 4over6 recipe on; bit 1 e4m3_max == 256 (the caller's global-scale rule only: the
// kernels compute the same bytes for 448 and 256); bits 2-3 the error mode; bit 4 the fp16 error form.
constexpr int32_t kNvfp4Recipe4Over6 = 1;
constexpr int32_t kNvfp4RecipeErrModeShift = 2;  // 0: MAE (sum |d|), 1: MSE (sum d^2)
constexpr int32_t kNvfp4RecipeErrModeMask = 3;
constexpr int32_t kNvfp4RecipeErrFastMath = 16;
constexpr int32_t kNvfp4RecipeKnownBits = 5;
QWEN_FP4_HOST_DEVICE constexpr bool recipe_uses_4over6(int32_t code) { return (code & kNvfp4Recipe4Over6) != 0; }
QWEN_FP4_HOST_DEVICE constexpr bool recipe_error_is_mse(int32_t code) {
  return ((code >> kNvfp4RecipeErrModeShift) & kNvfp4RecipeErrModeMask) == 1;
}
QWEN_FP4_HOST_DEVICE constexpr bool recipe_error_fast_math(int32_t code) {
  return (code & kNvfp4RecipeErrFastMath) != 0;
}

// Portable path (software E2M1, = cuda_fp4.h): sm_90a and the compute_90 PTX. Also the bf16 row kernel everywhere.
void launch_resnorm(const ResnormArgs& args, const LaunchTarget& on);
void launch_resnorm_quant_portable(const ResnormArgs& args, bool fast_math, const LaunchTarget& on);
void launch_nvfp4_quantize_portable(const QuantizeArgs& args, bool fast_math, const LaunchTarget& on);

// Blackwell path (FlashInfer's production conversion): sm_100f / sm_120f cubins.
// blackwell_kernels_usable() is false when this build has no Blackwell code or the device can't run it.
bool blackwell_kernels_usable(int device_index);
void launch_resnorm_quant_blackwell(const ResnormArgs& args, bool fast_math, const LaunchTarget& on);
void launch_nvfp4_quantize_blackwell(const QuantizeArgs& args, bool fast_math, const LaunchTarget& on);

// NVFP4 -> exact bf16 (e2m1 * e4m3 scale, no global scale), csrc/nvfp4_dequantize.cu: packed [rows, cols / 2]
// (16-byte aligned), scales in the 128x4 layout (2-byte aligned), out bf16 [rows, cols]; cols % 64 == 0.
void launch_nvfp4_dequantize_bf16(const uint8_t* packed, const uint8_t* scales, void* out, int64_t rows, int32_t cols,
                                  void* stream);

// Throws std::runtime_error on a CUDA error of the last launch.
void check_launch(const char* what);

// The launch switches, decided by the Python package (qwen_resnorm_fp4/launch.py: from QWEN_FP4_KERNEL_PATH
// and QWEN_FP4_PDL when it loads this library, then by set_launch_options) and set through the op
// _set_launch_options; this library never reads the environment and has no defaults of its own.
enum class KernelPath : int32_t {
  kAuto = 0,       // the Blackwell kernels where usable on the device, else the portable ones
  kPortable = 1,   // always the portable kernels
  kBlackwell = 2,  // always the Blackwell kernels (an error where they are not usable)
  kInvalid = 3,    // QWEN_FP4_KERNEL_PATH held another value at load: the ops with a Blackwell path raise
};
struct LaunchOptions {
  KernelPath kernel_path;
  bool pdl;  // the row kernels launch with programmatic dependent launch (pdl.cuh)
};
void set_launch_options(LaunchOptions options);
// The options in force; throws std::runtime_error if they were never set (the library was loaded without
// the qwen_resnorm_fp4 package).
LaunchOptions launch_options();
inline bool pdl_enabled() { return launch_options().pdl; }

}  // namespace qwen_fp4
