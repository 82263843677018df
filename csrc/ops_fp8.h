// The CUDA implementations of the FP8 ops and the no-residual (norm_modulate) ops (schemas:
// qwen_resnorm_fp4/ops.py, the FP8 block).
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace qwen_fp4 {

using torch::stable::Tensor;

std::tuple<Tensor, Tensor> resnorm_quant_fp8_cuda(const Tensor& residual, const Tensor& x,
                                                  const std::optional<Tensor>& bias, const Tensor& gate,
                                                  const Tensor& scale, const Tensor& shift, const Tensor& input_scale,
                                                  double eps, const std::optional<Tensor>& weight,
                                                  const std::optional<Tensor>& norm_bias,
                                                  const std::optional<Tensor>& modulate_index);

void resnorm_quant_fp8_out_cuda(const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias,
                                const Tensor& gate, const Tensor& scale, const Tensor& shift, const Tensor& input_scale,
                                double eps, const Tensor& y, const Tensor& residual_out,
                                const std::optional<Tensor>& weight, const std::optional<Tensor>& norm_bias,
                                const std::optional<Tensor>& modulate_index, const std::optional<Tensor>& y_bf16);

Tensor fp8_quantize_cuda(const Tensor& y, const Tensor& input_scale);

void fp8_quantize_out_cuda(const Tensor& y, const Tensor& input_scale, const Tensor& out);
// E4M3 of bf16(GELU_tanh(y)), GELU as PyTorch's CUDA kernel computes it.
Tensor gelu_tanh_fp8_quantize_cuda(const Tensor& y, const Tensor& input_scale);
void gelu_tanh_fp8_quantize_out_cuda(const Tensor& y, const Tensor& input_scale, const Tensor& out);

std::tuple<Tensor, Tensor> norm_modulate_quant_cuda(const Tensor& x, const Tensor& scale, const Tensor& shift,
                                                    const Tensor& global_scale, double eps, bool fast_math,
                                                    const std::optional<Tensor>& weight,
                                                    const std::optional<Tensor>& norm_bias,
                                                    const std::optional<Tensor>& modulate_index,
                                                    int64_t nvfp4_4over6_code);

Tensor norm_modulate_quant_fp8_cuda(const Tensor& x, const Tensor& scale, const Tensor& shift,
                                    const Tensor& input_scale, double eps, const std::optional<Tensor>& weight,
                                    const std::optional<Tensor>& norm_bias,
                                    const std::optional<Tensor>& modulate_index);

void norm_modulate_quant_fp8_out_cuda(const Tensor& x, const Tensor& scale, const Tensor& shift,
                                      const Tensor& input_scale, double eps, const Tensor& y,
                                      const std::optional<Tensor>& weight, const std::optional<Tensor>& norm_bias,
                                      const std::optional<Tensor>& modulate_index, const std::optional<Tensor>& y_bf16);

}  // namespace qwen_fp4
