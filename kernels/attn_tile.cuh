// attn_tile.cuh — what the tensor-core attention kernels share (flash.cu,
// ring.cu): the tile constants, the PTX wrappers (cp.async, ldmatrix,
// mma.sync m16n8k16, exp2, bf16 packing), the XOR-swizzled shared-memory
// row loads, and the tile configuration Cfg<D, DV, MT>. Included inside no
// namespace: it opens the translation unit's anonymous namespace itself.
#pragma once

#include "common.cuh"
#include "mma.cuh"

namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBN = 64;      // keys per tile
constexpr int kStages = 2;   // K/V shared-memory stages: one computed, one loading
// The running row max is raised only when a tile's max exceeds it by more
// than kRescaleSlack (log2 units), so most tiles skip rescaling O; P then
// stays below 2^kRescaleSlack, and O/l is the same for any consistent max.
constexpr float kRescaleSlack = 8.f;
constexpr float kLog2e = 1.4426950408889634f;

// ---- PTX wrappers ----

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// cp_async16 copies 16 bytes, or zero-fills them when bytes is 0.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

using mk::mma16816;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// swz is the swizzled 16-byte chunk of (row, chunk) in a tile whose rows hold
// W chunks: the 8 rows one ldmatrix reads land in 8 different bank groups.
template <int W>
__device__ __forceinline__ int swz(int row, int chunk) {
  if constexpr (W >= 8)
    return chunk ^ (row & 7);
  else
    return chunk ^ ((row >> 1) & 3);
}

// load_chunk_scalar fills one 8-element chunk element by element (head dims
// that are not multiples of 8, or misaligned pointers); kept out of line so
// the fast path's registers do not pay for it.
__device__ __noinline__ void load_chunk_scalar(bf16* dst, const bf16* src, int col, int ncols) {
  uint32_t w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int c0 = col + 2 * e;
    const unsigned short lo = (src != nullptr && c0 < ncols) ? __bfloat16_as_ushort(src[c0]) : (unsigned short)0;
    const unsigned short hi =
        (src != nullptr && c0 + 1 < ncols) ? __bfloat16_as_ushort(src[c0 + 1]) : (unsigned short)0;
    w[e] = (uint32_t)lo | ((uint32_t)hi << 16);
  }
  *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
}

// load_row fills chunks sub, sub+step, ... of smem row `row` (W chunks of 8
// bf16) from src (ncols real columns; src == nullptr: zeros). vec: 16-byte
// cp.async (ncols a multiple of 8, src 16-byte aligned); else element loads.
template <int W>
__device__ __forceinline__ void load_row(bf16* tile, int row, const bf16* src, int ncols, int sub, int step,
                                         bool vec, const void* dummy) {
  bf16* dst = tile + row * (W * 8);
  if (vec) {
#pragma unroll
    for (int c = sub; c < W; c += step) {
      const bool ok = src != nullptr && c * 8 < ncols;
      cp_async16(dst + swz<W>(row, c) * 8, ok ? static_cast<const void*>(src + c * 8) : dummy, ok ? 16 : 0);
    }
  } else {
    for (int c = sub; c < W; c += step) load_chunk_scalar(dst + swz<W>(row, c) * 8, src, c * 8, ncols);
  }
}

template <int D, int DV, int MT>
struct Cfg {
  static constexpr int BM = 16 * MT * kWarps;
  static constexpr int WQ = D / 8, WV = DV / 8;
  static constexpr int QE = BM * D, KE = kBN * D, VE = kBN * DV;  // elements
  static constexpr size_t smem = (size_t)(QE + kStages * (KE + VE)) * sizeof(bf16);
  // Floats of per-thread softmax state (ring.cu): O fragments, then m and l.
  static constexpr int NS = MT * (DV / 8) * 4 + MT * 4;
};

}  // namespace
