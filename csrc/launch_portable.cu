// Launchers of the portable path: resnorm (no conversion, every GPU) and the software E2M1 conversion.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "dispatch.cuh"
#include "launch.h"
#include "launch_rows.cuh"
#include "nvfp4_portable.cuh"

namespace qwen_fp4 {

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("qwen_fp4: launching ") + what + " failed: " + cudaGetErrorString(err));
  }
}

void launch_resnorm(const ResnormArgs& args, void* stream) {
  if (args.rows == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_plain(args, [&](auto plain) {
    dispatch_row_shape(args.cols, args.rows, [&](auto vpt, auto fixed, auto min_blocks, auto few, int threads) {
      // (std::decay_t: nvcc's launch rewriting sees the captured `plain` as a reference)
      constexpr int kVpt = decltype(vpt)::value, kFixedCols = decltype(fixed)::value;
      constexpr int kMinBlocks = decltype(min_blocks)::value;
      constexpr bool kPlain = std::decay_t<decltype(plain)>::value, kFew = decltype(few)::value;
      constexpr auto kernel = resnorm_kernel<kVpt, kFixedCols, kMinBlocks, kPlain, (kMinBlocks > 1), kFew>;
      if constexpr (kStaggerable<kVpt, kFixedCols, kMinBlocks>) {
        launch_row_kernel<kernel, resnorm_kernel<kVpt, kFixedCols, kMinBlocks, kPlain, true, kFew>, kFixedCols,
                          kMinBlocks>(args, args.rows, threads, s);
      } else {
        kernel<<<args.rows, threads, 0, s>>>(args);
      }
    });
  });
  check_launch("resnorm");
}

void launch_resnorm_quant_portable(const ResnormArgs& args, bool fast_math, void* stream) {
  launch_resnorm_quant_mode<PortableNvfp4>(args, fast_math, stream, "resnorm_quant");
}

void launch_nvfp4_quantize_portable(const QuantizeArgs& args, bool fast_math, void* stream) {
  launch_nvfp4_quantize_mode<PortableNvfp4>(args, fast_math, stream, "nvfp4_quantize");
}

__global__ void e2m1_codes_kernel(const float* in, uint8_t* out, int64_t n, bool toolkit) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = toolkit ? e2m1_code_toolkit(in[i]) : e2m1_code(in[i]);
  }
}

void launch_e2m1_codes(const float* in, uint8_t* out, int64_t n, bool toolkit, void* stream) {
  if (n == 0) return;
  const int64_t blocks = (n + 255) / 256 < 65536 ? (n + 255) / 256 : 65536;
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
  const int64_t blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
  rcp_approx_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(in, out, n);
  check_launch("_rcp_approx");
}

}  // namespace qwen_fp4
