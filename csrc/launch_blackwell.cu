// Launchers of the Blackwell path: the same row kernels with FlashInfer's production conversion.
// Compiled only when the build has a Blackwell target and FlashInfer's headers (setup.py then adds this
// file to the sources); launch_blackwell_stub.cpp stands in otherwise.
#include <cuda_runtime.h>

#include <mutex>

#include "launch.h"
#include "launch_rows.cuh"
#include "nvfp4_flashinfer.cuh"

namespace qwen_fp4 {

bool blackwell_kernels_usable(int device_index) {
  static std::once_flag once[kMaxCachedDevices];
  static bool usable[kMaxCachedDevices];
  if (!has_device_cache(device_index)) return false;
  std::call_once(once[device_index], [device_index] {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index);
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device_index);
    cudaFuncAttributes attr{};
    // ptxVersion < 100 means the driver would run the compute_90 PTX of this TU, where FlashInfer's
    // conversion is compiled out: only a real Blackwell cubin will do.
    const cudaError_t err =
        cudaFuncGetAttributes(&attr, resnorm_quant_kernel<FlashInferNvfp4<true>, RowConfig<4, 0, 1, false>, false, false>);
    cudaSetDevice(previous);
    cudaGetLastError();  // clear a "no kernel image" error: that is an answer, not a failure
    usable[device_index] = major >= 10 && err == cudaSuccess && attr.ptxVersion >= 100;
  });
  return usable[device_index];
}

void launch_resnorm_quant_blackwell(const ResnormArgs& args, bool fast_math, const LaunchTarget& on) {
  launch_resnorm_quant_mode<FlashInferNvfp4, FlashInfer4Over6Nvfp4>(args, fast_math, on, "resnorm_quant (Blackwell)");
}

void launch_nvfp4_quantize_blackwell(const QuantizeArgs& args, bool fast_math, const LaunchTarget& on) {
  launch_nvfp4_quantize_mode<FlashInferNvfp4, FlashInfer4Over6Nvfp4>(args, fast_math, on, "nvfp4_quantize (Blackwell)");
}

}  // namespace qwen_fp4
