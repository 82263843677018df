// The CUDA implementations of the qwen_fp4 ops (schemas: qwen_resnorm_fp4/ops.py).
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace qwen_fp4 {

using torch::stable::Tensor;

std::tuple<Tensor, Tensor, Tensor> resnorm_quant_cuda(
    const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias, const Tensor& gate, const Tensor& scale,
    const Tensor& shift, const Tensor& global_scale, double eps, bool fast_math, const std::optional<Tensor>& weight,
    const std::optional<Tensor>& norm_bias, const std::optional<Tensor>& modulate_index, int64_t nvfp4_4over6_code);

// The out-variants: the same launches into caller-provided outputs; residual_out may be residual itself.
void resnorm_quant_out_cuda(const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias,
                            const Tensor& gate, const Tensor& scale, const Tensor& shift, const Tensor& global_scale,
                            double eps, bool fast_math, const Tensor& packed, const Tensor& scales,
                            const Tensor& residual_out, const std::optional<Tensor>& weight,
                            const std::optional<Tensor>& norm_bias, const std::optional<Tensor>& modulate_index,
                            int64_t nvfp4_4over6_code);

void resnorm_out_cuda(const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias, const Tensor& gate,
                      const Tensor& scale, const Tensor& shift, double eps, const Tensor& y, const Tensor& residual_out,
                      const std::optional<Tensor>& weight, const std::optional<Tensor>& norm_bias,
                      const std::optional<Tensor>& modulate_index);

void nvfp4_quantize_out_cuda(const Tensor& y, const Tensor& global_scale, bool fast_math, const Tensor& packed,
                             const Tensor& scales, int64_t nvfp4_4over6_code);

std::tuple<Tensor, Tensor> resnorm_cuda(const Tensor& residual, const Tensor& x, const std::optional<Tensor>& bias,
                                        const Tensor& gate, const Tensor& scale, const Tensor& shift, double eps,
                                        const std::optional<Tensor>& weight, const std::optional<Tensor>& norm_bias,
                                        const std::optional<Tensor>& modulate_index);

std::tuple<Tensor, Tensor> nvfp4_quantize_cuda(const Tensor& y, const Tensor& global_scale, bool fast_math,
                                               int64_t nvfp4_4over6_code);

Tensor nvfp4_dequantize_bf16_cuda(const Tensor& packed, const Tensor& scales);

// _set_launch_options: kernel_path a KernelPath code (launch.h), pdl the PDL switch.
void set_launch_options_op(int64_t kernel_path, bool pdl);

}  // namespace qwen_fp4
