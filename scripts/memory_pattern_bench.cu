// Diagnostic (docs/performance.md, "Why 90% of copy ..."): what fraction of copy bandwidth each memory
// pattern of the fused op's bytes reaches on this GPU, under the benchmark's per-call timing (CUDA events
// around each call, the queue pre-filled by a spinning kernel, cold L2 by rotating input sets, medians).
// Arithmetic-free: every kernel moves the fused op's bytes at D = 3072 (x and residual read; residual_out,
// packed codes and 128x4 scale bytes written) and computes nothing but XORs, so the figures are the
// pattern's alone. Outputs are meaningless by design. A bound for the pattern, not a forecast for the real
// kernels: its best form here (four rows per CTA) made the real fused kernel 13% slower (docs, item 13).
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o memory_pattern_bench scripts/memory_pattern_bench.cu
//   ROUNDS=2 ./memory_pattern_bench [rows ...]   (multiples of 128; default 4096 8192 16384; ROUNDS: the
//                                                list again, in the same process)
//   ONLY=R1_128x3_occ6,R4_128x3_occ2 REPS=4 ...  only the variants named (comma-separated, exact names), and
//                                                REPS timed calls each instead of 100 (for profilers)
// Each variant's scale bytes are compared, once, with the first variant's (the kernels' byte stores):
// "[same]" in its line; "[-]" where it writes none or not the layout.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "../csrc/sf_layout.cuh"  // the 128x4 layout of the scale bytes, as the kernels write it

#define CHECK(call)                                                                              \
  do {                                                                                           \
    cudaError_t err_ = (call);                                                                   \
    if (err_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

constexpr int kCols = 3072;
constexpr int kVecs = kCols / 8;  // 16-byte vectors of bf16 per row

struct Buffers {
  const uint4* x;
  const uint4* residual;
  uint4* residual_out;
  uint32_t* packed;
  uint8_t* scales;
  int64_t rows;
};

__device__ __forceinline__ int64_t sf_offset(int64_t m, int k) {  // scale byte of row m, block k: the kernels' layout
  return qwen_fp4::sf_row_offset_128x4(m, kCols) + qwen_fp4::sf_block_offset_128x4(k);
}

template <bool kStream, class T>
__device__ __forceinline__ void store(T* p, const T& v) {
  if constexpr (kStream) __stcs(p, v); else *p = v;
}

// Barrier of one row's thread group (named barrier 1 + group; count = the group's threads).
template <int kThreads, int kRowsPerCta>
__device__ __forceinline__ void group_sync(int group) {
  if constexpr (kRowsPerCta == 1) {
    __syncthreads();
  } else {  // constant barrier ids: a register id makes ptxas reserve all 16
    static_assert(kRowsPerCta <= 8, "eight groups at most");
    switch (group) {
      case 0: asm volatile("bar.sync 1, %0;" ::"n"(kThreads) : "memory"); break;
      case 1: asm volatile("bar.sync 2, %0;" ::"n"(kThreads) : "memory"); break;
      case 2: asm volatile("bar.sync 3, %0;" ::"n"(kThreads) : "memory"); break;
      case 3: asm volatile("bar.sync 4, %0;" ::"n"(kThreads) : "memory"); break;
      case 4: asm volatile("bar.sync 5, %0;" ::"n"(kThreads) : "memory"); break;
      case 5: asm volatile("bar.sync 6, %0;" ::"n"(kThreads) : "memory"); break;
      case 6: asm volatile("bar.sync 7, %0;" ::"n"(kThreads) : "memory"); break;
      default: asm volatile("bar.sync 8, %0;" ::"n"(kThreads) : "memory"); break;
    }
  }
}

// How a row's 192 scale bytes (one per 16-element block) reach the 128x4 layout.
enum ScaleMode : int {
  kNoScales = 0,
  kBytes = 1,          // the kernels' way: the even lane of each pair stores its block's byte
  kWords = 2,          // the 4 bytes of one row's 4-block group gathered by two shuffles, one 32-bit store
  kLinearBytes = 3,    // diagnostic only (not the layout): bytes to a row-major [rows, 192]
  kBytesPlain = 4,     // kBytes with a plain (write-back) store, the other stores as kStream says
  kBytesEvictLast = 5, // kBytes with an L2 evict_last cache hint
  kWordsPlain = 6,     // kWords with a plain store
  kChunks4Rows = 7,    // 4 rows per CTA (m, m + 32, m + 64, m + 96): whole 16-byte chunks from shared memory
  kSectors8Rows = 8,   // 8 rows per CTA (those of one 32-byte sector): whole sectors from shared memory
};

template <int kMode>
__device__ __forceinline__ void store_scale_byte(const Buffers& b, int64_t row, int block, uint8_t v) {
  uint8_t* p = b.scales + sf_offset(row, block);
  if constexpr (kMode == kBytes) {
    __stcs(p, v);
  } else if constexpr (kMode == kBytesPlain) {
    *p = v;
  } else if constexpr (kMode == kBytesEvictLast) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("st.global.L2::cache_hint.b8 [%0], %1, %2;" ::"l"(p), "h"(uint16_t(v)), "l"(policy) : "memory");
  } else if constexpr (kMode == kLinearBytes) {
    __stcs(b.scales + row * (kCols / 16) + block, v);
  }
}

// Row of group g of CTA c for the multi-row scale modes: the rows that share 16-byte chunks (4 rows) or
// 32-byte sectors (8 rows) of the 128x4 layout; otherwise c * R + g.
template <int kMode, int kRowsPerCta>
__device__ __forceinline__ int64_t cta_row(int64_t c, int g) {
  if constexpr (kMode == kChunks4Rows) {
    return (c / 32) * 128 + (c % 32) + 32 * g;
  } else if constexpr (kMode == kSectors8Rows) {
    return (c / 16) * 128 + 2 * (c % 16) + (g % 2) + 32 * (g / 2);
  } else {
    return c * kRowsPerCta + g;
  }
}

// One row per group of kThreads threads, kRowsPerCta groups per CTA; each thread holds kVpt vectors of x
// and residual. kBarriers block-wide exchanges (0 or 2: the LayerNorm's two reductions) between the
// residual_out stores and the packed stores, which depend on their result. kPersistent: grid-stride over
// the rows instead of one group per row (with several groups per CTA, each group walks its own rows and
// meets only its own barrier, so the groups drift apart).
template <int kThreads, int kVpt, int kRowsPerCta, int kBarriers, int kScaleMode, bool kStream, bool kPersistent>
__global__ void __launch_bounds__(kThreads* kRowsPerCta) row_pattern_kernel(Buffers b) {
  static_assert(kThreads * kVpt == kVecs, "one row per group");
  static_assert(kScaleMode != kChunks4Rows || (kRowsPerCta == 4 && !kPersistent), "4 rows per CTA");
  static_assert(kScaleMode != kSectors8Rows || (kRowsPerCta == 8 && !kPersistent), "8 rows per CTA");
  constexpr bool kStaged = kScaleMode == kChunks4Rows || kScaleMode == kSectors8Rows;
  __shared__ uint32_t scratch[2][kRowsPerCta][32];
  __shared__ __align__(16) uint8_t staged[kStaged ? kRowsPerCta : 1][kCols / 16];
  extern __shared__ uint8_t occupancy_limiter[];  // dynamic shared memory only caps resident CTAs
  const int group = threadIdx.x / kThreads, t = threadIdx.x % kThreads;
  const int64_t step = kPersistent ? int64_t(gridDim.x) * kRowsPerCta : 0;
  for (int64_t row = cta_row<kScaleMode, kRowsPerCta>(blockIdx.x, group); row < b.rows; row += step) {
    uint4 xv[kVpt], rv[kVpt];
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      xv[i] = b.x[row * kVecs + i * kThreads + t];
      rv[i] = b.residual[row * kVecs + i * kThreads + t];
    }
    uint32_t acc = 0;
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      const uint4 r = make_uint4(xv[i].x ^ rv[i].x, xv[i].y ^ rv[i].y, xv[i].z ^ rv[i].z, xv[i].w ^ rv[i].w);
      store<kStream>(b.residual_out + row * kVecs + i * kThreads + t, r);
      acc ^= r.x;
    }
#pragma unroll
    for (int k = 0; k < kBarriers; ++k) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
      if (t % 32 == 0) scratch[k][group][t / 32] = acc;
      group_sync<kThreads, kRowsPerCta>(group);
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) acc ^= scratch[k][group][w];
    }
#pragma unroll
    for (int i = 0; i < kVpt; ++i) {
      const int v = i * kThreads + t;
      store<kStream>(b.packed + row * kVecs + v, xv[i].x ^ rv[i].w ^ acc);
      const uint8_t sf = uint8_t(xv[i].y ^ acc);  // this lane pair's block v / 2 (even lane's)
      if constexpr (kScaleMode == kWords || kScaleMode == kWordsPlain) {
        // lanes 8q .. 8q + 7 hold blocks 4q .. 4q + 3 (even lanes): byte (lane / 2) % 4 of the word
        uint32_t w = t % 2 == 0 ? uint32_t(sf) << (8 * ((t / 2) % 4)) : 0u;
        w |= __shfl_xor_sync(0xffffffffu, w, 2);
        w |= __shfl_xor_sync(0xffffffffu, w, 4);
        if (t % 8 == 0) {
          uint32_t* p = reinterpret_cast<uint32_t*>(b.scales + sf_offset(row, v / 2));
          if constexpr (kScaleMode == kWords) __stcs(p, w); else *p = w;
        }
      } else if constexpr (kStaged) {
        if (t % 2 == 0) staged[group][v / 2] = sf;
      } else if constexpr (kScaleMode != kNoScales) {
        if (t % 2 == 0) store_scale_byte<kScaleMode>(b, row, v / 2, sf);
      }
    }
    if constexpr (!kPersistent) break;  // (scratch[k] is reused only after the other exchange's barrier)
  }
  if constexpr (kStaged) {  // every row of the CTA exists (rows % 128 == 0)
    __syncthreads();
    const int64_t first = cta_row<kScaleMode, kRowsPerCta>(blockIdx.x, 0);
    constexpr int kChunks = kCols / 64 * kRowsPerCta / 4;  // 16-byte chunks: 4 rows x 4 blocks each
    for (int c = threadIdx.x; c < kChunks; c += blockDim.x) {
      const int tile = c % (kCols / 64), half = c / (kCols / 64);  // half: rows first + half (8-row mode)
      const uint32_t* w0 = reinterpret_cast<const uint32_t*>(staged[half]) + tile;  // groups half, half + 2, ...
      const int gs = kScaleMode == kSectors8Rows ? 2 : 1;
      const uint4 chunk = make_uint4(w0[0], w0[gs * (kCols / 64)], w0[2 * gs * (kCols / 64)], w0[3 * gs * (kCols / 64)]);
      __stcs(reinterpret_cast<uint4*>(b.scales + sf_offset(first + half, 4 * tile)), chunk);
    }
  }
  if (threadIdx.x == 0x7fffffff) occupancy_limiter[0] = 0;
}

// A plain copy kernel of n 16-byte vectors (grid-stride), next to cudaMemcpyAsync.
__global__ void __launch_bounds__(256) copy_kernel(const uint4* src, uint4* dst, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    __stcs(dst + i, src[i]);
}

__global__ void fill_kernel(uint32_t* p, int64_t n, uint32_t seed) {  // distinct words, so misplaced bytes show
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = uint32_t(i) * 2654435761u ^ seed;
}

__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timer {
  double cycles_per_us = 1500.0;
  Timer() {
    cudaEvent_t s, e;
    CHECK(cudaEventCreate(&s));
    CHECK(cudaEventCreate(&e));
    spin_kernel<<<1, 1>>>(1000);
    std::vector<double> r;
    for (int k = 0; k < 3; ++k) {
      CHECK(cudaEventRecord(s));
      spin_kernel<<<1, 1>>>(2000000);
      CHECK(cudaEventRecord(e));
      CHECK(cudaEventSynchronize(e));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, s, e));
      r.push_back(2000000.0 / (ms * 1e3));
    }
    cycles_per_us = median(r);
  }
  // Median per-call GPU time (us) of fn(i), i rotating over n_sets, as the benchmark's GpuTimer.per_call_us.
  double per_call_us(const std::function<void(int)>& fn, int n_sets, int reps = 100, int batch = 25) {
    for (int i = 0; i < 3; ++i) fn(i % n_sets);
    CHECK(cudaDeviceSynchronize());
    std::vector<cudaEvent_t> ev(batch + 1);
    for (auto& e : ev) CHECK(cudaEventCreate(&e));
    std::vector<double> times;
    int idx = 3;
    for (int done = 0; done < reps; done += batch) {
      spin_kernel<<<1, 1>>>(static_cast<long long>((batch * 20.0 + 50.0) * cycles_per_us));
      CHECK(cudaEventRecord(ev[0]));
      for (int j = 0; j < batch; ++j) {
        fn(idx++ % n_sets);
        CHECK(cudaEventRecord(ev[j + 1]));
      }
      CHECK(cudaDeviceSynchronize());
      for (int j = 0; j < batch; ++j) {
        float ms;
        CHECK(cudaEventElapsedTime(&ms, ev[j], ev[j + 1]));
        times.push_back(ms * 1e3);
      }
    }
    CHECK(cudaGetLastError());
    for (auto& e : ev) CHECK(cudaEventDestroy(e));
    return median(times);
  }
};

struct Variant {
  std::string name;
  int scale_mode, barriers;
  const void* kernel;
  int threads, rows_per_cta;
  bool persistent;
  int ctas_per_sm;  // 0: as many as fit; else capped by dynamic shared memory
  std::function<void(dim3, int, size_t, Buffers)> launch;
};

// cluster > 1: launched in thread-block clusters of that many CTAs (consecutive CTAs, so consecutive rows;
// a cluster's CTAs start together on SMs of one GPC and share nothing here).
template <int T, int V, int R, int B, int S, bool ST, bool P>
Variant make_variant(const std::string& name, int ctas_per_sm, int cluster = 1) {
  auto k = row_pattern_kernel<T, V, R, B, S, ST, P>;
  CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  return Variant{name, S, B, reinterpret_cast<const void*>(k), T * R, R, P, ctas_per_sm,
                 [k, cluster](dim3 g, int t, size_t smem, Buffers b) {
                   if (cluster <= 1) {
                     k<<<g, t, smem>>>(b);
                     return;
                   }
                   cudaLaunchConfig_t config = {};
                   config.gridDim = g;
                   config.blockDim = dim3(t);
                   config.dynamicSmemBytes = smem;
                   cudaLaunchAttribute attr;
                   attr.id = cudaLaunchAttributeClusterDimension;
                   attr.val.clusterDim.x = cluster;
                   attr.val.clusterDim.y = 1;
                   attr.val.clusterDim.z = 1;
                   config.attrs = &attr;
                   config.numAttrs = 1;
                   CHECK(cudaLaunchKernelEx(&config, k, b));
                 }};
}

int main(int argc, char** argv) {
  std::vector<int64_t> row_counts;
  for (int i = 1; i < argc; ++i) row_counts.push_back(std::atoll(argv[i]));
  if (row_counts.empty()) row_counts = {4096, 8192, 16384};
  for (const int64_t rows : row_counts) {
    if (rows <= 0 || rows % 128 != 0) {  // the multi-row scale modes cover whole 128-row groups only
      std::fprintf(stderr, "rows must be positive multiples of 128 (got %lld)\n", (long long)rows);
      return 2;
    }
  }
  int dev = 0, sms = 0, l2 = 0, smem_per_sm = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  CHECK(cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  Timer timer;
  std::printf("device %s, %d SMs, L2 %d MiB, SM clock %.0f MHz (spinning kernel)\n", prop.name, sms, l2 >> 20,
              timer.cycles_per_us);

  // Copy ceiling: 1 GiB device-to-device, read + write bytes over the median time.
  const size_t big = size_t(1) << 30;
  void *a, *c;
  CHECK(cudaMalloc(&a, big));
  CHECK(cudaMalloc(&c, big));
  CHECK(cudaMemset(a, 1, big));
  const double big_us = timer.per_call_us([&](int) { CHECK(cudaMemcpyAsync(c, a, big, cudaMemcpyDeviceToDevice)); }, 1, 20, 5);
  const double ceiling = 2.0 * big / (big_us * 1e-6) / 1e9;
  CHECK(cudaFree(a));
  CHECK(cudaFree(c));
  std::printf("copy ceiling %.0f GB/s\n", ceiling);

  // Rn_TxV_occK: n rows per CTA (one per group of T threads, V vectors each), K CTAs per SM (0: as many as fit)
  std::vector<Variant> variants = {
      make_variant<128, 3, 1, 2, kBytes, true, false>("R1_128x3_occ6", 6),  // the fused kernel's pattern
      make_variant<128, 3, 1, 2, kNoScales, true, false>("R1_128x3_occ6_noscales", 6),
      make_variant<128, 3, 1, 2, kWords, true, false>("R1_128x3_occ6_words", 6),
      make_variant<128, 3, 1, 2, kBytesPlain, true, false>("R1_128x3_occ6_bytes_plain", 6),
      make_variant<128, 3, 1, 2, kBytesEvictLast, true, false>("R1_128x3_occ6_bytes_evict_last", 6),
      make_variant<128, 3, 1, 2, kLinearBytes, true, false>("R1_128x3_occ6_linear(not layout)", 6),
      make_variant<128, 3, 1, 0, kBytes, true, false>("R1_128x3_occ6_nobarrier", 6),
      make_variant<128, 3, 1, 2, kBytes, true, false>("R1_128x3_occ8", 8),
      make_variant<128, 3, 2, 2, kBytes, true, false>("R2_128x3_occ3", 3),
      make_variant<128, 3, 3, 2, kBytes, true, false>("R3_128x3_occ2", 2),
      make_variant<128, 3, 4, 2, kBytes, true, false>("R4_128x3_occ2", 2),
      make_variant<128, 3, 4, 2, kNoScales, true, false>("R4_128x3_occ2_noscales", 2),
      // every store write-back (no evict-first hint): what a call leaves dirty in L2 is written back after it
      make_variant<128, 3, 1, 2, kBytesPlain, false, false>("R1_128x3_occ6_plain_stores", 6),
      make_variant<128, 3, 4, 2, kBytesPlain, false, false>("R4_128x3_occ2_plain_stores", 2),
      make_variant<128, 3, 4, 2, kChunks4Rows, true, false>("R4_128x3_occ2_chunks", 2),
      make_variant<128, 3, 8, 2, kSectors8Rows, true, false>("R8_128x3_occ1_sectors", 1),
      make_variant<192, 2, 1, 2, kBytes, true, false>("R1_192x2_occ5", 5),
      make_variant<192, 2, 1, 2, kNoScales, true, false>("R1_192x2_occ5_noscales", 5),
      make_variant<128, 3, 1, 2, kBytes, true, true>("persistent_128x3_occ6", 6),
      make_variant<128, 3, 2, 2, kBytes, true, false>("R2_128x3_occ4", 4),
      make_variant<128, 3, 2, 2, kBytes, true, true>("persistent_R2_128x3_occ4", 4),
      make_variant<128, 3, 4, 2, kBytes, true, true>("persistent_R4_128x3_occ2", 2),
      make_variant<128, 3, 1, 2, kBytes, true, false>("R1_128x3_occ6_cluster2", 6, 2),
      make_variant<128, 3, 1, 2, kBytes, true, false>("R1_128x3_occ6_cluster4", 6, 4),
      make_variant<128, 3, 1, 2, kBytes, true, false>("R1_128x3_occ6_cluster8", 6, 8),
      make_variant<128, 3, 1, 2, kNoScales, true, false>("R1_128x3_occ6_noscales_cluster4", 6, 4),
  };

  if (const char* only = std::getenv("ONLY")) {  // keep the variants named, in the table's order
    const std::string list = std::string(",") + only + ",";
    for (size_t start = 1, comma; (comma = list.find(',', start)) != std::string::npos; start = comma + 1) {
      const std::string name = list.substr(start, comma - start);
      if (name.empty()) continue;
      if (std::none_of(variants.begin(), variants.end(), [&](const Variant& v) { return v.name == name; })) {
        std::fprintf(stderr, "ONLY: no variant named %s\n", name.c_str());
        return 2;
      }
    }
    variants.erase(std::remove_if(variants.begin(), variants.end(),
                                  [&](const Variant& v) { return list.find("," + v.name + ",") == std::string::npos; }),
                   variants.end());
  }
  const int reps = std::getenv("REPS") ? std::max(1, std::atoi(std::getenv("REPS"))) : 100;
  const int batch = std::min(reps, 25);

  std::printf("%-36s %6s %5s %10s %9s %8s %10s\n", "pattern", "rows", "occ", "us", "GB/s", "%copy", "%same-copy");
  for (const int64_t rows : row_counts) {
    const int64_t sf_rows = (rows + 127) / 128 * 128;
    const size_t in_bytes = size_t(rows) * kCols * 2, packed_bytes = size_t(rows) * kCols / 2,
                 sf_bytes = size_t(sf_rows) * kCols / 16;
    const size_t moved = 3 * in_bytes + packed_bytes + sf_bytes;  // bench.bytes_moved
    const size_t set_bytes = 3 * in_bytes + packed_bytes + sf_bytes;
    const int n_sets = std::max<int>(2, int((2.5 * l2) / set_bytes) + 1);
    std::vector<Buffers> sets(n_sets);
    std::vector<void*> allocs;
    for (auto& s : sets) {
      void *x, *r, *ro, *p, *sf;
      CHECK(cudaMalloc(&x, in_bytes));
      CHECK(cudaMalloc(&r, in_bytes));
      CHECK(cudaMalloc(&ro, in_bytes));
      CHECK(cudaMalloc(&p, packed_bytes));
      CHECK(cudaMalloc(&sf, sf_bytes));
      fill_kernel<<<sms * 4, 256>>>(static_cast<uint32_t*>(x), in_bytes / 4, 0x12345u);
      fill_kernel<<<sms * 4, 256>>>(static_cast<uint32_t*>(r), in_bytes / 4, 0x6789u);
      CHECK(cudaGetLastError());
      allocs.insert(allocs.end(), {x, r, ro, p, sf});
      s = Buffers{static_cast<const uint4*>(x), static_cast<const uint4*>(r), static_cast<uint4*>(ro),
                  static_cast<uint32_t*>(p), static_cast<uint8_t*>(sf), rows};
    }
    auto report = [&](const std::string& name, int occ, double us, double same_copy_us) {
      const double gbs = moved / (us * 1e-6) / 1e9;
      std::printf("%-36s %6lld %5d %10.2f %9.0f %7.1f%% %9.1f%%\n", name.c_str(), (long long)rows, occ, us, gbs,
                  100.0 * gbs / ceiling, same_copy_us > 0 ? 100.0 * same_copy_us / us : 100.0);
      std::fflush(stdout);
    };
    // Copies of the same bytes (half read, half written), over their own rotating buffers.
    const size_t half = moved / 2;
    std::vector<void*> src(n_sets), dst(n_sets);
    for (int i = 0; i < n_sets; ++i) {
      CHECK(cudaMalloc(&src[i], half));
      CHECK(cudaMalloc(&dst[i], half));
      CHECK(cudaMemset(src[i], 1, half));
    }
    const int rounds = std::getenv("ROUNDS") ? std::atoi(std::getenv("ROUNDS")) : 2;
    std::vector<uint8_t> reference;
    for (int round = 1; round <= rounds; ++round) {
      std::printf("-- round %d of %d\n", round, rounds);
      const double memcpy_us = timer.per_call_us(
          [&](int i) { CHECK(cudaMemcpyAsync(dst[i], src[i], half, cudaMemcpyDeviceToDevice)); }, n_sets, reps, batch);
      report("memcpy_same_bytes", 0, memcpy_us, memcpy_us);
      const double own_copy_us = timer.per_call_us(
          [&](int i) {
            copy_kernel<<<sms * 8, 256>>>(static_cast<const uint4*>(src[i]), static_cast<uint4*>(dst[i]), half / 16);
          },
          n_sets, reps, batch);
      report("copy_kernel_same_bytes", 8, own_copy_us, memcpy_us);
      for (const auto& v : variants) {
        // The largest dynamic shared memory at which exactly ctas_per_sm CTAs fit (0: as many as fit).
        size_t smem = 0;
        int occ = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, v.kernel, v.threads, 0));
        if (v.ctas_per_sm > 0 && v.ctas_per_sm < occ) {
          for (smem = std::min<size_t>(size_t(smem_per_sm) / v.ctas_per_sm, 150 * 1024); smem > 0; smem -= 256) {
            CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, v.kernel, v.threads, smem));
            if (occ >= v.ctas_per_sm) break;
          }
        }
        const int64_t row_ctas = (rows + v.rows_per_cta - 1) / v.rows_per_cta;
        const int64_t grid = v.persistent ? std::min<int64_t>(row_ctas, int64_t(sms) * occ) : row_ctas;
        // The scale bytes must land where the kernels' byte stores put them (first variant: kBytes).
        std::string check = "-";
        // (Without the exchanges the bytes differ by design: they XOR in the exchanged word.)
        if (round == 1 && v.barriers == 2 && v.scale_mode != kNoScales && v.scale_mode != kLinearBytes) {
          CHECK(cudaMemset(sets[0].scales, 0xEE, sf_bytes));
          v.launch(dim3(unsigned(grid)), v.threads, smem, sets[0]);
          CHECK(cudaDeviceSynchronize());
          std::vector<uint8_t> got(sf_bytes);
          CHECK(cudaMemcpy(got.data(), sets[0].scales, sf_bytes, cudaMemcpyDeviceToHost));
          if (reference.empty()) reference = got;
          check = got == reference ? "same" : "DIFFERENT";
        }
        const double us = timer.per_call_us([&](int i) { v.launch(dim3(unsigned(grid)), v.threads, smem, sets[i]); }, n_sets, reps, batch);
        report(v.name + " [" + check + "]", occ, us, memcpy_us);
      }
    }  // rounds
    for (int i = 0; i < n_sets; ++i) {
      CHECK(cudaFree(src[i]));
      CHECK(cudaFree(dst[i]));
    }
    for (void* p : allocs) CHECK(cudaFree(p));
  }
  return 0;
}
