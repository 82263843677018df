// Registers the CUDA kernels for the qwen_fp4 ops. The schemas are defined once, in
// qwen_resnorm_fp4/ops.py, which loads this library once they are defined.
#include <torch/csrc/stable/library.h>

#include "ops.h"
#include "ops_fp8.h"

STABLE_TORCH_LIBRARY_IMPL(qwen_fp4, CUDA, m) {
  m.impl("resnorm_quant", TORCH_BOX(&qwen_fp4::resnorm_quant_cuda));
  m.impl("resnorm", TORCH_BOX(&qwen_fp4::resnorm_cuda));
  m.impl("nvfp4_quantize", TORCH_BOX(&qwen_fp4::nvfp4_quantize_cuda));
  m.impl("resnorm_quant_out", TORCH_BOX(&qwen_fp4::resnorm_quant_out_cuda));
  m.impl("resnorm_out", TORCH_BOX(&qwen_fp4::resnorm_out_cuda));
  m.impl("nvfp4_quantize_out", TORCH_BOX(&qwen_fp4::nvfp4_quantize_out_cuda));
  m.impl("nvfp4_dequantize_bf16", TORCH_BOX(&qwen_fp4::nvfp4_dequantize_bf16_cuda));
}

// The FP8 ops and the no-residual ops (ops_fp8.cpp).
STABLE_TORCH_LIBRARY_IMPL(qwen_fp4, CUDA, m) {
  m.impl("resnorm_quant_fp8", TORCH_BOX(&qwen_fp4::resnorm_quant_fp8_cuda));
  m.impl("resnorm_quant_fp8_out", TORCH_BOX(&qwen_fp4::resnorm_quant_fp8_out_cuda));
  m.impl("fp8_quantize", TORCH_BOX(&qwen_fp4::fp8_quantize_cuda));
  m.impl("fp8_quantize_out", TORCH_BOX(&qwen_fp4::fp8_quantize_out_cuda));
  m.impl("gelu_tanh_fp8_quantize", TORCH_BOX(&qwen_fp4::gelu_tanh_fp8_quantize_cuda));
  m.impl("gelu_tanh_fp8_quantize_out", TORCH_BOX(&qwen_fp4::gelu_tanh_fp8_quantize_out_cuda));
  m.impl("norm_modulate_quant", TORCH_BOX(&qwen_fp4::norm_modulate_quant_cuda));
  m.impl("norm_modulate_quant_fp8", TORCH_BOX(&qwen_fp4::norm_modulate_quant_fp8_cuda));
  m.impl("norm_modulate_quant_fp8_out", TORCH_BOX(&qwen_fp4::norm_modulate_quant_fp8_out_cuda));
}

// No tensor arguments: the dispatcher takes it to this key's kernel.
STABLE_TORCH_LIBRARY_IMPL(qwen_fp4, CompositeExplicitAutograd, m) {
  m.impl("_set_launch_options", TORCH_BOX(&qwen_fp4::set_launch_options_op));
}
