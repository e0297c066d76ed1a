// tile_stream_probe.cu — how fast the fused MoE layer's one-token GEMM1
// could read its weights, by the copy form of its 16-row decode tiles
// (kernels/moe_fused.cu: 396 CTAs of 128 threads, three an SM, each task a
// 64-row block of one expert's gate/up matrix over half its k, a ring of
// stages of 64 rows × 128 bytes). A measurement aid: nothing is computed,
// every form reads the same bytes in the same task order, and only the
// copy instruction differs:
//   cpasync  cp.async.cg 16 bytes a thread (the kernel's form), waits by
//            cp.async.wait_group, a barrier a stage;
//   tma      one 2-D TMA box (64 columns × 64 rows, 128-byte swizzle) a
//            stage from one thread, completion on a stage mbarrier;
//   plain    ld.global.nc 16 bytes a thread, a stage's loads in flight
//            together, no shared memory at all;
//   tma2x32  two boxes of 32 rows a stage: the gate rows and their up rows
//            half the expert further (GEMM1's 16-row tile as it is laid out).
// Each "layer" (one launch) reads `experts` experts' matrices (rows × cols
// bf16) chosen so that consecutive launches read other experts (none from
// L2); 16 launches between two events after an L2 flush, the mean per
// launch, median of 5 repetitions. Shapes: Qwen3-30B-A3B at one token (8
// experts, 1536 × 2048), DeepSeek-V3 (8, 4096 × 7168), Mixtral (2, 28672 ×
// 4096).
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o .dev/tile_stream_probe scripts/tile_stream_probe.cu -lcuda && .dev/tile_stream_probe
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_check.h"

constexpr int kRows = 64, kBK = 64, kStage = kRows * kBK * 2;  // a stage: 64 rows × 128 bytes

__device__ __forceinline__ uint32_t saddr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// Task t of a launch: expert e (of the launch's), row block b, k half h.
struct Shape {
  long rows, cols;  // one expert's matrix, bf16
  int experts, E;   // experts a launch, experts in the buffer
  int splits;       // k parts a row block (the kernel's ksplit)
};

__device__ __forceinline__ void task_of(const Shape& s, int layer, int t, long& row0, long& col0, int& kt) {
  const int nb = (int)(s.rows / kRows), ke = s.splits;
  const int e = t / (nb * ke), b = (t / ke) % nb, h = t % ke;
  const int expert = (layer * s.experts + e) % s.E;
  row0 = (long)expert * s.rows + (long)b * kRows;
  kt = (int)(s.cols / kBK / ke);
  col0 = (long)h * kt * kBK;
}

// for_tasks calls f(row0, col0, kt) for each task of the launch this CTA
// takes (task_of; CTAs stride the tasks by the grid).
template <class F>
__device__ __forceinline__ void for_tasks(const Shape& s, int layer, F&& f) {
  const int ntask = s.experts * (int)(s.rows / kRows) * s.splits;
  for (int t = blockIdx.x; t < ntask; t += gridDim.x) {
    long row0, col0;
    int kt;
    task_of(s, layer, t, row0, col0, kt);
    f(row0, col0, kt);
  }
}

template <int ST>
__global__ void __launch_bounds__(128) k_cpasync(const char* w, Shape s, int layer, unsigned* sink) {
  extern __shared__ __align__(1024) unsigned char sm[];
  unsigned acc = 0;
  for_tasks(s, layer, [&](long row0, long col0, int kt) {
    auto load = [&](int st, int k) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int c = threadIdx.x + 128 * i, r = c / 8, ch = c % 8;
        const char* g = w + ((row0 + r) * s.cols + col0 + (long)k * kBK + ch * 8) * 2;
        const uint32_t d = saddr(sm + st * kStage + r * 128 + ((ch ^ (r & 7)) * 16));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(g) : "memory");
      }
    };
    for (int k = 0; k < ST - 1; k++) {
      if (k < kt) load(k, k);
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    for (int k = 0; k < kt; k++) {
      asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 2) : "memory");
      __syncthreads();
      acc ^= *reinterpret_cast<const unsigned*>(sm + (k % ST) * kStage + threadIdx.x * 4);
      if (k + ST - 1 < kt) load((k + ST - 1) % ST, k + ST - 1);
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
  });
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

template <int ST, bool PAIR>
__global__ void __launch_bounds__(128) k_tma(const __grid_constant__ CUtensorMap m, Shape s, int layer, unsigned* sink) {
  extern __shared__ __align__(1024) unsigned char sm[];
  unsigned char* ring = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(sm) + 1023) & ~uintptr_t(1023));
  __shared__ __align__(8) uint64_t full[ST];
  if (threadIdx.x == 0) {
    for (int i = 0; i < ST; i++) asm volatile("mbarrier.init.shared.b64 [%0], 1;\n" ::"r"(saddr(&full[i])));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  unsigned acc = 0;
  int g = 0;  // stages used so far by this CTA (the barriers' phases)
  for_tasks(s, layer, [&](long row0, long col0, int kt) {
    auto load = [&](int k) {  // thread 0: stage (g0 + k) % ST
      const int st = (g + k) % ST;
      asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;\n" ::"r"(saddr(&full[st])), "r"(kStage) : "memory");
      // PAIR: the 16-row tiles' GEMM1 form, 32 gate rows and the 32 matching
      // up rows (half the expert further) in two boxes of 32 rows.
      for (int q = 0; q < (PAIR ? 2 : 1); q++) {
        const long r0 = PAIR ? (row0 - (row0 % s.rows)) + (row0 % s.rows) / 2 + q * (s.rows / 2) : row0;
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                saddr(ring + st * kStage + q * (kStage / 2))),
            "l"(reinterpret_cast<uint64_t>(&m)), "r"((int)(col0 + (long)k * kBK)), "r"((int)r0), "r"(saddr(&full[st]))
            : "memory");
      }
    };
    if (threadIdx.x == 0)
      for (int k = 0; k < ST && k < kt; k++) load(k);
    for (int k = 0; k < kt; k++) {
      const int st = (g + k) % ST;
      const uint32_t ph = (uint32_t)(((g + k) / ST) & 1);
      asm volatile(
          "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(saddr(&full[st])),
          "r"(ph)
          : "memory");
      acc ^= *reinterpret_cast<const unsigned*>(ring + st * kStage + threadIdx.x * 4);
      __syncthreads();  // every thread read stage st: it may be refilled
      if (threadIdx.x == 0 && k + ST < kt) load(k + ST);
    }
    g += kt;
  });
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

template <int ST>
__global__ void __launch_bounds__(128) k_plain(const char* w, Shape s, int layer, unsigned* sink) {
  unsigned acc = 0;
  for_tasks(s, layer, [&](long row0, long col0, int kt) {
    for (int k0 = 0; k0 < kt; k0 += ST) {  // ST stages' loads in flight together
      uint4 v[ST][4];
#pragma unroll
      for (int j = 0; j < ST; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int c = threadIdx.x + 128 * i, r = c / 8, ch = c % 8;
          const long k = k0 + j < kt ? k0 + j : k0;
          const char* gp = w + ((row0 + r) * s.cols + col0 + k * kBK + ch * 8) * 2;
          asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                       : "=r"(v[j][i].x), "=r"(v[j][i].y), "=r"(v[j][i].z), "=r"(v[j][i].w)
                       : "l"(gp));
        }
#pragma unroll
      for (int j = 0; j < ST; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc ^= v[j][i].x ^ v[j][i].w;
    }
  });
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

__global__ void flush_l2(const uint4* p, long n, unsigned* sink) {
  unsigned acc = 0;
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) acc ^= __ldcs(p + i).x;
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

int main() {
  int sms = 0;
  CK(cudaSetDevice(0));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const Shape shapes[] = {{1536, 2048, 8, 128, 2}, {4096, 7168, 8, 32, 1}, {28672, 4096, 2, 8, 1}};
  const char* names[] = {"qwen3 gate/up, 1 token", "deepseek-v3 gate/up, 1 token", "mixtral gate/up, 1 token"};
  long maxb = 0;
  for (const Shape& s : shapes) maxb = std::max(maxb, s.rows * s.cols * 2 * (long)s.E);
  char *w, *fl;
  unsigned* sink;
  const long flN = 256l << 20;
  CK(cudaMalloc(&w, maxb));
  CK(cudaMalloc(&fl, flN));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(w, 1, maxb));
  CK(cudaMemset(fl, 2, flN));
  constexpr int kSm3 = 60 * 1024;  // the 6-stage kernel's ring: three CTAs an SM, as moe_fused's 16-row tiles
  CK(cudaFuncSetAttribute(k_cpasync<6>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSm3));
  CK(cudaFuncSetAttribute(k_tma<6, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSm3));
  CK(cudaFuncSetAttribute(k_tma<6, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSm3));
  CK(cudaFuncSetAttribute(k_plain<6>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSm3));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int grid = 3 * sms, L = 16;
  printf("%-30s %-8s %10s %10s %8s\n", "shape", "form", "MB/launch", "us/launch", "TB/s");
  for (int si = 0; si < 3; si++) {
    const Shape s = shapes[si];
    CUtensorMap m, m2;  // boxes of 64 and of 32 rows
    const cuuint64_t dims[2] = {(cuuint64_t)s.cols, (cuuint64_t)(s.rows * s.E)}, strides[1] = {(cuuint64_t)s.cols * 2};
    const cuuint32_t bx[2] = {kBK, kRows}, bx2[2] = {kBK, kRows / 2}, el[2] = {1, 1};
    if (cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, w, dims, strides, bx, el,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS ||
        cuTensorMapEncodeTiled(&m2, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, w, dims, strides, bx2, el,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
      fprintf(stderr, "tensor map failed\n");
      return 1;
    }
    const double mb = (double)s.rows * s.cols * 2 * s.experts / 1e6;
    for (int form = 0; form < 4; form++) {
      std::vector<float> us;
      for (int rep = 0; rep < 5; rep++) {
        flush_l2<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(fl), flN / 16, sink);
        CK(cudaEventRecord(e0));
        for (int l = 0; l < L; l++) {
          const int layer = rep * L + l;
          if (form == 0) k_cpasync<6><<<grid, 128, kSm3>>>(w, s, layer, sink);
          if (form == 1) k_tma<6, false><<<grid, 128, kSm3>>>(m, s, layer, sink);
          if (form == 2) k_plain<6><<<grid, 128, kSm3>>>(w, s, layer, sink);
          if (form == 3) k_tma<6, true><<<grid, 128, kSm3>>>(m2, s, layer, sink);
        }
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t = 0;
        CK(cudaEventElapsedTime(&t, e0, e1));
        us.push_back(t * 1000.f / L);
      }
      CK(cudaGetLastError());
      std::sort(us.begin(), us.end());
      const char* fn[] = {"cpasync", "tma", "plain", "tma2x32"};
      printf("%-30s %-8s %10.1f %10.2f %8.2f\n", names[si], fn[form], mb, us[2], mb / us[2]);
    }
  }
  return 0;
}
