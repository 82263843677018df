// Host wrappers of the qwen_fp4 ops for CUDA tensors, against the LibTorch stable ABI: argument checks
// (they hold on their own, whatever the Python layer did), output allocation through torch (so CUDA-graph
// capture works), launch on the current stream of the tensors' device under a device guard, no host sync.
#include "ops.h"

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "launch.h"
#include "op_limits.h"
#include "op_checks.h"

namespace qwen_fp4 {

namespace {

// The quantizing ops' kernel path on x's device, by the launch options (launch.h): auto takes the
// Blackwell path where usable, portable never, blackwell always (an error where it is not usable).
bool blackwell_path(const Tensor& x) {
  const KernelPath path = launch_options().kernel_path;
  const int device = x.get_device_index();
  if (path == KernelPath::kAuto) return blackwell_kernels_usable(device);
  if (path == KernelPath::kPortable) return false;
  STD_TORCH_CHECK(path == KernelPath::kBlackwell,
                  "qwen_fp4: QWEN_FP4_KERNEL_PATH must be auto, portable or "
                  "blackwell (or unset) when qwen_resnorm_fp4 is imported; or pick the path with "
                  "qwen_resnorm_fp4.set_launch_options(kernel_path=...)");
  STD_TORCH_CHECK(blackwell_kernels_usable(device),
                  "qwen_fp4: kernel path blackwell (QWEN_FP4_KERNEL_PATH or "
                  "set_launch_options), but the Blackwell path is not usable on cuda:",
                  device,
                  " (this build has "
                  "no Blackwell cubin for it); use auto or portable");
  return true;
}

// The one launch of each op, into outputs that were allocated (the functional ops) or checked (the
// out-variants).
void run_resnorm_quant(ResnormArgs& a, const Tensor& x, const Tensor& global_scale, bool fast_math,
                       int64_t nvfp4_4over6_code, const Tensor& packed, const Tensor& scales,
                       const Tensor& residual_out) {
  set_quantized_outputs(a, packed, scales, global_scale);
  a.residual_out = residual_out.data_ptr();
  a.nvfp4_4over6_code = check_nvfp4_4over6_code(nvfp4_4over6_code);
  const LaunchTarget on = launch_target(x);
  if (blackwell_path(x))
    launch_resnorm_quant_blackwell(a, fast_math, on);
  else
    launch_resnorm_quant_portable(a, fast_math, on);
}

void run_resnorm(ResnormArgs& a, const Tensor& x, const Tensor& y, const Tensor& residual_out) {
  a.y = y.data_ptr();
  a.residual_out = residual_out.data_ptr();
  launch_resnorm(a, launch_target(x));
}

// The standalone quantizer's checks of y and global_scale, and its kernel arguments except the outputs.
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
  if (blackwell_path(y))
    launch_nvfp4_quantize_blackwell(a, fast_math, on);
  else
    launch_nvfp4_quantize_portable(a, fast_math, on);
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> resnorm_quant_cuda(
    const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias, const Tensor& gate, const Tensor& scale,
    const Tensor& shift, const Tensor& global_scale, double eps, bool fast_math, const std::optional<Tensor>& weight,
    const std::optional<Tensor>& norm_bias, const std::optional<Tensor>& modulate_index, int64_t nvfp4_4over6_code) {
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
                   {{"residual", &residual},
                    {"x", &x},
                    {"bias", optional_ptr(bias)},
                    {"gate", &gate},
                    {"scale", &scale},
                    {"shift", &shift},
                    {"global_scale", &global_scale},
                    {"weight", optional_ptr(weight)},
                    {"norm_bias", optional_ptr(norm_bias)},
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
                      const Tensor& scale, const Tensor& shift, double eps, const Tensor& y, const Tensor& residual_out,
                      const std::optional<Tensor>& weight, const std::optional<Tensor>& norm_bias,
                      const std::optional<Tensor>& modulate_index) {
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  ResnormArgs a = make_resnorm_args(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index,
                                    kRowColsMultiple);
  check_output("y", y, x, "x", {ScalarType::BFloat16}, sizes_of(x));
  check_output("residual_out", residual_out, x, "x", {ScalarType::BFloat16}, sizes_of(x));
  check_no_overlap({{"y", &y}, {"residual_out", &residual_out}},
                   {{"residual", &residual},
                    {"x", &x},
                    {"bias", optional_ptr(bias)},
                    {"gate", &gate},
                    {"scale", &scale},
                    {"shift", &shift},
                    {"weight", optional_ptr(weight)},
                    {"norm_bias", optional_ptr(norm_bias)},
                    {"modulate_index", optional_ptr(modulate_index)}},
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

void set_launch_options_op(int64_t kernel_path, bool pdl) {
  STD_TORCH_CHECK(kernel_path >= 0 && kernel_path <= static_cast<int64_t>(KernelPath::kInvalid),
                  "qwen_fp4: kernel_path must be a KernelPath code 0-3, got ", kernel_path);
  set_launch_options({static_cast<KernelPath>(kernel_path), pdl});
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
  STD_TORCH_CHECK(cols > 0 && cols % kColsMultiple == 0,
                  "qwen_fp4: packed.shape[1] * 2 (K) must be a positive multiple of ", kColsMultiple, ", got ", cols);
  STD_TORCH_CHECK(cols <= kMaxDequantizeCols, "qwen_fp4: packed.shape[1] * 2 (K) must be at most ", kMaxDequantizeCols,
                  ", got ", cols);
  STD_TORCH_CHECK(scales.numel() >= scale_rows(rows) * (cols / 16), "qwen_fp4: scales has ", scales.numel(), " bytes, ",
                  scale_rows(rows) * (cols / 16), " needed for ", rows, " rows of K = ", cols, " in the 128x4 layout");
  torch::stable::accelerator::DeviceGuard guard(packed.get_device_index());
  Tensor out = empty_cuda(packed, {rows, cols}, aoti_torch_dtype_bfloat16());
  launch_nvfp4_dequantize_bf16(static_cast<const uint8_t*>(packed.data_ptr()),
                               static_cast<const uint8_t*>(scales.data_ptr()), out.data_ptr(), rows,
                               static_cast<int32_t>(cols), current_stream(packed));
  return out;
}

}  // namespace qwen_fp4
