// Launchers of the portable path: resnorm (no conversion, every GPU) and the software E2M1 conversion.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "launch.h"
#include "launch_rows.cuh"
#include "nvfp4_4over6.cuh"
#include "nvfp4_portable.cuh"

namespace qwen_fp4 {

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("qwen_fp4: launching ") + what + " failed: " + cudaGetErrorString(err));
  }
}

bool pdl_enabled() {
  // What an unset (or any other) value means: off, since after a GEMM (the fused op's predecessor in a
  // model) PDL did not pay in the benchmark (docs/performance.md); env.py PDL_DEFAULT is the same.
  constexpr bool kPdlByDefault = false;
  const char* value = std::getenv("QWEN_FP4_PDL");
  if (value == nullptr) return kPdlByDefault;
  if (std::strcmp(value, "0") == 0) return false;
  if (std::strcmp(value, "1") == 0) return true;
  return kPdlByDefault;
}

void launch_resnorm(const ResnormArgs& args, const LaunchTarget& on) {
  if (args.rows == 0) return;
  launch_row_kernels<ResnormKernels>(args, on);
  check_launch("resnorm");
}

void launch_resnorm_quant_portable(const ResnormArgs& args, bool fast_math, const LaunchTarget& on) {
  launch_resnorm_quant_mode<PortableNvfp4, Portable4Over6Nvfp4>(args, fast_math, on, "resnorm_quant");
}

void launch_nvfp4_quantize_portable(const QuantizeArgs& args, bool fast_math, const LaunchTarget& on) {
  launch_nvfp4_quantize_mode<PortableNvfp4, Portable4Over6Nvfp4>(args, fast_math, on, "nvfp4_quantize");
}

__global__ void e2m1_codes_kernel(const float* in, uint8_t* out, int64_t n, bool toolkit) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = toolkit ? e2m1_code_toolkit(in[i]) : e2m1_code(in[i]);
  }
}

void launch_e2m1_codes(const float* in, uint8_t* out, int64_t n, bool toolkit, void* stream) {
  if (n == 0) return;
  const int64_t blocks = ceil_div(n, 256) < 65536 ? ceil_div(n, 256) : 65536;
  e2m1_codes_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(in, out, n, toolkit);
  check_launch("_e2m1_codes");
}

__global__ void rcp_approx_kernel(const float* in, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = rcp_approx_ftz(in[i]);
  }
}

void launch_rcp_approx(const float* in, float* out, int64_t n, void* stream) {
  if (n == 0) return;
  const int64_t blocks = ceil_div(n, 256) < 4096 ? ceil_div(n, 256) : 4096;
  rcp_approx_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(in, out, n);
  check_launch("_rcp_approx");
}

}  // namespace qwen_fp4
