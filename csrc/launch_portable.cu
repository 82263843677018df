// Launchers of the portable path: the bf16 row kernel (no conversion, every GPU) and the software E2M1
// conversion.
#include <cuda_runtime.h>

#include <atomic>
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

namespace {
// Both switches in one word (bits 0-1 the kernel path, bit 2 PDL), so that a launch reads them with one
// load; kLaunchOptionsUnset until the package sets them.
constexpr int32_t kLaunchOptionsUnset = -1;
std::atomic<int32_t> g_launch_options{kLaunchOptionsUnset};
}  // namespace

void set_launch_options(LaunchOptions options) {
  g_launch_options.store(static_cast<int32_t>(options.kernel_path) | (options.pdl ? 4 : 0), std::memory_order_relaxed);
}

LaunchOptions launch_options() {
  const int32_t word = g_launch_options.load(std::memory_order_relaxed);
  if (word == kLaunchOptionsUnset) {
    throw std::runtime_error(
        "qwen_fp4: the launch options were never set: load this library with "
        "`import qwen_resnorm_fp4`, which sets them");
  }
  return {static_cast<KernelPath>(word & 3), (word & 4) != 0};
}

void launch_resnorm(const ResnormArgs& args, const LaunchTarget& on) {
  if (args.rows == 0) return;
  launch_row_kernels<ResnormKernels>(args, on);
  check_launch("resnorm_kernel");
}

void launch_resnorm_quant_portable(const ResnormArgs& args, bool fast_math, const LaunchTarget& on) {
  launch_resnorm_quant_mode<PortableNvfp4, Portable4Over6Nvfp4>(args, fast_math, on, "resnorm_quant_kernel");
}

void launch_nvfp4_quantize_portable(const QuantizeArgs& args, bool fast_math, const LaunchTarget& on) {
  launch_nvfp4_quantize_mode<PortableNvfp4, Portable4Over6Nvfp4>(args, fast_math, on, "nvfp4_quantize_kernel");
}

}  // namespace qwen_fp4
