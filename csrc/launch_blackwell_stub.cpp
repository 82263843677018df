// Stands in for launch_blackwell.cu in builds without a Blackwell target (or without FlashInfer's
// headers): the Blackwell path is never usable, and the portable path serves every GPU.
#include <stdexcept>

#include "launch.h"

namespace qwen_fp4 {

bool blackwell_kernels_usable(int) { return false; }

void launch_resnorm_quant_blackwell(const ResnormArgs&, bool, const LaunchTarget&) {
  throw std::runtime_error("qwen_fp4: this build has no Blackwell kernels");
}

void launch_nvfp4_quantize_blackwell(const QuantizeArgs&, bool, const LaunchTarget&) {
  throw std::runtime_error("qwen_fp4: this build has no Blackwell kernels");
}

}  // namespace qwen_fp4
