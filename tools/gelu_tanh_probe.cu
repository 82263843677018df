// GELU(tanh) of every bf16 bit pattern on the GPU: (A) the kernels' own gelu_tanh_bf16 (csrc/fp8_e4m3.cuh,
// PyTorch's CUDA expression with nvcc's default contraction) and (B) the same expression with no
// contraction, rounded to bf16: tools/gelu_tanh_probe.py compares both with torch's F.gelu(approximate="tanh").
//   nvcc -O3 -arch=sm_90a -Icsrc -o gelu_probe tools/gelu_tanh_probe.cu && ./gelu_probe a.bin b.bin
#include <cuda_bf16.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "fp8_e4m3.cuh"

__global__ void gelu_variants(uint16_t* a, uint16_t* b) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 65536) return;
  const float x = __uint_as_float(uint32_t(i) << 16);
  constexpr float kBeta = M_SQRT2 * M_2_SQRTPI * 0.5f;
  constexpr float kKappa = 0.044715f;
  const float inner_b = __fmul_rn(kBeta, __fadd_rn(x, __fmul_rn(kKappa, __fmul_rn(__fmul_rn(x, x), x))));
  const float yb = __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner_b)));
  a[i] = qwen_fp4::gelu_tanh_bf16(static_cast<uint16_t>(i));
  b[i] = __bfloat16_as_ushort(__float2bfloat16_rn(yb));
}

int main(int argc, char** argv) {
  if (argc != 3) { std::fprintf(stderr, "usage: %s A.bin B.bin\n", argv[0]); return 2; }
  uint16_t *a, *b;
  cudaMalloc(&a, 65536 * 2);
  cudaMalloc(&b, 65536 * 2);
  gelu_variants<<<256, 256>>>(a, b);
  std::vector<uint16_t> h(65536);
  for (int k = 0; k < 2; ++k) {
    cudaMemcpy(h.data(), k ? b : a, 65536 * 2, cudaMemcpyDeviceToHost);
    FILE* f = std::fopen(argv[1 + k], "wb");
    std::fwrite(h.data(), 2, 65536, f);
    std::fclose(f);
  }
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
