// Launcher of the no-residual NVFP4 kernel (steps 3-7 on x, then NVFP4) with the portable conversion:
// the configuration the bf16 row kernel takes for (D, rows) (dispatch_row_config), the general-parameter row kernel
// (fp8_kernels.cuh norm_modulate_quant_kernel), one CTA per row plus the scale padding CTAs.
#include <cuda_runtime.h>

#include <type_traits>

#include "fp8_kernels.cuh"
#include "launch.h"
#include "launch_fp8.h"
#include "launch_rows.cuh"
#include "nvfp4_4over6.cuh"
#include "nvfp4_portable.cuh"

namespace qwen_fp4 {

namespace {

template <class Quantizer>
void launch_norm_modulate_quant_rows(const ResnormArgs& args, cudaStream_t s) {
  dispatch_row_config(args.cols, args.rows, [&](auto config) {
    using Config = std::decay_t<decltype(config)>;
    launch_kernel(norm_modulate_quant_kernel<Quantizer, Config>, quantize_grid(args.rows),
                  Config::threads_for(args.cols), s, pdl_enabled(), args);
  });
}

}  // namespace

void launch_norm_modulate_quant_portable(const ResnormArgs& args, bool fast_math, const LaunchTarget& on) {
  if (args.rows == 0) return;
  const auto s = static_cast<cudaStream_t>(on.stream);
  if (recipe_uses_4over6(args.nvfp4_4over6_code)) {
    if (fast_math)
      launch_norm_modulate_quant_rows<Portable4Over6Nvfp4<true>>(args, s);
    else
      launch_norm_modulate_quant_rows<Portable4Over6Nvfp4<false>>(args, s);
  } else if (fast_math) {
    launch_norm_modulate_quant_rows<PortableNvfp4<true>>(args, s);
  } else {
    launch_norm_modulate_quant_rows<PortableNvfp4<false>>(args, s);
  }
  check_launch("norm_modulate_quant_kernel");
}

}  // namespace qwen_fp4
