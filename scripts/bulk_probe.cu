// bulk_probe.cu — the DRAM read rate of cp.async.bulk streams on this GPU
// by chunk size, bytes in flight per SM and layout, against plain vector
// loads. A measurement aid for the persistent decode layer (kernels/
// layer.cu), whose weight streams run at ~2.4–2.6 TB/s against 4.24 TB/s
// of a plain read (docs/PERF.md, "GPU, thirty-ninth pass").
//
//   nvcc -O3 -arch=sm_90a -o .dev/bulk_probe scripts/bulk_probe.cu -lcuda && .dev/bulk_probe
//
// One CTA an SM, one thread issuing bulk copies into a ring of `depth`
// slots of `chunk` bytes (each slot an mbarrier; a slot is reissued once
// its copy has landed; nothing reads the data). Layouts: contiguous (CTA c
// streams its own 1/G of the bytes, as the layer kernel does), interleaved
// (chunk j by CTA j mod G: all SMs in one moving window) and pairs (each
// slot two half-chunks from two regions half the buffer apart, as the
// layer's gate/up rows). Sizes: 1 GiB (steady state) and 48 MiB (one
// layer phase, L2 flushed before each run). Prints one line per setting:
// the median of 7 runs in TB/s. Then the 2-D form (cp.async.bulk.tensor,
// boxes of 64 columns × R rows with the 128-byte swizzle, as the expert
// GEMMs read their weights): each CTA walks its share of the row tiles,
// every box of a tile's columns in turn.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_check.h"

__device__ __forceinline__ uint32_t saddr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void bar_init(uint64_t* b) {
  asm volatile("mbarrier.init.shared.b64 [%0], 1;\n" ::"r"(saddr(b)));
}
__device__ __forceinline__ void bar_expect(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;\n" ::"r"(saddr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_wait(uint64_t* b, uint32_t phase) {
  asm volatile(
      "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(saddr(b)),
      "r"(phase)
      : "memory");
}
__device__ __forceinline__ void bulk(void* dst, const void* src, uint32_t bytes, uint64_t* b, uint64_t pol, bool ef) {
  if (ef)
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
        "%4;\n" ::"r"(saddr(dst)),
        "l"(src), "r"(bytes), "r"(saddr(b)), "l"(pol)
        : "memory");
  else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     saddr(dst)),
                 "l"(src), "r"(bytes), "r"(saddr(b))
                 : "memory");
}

enum { kContig = 0, kInter = 1, kPairs = 2 };

__global__ void probe(const char* src, long total, int chunk, int depth, int layout, int ef) {
  extern __shared__ __align__(128) unsigned char sm[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm);
  unsigned char* ring = sm + 1024;
  if (threadIdx.x != 0) return;
  for (int s = 0; s < depth; s++) bar_init(bars + s);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  const long T = total / chunk;
  const int G = gridDim.x, c = blockIdx.x;
  long j0 = (long)c * T / G, j1 = (long)(c + 1) * T / G, step = 1;
  if (layout == kInter) j0 = c, j1 = T, step = G;
  int i = 0;
  for (long j = j0; j < j1; j += step, i++) {
    const int s = i % depth;
    if (i >= depth) bar_wait(bars + s, (uint32_t)((i / depth - 1) & 1));
    unsigned char* dst = ring + (size_t)s * chunk;
    bar_expect(bars + s, (uint32_t)chunk);
    if (layout == kPairs) {  // half from the first half of the buffer, half from the second
      const long h = total / 2, o = j * (chunk / 2);
      bulk(dst, src + o, chunk / 2, bars + s, pol, ef);
      bulk(dst + chunk / 2, src + h + o, chunk / 2, bars + s, pol, ef);
    } else {
      bulk(dst, src + j * chunk, chunk, bars + s, pol, ef);
    }
  }
  for (int k = i > depth ? i - depth : 0; k < i; k++) bar_wait(bars + k % depth, (uint32_t)((k / depth) & 1));
}

__global__ void probe2d(const __grid_constant__ CUtensorMap m, int rows, int cols, int box_rows, int depth) {
  extern __shared__ __align__(1024) unsigned char sm2[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm2);
  unsigned char* ring = sm2 + 1024;
  if (threadIdx.x != 0) return;
  for (int s = 0; s < depth; s++) bar_init(bars + s);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  const int kt = cols / 64, box = 64 * 2 * box_rows;
  const long T = (long)(rows / box_rows) * kt;
  const int G = gridDim.x, c = blockIdx.x;
  const long j0 = (long)c * T / G, j1 = (long)(c + 1) * T / G;
  int i = 0;
  for (long j = j0; j < j1; j++, i++) {
    const int s = i % depth;
    if (i >= depth) bar_wait(bars + s, (uint32_t)((i / depth - 1) & 1));
    bar_expect(bars + s, (uint32_t)box);
    const int x = (int)(j % kt) * 64, y = (int)(j / kt) * box_rows;
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            saddr(ring + (size_t)s * box)),
        "l"(reinterpret_cast<uint64_t>(&m)), "r"(x), "r"(y), "r"(saddr(bars + s))
        : "memory");
  }
  for (int k = i > depth ? i - depth : 0; k < i; k++) bar_wait(bars + k % depth, (uint32_t)((k / depth) & 1));
}

// plain: every thread reads 16-byte vectors, grid-stride, 4 in flight.
__global__ void plain(const uint4* src, long n, unsigned* sink) {
  uint32_t acc = 0;
  const long stride = (long)gridDim.x * blockDim.x;
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride), c = __ldcs(src + i + 2 * stride),
          d = __ldcs(src + i + 3 * stride);
    acc ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n; i += stride) acc ^= __ldcs(src + i).x;
  if (acc == 0x12345678u) sink[0] = acc;
}

int main() {
  int dev = 0, sms = 0, optin = 0;
  CK(cudaSetDevice(dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  CK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  const long big = 1l << 30, flushN = 256l << 20;
  char *buf, *flush;
  unsigned* sink;
  CK(cudaMalloc(&buf, big));
  CK(cudaMalloc(&flush, flushN));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(buf, 1, big));
  CK(cudaMemset(flush, 2, flushN));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // run times one launch (after an L2 flush for the small size) 7 times: the median's TB/s.
  auto run = [&](long total, auto&& launch) -> double {
    std::vector<float> ms;
    for (int r = 0; r < 7; r++) {
      plain<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(flush), flushN / 16, sink);
      cudaEventRecord(e0);
      launch();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float t = 0;
      cudaEventElapsedTime(&t, e0, e1);
      ms.push_back(t);
    }
    if (cudaGetLastError() != cudaSuccess) return -1;
    std::sort(ms.begin(), ms.end());
    return (double)total / (ms[3] * 1e-3) / 1e12;
  };
  printf("device SMs %d, shared memory opt-in %d bytes\n", sms, optin);
  for (long total : {big, 48l << 20}) {
    printf("plain ld.global.v4 %4ld MiB: %.2f TB/s\n", total >> 20,
           run(total, [&] { plain<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(buf), total / 16, sink); }));
  }
  const char* names[] = {"contiguous", "interleaved", "pairs"};
  printf("%-11s %6s %6s %8s %3s %10s %10s\n", "layout", "chunk", "depth", "inflight", "ef", "1GiB TB/s", "48MiB TB/s");
  for (int layout : {kContig, kInter, kPairs})
    for (int chunk : {2048, 4096, 8192, 16384})
      for (int inflight : {32768, 65536, 131072, 196608}) {
        const int depth = inflight / chunk;
        if (1024 + (long)depth * chunk > optin || depth < 2) continue;
        for (int ef : {0, 1}) {
          if (ef && !(chunk == 8192 || layout == kContig)) continue;
          double r[2];
          int n = 0;
          for (long total : {big, 48l << 20})
            r[n++] = run(total, [&] {
              probe<<<sms, 32, 1024 + depth * chunk>>>(buf, total, chunk, depth, layout, ef);
            });
          printf("%-11s %6d %6d %8d %3d %10.2f %10.2f\n", names[layout], chunk, depth, inflight, ef, r[0], r[1]);
        }
      }
  CK(cudaFuncSetAttribute(probe2d, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  printf("%-11s %6s %6s %8s %10s %10s\n", "2d cols", "rows", "box KB", "inflight", "1GiB TB/s", "48MiB TB/s");
  for (int cols : {2048, 7168})
    for (int box_rows : {32, 64, 128, 256})
      for (int inflight : {65536, 131072}) {
        const int box = 128 * box_rows, depth = inflight / box;
        if (depth < 2) continue;
        double r[2];
        int n = 0;
        for (long total : {big, 48l << 20}) {
          const long rows = total / (cols * 2) / box_rows * box_rows;
          CUtensorMap m;
          const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)cols * 2};
          const cuuint32_t bx[2] = {64, (cuuint32_t)box_rows}, el[2] = {1, 1};
          if (cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, buf, dims, strides, bx, el,
                                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
            r[n++] = -1;
            continue;
          }
          r[n++] = run(rows * cols * 2, [&] {
            probe2d<<<sms, 32, 1024 + depth * box>>>(m, (int)rows, cols, box_rows, depth);
          });
        }
        printf("2d %7d %6d %6d %8d %10.2f %10.2f\n", cols, box_rows, box / 1024, inflight, r[0], r[1]);
      }
  CK(cudaDeviceSynchronize());
  return 0;
}
