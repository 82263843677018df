// Kernels of the test-only ops (qwen_resnorm_fp4/testing.py, never registered by the release package):
// the portable path's approximate reciprocal and E2M1 encode, and the FP8 ops' inverse scale (div.full.f32
// of 1 by x), element by element.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "fp8_e4m3.cuh"
#include "nvfp4_portable.cuh"

namespace qwen_fp4_testing {

namespace {

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("qwen_fp4_testing: launching ") + what +
                             " failed: " + cudaGetErrorString(err));
  }
}

// Grid-stride loops over n elements: at most max_blocks blocks of 256 threads.
int64_t blocks_for(int64_t n, int64_t max_blocks) {
  const int64_t blocks = (n + 255) / 256;
  return blocks < max_blocks ? blocks : max_blocks;
}

__global__ void e2m1_codes_kernel(const float* in, uint8_t* out, int64_t n, bool toolkit) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = toolkit ? qwen_fp4::e2m1_code_toolkit(in[i]) : qwen_fp4::e2m1_code(in[i]);
  }
}

__global__ void rcp_approx_kernel(const float* in, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = qwen_fp4::rcp_approx_ftz(in[i]);
  }
}

__global__ void div_full_rcp_kernel(const float* in, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = qwen_fp4::div_full_rcp(in[i]);
  }
}

}  // namespace

void launch_e2m1_codes(const float* in, uint8_t* out, int64_t n, bool toolkit, void* stream) {
  if (n == 0) return;
  e2m1_codes_kernel<<<blocks_for(n, 65536), 256, 0, static_cast<cudaStream_t>(stream)>>>(in, out, n, toolkit);
  check_launch("e2m1_codes");
}

void launch_rcp_approx(const float* in, float* out, int64_t n, void* stream) {
  if (n == 0) return;
  rcp_approx_kernel<<<blocks_for(n, 4096), 256, 0, static_cast<cudaStream_t>(stream)>>>(in, out, n);
  check_launch("rcp_approx");
}

void launch_div_full_rcp(const float* in, float* out, int64_t n, void* stream) {
  if (n == 0) return;
  div_full_rcp_kernel<<<blocks_for(n, 4096), 256, 0, static_cast<cudaStream_t>(stream)>>>(in, out, n);
  check_launch("div_full_rcp");
}

}  // namespace qwen_fp4_testing
