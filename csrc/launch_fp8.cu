// Launchers of the FP8 (E4M3) kernels: the FP8 row kernel through the row kernels' launch path (the
// configuration, plain/general and first-wave stagger variants the bf16 row kernel takes), the no-residual
// FP8 kernel, and the element-wise kernel (plain, or GELU first).
#include <cuda_runtime.h>

#include <type_traits>

#include "fp8_kernels.cuh"
#include "launch.h"
#include "launch_fp8.h"
#include "launch_rows.cuh"

namespace qwen_fp4 {

// The element-wise kernel, kActivation kNone (plain) or kGeluTanh (GELU first): E4M3 of a.n contiguous bf16
// values (after GELU to bf16), 8 per 16-byte vector (grid-stride over the vectors), the last n % 8 one by
// one in CTA 0.
template <Fp8Activation kActivation>
__global__ void __launch_bounds__(256) fp8_quantize_kernel(const Fp8QuantizeArgs a) {
  constexpr bool kGelu = kActivation == Fp8Activation::kGeluTanh;
  begin_after_predecessor();
  const float input_scale = __ldg(a.input_scale);
  const bool valid = fp8_scale_valid(input_scale);
  const float inv = div_full_rcp(input_scale);
  const int64_t vecs = a.n / kVecElems;
  const uint4* y = static_cast<const uint4*>(a.y);
  uint2* q = reinterpret_cast<uint2*>(a.out);
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < vecs; v += int64_t(gridDim.x) * blockDim.x) {
    const uint4 in = load_stream(y + v);
    store_stream(q + v, e4m3x8_from_bf16x8(kGelu ? gelu_tanh_bf16x8(in) : in, inv, valid));
  }
  const int64_t tail = a.n - vecs * kVecElems;
  if (blockIdx.x == 0 && threadIdx.x < tail) {
    const int64_t i = vecs * kVecElems + threadIdx.x;
    const uint16_t in = static_cast<const uint16_t*>(a.y)[i];
    a.out[i] = e4m3_from_bf16(kGelu ? gelu_tanh_bf16(in) : in, inv, valid);
  }
}

void launch_resnorm_fp8(const ResnormArgs& args, const LaunchTarget& on) {
  if (args.rows == 0) return;
  launch_row_kernels<ResnormFp8Kernels>(args, on);
  check_launch("resnorm_fp8_kernel");
}

void launch_norm_modulate_fp8(const ResnormArgs& args, const LaunchTarget& on) {
  if (args.rows == 0) return;
  dispatch_row_config(args.cols, args.rows, [&](auto config) {
    using Config = std::decay_t<decltype(config)>;
    launch_kernel(norm_modulate_fp8_kernel<Config>, args.rows, Config::threads_for(args.cols),
                  static_cast<cudaStream_t>(on.stream), pdl_enabled(), args);
  });
  check_launch("norm_modulate_fp8_kernel");
}

void launch_fp8_quantize(const Fp8QuantizeArgs& args, const LaunchTarget& on) {
  if (args.n == 0) return;
  constexpr int kThreads = 256;
  const int64_t vecs = args.n / kVecElems;
  // Enough CTAs to fill every SM (8 of 256 threads each), fewer for small tensors; at least one (the tail).
  const int64_t fill = has_device_cache(on.device) ? int64_t(device_sms(on.device)) * 8 : 1024;
  int64_t grid = ceil_div(vecs, kThreads);
  grid = grid < 1 ? 1 : (grid > fill ? fill : grid);
  const auto kernel = args.activation == Fp8Activation::kGeluTanh ? fp8_quantize_kernel<Fp8Activation::kGeluTanh>
                                                                  : fp8_quantize_kernel<Fp8Activation::kNone>;
  launch_kernel(kernel, grid, kThreads, static_cast<cudaStream_t>(on.stream), pdl_enabled(), args);
  check_launch(args.activation == Fp8Activation::kGeluTanh ? "fp8_quantize_kernel<kGeluTanh>" : "fp8_quantize_kernel");
}

}  // namespace qwen_fp4
