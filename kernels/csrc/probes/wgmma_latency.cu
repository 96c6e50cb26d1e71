// Probe (issue 29): what one small wgmma costs on an H200. Chains of 36 m64n16k16 (the few-heads
// kernel's S^T step count) with A from shared memory (SS) or registers (RS), into one accumulator
// (each depends on the last) or four (independent), by one or two warp groups per SM; prints
// cycles per instruction. Build and run on the device:
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o /tmp/wgmma_latency kernels/csrc/probes/wgmma_latency.cu && /tmp/wgmma_latency
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (1ull << 62);
}
#define D8(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3]), "+f"(d[i][4]), \
              "+f"(d[i][5]), "+f"(d[i][6]), "+f"(d[i][7])
template <int kAcc>
__device__ __forceinline__ void ss(float (&d)[4][8], uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1, 1, 1, 0, 0;\n"
               : D8(kAcc) : "l"(da), "l"(db));
}
template <int kAcc>
__device__ __forceinline__ void rs(float (&d)[4][8], const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
               "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, 1, 1, 1, 0;\n"
               : D8(kAcc) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
template <int kMode, int kAccs>
__device__ __forceinline__ void step(float (&d)[4][8], const uint32_t (&a)[4], uint64_t da,
                                     uint64_t db, int kk) {
  // kk is a compile-time constant after unrolling
  switch (kk % kAccs) {
    case 0: if (kMode) rs<0>(d, a, db); else ss<0>(d, da, db); break;
    case 1: if (kMode) rs<1>(d, a, db); else ss<1>(d, da, db); break;
    case 2: if (kMode) rs<2>(d, a, db); else ss<2>(d, da, db); break;
    default: if (kMode) rs<3>(d, a, db); else ss<3>(d, da, db); break;
  }
}
template <int kMode, int kAccs>
__global__ void probe(long long* out, float* sink, int reps) {
  __shared__ __align__(1024) uint8_t sm[8192 + 2048];
  for (int i = threadIdx.x; i < (8192 + 2048) / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(sm)[i] = 0x3C003C00u * ((i & 7) == 0);
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(sm));
  const uint64_t da = desc(base, 16, 1024), db = desc(base + 8192, 16, 1024);
  float d[4][8] = {};
  uint32_t a[4] = {0x3C003C00u, 0, 0, 0x3C003C00u};
  const long long t0 = clock64();
  for (int r = 0; r < reps; ++r) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < 36; ++kk) step<kMode, kAccs>(d, a, da + 2 * (kk & 3), db + 2 * (kk & 3), kk);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  }
  const long long t1 = clock64();
  float s = 0.f;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 8; ++j) s += d[i][j];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) out[blockIdx.x] = t1 - t0;
}

template <int kMode, int kAccs>
void run(const char* name, int groups) {
  const int blocks = 132, reps = 200;
  long long* out;
  float* sink;
  cudaMalloc(&out, blocks * sizeof(long long));
  cudaMalloc(&sink, blocks * 256 * sizeof(float));
  probe<kMode, kAccs><<<blocks, 128 * groups>>>(out, sink, reps);  // warm
  probe<kMode, kAccs><<<blocks, 128 * groups>>>(out, sink, reps);
  long long host[132];
  cudaMemcpy(host, out, sizeof(host), cudaMemcpyDeviceToHost);
  double avg = 0;
  for (int i = 0; i < blocks; ++i) avg += host[i];
  avg /= blocks;
  printf("%-4s accumulators=%d groups/SM=%d: %6.1f cycles per wgmma m64n16k16 (%s)\n", name,
         kAccs, groups, avg / (reps * 36.0), cudaGetErrorString(cudaGetLastError()));
  cudaFree(out);
  cudaFree(sink);
}

int main() {
  for (int g = 1; g <= 2; ++g) {
    run<0, 1>("SS", g);
    run<0, 4>("SS", g);
    run<1, 1>("RS", g);
    run<1, 4>("RS", g);
  }
  return 0;
}
