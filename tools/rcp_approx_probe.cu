// Tabulates div.full.f32(1, s) (SGLang's and Triton's fp32 1/s) against the correctly rounded 1/s
// (div.rn.f32) over every positive finite fp32 s, on the GPU it runs on: the source of
// qwen_resnorm_fp4/data/rcp_approx_f32.xz (tools/rcp_approx_table.py) and of the rules in
// qwen_resnorm_fp4/rcp_approx.py, which hold where hypotheses.txt counts no miss. Writes, to the directory in argv[1]:
//   summary.txt        per biased exponent of s: how many s give delta = -2..+2 ulps, and how many differ
//                      from the delta of the same mantissa at exponent 127 (s in [1, 2))
//   delta_e127.bin     int8[2^23]: the delta in ulps for s = (1 + m * 2^-23), m = 0 .. 2^23 - 1
// The same for div.full.ftz.f32 (suffix _ftz); hypotheses.txt tests candidate closed forms per exponent. A maintainer tool: nvcc -O2 -arch=sm_90a rcp_approx_probe.cu.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

__device__ __forceinline__ float div_full(float a, float b, bool ftz) {
  float r;
  if (ftz) asm("div.full.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  else asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ float div_rn(float a, float b) {
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// hist[e][d + 2] for d in -2..2; hist[e][5]: |d| > 2 or non-finite mismatch; other[e]: delta differs from
// the exponent-127 delta of the same mantissa.
__global__ void probe(bool ftz, unsigned long long* hist, unsigned long long* other, int8_t* delta127) {
  const uint32_t m = blockIdx.x * blockDim.x + threadIdx.x;  // mantissa
  if (m >= (1u << 23)) return;
  const float s127 = __uint_as_float((127u << 23) | m);
  const int d127 = int(__float_as_uint(div_full(1.0f, s127, ftz))) - int(__float_as_uint(div_rn(1.0f, s127)));
  delta127[m] = (int8_t)max(-128, min(127, d127));
  for (uint32_t e = 0; e < 255; ++e) {
    const uint32_t bits = (e << 23) | m;
    if (bits == 0) continue;
    const float s = __uint_as_float(bits);
    const float a = div_full(1.0f, s, ftz), b = div_rn(1.0f, s);
    const int d = int(__float_as_uint(a)) - int(__float_as_uint(b));
    const int slot = (d >= -2 && d <= 2) ? d + 2 : 5;
    atomicAdd(&hist[e * 6 + slot], 1ull);
    if (d != d127) atomicAdd(&other[e], 1ull);
  }
}

int run(bool ftz, const std::string& dir) {
  unsigned long long *hist, *other;
  int8_t* delta;
  cudaMallocManaged(&hist, 255 * 6 * sizeof(unsigned long long));
  cudaMallocManaged(&other, 255 * sizeof(unsigned long long));
  cudaMallocManaged(&delta, 1u << 23);
  cudaMemset(hist, 0, 255 * 6 * sizeof(unsigned long long));
  cudaMemset(other, 0, 255 * sizeof(unsigned long long));
  probe<<<(1u << 23) / 256, 256>>>(ftz, hist, other, delta);
  if (cudaDeviceSynchronize() != cudaSuccess) { std::printf("kernel failed\n"); return 1; }
  const std::string sfx = ftz ? "_ftz" : "";
  FILE* f = std::fopen((dir + "/summary" + sfx + ".txt").c_str(), "w");
  std::fprintf(f, "exp d-2 d-1 d0 d+1 d+2 other_big differs_from_e127\n");
  for (int e = 0; e < 255; ++e) {
    std::fprintf(f, "%d", e);
    for (int k = 0; k < 6; ++k) std::fprintf(f, " %llu", hist[e * 6 + k]);
    std::fprintf(f, " %llu\n", other[e]);
  }
  std::fclose(f);
  FILE* b = std::fopen((dir + "/delta_e127" + sfx + ".bin").c_str(), "wb");
  std::fwrite(delta, 1, 1u << 23, b);
  std::fclose(b);
  return 0;
}


__device__ __forceinline__ float rcp_approx(float b) {
  float r;
  asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(b));
  return r;
}

// Mismatch counts of div.full.f32(1, s) against candidate rules, per biased exponent of s:
//   [0] rcp.approx.f32(s); [1] 0.25f * div.full(1, 0.25f * s) (rounded once); [2] 4.0f * div.full(1, 4.0f * s).
__global__ void hypotheses(unsigned long long* miss) {
  const uint32_t m = blockIdx.x * blockDim.x + threadIdx.x;
  if (m >= (1u << 23)) return;
  for (uint32_t e = 0; e < 255; ++e) {
    const uint32_t bits = (e << 23) | m;
    if (bits == 0) continue;
    const float s = __uint_as_float(bits);
    const uint32_t a = __float_as_uint(div_full(1.0f, s, false));
    if (a != __float_as_uint(rcp_approx(s))) atomicAdd(&miss[e * 3 + 0], 1ull);
    if (a != __float_as_uint(__fmul_rn(0.25f, div_full(1.0f, __fmul_rn(0.25f, s), false)))) atomicAdd(&miss[e * 3 + 1], 1ull);
    if (a != __float_as_uint(__fmul_rn(4.0f, div_full(1.0f, __fmul_rn(4.0f, s), false)))) atomicAdd(&miss[e * 3 + 2], 1ull);
  }
}

int run_hypotheses(const std::string& dir) {
  unsigned long long* miss;
  cudaMallocManaged(&miss, 255 * 3 * sizeof(unsigned long long));
  cudaMemset(miss, 0, 255 * 3 * sizeof(unsigned long long));
  hypotheses<<<(1u << 23) / 256, 256>>>(miss);
  if (cudaDeviceSynchronize() != cudaSuccess) { std::printf("kernel failed\n"); return 1; }
  FILE* f = std::fopen((dir + "/hypotheses.txt").c_str(), "w");
  std::fprintf(f, "exp miss_rcp_approx miss_quarter_scaling miss_times4_scaling\n");
  for (int e = 0; e < 255; ++e) std::fprintf(f, "%d %llu %llu %llu\n", e, miss[e * 3], miss[e * 3 + 1], miss[e * 3 + 2]);
  std::fclose(f);
  return 0;
}

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  return run(false, dir) | run(true, dir) | run_hypotheses(dir);
}
