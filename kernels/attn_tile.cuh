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
  // ldmatrix base addresses per operand (TileAddr).
  static constexpr int KQ = WQ / 2 < 4 ? WQ / 2 : 4, KV = WV / 2 < 4 ? WV / 2 : 4;
};

// TileAddr holds a lane's ldmatrix base addresses into the Q tile and into
// stage 0 of the K and V tiles. Every fragment row group starts at a
// multiple of 8, so a lane's swizzle key (row & 7) is fixed, and chunk 2k+c
// of it sits at 8*(k/4) + ((2*(k%4)+c) ^ key): four base addresses per
// operand, the rest immediate offsets.
template <int D, int DV, int MT>
struct TileAddr {
  using C = Cfg<D, DV, MT>;
  uint32_t q[C::KQ], k[C::KQ], v[C::KV];
  __device__ __forceinline__ TileAddr(const bf16* sq, const bf16* sk, const bf16* sv, int wrow, int lane) {
    const int qr = wrow + (lane & 15);
    const int kr = (lane & 7) + ((lane >> 4) << 3);
    const int vr = (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
    for (int kl = 0; kl < C::KQ; ++kl) {
      q[kl] = smem_addr(sq) + 2 * (qr * D + swz<C::WQ>(qr, 2 * kl + (lane >> 4)) * 8);
      k[kl] = smem_addr(sk) + 2 * (kr * D + swz<C::WQ>(kr, 2 * kl + ((lane >> 3) & 1)) * 8);
    }
#pragma unroll
    for (int kl = 0; kl < C::KV; ++kl) v[kl] = smem_addr(sv) + 2 * (vr * DV + swz<C::WV>(vr, 2 * kl + (lane >> 4)) * 8);
  }
};

// TileRows says which query positions a tile's rows hold and where the
// keys end: row r of the tile is position pos0 + (r & (rph-1)) (of head r /
// rph); posend is one past the tile's last real position; key j is visible
// when j < jend and, causal, j <= pos and (window 0 or j > pos - window).
struct TileRows {
  int pos0, posend, jend, rph;
};

// attend_tile folds the K/V tile of keys [j0, j0 + kBN) — in shared memory
// at byte offsets koff (K) and voff (V) from stage 0 — into the warp's
// online-softmax state: unnormalised O, the running max m (log2 units,
// raised lazily by kRescaleSlack) and the running sum l, each in the MMA
// fragment layout of the warp's 16·MT rows from wrow. S = Q·Kᵀ, the mask
// where the tile crosses the diagonal, the window start or the keys' end,
// (causal, window as in TileRows), exp2 with the scale folded in (sl2 = scale·log2 e), O += P·V (P in bf16).
// flash.cu and ring.cu run exactly this per tile.
template <int D, int DV, int MT>
__device__ __forceinline__ void attend_tile(float (&o)[MT][DV / 8][4], float (&m)[MT][2], float (&l)[MT][2],
                                            const TileAddr<D, DV, MT>& ad, uint32_t koff, uint32_t voff, int j0,
                                            const TileRows& tr, int causal, int window, int wrow, float sl2) {
  constexpr int NT = kBN / 8, NO = DV / 8;
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  // S = Q·Kᵀ
  float s[MT][NT][4];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int ni = 0; ni < NT; ++ni) s[mi][ni][0] = s[mi][ni][1] = s[mi][ni][2] = s[mi][ni][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t kh_off = 128 * (kk / 4);
    uint32_t a[MT][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) ldsm_x4(a[mi], ad.q[kk % 4] + kh_off + 2 * mi * 16 * D);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t bb[4];
      ldsm_x4(bb, ad.k[kk % 4] + koff + kh_off + 2 * np * 16 * D);
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        mma16816(s[mi][2 * np], a[mi], bb[0], bb[1]);
        mma16816(s[mi][2 * np + 1], a[mi], bb[2], bb[3]);
      }
    }
  }

  // Mask where the tile crosses the diagonal, the window start or the keys' end.
  const int rph = tr.rph;
  const bool need = (j0 + kBN > tr.jend) ||
                    (causal && (j0 + kBN - 1 > tr.pos0 || (window > 0 && j0 < tr.posend - window)));
  if (need) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int ni = 0; ni < NT; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int pos = tr.pos0 + ((wrow + mi * 16) & (rph - 1)) + g + (e >= 2 ? 8 : 0);
          const int j = j0 + ni * 8 + 2 * t4 + (e & 1);
          bool ok = j < tr.jend;
          if (causal) ok = ok && j <= pos && (window <= 0 || j > pos - window);
          if (!ok) s[mi][ni][e] = -INFINITY;
        }
  }

  // Online softmax (log2 domain), the max raised lazily (kRescaleSlack).
  float mx[MT][2];
  bool raise = false;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float v = -INFINITY;
#pragma unroll
      for (int ni = 0; ni < NT; ++ni) v = fmaxf(v, fmaxf(s[mi][ni][2 * hh], s[mi][ni][2 * hh + 1]));
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
      mx[mi][hh] = v * sl2;
      raise = raise || mx[mi][hh] > m[mi][hh] + kRescaleSlack;  // -inf + slack: any finite max raises
    }
  if (__any_sync(0xffffffffu, raise)) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float mnew = fmaxf(m[mi][hh], mx[mi][hh]);
        const float corr = mnew == -INFINITY ? 1.f : ex2(m[mi][hh] - mnew);
        m[mi][hh] = mnew;
        l[mi][hh] *= corr;
#pragma unroll
        for (int nt = 0; nt < NO; ++nt) {
          o[mi][nt][2 * hh] *= corr;
          o[mi][nt][2 * hh + 1] *= corr;
        }
      }
  }
  uint32_t pa[MT][kBN / 16][4];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float base = m[mi][hh] == -INFINITY ? 0.f : m[mi][hh];
      float sum = 0.f;
#pragma unroll
      for (int ni = 0; ni < NT; ++ni) {
        const float p0 = ex2(fmaf(s[mi][ni][2 * hh], sl2, -base));
        const float p1 = ex2(fmaf(s[mi][ni][2 * hh + 1], sl2, -base));
        s[mi][ni][2 * hh] = p0;
        s[mi][ni][2 * hh + 1] = p1;
        sum += p0 + p1;
      }
      l[mi][hh] += sum;
    }
#pragma unroll
    for (int kj = 0; kj < kBN / 16; ++kj) {
      pa[mi][kj][0] = pack_bf16(s[mi][2 * kj][0], s[mi][2 * kj][1]);
      pa[mi][kj][1] = pack_bf16(s[mi][2 * kj][2], s[mi][2 * kj][3]);
      pa[mi][kj][2] = pack_bf16(s[mi][2 * kj + 1][0], s[mi][2 * kj + 1][1]);
      pa[mi][kj][3] = pack_bf16(s[mi][2 * kj + 1][2], s[mi][2 * kj + 1][3]);
    }
  }

  // O += P·V
#pragma unroll
  for (int kj = 0; kj < kBN / 16; ++kj) {
#pragma unroll
    for (int dp = 0; dp < DV / 16; ++dp) {
      uint32_t bb[4];
      ldsm_x4_t(bb, ad.v[dp % 4] + voff + 128 * (dp / 4) + 2 * kj * 16 * DV);
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        mma16816(o[mi][2 * dp], pa[mi][kj], bb[0], bb[1]);
        mma16816(o[mi][2 * dp + 1], pa[mi][kj], bb[2], bb[3]);
      }
    }
  }
}

}  // namespace
