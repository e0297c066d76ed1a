// moe_wgmma.cu — the prefill-regime grouped expert GEMM on sm_90a: wgmma
// (warpgroup MMA, bf16 → f32) reading both operands from shared memory
// through 128-byte-swizzle descriptors. Same contract as moe.cu's mma.sync
// kernel (GemmArgs, 128-row tiles of one expert, grouped rasterisation, the
// activation fused into GEMM1's epilogue); CTA tile 128×256, BK 64, 4 cp.async
// stages; 2 warpgroups, each 64 rows × 256 columns as two m64n128k16 wgmmas
// per 16-wide k step (GEMM1: the gate half and the up half).
//
// The cp.async layout of moe.cu (128-byte rows, 16-byte chunk c of row r at
// c ^ (r & 7)) is exactly the hardware's 128B swizzle within 1024-byte-aligned
// 8-row atoms, so the descriptors use swizzle mode 1, SBO 1024 bytes, and a
// k step of 16 advances the start address by 32 bytes.
#include <cstdint>

#include "common.cuh"
#include "moe_gemm.cuh"

namespace {

using mkmoe::bf16;
using mkmoe::GemmArgs;

constexpr int BM = 128, BN = 256, BK = 64, ST = 4, THREADS = 256;
constexpr size_t kStageA = BM * BK * 2, kStageB = BN * BK * 2;
constexpr size_t kSmem = ST * (kStageA + kStageB) + 1024;  // + alignment slack

__device__ __forceinline__ int swz(int row, int ch) { return row * BK + ((ch ^ (row & 7)) << 3); }

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MK_WGMMA 1
#endif

// desc is the wgmma shared-memory descriptor of a K-major tile at smem
// address addr (1024-aligned atom base + k offset): 128B swizzle, SBO 1024.
__device__ __forceinline__ uint64_t desc(uint32_t addr) {
  uint64_t d = 0;
  d |= (uint64_t)((addr & 0x3FFFF) >> 4);
  d |= (uint64_t)1 << 16;                 // LBO (unused for swizzled K-major)
  d |= (uint64_t)(1024 >> 4) << 32;       // SBO: 8 rows × 128 bytes
  d |= (uint64_t)1 << 62;                 // 128-byte swizzle
  return d;
}

__device__ __forceinline__ void wgmma_n128(float (&d)[64], uint64_t a, uint64_t b) {
#ifdef MK_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(1));
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef MK_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef MK_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait0() {
#ifdef MK_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait1() {
#ifdef MK_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void fence_proxy_async() {
#ifdef MK_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

template <bool GATEUP>
__global__ void __launch_bounds__(THREADS) moe_wgmma_kernel(const GemmArgs p) {
  const int pid = blockIdx.x;
  const int span = p.group_m * p.nt;
  const int first_m = (pid / span) * p.group_m;
  const int gsize = min(p.mt - first_m, p.group_m);
  const int tile = first_m + (pid % span) % gsize;
  const int ntile = (pid % span) / gsize;
  if (tile >= *p.num_tiles) return;
  extern __shared__ unsigned char wg_sm_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(wg_sm_raw) + 1023) & ~uintptr_t(1023));
  bf16* sA = reinterpret_cast<bf16*>(base);
  bf16* sB = reinterpret_cast<bf16*>(base + ST * kStageA);

  const int tid = threadIdx.x, wg = tid / 128, wl = tid % 128, warp = wl / 32, lane = tid % 32;
  const int e = p.tile_expert[tile];
  const int64_t m0 = (int64_t)tile * BM;
  const int64_t Kd = p.Kd, N = p.N;

  constexpr int A_PER = BM * 8 / THREADS, B_PER = BN * 8 / THREADS;
  const bf16* a_src[A_PER];
  int a_dst[A_PER], a_ch[A_PER];
#pragma unroll
  for (int i = 0; i < A_PER; i++) {
    const int c = tid + i * THREADS, r = c / 8;
    a_ch[i] = c % 8;
    a_dst[i] = swz(r, a_ch[i]);
    const int32_t asg = p.sorted[m0 + r];
    a_src[i] = asg < 0 ? nullptr : (GATEUP ? p.A + (int64_t)(asg / p.topk) * Kd : p.A + (m0 + r) * Kd);
  }
  const bf16* b_src[B_PER];
  int b_dst[B_PER], b_ch[B_PER];
#pragma unroll
  for (int i = 0; i < B_PER; i++) {
    const int c = tid + i * THREADS, r = c / 8;
    b_ch[i] = c % 8;
    b_dst[i] = swz(r, b_ch[i]);
    int64_t wrow;
    bool ok;
    if (GATEUP) {
      const int64_t j = (int64_t)ntile * (BN / 2) + (r % (BN / 2));
      ok = j < N;
      wrow = (int64_t)e * 2 * N + (r < BN / 2 ? 0 : N) + j;
    } else {
      const int64_t n = (int64_t)ntile * BN + r;
      ok = n < N;
      wrow = (int64_t)e * N + n;
    }
    b_src[i] = ok ? p.W + wrow * Kd : nullptr;
  }
  const int KT = (int)((Kd + BK - 1) / BK);
  auto load = [&](int stage, int kt) {
    const int64_t k0 = (int64_t)kt * BK;
    bf16* a = sA + stage * (BM * BK);
    bf16* b = sB + stage * (BN * BK);
#pragma unroll
    for (int i = 0; i < A_PER; i++) {
      const int64_t k = k0 + a_ch[i] * 8;
      const bool v = a_src[i] != nullptr && k < Kd;
      cp_async16(a + a_dst[i], v ? a_src[i] + k : p.A, v);
    }
#pragma unroll
    for (int i = 0; i < B_PER; i++) {
      const int64_t k = k0 + b_ch[i] * 8;
      const bool v = b_src[i] != nullptr && k < Kd;
      cp_async16(b + b_dst[i], v ? b_src[i] + k : p.W, v);
    }
  };

  float acc0[64], acc1[64];
#pragma unroll
  for (int i = 0; i < 64; i++) acc0[i] = acc1[i] = 0.0f;

#pragma unroll
  for (int s = 0; s < ST - 1; s++) {
    if (s < KT) load(s, s);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  const uint32_t sA0 = (uint32_t)__cvta_generic_to_shared(sA), sB0 = (uint32_t)__cvta_generic_to_shared(sB);
  // Stage kt: wait for its tile, issue its wgmmas, then (while they run)
  // wait for stage kt-1's wgmmas, barrier, and prefetch tile kt+ST-1 into
  // the stage they read. One wgmma group stays in flight across the barrier.
  for (int kt = 0; kt < KT; kt++) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 2));
    fence_proxy_async();
    __syncthreads();
    const int st = kt % ST;
    const uint32_t a = sA0 + st * (uint32_t)kStageA + wg * 64 * 128;
    const uint32_t b = sB0 + st * (uint32_t)kStageB;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
      wgmma_n128(acc0, desc(a + kk * 32), desc(b + kk * 32));
      wgmma_n128(acc1, desc(a + kk * 32), desc(b + 128 * 128 + kk * 32));
    }
    wgmma_commit();
    wgmma_wait1();
    __syncthreads();  // every warpgroup's stage kt-1 wgmmas are done
    const int nk = kt + ST - 1;
    if (nk < KT) load(nk % ST, nk);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  wgmma_wait0();
  asm volatile("cp.async.wait_group 0;\n" ::);

  // Epilogue: d[4i + q] is row 16*warp + lane/4 + 8*(q/2), column 8i + 2*(lane%4) + q%2.
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int64_t slot = m0 + wg * 64 + warp * 16 + lane / 4 + 8 * h;
    if (p.sorted[slot] < 0) continue;
    if (GATEUP) {
      bf16* out = reinterpret_cast<bf16*>(p.out) + slot * N;
      const float* gb = p.bias ? p.bias + (int64_t)e * 2 * N : nullptr;
#pragma unroll
      for (int i = 0; i < 16; i++) {
        const int64_t j = (int64_t)ntile * (BN / 2) + 8 * i + 2 * (lane % 4);
        if (j >= N) continue;
        float r2[2];
#pragma unroll
        for (int q = 0; q < 2; q++) {
          float g = acc0[4 * i + 2 * h + q], u = acc1[4 * i + 2 * h + q];
          if (gb) {
            g += gb[j + q];
            u += gb[N + j + q];
          }
          if (p.act == MK_MOE_SWIGLU) {
            r2[q] = g / (1.0f + __expf(-g)) * u;
          } else {
            const float lim = p.limit;
            if (g > lim) g = lim;
            if (u > lim) u = lim;
            else if (u < -lim) u = -lim;
            r2[q] = (u + 1.0f) * (g / (1.0f + __expf(-p.alpha * g)));
          }
        }
        *reinterpret_cast<__nv_bfloat162*>(out + j) = __floats2bfloat162_rn(r2[0], r2[1]);
      }
    } else {
      float* out = reinterpret_cast<float*>(p.out) + slot * N;
      const float* db = p.bias ? p.bias + (int64_t)e * N : nullptr;
#pragma unroll
      for (int half = 0; half < 2; half++) {
#pragma unroll
        for (int i = 0; i < 16; i++) {
          const int64_t n = (int64_t)ntile * BN + half * 128 + 8 * i + 2 * (lane % 4);
          if (n >= N) continue;
          float2 v = half ? make_float2(acc1[4 * i + 2 * h], acc1[4 * i + 2 * h + 1])
                          : make_float2(acc0[4 * i + 2 * h], acc0[4 * i + 2 * h + 1]);
          if (db) {
            v.x += db[n];
            v.y += db[n + 1];
          }
          *reinterpret_cast<float2*>(out + n) = v;
        }
      }
    }
  }
}

template <bool GU>
int launch(const GemmArgs& a, int64_t tiles, int64_t ntiles, cudaStream_t s) {
  auto kern = moe_wgmma_kernel<GU>;
  static int ok = 0;  // 0 unknown, 1 runnable, -1 not built for this device
  if (ok == 0) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, kern) != cudaSuccess || fa.binaryVersion < 90) {
      cudaGetLastError();
      ok = -1;
    } else {
      MK_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmem));
      ok = 1;
    }
  }
  if (ok < 0) return -1;
  kern<<<(unsigned)(tiles * ntiles), THREADS, kSmem, s>>>(a);
  MK_LAUNCHED(GU ? "moe_wgmma (gate/up)" : "moe_wgmma (down)");
  return MK_OK;
}

}  // namespace

namespace mkmoe {

int wgmma_gemm(const GemmArgs& a, bool gateup, int64_t tiles, int64_t ntiles, cudaStream_t s) {
#ifndef MK_MOE_NO_WGMMA
  return gateup ? launch<true>(a, tiles, ntiles, s) : launch<false>(a, tiles, ntiles, s);
#else
  return -1;
#endif
}

}  // namespace mkmoe
