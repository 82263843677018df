// Launchers of the Blackwell path: the same row kernels with FlashInfer's production conversion.
// Compiled only when the build has a Blackwell target and FlashInfer's headers (setup.py then adds this
// file to the sources); launch_blackwell_stub.cpp stands in otherwise.
#include <cuda_runtime.h>

#include <mutex>

#include "launch.h"
#include "launch_rows.cuh"
#include "nvfp4_flashinfer.cuh"

namespace qwen_fp4 {

#if QWEN_FP4_EMULATE_BLACKWELL
// Found by scripts/check_wheel.py, which refuses a wheel holding it as a release.
extern "C" __attribute__((used, visibility("default"))) const char qwen_fp4_blackwell_emulation_build[] =
    "qwen_fp4 Blackwell emulation build: software E2M1 on sm_90a, never to be shipped";
// The emulation build's only cubin is sm_90a: the Blackwell path runs on compute capability 9.0.
constexpr int kBlackwellMajor = 9, kMinPtxVersion = 90;
#else
// ptxVersion < 100 means the driver would run the compute_90 PTX of this TU, where FlashInfer's
// conversion is compiled out: only a real Blackwell cubin will do.
constexpr int kBlackwellMajor = 10, kMinPtxVersion = 100;
#endif

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
    const cudaError_t err = cudaFuncGetAttributes(
        &attr, resnorm_quant_kernel<FlashInferNvfp4<true>, RowConfig<4, 0, 1, false>, false, false>);
    cudaSetDevice(previous);
    cudaGetLastError();  // clear a "no kernel image" error: that is an answer, not a failure
    usable[device_index] = major >= kBlackwellMajor && err == cudaSuccess && attr.ptxVersion >= kMinPtxVersion;
  });
  return usable[device_index];
}

void launch_resnorm_quant_blackwell(const ResnormArgs& args, bool fast_math, const LaunchTarget& on) {
  launch_resnorm_quant_mode<FlashInferNvfp4, FlashInfer4Over6Nvfp4>(args, fast_math, on,
                                                                    "resnorm_quant_kernel (Blackwell)");
}

void launch_nvfp4_quantize_blackwell(const QuantizeArgs& args, bool fast_math, const LaunchTarget& on) {
  launch_nvfp4_quantize_mode<FlashInferNvfp4, FlashInfer4Over6Nvfp4>(args, fast_math, on,
                                                                     "nvfp4_quantize_kernel (Blackwell)");
}

}  // namespace qwen_fp4
