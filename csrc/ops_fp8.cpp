// Host wrappers of the FP8 ops (with and without the residual update, element-wise; their out-variants) and
// of the no-residual NVFP4 op, for CUDA tensors: the checks and helpers of op_checks.h (the row ops' rules), outputs
// allocated through torch, launch on the current stream under a device guard, no host sync. input_scale is never read
// on the host (that would sync): the kernels write E4M3 NaN bytes for a scale they refuse (fp8_e4m3.cuh).
#include "ops_fp8.h"

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/headeronly/util/Exception.h>

#include "launch.h"
#include "launch_fp8.h"
#include "op_checks.h"
#include "op_limits.h"

namespace qwen_fp4 {

namespace {

// input_scale: one float32 element on like's CUDA device.
void check_input_scale(const Tensor& s, const Tensor& like, const char* like_name = "x") {
  check_cuda_tensor("input_scale", s, like, /*vector_access=*/false, like_name);
  STD_TORCH_CHECK(s.scalar_type() == ScalarType::Float, "qwen_fp4: input_scale must be float32, got ",
                  dtype_name(s.scalar_type()));
  STD_TORCH_CHECK(s.numel() == 1, "qwen_fp4: input_scale must have exactly one element, got shape ", shape_str(s));
}

Tensor empty_fp8(const Tensor& like) { return empty_cuda(like, sizes_of(like), aoti_torch_dtype_float8_e4m3fn()); }

// The row op's arguments of the no-residual ops: the row checks with residual = x and gate = scale (gate
// is not read: the kernels use a zero gate), no bias.
ResnormArgs make_norm_modulate_args(const Tensor& x, const Tensor& scale, const Tensor& shift, double eps,
                                    const std::optional<Tensor>& weight, const std::optional<Tensor>& norm_bias,
                                    const std::optional<Tensor>& modulate_index, int64_t cols_multiple) {
  ResnormArgs a =
      make_resnorm_args(x, x, std::nullopt, scale, scale, shift, eps, weight, norm_bias, modulate_index, cols_multiple);
  a.residual = nullptr;
  a.residual_out = nullptr;
  return a;
}

void set_fp8_outputs(ResnormArgs& a, const Tensor& input_scale, const Tensor& y, const std::optional<Tensor>& y_bf16) {
  a.input_scale = static_cast<const float*>(input_scale.data_ptr());
  a.fp8_out = static_cast<uint8_t*>(y.data_ptr());
  a.y = y_bf16.has_value() ? y_bf16->data_ptr() : nullptr;
}

Fp8QuantizeArgs make_fp8_quantize_args(const Tensor& y, const Tensor& input_scale, Fp8Activation activation) {
  STD_TORCH_CHECK(y.is_cuda(), "qwen_fp4: y must be a CUDA tensor for the CUDA kernels");
  check_cuda_tensor("y", y, y, /*vector_access=*/true, "y");
  check_dtype("y", y, false);
  check_input_scale(input_scale, y, "y");
  Fp8QuantizeArgs a{};
  a.y = y.data_ptr();
  a.n = y.numel();
  a.input_scale = static_cast<const float*>(input_scale.data_ptr());
  a.activation = activation;
  return a;
}

Tensor fp8_quantize_functional(const Tensor& y, const Tensor& input_scale, Fp8Activation activation) {
  torch::stable::accelerator::DeviceGuard guard(y.get_device_index());
  Fp8QuantizeArgs a = make_fp8_quantize_args(y, input_scale, activation);
  Tensor out = empty_fp8(y);
  a.out = static_cast<uint8_t*>(out.data_ptr());
  launch_fp8_quantize(a, launch_target(y));
  return out;
}

void fp8_quantize_into(const Tensor& y, const Tensor& input_scale, const Tensor& out, Fp8Activation activation) {
  torch::stable::accelerator::DeviceGuard guard(y.get_device_index());
  Fp8QuantizeArgs a = make_fp8_quantize_args(y, input_scale, activation);
  check_output("out", out, y, "y", {ScalarType::Float8_e4m3fn}, sizes_of(y));
  check_no_overlap({{"out", &out}}, {{"y", &y}, {"input_scale", &input_scale}});
  a.out = static_cast<uint8_t*>(out.data_ptr());
  launch_fp8_quantize(a, launch_target(y));
}

}  // namespace

std::tuple<Tensor, Tensor> resnorm_quant_fp8_cuda(const Tensor& residual, const Tensor& x,
                                                  const std::optional<Tensor>& bias, const Tensor& gate,
                                                  const Tensor& scale, const Tensor& shift, const Tensor& input_scale,
                                                  double eps, const std::optional<Tensor>& weight,
                                                  const std::optional<Tensor>& norm_bias,
                                                  const std::optional<Tensor>& modulate_index) {
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  ResnormArgs a = make_resnorm_args(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index,
                                    kRowColsMultiple);
  check_input_scale(input_scale, x);
  Tensor y = empty_fp8(x);
  Tensor residual_out = empty_like_bf16(x);
  set_fp8_outputs(a, input_scale, y, std::nullopt);
  a.residual_out = residual_out.data_ptr();
  launch_resnorm_fp8(a, launch_target(x));
  return {y, residual_out};
}

void resnorm_quant_fp8_out_cuda(const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias,
                                const Tensor& gate, const Tensor& scale, const Tensor& shift, const Tensor& input_scale,
                                double eps, const Tensor& y, const Tensor& residual_out,
                                const std::optional<Tensor>& weight, const std::optional<Tensor>& norm_bias,
                                const std::optional<Tensor>& modulate_index, const std::optional<Tensor>& y_bf16) {
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  ResnormArgs a = make_resnorm_args(residual, x, bias, gate, scale, shift, eps, weight, norm_bias, modulate_index,
                                    kRowColsMultiple);
  check_input_scale(input_scale, x);
  check_output("y", y, x, "x", {ScalarType::Float8_e4m3fn}, sizes_of(x));
  check_output("residual_out", residual_out, x, "x", {ScalarType::BFloat16}, sizes_of(x));
  const std::initializer_list<NamedTensor> inputs = {{"residual", &residual},
                                                     {"x", &x},
                                                     {"bias", optional_ptr(bias)},
                                                     {"gate", &gate},
                                                     {"scale", &scale},
                                                     {"shift", &shift},
                                                     {"input_scale", &input_scale},
                                                     {"weight", optional_ptr(weight)},
                                                     {"norm_bias", optional_ptr(norm_bias)},
                                                     {"modulate_index", optional_ptr(modulate_index)}};
  if (y_bf16.has_value()) {
    check_output("y_bf16", *y_bf16, x, "x", {ScalarType::BFloat16}, sizes_of(x));
    check_no_overlap({{"y", &y}, {"residual_out", &residual_out}, {"y_bf16", &*y_bf16}}, inputs, "residual_out",
                     "residual");
  } else {
    check_no_overlap({{"y", &y}, {"residual_out", &residual_out}}, inputs, "residual_out", "residual");
  }
  set_fp8_outputs(a, input_scale, y, y_bf16);
  a.residual_out = residual_out.data_ptr();
  launch_resnorm_fp8(a, launch_target(x));
}

Tensor fp8_quantize_cuda(const Tensor& y, const Tensor& input_scale) {
  return fp8_quantize_functional(y, input_scale, Fp8Activation::kNone);
}

void fp8_quantize_out_cuda(const Tensor& y, const Tensor& input_scale, const Tensor& out) {
  fp8_quantize_into(y, input_scale, out, Fp8Activation::kNone);
}

Tensor gelu_tanh_fp8_quantize_cuda(const Tensor& y, const Tensor& input_scale) {
  return fp8_quantize_functional(y, input_scale, Fp8Activation::kGeluTanh);
}

void gelu_tanh_fp8_quantize_out_cuda(const Tensor& y, const Tensor& input_scale, const Tensor& out) {
  fp8_quantize_into(y, input_scale, out, Fp8Activation::kGeluTanh);
}

std::tuple<Tensor, Tensor> norm_modulate_quant_cuda(const Tensor& x, const Tensor& scale, const Tensor& shift,
                                                    const Tensor& global_scale, double eps, bool fast_math,
                                                    const std::optional<Tensor>& weight,
                                                    const std::optional<Tensor>& norm_bias,
                                                    const std::optional<Tensor>& modulate_index,
                                                    int64_t nvfp4_4over6_code) {
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  ResnormArgs a = make_norm_modulate_args(x, scale, shift, eps, weight, norm_bias, modulate_index, kColsMultiple);
  check_global_scale(global_scale, x);
  auto [packed, scales] = new_quantized_outputs(x, a.rows, a.cols);
  set_quantized_outputs(a, packed, scales, global_scale);
  a.nvfp4_4over6_code = check_nvfp4_4over6_code(nvfp4_4over6_code);
  launch_norm_modulate_quant_portable(a, fast_math, launch_target(x));
  return {packed, scales};
}

Tensor norm_modulate_quant_fp8_cuda(const Tensor& x, const Tensor& scale, const Tensor& shift,
                                    const Tensor& input_scale, double eps, const std::optional<Tensor>& weight,
                                    const std::optional<Tensor>& norm_bias,
                                    const std::optional<Tensor>& modulate_index) {
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  ResnormArgs a = make_norm_modulate_args(x, scale, shift, eps, weight, norm_bias, modulate_index, kRowColsMultiple);
  check_input_scale(input_scale, x);
  Tensor y = empty_fp8(x);
  set_fp8_outputs(a, input_scale, y, std::nullopt);
  launch_norm_modulate_fp8(a, launch_target(x));
  return y;
}

void norm_modulate_quant_fp8_out_cuda(const Tensor& x, const Tensor& scale, const Tensor& shift,
                                      const Tensor& input_scale, double eps, const Tensor& y,
                                      const std::optional<Tensor>& weight, const std::optional<Tensor>& norm_bias,
                                      const std::optional<Tensor>& modulate_index,
                                      const std::optional<Tensor>& y_bf16) {
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  ResnormArgs a = make_norm_modulate_args(x, scale, shift, eps, weight, norm_bias, modulate_index, kRowColsMultiple);
  check_input_scale(input_scale, x);
  check_output("y", y, x, "x", {ScalarType::Float8_e4m3fn}, sizes_of(x));
  const std::initializer_list<NamedTensor> inputs = {{"x", &x},
                                                     {"scale", &scale},
                                                     {"shift", &shift},
                                                     {"input_scale", &input_scale},
                                                     {"weight", optional_ptr(weight)},
                                                     {"norm_bias", optional_ptr(norm_bias)},
                                                     {"modulate_index", optional_ptr(modulate_index)}};
  if (y_bf16.has_value()) {
    check_output("y_bf16", *y_bf16, x, "x", {ScalarType::BFloat16}, sizes_of(x));
    check_no_overlap({{"y", &y}, {"y_bf16", &*y_bf16}}, inputs);
  } else {
    check_no_overlap({{"y", &y}}, inputs);
  }
  set_fp8_outputs(a, input_scale, y, y_bf16);
  launch_norm_modulate_fp8(a, launch_target(x));
}

}  // namespace qwen_fp4
