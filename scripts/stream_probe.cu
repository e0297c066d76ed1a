// stream_probe.cu — the DRAM read rate of a weight stream read the way the
// MoE decode tiles read it (kernels/moe.cu, config 0: a CTA owns 64 weight
// rows and walks their k columns through a cp.async ring, BK = 64 columns,
// 128 bytes of each row, a stage), against the same stream in wider k
// blocks (BK = 128 and 256: 256 and 512 contiguous bytes a row a stage,
// as Triton's fused_moe configs take 128–256). A measurement aid: at 16–256
// tokens our decode tiles read the touched experts at 4.16–4.38 TB/s
// where vLLM's kernel reads 4.25–4.58 (docs/PERF.md, "GPU, fifty-sixth
// pass"); if the 128-byte row segments bound the rate, wider stages read
// faster here.
//
//   nvcc -O3 -arch=sm_90a -o .dev/stream_probe scripts/stream_probe.cu && .dev/stream_probe
//
// W is [N, K] bf16 (K = 7168 and 2048, 1 GiB), 64-row blocks handed to
// the CTAs in order (block b to CTA b mod grid), every CTA co-resident
// (occupancy × SMs). 128 threads issue 16-byte cp.async copies of a stage
// (64 rows × BK columns) into a ring of ST stages; one commit group a
// stage, waiting for the oldest before reusing its slot; one value a
// stage is read from shared memory into a sum so the copies are used.
// Prints one line a setting: the median of 7 runs, in TB/s.
// scripts/tile_stream_probe.cu compares copy instructions (cp.async, TMA,
// plain loads) at the kernel's 128-byte stages; this one, stage widths.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_check.h"

constexpr int kRows = 64, kThreads = 128;

__device__ __forceinline__ void cp16(void* smem, const void* g) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wait_n() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// stream reads rows [64 b, 64 b + 64) of W [n, k] for the blocks b of this
// CTA, BK columns a stage, ST stages in flight.
template <int BK, int ST>
__global__ void __launch_bounds__(kThreads) stream(const uint16_t* __restrict__ w, int64_t n, int64_t k,
                                                   float* sink) {
  extern __shared__ __align__(128) uint16_t sm[];  // [ST][64][BK]
  constexpr int kChunks = kRows * BK / 8;          // 16-byte chunks a stage
  const int64_t blocks = n / kRows, kt = k / BK;
  float acc = 0;
  int slot = 0, issued = 0;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const uint16_t* base = w + b * kRows * k;
    for (int64_t t = 0; t < kt; ++t) {
      uint16_t* s = sm + slot * kRows * BK;
      for (int c = threadIdx.x; c < kChunks; c += kThreads) {
        const int r = c / (BK / 8), ch = c % (BK / 8);
        cp16(s + r * BK + ch * 8, base + r * k + t * BK + ch * 8);
      }
      commit();
      ++issued;
      slot = (slot + 1) % ST;
      if (issued >= ST) {
        wait_n<ST - 1>();
        __syncthreads();
        acc += __half2float(*reinterpret_cast<const __half*>(sm + slot * kRows * BK + threadIdx.x));
        __syncthreads();  // the oldest slot is refilled next
      }
    }
  }
  wait_n<0>();
  if (acc == 12345.0f) sink[threadIdx.x] = acc;  // never true on random bits in practice; keeps acc live
}

template <int BK, int ST>
int run(const uint16_t* w, int64_t n, int64_t k, float* sink, int sms) {
  auto fn = stream<BK, ST>;
  const int smem = ST * kRows * BK * 2;
  CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int occ = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, kThreads, smem));
  const int grid = occ * sms;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  fn<<<grid, kThreads, smem>>>(w, n, k, sink);  // warm
  CK(cudaGetLastError());
  std::vector<float> ms;
  for (int i = 0; i < 7; ++i) {
    CK(cudaEventRecord(a));
    fn<<<grid, kThreads, smem>>>(w, n, k, sink);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double bytes = (double)(n / kRows) * kRows * (k / BK) * BK * 2;
  printf("stream K=%-5lld BK=%-3d ST=%d  %2d KB a stage, %d CTAs an SM: %.2f TB/s (%.3f ms)\n", (long long)k, BK, ST,
         kRows * BK * 2 / 1024, occ, bytes / (ms[3] * 1e-3) / 1e12, ms[3]);
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return 0;
}

// plain reads the same bytes with 16-byte vector loads (the ceiling of a
// read stream without shared memory).
__global__ void plain(const uint4* __restrict__ w, int64_t n16, float* sink) {
  uint32_t x = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16; i += (int64_t)gridDim.x * blockDim.x) {
    const uint4 v = __ldg(w + i);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9e3779b9u) sink[0] = (float)x;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t bytes = 1LL << 30;
  uint16_t* w = nullptr;
  float* sink = nullptr;
  CK(cudaMalloc(&w, bytes));
  CK(cudaMalloc(&sink, 4096));
  // Random bits (not zeros): a simple LCG per 32-bit word on the device.
  {
    std::vector<uint32_t> h(1 << 20);
    uint32_t s = 12345;
    for (auto& v : h) v = (s = s * 1664525u + 1013904223u) & 0x3bff3bffu;  // finite bf16 pairs
    for (int64_t off = 0; off < bytes; off += (int64_t)h.size() * 4)
      CK(cudaMemcpy(reinterpret_cast<char*>(w) + off, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  }
  {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int i = 0; i < 8; ++i) {
      CK(cudaEventRecord(a));
      plain<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(w), bytes / 16, sink);
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float t = 0;
      CK(cudaEventElapsedTime(&t, a, b));
      if (i) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    printf("plain ld.global.nc.v4: %.2f TB/s\n", bytes / (ms[3] * 1e-3) / 1e12);
  }
  for (const int64_t k : {7168LL, 2048LL}) {
    const int64_t n = bytes / 2 / k / kRows * kRows;
    if (run<64, 4>(w, n, k, sink, sms) || run<64, 6>(w, n, k, sink, sms) || run<64, 8>(w, n, k, sink, sms) ||
        run<128, 3>(w, n, k, sink, sms) || run<128, 4>(w, n, k, sink, sms) || run<128, 6>(w, n, k, sink, sms) ||
        run<256, 2>(w, n, k, sink, sms) || run<256, 3>(w, n, k, sink, sms))
      return 1;
  }
  return 0;
}
