// Programmatic dependent launch (PDL) of the row kernels: the host launch with programmatic stream
// serialization, and the device side, which waits for the predecessor grid before its first global memory
// access. Launched so, a kernel's launch and CTA start overlap the tail of the kernel before it (a GEMM, in
// a model); without the attribute the device side costs nothing (griddepcontrol.wait returns at once).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

namespace qwen_fp4 {

// Blocks until every grid this one depends on programmatically has completed and its memory is visible.
// Called before any global load or store: an input may be the predecessor's output, and an output may be
// memory the predecessor still reads (the caching allocator hands freed blocks out again at once).
__device__ __forceinline__ void wait_for_predecessor_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets a successor launched with PDL start launching once every CTA of this grid has called this. Safe
// anywhere: such a successor still waits for this grid's completion and memory flush on its own
// griddepcontrol.wait; a successor launched without PDL is ordered by the stream as always.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches kernel<<<grid, threads, 0, stream>>>(args...), with programmatic stream serialization when
// `pdl` (the kernel must call wait_for_predecessor_grid before touching global memory). Errors are left
// for check_launch (cudaGetLastError), like a <<<>>> launch.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), int64_t grid, int threads, cudaStream_t stream, bool pdl,
                   Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace qwen_fp4
