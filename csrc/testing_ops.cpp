// Host wrappers and registration of the test-only ops (schemas: qwen_resnorm_fp4/testing.py, which loads
// this library): float32 CUDA tensors in, one launch on the current stream of their device.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>
#include <vector>

namespace qwen_fp4_testing {

void launch_e2m1_codes(const float* in, uint8_t* out, int64_t n, bool toolkit, void* stream);
void launch_rcp_approx(const float* in, float* out, int64_t n, void* stream);
void launch_div_full_rcp(const float* in, float* out, int64_t n, void* stream);

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

void check_input(const char* op, const Tensor& x) {
  STD_TORCH_CHECK(x.is_cuda(), "qwen_fp4_testing: ", op, " needs a CUDA tensor");
  STD_TORCH_CHECK(x.scalar_type() == ScalarType::Float, "qwen_fp4_testing: ", op, " needs float32");
  STD_TORCH_CHECK(x.is_contiguous(), "qwen_fp4_testing: ", op, " needs a contiguous tensor");
}

// A contiguous CUDA tensor of x's shape on x's device.
Tensor empty_like_cuda(const Tensor& x, int32_t dtype) {
  std::vector<int64_t> sizes(x.dim()), strides(x.dim());
  int64_t stride = 1;
  for (int64_t d = x.dim(); d-- > 0;) {
    sizes[d] = x.size(d);
    strides[d] = stride;
    stride *= sizes[d] > 0 ? sizes[d] : 1;
  }
  AtenTensorHandle handle = nullptr;
  STD_TORCH_CHECK(aoti_torch_empty_strided(x.dim(), sizes.data(), strides.data(), dtype, aoti_torch_device_type_cuda(),
                                           x.get_device_index(), &handle) == AOTI_TORCH_SUCCESS,
                  "qwen_fp4_testing: allocating the output failed");
  return Tensor(handle);
}

void* current_stream(const Tensor& x) {
  void* stream = nullptr;
  STD_TORCH_CHECK(aoti_torch_get_current_cuda_stream(x.get_device_index(), &stream) == AOTI_TORCH_SUCCESS,
                  "qwen_fp4_testing: could not get the current CUDA stream");
  return stream;
}

Tensor rcp_approx(const Tensor& x) {
  check_input("rcp_approx", x);
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  Tensor out = empty_like_cuda(x, aoti_torch_dtype_float32());
  launch_rcp_approx(static_cast<const float*>(x.data_ptr()), static_cast<float*>(out.data_ptr()), x.numel(),
                    current_stream(x));
  return out;
}

Tensor div_full_rcp(const Tensor& x) {
  check_input("div_full_rcp", x);
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  Tensor out = empty_like_cuda(x, aoti_torch_dtype_float32());
  launch_div_full_rcp(static_cast<const float*>(x.data_ptr()), static_cast<float*>(out.data_ptr()), x.numel(),
                      current_stream(x));
  return out;
}

Tensor e2m1_codes(const Tensor& x, bool toolkit) {
  check_input("e2m1_codes", x);
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  Tensor out = empty_like_cuda(x, aoti_torch_dtype_uint8());
  launch_e2m1_codes(static_cast<const float*>(x.data_ptr()), static_cast<uint8_t*>(out.data_ptr()), x.numel(), toolkit,
                    current_stream(x));
  return out;
}

}  // namespace

}  // namespace qwen_fp4_testing

STABLE_TORCH_LIBRARY_IMPL(qwen_fp4_testing, CUDA, m) {
  m.impl("rcp_approx", TORCH_BOX(&qwen_fp4_testing::rcp_approx));
  m.impl("e2m1_codes", TORCH_BOX(&qwen_fp4_testing::e2m1_codes));
  m.impl("div_full_rcp", TORCH_BOX(&qwen_fp4_testing::div_full_rcp));
}
