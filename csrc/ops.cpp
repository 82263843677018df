// Host wrappers of the qwen_fp4 ops for CUDA tensors, against the LibTorch stable ABI: argument checks
// (they hold on their own, whatever the Python layer did), output allocation through torch (so CUDA-graph
// capture works), launch on the current stream of the tensors' device under a device guard, no host sync.
#include "ops.h"

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "launch.h"
#include "op_limits.h"
#include "op_checks.h"

namespace qwen_fp4 {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

namespace {

// The quantizing ops' kernel path on x's device, by QWEN_FP4_KERNEL_PATH read on every call (getenv, no
// allocation): "auto" (or unset/empty) takes the Blackwell path where usable, "portable" never, "blackwell"
// always (an error where it is not usable); any other value is an error.
bool blackwell_path(const Tensor& x) {
  const char* choice = std::getenv("QWEN_FP4_KERNEL_PATH");
  const int device = x.get_device_index();
  if (choice == nullptr || *choice == '\0' || std::strcmp(choice, "auto") == 0) return blackwell_kernels_usable(device);
  if (std::strcmp(choice, "portable") == 0) return false;
  STD_TORCH_CHECK(std::strcmp(choice, "blackwell") == 0,
                  "qwen_fp4: QWEN_FP4_KERNEL_PATH must be auto, portable or blackwell (or unset), got '", choice, "'");
  STD_TORCH_CHECK(blackwell_kernels_usable(device), "qwen_fp4: QWEN_FP4_KERNEL_PATH=blackwell, but the Blackwell "
                  "path is not usable on cuda:", device, " (this build has no Blackwell cubin for it); use auto or "
                  "portable");
  return true;
}

}  // namespace

namespace {

// The one launch of each op, into outputs that were allocated (the functional ops) or checked (the
// out-variants).
void run_resnorm_quant(ResnormArgs& a, const Tensor& x, const Tensor& global_scale, bool fast_math,
                       int64_t nvfp4_4over6_code, const Tensor& packed, const Tensor& scales,
                       const Tensor& residual_out) {
  set_quantized_outputs(a, packed, scales, global_scale);
  a.residual_out = residual_out.data_ptr();
  a.nvfp4_4over6_code = check_nvfp4_4over6_code(nvfp4_4over6_code);
  const LaunchTarget on = launch_target(x);
  if (blackwell_path(x)) launch_resnorm_quant_blackwell(a, fast_math, on);
  else launch_resnorm_quant_portable(a, fast_math, on);
}

void run_resnorm(ResnormArgs& a, const Tensor& x, const Tensor& y, const Tensor& residual_out) {
  a.y = y.data_ptr();
  a.residual_out = residual_out.data_ptr();
  launch_resnorm(a, launch_target(x));
}

// nvfp4_quantize's checks of y and global_scale, and its kernel arguments except the outputs.
QuantizeArgs make_quantize_args(const Tensor& y, const Tensor& global_scale) {
  check_cuda_tensor("y", y, y, /*vector_access=*/true, "y");
  check_dtype("y", y, false);
  const int32_t cols = check_cols("y", y);
  check_global_scale(global_scale, y, "y");
  QuantizeArgs a{};
  a.y = y.data_ptr();
  a.cols = cols;
  a.rows = check_rows("y", y, cols);
  return a;
}

void run_nvfp4_quantize(QuantizeArgs& a, const Tensor& y, const Tensor& global_scale, bool fast_math,
                        int64_t nvfp4_4over6_code, const Tensor& packed, const Tensor& scales) {
  set_quantized_outputs(a, packed, scales, global_scale);
  a.nvfp4_4over6_code = check_nvfp4_4over6_code(nvfp4_4over6_code);
  const LaunchTarget on = launch_target(y);
  if (blackwell_path(y)) launch_nvfp4_quantize_blackwell(a, fast_math, on);
  else launch_nvfp4_quantize_portable(a, fast_math, on);
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> resnorm_quant_cuda(const Tensor& residual, const Tensor& x,
                                                      const std::optional<Tensor>& bias, const Tensor& gate,
                                                      const Tensor& scale, const Tensor& shift,
                                                      const Tensor& global_scale, double eps, bool fast_math,
                                                      const std::optional<Tensor>& weight,
                                                      const std::optional<Tensor>& norm_bias,
                                                      const std::optional<Tensor>& modulate_index,
                                                      int64_t nvfp4_4over6_code) {
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  ResnormArgs a = make_resnorm_args(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index);
  check_global_scale(global_scale, x);
  auto [packed, scales] = new_quantized_outputs(x, a.rows, a.cols);
  Tensor residual_out = empty_like_bf16(x);
  run_resnorm_quant(a, x, global_scale, fast_math, nvfp4_4over6_code, packed, scales, residual_out);
  return {packed, scales, residual_out};
}

void resnorm_quant_out_cuda(const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias,
                            const Tensor& gate, const Tensor& scale, const Tensor& shift, const Tensor& global_scale,
                            double eps, bool fast_math, const Tensor& packed, const Tensor& scales,
                            const Tensor& residual_out, const std::optional<Tensor>& weight,
                            const std::optional<Tensor>& norm_bias, const std::optional<Tensor>& modulate_index,
                            int64_t nvfp4_4over6_code) {
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  ResnormArgs a = make_resnorm_args(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index);
  check_global_scale(global_scale, x);
  check_quantized_outputs(packed, scales, x, "x", a.rows, a.cols);
  check_output("residual_out", residual_out, x, "x", {ScalarType::BFloat16}, sizes_of(x));
  check_no_overlap({{"packed", &packed}, {"scales", &scales}, {"residual_out", &residual_out}},
                   {{"residual", &residual}, {"x", &x}, {"bias", optional_ptr(bias)}, {"gate", &gate},
                    {"scale", &scale}, {"shift", &shift}, {"global_scale", &global_scale},
                    {"weight", optional_ptr(weight)}, {"norm_bias", optional_ptr(norm_bias)},
                    {"modulate_index", optional_ptr(modulate_index)}},
                   "residual_out", "residual");
  run_resnorm_quant(a, x, global_scale, fast_math, nvfp4_4over6_code, packed, scales, residual_out);
}

std::tuple<Tensor, Tensor> resnorm_cuda(const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias,
                                        const Tensor& gate, const Tensor& scale, const Tensor& shift, double eps,
                                        const std::optional<Tensor>& weight, const std::optional<Tensor>& norm_bias,
                                        const std::optional<Tensor>& modulate_index) {
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  ResnormArgs a = make_resnorm_args(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index,
                                    kRowColsMultiple);
  Tensor y = empty_like_bf16(x);
  Tensor residual_out = empty_like_bf16(x);
  run_resnorm(a, x, y, residual_out);
  return {y, residual_out};
}

void resnorm_out_cuda(const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias, const Tensor& gate,
                      const Tensor& scale, const Tensor& shift, double eps, const Tensor& y,
                      const Tensor& residual_out, const std::optional<Tensor>& weight,
                      const std::optional<Tensor>& norm_bias, const std::optional<Tensor>& modulate_index) {
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  ResnormArgs a = make_resnorm_args(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index,
                                    kRowColsMultiple);
  check_output("y", y, x, "x", {ScalarType::BFloat16}, sizes_of(x));
  check_output("residual_out", residual_out, x, "x", {ScalarType::BFloat16}, sizes_of(x));
  check_no_overlap({{"y", &y}, {"residual_out", &residual_out}},
                   {{"residual", &residual}, {"x", &x}, {"bias", optional_ptr(bias)}, {"gate", &gate},
                    {"scale", &scale}, {"shift", &shift}, {"weight", optional_ptr(weight)},
                    {"norm_bias", optional_ptr(norm_bias)}, {"modulate_index", optional_ptr(modulate_index)}},
                   "residual_out", "residual");
  run_resnorm(a, x, y, residual_out);
}

std::tuple<Tensor, Tensor> nvfp4_quantize_cuda(const Tensor& y, const Tensor& global_scale, bool fast_math,
                                               int64_t nvfp4_4over6_code) {
  STD_TORCH_CHECK(y.is_cuda(), "qwen_fp4: y must be a CUDA tensor for the CUDA kernels");
  torch::stable::accelerator::DeviceGuard guard(y.get_device_index());
  QuantizeArgs a = make_quantize_args(y, global_scale);
  auto [packed, scales] = new_quantized_outputs(y, a.rows, a.cols);
  run_nvfp4_quantize(a, y, global_scale, fast_math, nvfp4_4over6_code, packed, scales);
  return {packed, scales};
}

void nvfp4_quantize_out_cuda(const Tensor& y, const Tensor& global_scale, bool fast_math, const Tensor& packed,
                             const Tensor& scales, int64_t nvfp4_4over6_code) {
  STD_TORCH_CHECK(y.is_cuda(), "qwen_fp4: y must be a CUDA tensor for the CUDA kernels");
  torch::stable::accelerator::DeviceGuard guard(y.get_device_index());
  QuantizeArgs a = make_quantize_args(y, global_scale);
  check_quantized_outputs(packed, scales, y, "y", a.rows, a.cols);
  check_no_overlap({{"packed", &packed}, {"scales", &scales}}, {{"y", &y}, {"global_scale", &global_scale}});
  run_nvfp4_quantize(a, y, global_scale, fast_math, nvfp4_4over6_code, packed, scales);
}

Tensor rcp_approx_cuda(const Tensor& x) {
  check_test_op_input("_rcp_approx", x);
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  Tensor out = empty_cuda(x, sizes_of(x), aoti_torch_dtype_float32());
  launch_rcp_approx(static_cast<const float*>(x.data_ptr()), static_cast<float*>(out.data_ptr()), x.numel(),
                    current_stream(x));
  return out;
}

Tensor e2m1_codes_cuda(const Tensor& x, bool toolkit) {
  check_test_op_input("_e2m1_codes", x);
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  Tensor out = empty_cuda(x, sizes_of(x), aoti_torch_dtype_uint8());
  launch_e2m1_codes(static_cast<const float*>(x.data_ptr()), static_cast<uint8_t*>(out.data_ptr()), x.numel(),
                    toolkit, current_stream(x));
  return out;
}

Tensor nvfp4_dequantize_bf16_cuda(const Tensor& packed, const Tensor& scales) {
  STD_TORCH_CHECK(packed.is_cuda(), "qwen_fp4: packed must be a CUDA tensor for the CUDA kernel");
  check_cuda_tensor("packed", packed, packed, /*vector_access=*/true, "packed");
  check_cuda_tensor("scales", scales, packed, /*vector_access=*/false, "packed");
  STD_TORCH_CHECK(packed.scalar_type() == ScalarType::Byte, "qwen_fp4: packed must be uint8, got ",
                  dtype_name(packed.scalar_type()));
  const ScalarType st = scales.scalar_type();
  STD_TORCH_CHECK(st == ScalarType::Byte || st == ScalarType::Float8_e4m3fn,
                  "qwen_fp4: scales must be uint8 or float8_e4m3fn, got ", dtype_name(st));
  STD_TORCH_CHECK(reinterpret_cast<uintptr_t>(scales.data_ptr()) % 2 == 0,
                  "qwen_fp4: scales must be 2-byte aligned (a view at an odd offset? pass a copy)");
  STD_TORCH_CHECK(packed.dim() == 2, "qwen_fp4: packed must be [rows, K/2], got shape ", shape_str(packed));
  const int64_t rows = packed.size(0), cols = packed.size(1) * 2;
  STD_TORCH_CHECK(cols > 0 && cols % 64 == 0, "qwen_fp4: packed.shape[1] * 2 (K) must be a positive multiple of 64, got ",
                  cols);
  // sf_block_offset_128x4 is 32-bit: K / 64 tiles of 512 bytes must stay below 2^31
  STD_TORCH_CHECK(cols <= (int64_t(1) << 27), "qwen_fp4: packed.shape[1] * 2 (K) must be at most 2^27, got ", cols);
  STD_TORCH_CHECK(scales.numel() >= scale_rows(rows) * (cols / 16), "qwen_fp4: scales has ", scales.numel(),
                  " bytes, ", scale_rows(rows) * (cols / 16), " needed for ", rows, " rows of K = ", cols,
                  " in the 128x4 layout");
  torch::stable::accelerator::DeviceGuard guard(packed.get_device_index());
  Tensor out = empty_cuda(packed, {rows, cols}, aoti_torch_dtype_bfloat16());
  launch_nvfp4_dequantize_bf16(static_cast<const uint8_t*>(packed.data_ptr()),
                               static_cast<const uint8_t*>(scales.data_ptr()), out.data_ptr(), rows,
                               static_cast<int32_t>(cols), current_stream(packed));
  return out;
}

}  // namespace qwen_fp4
