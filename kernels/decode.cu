// decode.cu — the bf16 paged KV cache and paged decode attention
// (flash-decoding): mk_kv_write_bf16, mk_paged_attn_bf16 and the size of its
// split-KV workspace, mk_paged_attn_workspace.
//
// Attention: one CTA of 128 threads per (query row, kv head, key split)
// computes all query heads of the GQA group that reads that kv head (up to 8
// per CTA; larger groups take several head chunks), so each K/V byte is read
// once per group and row. K/V tiles of 64 keys come through the block table
// with 16-byte cp.async loads into padded shared memory: double-buffered in
// paged_attn (the next tile loads while this one is computed), a ring of 2-4
// stages in paged_attn_mma (up to 3 tiles in flight). Scores, the online softmax
// (base 2, scale·log2 e folded into q) and the P·V accumulation are float32
// on the CUDA cores. A row's keys are cut into `splits` ranges across CTAs
// when the grid would not fill the GPU (batch 1, long context); each range
// leaves its un-normalised output and (max, sum) in a workspace and a second
// kernel merges them by log-sum-exp, adding the sinks.
//
// Two kernels share that frame (mk_paged_attn_variant): paged_attn computes
// on the CUDA cores (float32 FMAs; chosen for v_head_dim > 128), and
// paged_attn_mma on the tensor cores (mma.sync; chosen for v_head_dim ≤ 128,
// any group). Measured numbers and what limits them: kernels/README.md.
#include <algorithm>
#include <cmath>

#include "common.cuh"
#include "normrope.cuh"

namespace {

using bf16 = __nv_bfloat16;

constexpr int kNT = 128;          // threads per CTA
constexpr int kTK = 64;           // keys per tile
constexpr int kKS = kNT / kTK;    // threads per key in the QK step (each a part of D)
constexpr int kRows = kTK / (kNT / 16);  // tile rows one thread loads at most (≥ 8 rows per pass)
constexpr int kGMax = 8;          // query heads per CTA at most
constexpr int kMaxSplits = 128;   // key ranges per row at most
constexpr int kMinChunk = 2 * kTK;  // keys per range at least
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
// cp_wait waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
using mk::warp_sum;

struct AttnArgs {
  float* out;
  bf16* outb;  // or null: out rounded to bf16 (RN) as well
  const float* q;
  const bf16* pk;
  const bf16* pv;
  const int32_t* rows;
  const int32_t* pos;
  const int32_t* table;
  const int32_t* blocks;
  const float* sinks;
  float* wo;   // [n, H, splits, Dv] partial outputs (splits > 1)
  float* wml;  // [n, H, splits, 2] their (max, sum)
  int H, KV, D, Dv, bs, bs_shift, window, G, hchunks, splits;
  int minc, gran;  // keys per split at least, and the granule a split's keys round up to (row_split)
  int64_t ldv;     // pool row stride of the values: KV·Dv, or KV·D with the values inside the keys
  int vhs;         // offset of kv head kh's value in a row: kh·vhs (Dv, or D inside the keys)
  int lg_tpr;  // log2 of the threads that load one K/V row
  float scale2;  // scale * log2(e)
  // Decode rows with their new tokens (paged_attn_warp<KD, MV, true>,
  // mk_paged_decode_bf16): q is then the raw projection; each CTA runs the
  // per-head norm and RoPE of its q heads itself, and the CTAs whose key
  // range ends at the row's new key (pos[b]) take that key and its value
  // from knew / vnew (normed and rotated, rounded to bf16) instead of the
  // pool, the first head chunk's storing them at slots[rows[b]].
  const float* knew;      // [T, KV·D] raw keys
  const float* vnew;      // [T, KV·Dv] values
  const int32_t* slots;   // [T] pool rows of the new keys (< 0: not stored)
  const float* qnw;       // [D] q's per-head norm weights, or null (no norm)
  const float* knw;       // [D] k's
  const int32_t* rpos;    // [T] RoPE positions
  const float* inv_freq;  // [rot_half]
  int rot_half, neox;
  float attn_factor, eps;
};

// pool_row is the pool row of key j of a sequence with block table tab.
__device__ __forceinline__ int pool_row(const AttnArgs& a, const int32_t* tab, int j) {
  if (a.bs_shift >= 0) return tab[j >> a.bs_shift] * a.bs + (j & (a.bs - 1));
  const int blk = j / a.bs;
  return tab[blk] * a.bs + (j - blk * a.bs);
}

// put_out writes one output value (and its bf16 rounding when asked).
__device__ __forceinline__ void put_out(const AttnArgs& a, int64_t i, float v) {
  a.out[i] = v;
  if (a.outb) a.outb[i] = __float2bfloat16_rn(v);
}

// RowSplit is how a row's keys [lo, i] spread over the splits: `used`
// ranges of `chunk` keys from lo, the last one to i (shorter, or with a
// decode row's new key one longer). The plan fixes splits for a key count
// (a decode graph's: its bucket, up to 4x the real context); each row
// divides its own keys over min(splits, keys / minc) ranges, rounded up to
// whole granules (the kernel's tile), so no range sits idle past a short
// context while another walks a long one. A decode row's new key (knew:
// taken from the projection, not the pool) is not counted: it joins the
// last range, so 1024 pool keys make 16 ranges of 64, not 17 of which the
// last holds the new key alone. The ranges past `used` are empty: their
// CTAs return at once, the merge reads only the first `used`.
struct RowSplit {
  int lo, chunk, used;
};

__device__ __forceinline__ RowSplit row_split(const AttnArgs& a, int i) {
  RowSplit r;
  r.lo = a.window > 0 ? max(0, i - a.window + 1) : 0;
  const int nk = i + 1 - r.lo;
  const int np = a.knew ? nk - 1 : nk;  // keys the ranges divide (≥ 0)
  const int want = max(1, min(a.splits, (np + a.minc - 1) / a.minc));
  r.chunk = ((max(np, 1) + want - 1) / want + a.gran - 1) / a.gran * a.gran;
  r.used = max(1, (np + r.chunk - 1) / r.chunk);
  return r;
}

// CtaWork is a paged-attention CTA's share of the work: batch row b (query
// row row at position i), key range [kbeg, kend) of its split, and the gc
// query heads from h0 of kv head kh, with the row's block table tab. The
// grid is linear, kv head (and head chunk) fastest: the CTAs of one row and
// key range run together and read neighbouring bytes of the same rows.
struct CtaWork {
  int split, b, kh, h0, gc, i, kbeg, kend;
  int64_t row;
  const int32_t* tab;
};

// cta_work is this CTA's share for GM query heads per CTA.
__device__ __forceinline__ CtaWork cta_work(const AttnArgs& a, int GM) {
  CtaWork w;
  const int nkh = a.KV * a.hchunks;
  const int64_t lin = blockIdx.x;
  const int khc = (int)(lin % nkh);
  const int64_t rest = lin / nkh;
  w.split = (int)(rest % a.splits);
  w.b = (int)(rest / a.splits);
  w.kh = khc / a.hchunks;
  const int hc = khc - w.kh * a.hchunks;
  w.h0 = w.kh * a.G + hc * GM;
  w.gc = min(GM, a.G - hc * GM);
  w.row = a.rows[w.b];
  w.i = a.pos[w.b];
  const RowSplit rs = row_split(a, w.i);
  if (w.split >= rs.used) {  // empty: kbeg == kend
    w.kbeg = w.kend = w.i + 1;
  } else {
    w.kbeg = rs.lo + w.split * rs.chunk;
    w.kend = w.split == rs.used - 1 ? w.i + 1 : w.kbeg + rs.chunk;
  }
  w.tab = a.blocks + a.table[w.b];
  return w;
}


// Shared memory of one CTA, in bytes, laid out as
// Ks [2][kTK][D+8] bf16 | Vs [2][kTK][Dv+8] bf16 | qs [GM][D] f32 |
// sp [kKS][kTK][GM] f32 | pb [kTK][GM] f32 | corr [GM] | mfin [GM] | lfin [GM].
__host__ __device__ inline size_t smem_kv(int D, int Dv, int stages = 2) {
  return (size_t)stages * kTK * ((D + 8) + (Dv + 8)) * sizeof(bf16);
}
__host__ __device__ inline size_t smem_bytes(int D, int Dv, int GM) {
  return smem_kv(D, Dv) + sizeof(float) * ((size_t)GM * D + (size_t)kKS * kTK * GM + (size_t)kTK * GM + 3 * GM);
}

template <int GM>
__global__ void __launch_bounds__(kNT) paged_attn(const AttnArgs a) {
  mk::pdl_begin();
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = a.D, Dv = a.Dv, KV = a.KV;
  const int ldk = D + 8, ldv = Dv + 8;
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + 2 * kTK * ldk;
  float* qs = reinterpret_cast<float*>(smem + smem_kv(D, Dv));
  float* sp = qs + GM * D;
  float* pb = sp + kKS * kTK * GM;
  float* corr = pb + kTK * GM;
  float* mfin = corr + GM;
  float* lfin = mfin + GM;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const CtaWork w = cta_work(a, GM);
  const int split = w.split, b = w.b, kh = w.kh, h0 = w.h0, gc = w.gc, kbeg = w.kbeg, kend = w.kend;
  const int64_t row = w.row;
  const int32_t* tab = w.tab;
  if (kbeg >= kend) return;  // past the row's used ranges (row_split)

  const int cprk = D >> 3, cprv = Dv >> 3;  // 16-byte chunks per K / V row
  const int tpr = 1 << a.lg_tpr, rstep = kNT >> a.lg_tpr;
  const int sub = tid & (tpr - 1);
  const int64_t ldpk = (int64_t)KV * D, ldpv = a.ldv;
  const bf16* pk = a.pk + (int64_t)kh * D;
  const bf16* pv = a.pv + (int64_t)kh * a.vhs;

  // A thread loads rows r0 + k*rstep (k < kRows) of a tile. fetch reads the
  // pool rows of tile t's keys from the block table into prow (a tile ahead,
  // so the table's latency hides behind a tile of work); issue starts the
  // 16-byte copies of those rows into stage st.
  const int r0 = tid >> a.lg_tpr;
  int prow[kRows];
  auto fetch = [&](int t) {
    const int j0 = kbeg + t * kTK;
    const int nk = min(kTK, kend - j0);
#pragma unroll
    for (int k = 0; k < kRows; k++) {
      const int r = r0 + k * rstep;
      if (r < nk) prow[k] = pool_row(a, tab, j0 + r);
    }
  };
  auto issue = [&](int t, int st) {
    const int nk = min(kTK, kend - (kbeg + t * kTK));
    bf16* kd = Ks + st * kTK * ldk;
    bf16* vd = Vs + st * kTK * ldv;
#pragma unroll
    for (int k = 0; k < kRows; k++) {
      const int r = r0 + k * rstep;
      if (r < nk) {
        const bf16* ks = pk + (int64_t)prow[k] * ldpk;
        const bf16* vs = pv + (int64_t)prow[k] * ldpv;
        for (int c = sub; c < cprk; c += tpr) cp_async16(kd + r * ldk + c * 8, ks + c * 8);
        for (int c = sub; c < cprv; c += tpr) cp_async16(vd + r * ldv + c * 8, vs + c * 8);
      }
    }
    cp_commit();
  };

  const int ntiles = (kend - kbeg + kTK - 1) / kTK;
  fetch(0);
  issue(0, 0);
  if (ntiles > 1) fetch(1);

  for (int x = tid; x < GM * D; x += kNT) {
    const int g = x / D, c = x - g * D;
    qs[x] = g < gc ? a.q[(row * a.H + h0 + g) * D + c] * a.scale2 : 0.0f;
  }

  // The softmax state of heads warp and warp+4 (kNT/32 = 4 warps), lane-uniform.
  float mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {0.0f, 0.0f};
  // P·V: thread (kg, cp) owns columns 2cp, 2cp+1 of every head, keys kg mod kgn.
  const int P = Dv >> 1;
  const int kgn = max(1, kNT / P);
  const int cp = tid % P, kg = tid / P;
  const bool pvt = kg < kgn && cp < P && tid < kgn * P;
  float acc[GM][2];
#pragma unroll
  for (int g = 0; g < GM; g++) acc[g][0] = acc[g][1] = 0.0f;

  for (int t = 0; t < ntiles; t++) {
    const int st = t & 1;
    const int nk = min(kTK, kend - (kbeg + t * kTK));
    cp_wait_all();
    __syncthreads();  // tile t is in; stage st^1 is free (P·V of t-1 done)
    if (t + 1 < ntiles) {
      issue(t + 1, st ^ 1);
      if (t + 2 < ntiles) fetch(t + 2);
    }

    // S = q·k for key j (thread's part kp of D), all heads.
    {
      const int j = tid % kTK, kp = tid / kTK;
      if (j < nk) {
        float s[GM];
#pragma unroll
        for (int g = 0; g < GM; g++) s[g] = 0.0f;
        const bf16* kr = Ks + (st * kTK + j) * ldk;
#pragma unroll 2
        for (int c = kp; c < cprk; c += kKS) {
          const uint4 raw = *reinterpret_cast<const uint4*>(kr + c * 8);
          const float k0 = bf_lo(raw.x), k1 = bf_hi(raw.x), k2 = bf_lo(raw.y), k3 = bf_hi(raw.y);
          const float k4 = bf_lo(raw.z), k5 = bf_hi(raw.z), k6 = bf_lo(raw.w), k7 = bf_hi(raw.w);
#pragma unroll
          for (int g = 0; g < GM; g++) {
            if (g < gc) {
              const float4 qa = *reinterpret_cast<const float4*>(qs + g * D + c * 8);
              const float4 qb = *reinterpret_cast<const float4*>(qs + g * D + c * 8 + 4);
              float v = s[g];
              v = fmaf(qa.x, k0, v);
              v = fmaf(qa.y, k1, v);
              v = fmaf(qa.z, k2, v);
              v = fmaf(qa.w, k3, v);
              v = fmaf(qb.x, k4, v);
              v = fmaf(qb.y, k5, v);
              v = fmaf(qb.z, k6, v);
              v = fmaf(qb.w, k7, v);
              s[g] = v;
            }
          }
        }
        float* so = sp + (kp * kTK + j) * GM;
#pragma unroll
        for (int g = 0; g < GM; g++) so[g] = s[g];
      }
    }
    __syncthreads();

    // Online softmax, one warp per head (kTK = 64 = 2 keys per lane).
#pragma unroll
    for (int u = 0; u < 2; u++) {
      const int g = warp + 4 * u;
      if (g < gc) {
        float s0 = -INFINITY, s1 = -INFINITY;
        if (lane < nk) {
          s0 = 0.0f;
#pragma unroll
          for (int kp = 0; kp < kKS; kp++) s0 += sp[(kp * kTK + lane) * GM + g];
        }
        if (lane + 32 < nk) {
          s1 = 0.0f;
#pragma unroll
          for (int kp = 0; kp < kKS; kp++) s1 += sp[(kp * kTK + lane + 32) * GM + g];
        }
        const float mn = fmaxf(mrun[u], warp_max(fmaxf(s0, s1)));
        const float cr = exp2f(mrun[u] - mn);  // 0 on the first tile
        const float p0 = exp2f(s0 - mn), p1 = exp2f(s1 - mn);
        pb[lane * GM + g] = p0;
        pb[(lane + 32) * GM + g] = p1;
        lrun[u] = lrun[u] * cr + warp_sum(p0 + p1);
        mrun[u] = mn;
        if (lane == 0) corr[g] = cr;
      }
    }
    __syncthreads();

    // acc = acc·corr + P·V.
    if (pvt) {
#pragma unroll
      for (int g = 0; g < GM; g++) {
        if (g < gc) {
          const float cr = corr[g];
          acc[g][0] *= cr;
          acc[g][1] *= cr;
        }
      }
      const bf16* vb = Vs + st * kTK * ldv + 2 * cp;
#pragma unroll 4
      for (int jj = kg; jj < nk; jj += kgn) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(vb + jj * ldv);
        const float v0 = bf_lo(w), v1 = bf_hi(w);
        float p[GM];
        if constexpr (GM >= 4) {
#pragma unroll
          for (int g = 0; g < GM; g += 4) {
            const float4 f = *reinterpret_cast<const float4*>(pb + jj * GM + g);
            p[g] = f.x;
            p[g + 1] = f.y;
            p[g + 2] = f.z;
            p[g + 3] = f.w;
          }
        } else {
#pragma unroll
          for (int g = 0; g < GM; g++) p[g] = pb[jj * GM + g];
        }
#pragma unroll
        for (int g = 0; g < GM; g++) {
          if (g < gc) {
            acc[g][0] = fmaf(p[g], v0, acc[g][0]);
            acc[g][1] = fmaf(p[g], v1, acc[g][1]);
          }
        }
      }
    }
  }

  // Final (max, sum) per head, and the key groups' partial sums merged.
#pragma unroll
  for (int u = 0; u < 2; u++) {
    const int g = warp + 4 * u;
    if (g < gc && lane == 0) {
      mfin[g] = mrun[u];
      lfin[g] = lrun[u];
    }
  }
  __syncthreads();  // all P·V reads of the tiles are done: their memory is free
  float* red = reinterpret_cast<float*>(smem);  // [kgn][GM][Dv]
  if (kgn > 1) {
    if (pvt) {
#pragma unroll
      for (int g = 0; g < GM; g++) {
        if (g < gc) {
          red[(kg * GM + g) * Dv + 2 * cp] = acc[g][0];
          red[(kg * GM + g) * Dv + 2 * cp + 1] = acc[g][1];
        }
      }
    }
    __syncthreads();
  }
  if (kgn > 1) {
    for (int x = tid; x < gc * Dv; x += kNT) {
      const int g = x / Dv, c = x - g * Dv, h = h0 + g;
      float o = 0.0f;
      for (int k = 0; k < kgn; k++) o += red[(k * GM + g) * Dv + c];
      if (a.splits == 1) {
        float m = mfin[g], l = lfin[g];
        if (a.sinks) {
          const float sk = a.sinks[h] * kLog2e;
          const float mn = fmaxf(m, sk);
          const float cr = exp2f(m - mn);
          l = l * cr + exp2f(sk - mn);
          o *= cr;
        }
        put_out(a, (row * a.H + h) * Dv + c, o / l);
      } else {
        a.wo[(((int64_t)b * a.H + h) * a.splits + split) * Dv + c] = o;
      }
    }
  }
  if (kgn == 1 && pvt) {
#pragma unroll
    for (int g = 0; g < GM; g++) {
      if (g < gc) {
        const int h = h0 + g;
        float o0 = acc[g][0], o1 = acc[g][1];
        if (a.splits == 1) {
          float m = mfin[g], l = lfin[g];
          if (a.sinks) {
            const float sk = a.sinks[h] * kLog2e;
            const float mn = fmaxf(m, sk);
            const float cr = exp2f(m - mn);
            l = l * cr + exp2f(sk - mn);
            o0 *= cr;
            o1 *= cr;
          }
          const int64_t o = (row * a.H + h) * Dv + 2 * cp;
          put_out(a, o, o0 / l);
          put_out(a, o + 1, o1 / l);
        } else {
          float* o = a.wo + (((int64_t)b * a.H + h) * a.splits + split) * Dv + 2 * cp;
          o[0] = o0;
          o[1] = o1;
        }
      }
    }
  }
  if (a.splits > 1 && tid < gc) {
    float* ml = a.wml + (((int64_t)b * a.H + h0 + tid) * a.splits + split) * 2;
    ml[0] = mfin[tid];
    ml[1] = lfin[tid];
  }
}

// ---- tensor-core variant ----
//
// The same CTA (row, kv head, key range; 4 warps, 64-key tiles) with the
// products on the tensor cores (mma.sync m16n8k16, bf16 in, float32 accumulate): the up to 16
// query heads of a group are the 16 rows of A. Each warp owns 16 keys of a
// tile: S = Q·Kᵀ (K fragments by ldmatrix), its own online softmax (running
// max and sum per head) and O += P·V (V fragments by ldmatrix.trans, P taken
// from S's accumulator registers); the 4 warps' states merge at the end.
// q and P are float32 split into hi = bf16(x) and lo = bf16(x − hi), two
// MMAs each, so they keep ~16 bits of mantissa: only K and V are rounded
// (to the bf16 of the cache). One barrier per tile.
//
// The K/V tiles come through a ring of NS stages (2-4, chosen per shape by
// pick_stages): NS-1 tiles are in flight while one is computed (cp.async
// groups, wait_group NS-2), and the block-table lookups of the tile after
// the one being issued are read a tile ahead, so neither the pool loads nor
// the table loads wait on the compute. With D = 128, 3 stages (111 KB) still
// fit 2 CTAs per SM: 4 tiles (128 KB of K/V) in flight per SM, where the
// double-buffered version had at most 2 and drained them every tile.

constexpr int kGMma = 16;  // query heads per CTA (the MMA's M)

__device__ __forceinline__ uint32_t bf2_bits(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }

// split2 splits the pair (x0, x1) into bf16x2 hi and lo words (x0 in the low half).
__device__ __forceinline__ void split2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  hi = bf2_bits(h);
  lo = bf2_bits(__floats2bfloat162_rn(x0 - hf.x, x1 - hf.y));
}

__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}

constexpr int kMinStages = 2, kMaxStages = 4;  // the ring's depth (tiles)

// Shared memory of the MMA kernel: Ks [NS][kTK][D+8] bf16 | Vs [NS][kTK][Dv+8] bf16 |
// qf [ceil(D/16)][32][8] u32 (q's A fragments, hi then lo) | mls [4][16][2] f32 | fin [16][2] f32.
__host__ __device__ inline size_t smem_bytes_mma(int D, int Dv, int stages) {
  return smem_kv(D, Dv, stages) + (size_t)((D + 15) / 16) * 32 * 8 * 4 + 4 * 16 * 2 * 4 + 16 * 2 * 4;
}

// NV: n-tiles of 8 output columns the accumulators hold (≥ Dv/8); NS: stages of the K/V ring.
template <int NV, int NS>
__global__ void __launch_bounds__(kNT) paged_attn_mma(const AttnArgs a) {
  mk::pdl_begin();
  static_assert(NS >= kMinStages && NS <= kMaxStages, "stages");
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = a.D, Dv = a.Dv, KV = a.KV;
  const int ldk = D + 8, ldv = Dv + 8;
  const int ksteps = (D + 15) >> 4, nvt = Dv >> 3;
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + NS * kTK * ldk;
  uint32_t* qf = reinterpret_cast<uint32_t*>(smem + smem_kv(D, Dv, NS));
  float* mls = reinterpret_cast<float*>(qf + ksteps * 32 * 8);
  float* fin = mls + 4 * 16 * 2;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const CtaWork w = cta_work(a, kGMma);
  const int split = w.split, b = w.b, kh = w.kh, h0 = w.h0, gc = w.gc, kbeg = w.kbeg, kend = w.kend;
  const int64_t row = w.row;
  const int32_t* tab = w.tab;
  if (kbeg >= kend) return;  // past the row's used ranges (row_split)

  const int cprk = D >> 3, cprv = Dv >> 3;
  const int tpr = 1 << a.lg_tpr, rstep = kNT >> a.lg_tpr;
  const int sub = tid & (tpr - 1);
  const int64_t ldpk = (int64_t)KV * D, ldpv = a.ldv;
  const bf16* pk = a.pk + (int64_t)kh * D;
  const bf16* pv = a.pv + (int64_t)kh * a.vhs;
  // A thread loads rows r0 + k*rstep (k < kRows) of a tile. fetch reads the
  // pool rows of tile t's keys from the block table into pr; issue starts the
  // 16-byte copies of those rows into stage st (the caller commits).
  const int r0 = tid >> a.lg_tpr;
  auto fetch = [&](int t, int (&pr)[kRows]) {
    const int j0 = kbeg + t * kTK;
    const int nk = min(kTK, kend - j0);
#pragma unroll
    for (int k = 0; k < kRows; k++) {
      const int r = r0 + k * rstep;
      pr[k] = 0;
      if (r < nk) pr[k] = pool_row(a, tab, j0 + r);
    }
  };
  auto issue = [&](int t, int st, const int (&pr)[kRows]) {
    const int nk = min(kTK, kend - (kbeg + t * kTK));
    bf16* kd = Ks + st * kTK * ldk;
    bf16* vd = Vs + st * kTK * ldv;
#pragma unroll
    for (int k = 0; k < kRows; k++) {
      const int r = r0 + k * rstep;
      if (r < nk) {
        const bf16* ks = pk + (int64_t)pr[k] * ldpk;
        const bf16* vs = pv + (int64_t)pr[k] * ldpv;
        for (int c = sub; c < cprk; c += tpr) cp_async16(kd + r * ldk + c * 8, ks + c * 8);
        for (int c = sub; c < cprv; c += tpr) cp_async16(vd + r * ldv + c * 8, vs + c * 8);
      }
    }
    // Rows past the keys: V must be finite there (P is 0, but 0·NaN is not).
    // Plain stores: the stage is free, and a barrier comes before its use.
    for (int x = tid; x < (kTK - nk) * cprv; x += kNT) {
      const int r = nk + x / cprv, c = x - (x / cprv) * cprv;
      *reinterpret_cast<uint4*>(vd + r * ldv + c * 8) = make_uint4(0, 0, 0, 0);
    }
  };

  // K's padding columns D..D+7 meet q's zero columns when D % 16 == 8.
  if (D & 8)
    for (int x = tid; x < NS * kTK; x += kNT) *reinterpret_cast<uint4*>(Ks + x * ldk + D) = make_uint4(0, 0, 0, 0);

  // Prologue: tiles 0..NS-2 in flight, one commit group each (empty past the
  // last tile, so that group t is always tile t), their table lookups first
  // (all at once), then the lookups of tile NS-1.
  const int ntiles = (kend - kbeg + kTK - 1) / kTK;
  int prow[kRows];
  {
    int pre[NS - 1][kRows];
#pragma unroll
    for (int s = 0; s < NS - 1; s++)
      if (s < ntiles) fetch(s, pre[s]);
#pragma unroll
    for (int s = 0; s < NS - 1; s++) {
      if (s < ntiles) issue(s, s, pre[s]);
      cp_commit();
    }
  }
  if (NS - 1 < ntiles) fetch(NS - 1, prow);

  // q's A fragments: lane l holds rows l/4 and l/4+8, columns 2(l%4)+{0,1} and +8.
  for (int x = tid; x < ksteps * 32; x += kNT) {
    const int ks = x >> 5, l = x & 31, gr = l >> 2, k0 = ks * 16 + (l & 3) * 2;
    auto qv = [&](int g, int k) -> float {
      return g < gc && k < D ? a.q[(row * a.H + h0 + g) * D + k] * a.scale2 : 0.0f;
    };
    uint32_t h[4], w[4];
    split2(qv(gr, k0), qv(gr, k0 + 1), h[0], w[0]);
    split2(qv(gr + 8, k0), qv(gr + 8, k0 + 1), h[1], w[1]);
    split2(qv(gr, k0 + 8), qv(gr, k0 + 9), h[2], w[2]);
    split2(qv(gr + 8, k0 + 8), qv(gr + 8, k0 + 9), h[3], w[3]);
    uint4* dst = reinterpret_cast<uint4*>(qf + x * 8);
    dst[0] = make_uint4(h[0], h[1], h[2], h[3]);
    dst[1] = make_uint4(w[0], w[1], w[2], w[3]);
  }

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows lane/4, lane/4 + 8
  float o[NV][4];
#pragma unroll
  for (int nt = 0; nt < NV; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  const int kb = warp * 16;  // this warp's keys in a tile

  // st: tile t's stage (t mod NS); sn: the stage tile t+NS-1 goes to, the one
  // tile t-1 used.
  int st = 0, sn = NS - 1;
  for (int t = 0; t < ntiles; t++) {
    const int nk = min(kTK, kend - (kbeg + t * kTK));
    // Groups 0..t+NS-2 are committed; at most NS-2 pending means tile t is in.
    cp_wait<NS - 2>();
    __syncthreads();  // tile t is in for all threads; stage sn is free (every warp is past tile t-1)
    {
      const int tn = t + NS - 1;
      if (tn < ntiles) {
        issue(tn, sn, prow);
        if (tn + 1 < ntiles) fetch(tn + 1, prow);
      }
      cp_commit();
    }
    const int cur = st;
    st = st + 1 == NS ? 0 : st + 1;
    sn = sn + 1 == NS ? 0 : sn + 1;
    if (kb >= nk) continue;  // no keys for this warp in the last tile
    const bf16* kt = Ks + cur * kTK * ldk;
    const bf16* vt = Vs + cur * kTK * ldv;

    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    {
      const bf16* kp = kt + (kb + (lane & 7) + ((lane >> 4) << 3)) * ldk + ((lane >> 3) & 1) * 8;
      for (int ks = 0; ks < ksteps; ks++) {
        const uint4 qh = *reinterpret_cast<const uint4*>(qf + (ks * 32 + lane) * 8);
        const uint4 ql = *reinterpret_cast<const uint4*>(qf + (ks * 32 + lane) * 8 + 4);
        uint32_t kr[4];
        ldsm_x4(kr, kp + ks * 16);
        mma16816(s[0], qh.x, qh.y, qh.z, qh.w, kr[0], kr[1]);
        mma16816(s[0], ql.x, ql.y, ql.z, ql.w, kr[0], kr[1]);
        mma16816(s[1], qh.x, qh.y, qh.z, qh.w, kr[2], kr[3]);
        mma16816(s[1], ql.x, ql.y, ql.z, ql.w, kr[2], kr[3]);
      }
    }
    // Online softmax of rows lane/4 (elements 0, 1) and lane/4 + 8 (2, 3).
    const int kc = kb + (lane & 3) * 2;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          float& v = s[nt][hr * 2 + e];
          if (kc + nt * 8 + e >= nk) v = -INFINITY;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mn = fmaxf(m[hr], mx);
      const float mu = mn == -INFINITY ? 0.0f : mn;
      const float cr = exp2f(m[hr] - mu);
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          float& v = s[nt][hr * 2 + e];
          v = exp2f(v - mu);
          sum += v;
        }
      l[hr] = l[hr] * cr + sum;
      m[hr] = mn;
#pragma unroll
      for (int nt = 0; nt < NV; nt++) {
        o[nt][hr * 2] *= cr;
        o[nt][hr * 2 + 1] *= cr;
      }
    }
    // P (16 heads × this warp's 16 keys) as A fragments, hi and lo.
    uint32_t ph[4], pl[4];
    split2(s[0][0], s[0][1], ph[0], pl[0]);
    split2(s[0][2], s[0][3], ph[1], pl[1]);
    split2(s[1][0], s[1][1], ph[2], pl[2]);
    split2(s[1][2], s[1][3], ph[3], pl[3]);
    const bf16* vp = vt + (kb + (lane & 7) + ((lane >> 3) & 1) * 8) * ldv + (lane >> 4) * 8;
#pragma unroll
    for (int nt = 0; nt < NV; nt += 2) {
      if (nt < nvt) {
        uint32_t vr[4];
        ldsm_x4_t(vr, vp + nt * 8);
        mma16816(o[nt], ph[0], ph[1], ph[2], ph[3], vr[0], vr[1]);
        mma16816(o[nt], pl[0], pl[1], pl[2], pl[3], vr[0], vr[1]);
        mma16816(o[nt + 1], ph[0], ph[1], ph[2], ph[3], vr[2], vr[3]);
        mma16816(o[nt + 1], pl[0], pl[1], pl[2], pl[3], vr[2], vr[3]);
      }
    }
  }

  // Merge the 4 warps: each row's max M over warps, sums and outputs rescaled to it.
  const int gr = lane >> 2;
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
    l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
    if ((lane & 3) == 0) {
      mls[(warp * 16 + gr + hr * 8) * 2] = m[hr];
      mls[(warp * 16 + gr + hr * 8) * 2 + 1] = l[hr];
    }
  }
  __syncthreads();  // the tiles' memory is free from here on
  if (tid < kGMma) {
    float M = -INFINITY;
    for (int w = 0; w < 4; w++) M = fmaxf(M, mls[(w * 16 + tid) * 2]);
    float L = 0.0f;
    for (int w = 0; w < 4; w++) {
      const float mw = mls[(w * 16 + tid) * 2];
      if (mw != -INFINITY) L += mls[(w * 16 + tid) * 2 + 1] * exp2f(mw - M);
    }
    fin[tid * 2] = M;
    fin[tid * 2 + 1] = L;
  }
  float* red = reinterpret_cast<float*>(smem);  // [4][16][Dv]
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int g = gr + hr * 8;
    if (g < gc) {
      float M = -INFINITY;
      for (int w = 0; w < 4; w++) M = fmaxf(M, mls[(w * 16 + g) * 2]);
      const float f = m[hr] == -INFINITY ? 0.0f : exp2f(m[hr] - M);
#pragma unroll
      for (int nt = 0; nt < NV; nt++) {
        if (nt < nvt) {
          const int c = nt * 8 + (lane & 3) * 2;
          red[(warp * 16 + g) * Dv + c] = o[nt][hr * 2] * f;
          red[(warp * 16 + g) * Dv + c + 1] = o[nt][hr * 2 + 1] * f;
        }
      }
    }
  }
  __syncthreads();
  for (int x = tid; x < gc * Dv; x += kNT) {
    const int g = x / Dv, c = x - g * Dv, h = h0 + g;
    float ov = 0.0f;
    for (int w = 0; w < 4; w++) ov += red[(w * 16 + g) * Dv + c];
    const float M = fin[g * 2];
    if (a.splits == 1) {
      float L = fin[g * 2 + 1];
      if (a.sinks) {
        const float sk = a.sinks[h] * kLog2e;
        const float mn = fmaxf(M, sk);
        const float cr = exp2f(M - mn);
        L = L * cr + exp2f(sk - mn);
        ov *= cr;
      }
      put_out(a, (row * a.H + h) * Dv + c, ov / L);
    } else {
      a.wo[(((int64_t)b * a.H + h) * a.splits + split) * Dv + c] = ov;
    }
  }
  if (a.splits > 1 && tid < gc) {
    float* ml = a.wml + (((int64_t)b * a.H + h0 + tid) * a.splits + split) * 2;
    ml[0] = fin[tid * 2];
    ml[1] = fin[tid * 2 + 1];
  }
}

// ---- warp-split variant (PagedWarp) ----
//
// Built for bandwidth: no shared memory on the K/V path and few registers,
// so that 12-16 warps per SM keep their loads in flight (ncu on the two
// kernels above: 8-12 warps per SM, no eligible warp 49-67 % of the time).
// The CTA is the same (row, kv head, key range; 4 warps), but each warp owns
// every 4th 16-key chunk of the range with its own online softmax, and the 4
// warps merge once at the end. Per chunk a lane loads its parts of K and V
// straight from the pool into registers (16-byte loads) in the layouts the
// tensor cores take, by permuting the dot product's index (the sum over d
// does not care about order) and by letting each lane own real V columns:
//   Sᵀ [16 keys × 8 heads] = K [16 × D] · Qᵀ [D × 8]         (A = K, B = q)
//   Oᵀ [Dv × 8 heads]    += Vᵀ [Dv × 16 keys] · Pᵀ [16 × 8]  (A = Vᵀ, B = Pᵀ)
// Lane (g = lane/4, t = lane%4) loads K rows (keys) g and g+8, columns
// [t·D/4, (t+1)·D/4), of which k step s takes 4; and V rows (keys) 2t, 2t+1,
// 2t+8, 2t+9, columns [g·Dv/8, (g+1)·Dv/8), of which m tile i takes columns
// 2i (A row g) and 2i+1 (A row g+8), paired across keys by byte permutes.
// Sᵀ's accumulator (keys g, g+8 × heads 2t, 2t+1) becomes Pᵀ's B fragment
// (keys 2t.., head g) by movmatrix.trans. q and P enter the MMAs as bf16 (as
// in flash attention); K and V are the cache's bf16; all sums are float32.

constexpr int kWG = 8;  // query heads per CTA (the MMA's N)

__device__ __forceinline__ uint32_t movtrans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
  return bf2_bits(__floats2bfloat162_rn(lo, hi));
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// KD: 16-byte loads of one key's K per lane (D = 32·KD); MV: m tiles of 16
// V columns (Dv = 16·MV, MV 4 or 8: one or two 16-byte loads per key).
//
// NEW (mk_paged_decode_bf16; one new token a row, at pos[b]): the CTA reads
// its metadata and its warps' first K/V chunk from the pool before the
// programmatic-launch wait — keys below the new one were written by earlier
// steps, and the metadata is uploaded before the step's first kernel — so
// those loads may overlap the kernel before it (the q/k/v projection). After
// the wait it loads its q heads (and, where its range ends at the new key,
// that key and value) in one pass into shared memory, normalises and
// rotates them there (mk::norm_rope_head, the fast arithmetic of
// mk_norm_rope_f32), rounds the key and value to bf16, stores them (head
// chunk 0) and adds the key to warp 0's softmax from shared memory; the
// pool is read for keys [kbeg, pos) only. H200, against norm + RoPE, KV
// write and attention as three kernels (call 124): Qwen3-8l batch 1 level
// at 1k context, 2.7 % faster a step at 8k; batch 8–32 0.7–0.9 %.
template <int KD, int MV, bool NEW>
__global__ void __launch_bounds__(kNT, 4) paged_attn_warp(const AttnArgs a) {
  if constexpr (!NEW) mk::pdl_begin();
  constexpr int D = 32 * KD, Dv = 16 * MV, KS = D / 16, VL = MV / 4;
  static_assert(MV == 4 || MV == 8, "Dv 64 or 128");
  __shared__ float red[4][kWG][Dv];  // the warps' outputs, rescaled to the CTA's max
  __shared__ float mls[4][kWG][2];   // the warps' (max, sum) per head
  __shared__ uint2 qf[KS][32];       // q's B fragments
  // NEW: q's heads, raw then normed and rotated in place (row kWG: the new
  // key, then rounded to bf16), the new value (bf16-rounded), each warp's
  // norm scratch.
  __shared__ __align__(16) float nq[NEW ? kWG + 1 : 1][NEW ? D : 4];
  __shared__ float nv[NEW ? Dv : 1];
  __shared__ float scr[NEW ? 4 : 1][NEW ? D : 1];
  // NEW: the rotation's scaled cosines and sines at the row's position
  // (rope_cs), the norm weights.
  __shared__ float rc[NEW ? D / 2 : 1], rsn[NEW ? D / 2 : 1];
  __shared__ float nwq[NEW ? D : 1], nwk[NEW ? D : 1];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const CtaWork w = cta_work(a, kWG);
  const int split = w.split, b = w.b, kh = w.kh, h0 = w.h0, gc = w.gc, kbeg = w.kbeg;
  const int64_t row = w.row;
  const int32_t* tab = w.tab;
  if (kbeg >= w.kend) return;  // past the row's used ranges (row_split)
  const bool has_new = NEW && w.kend == w.i + 1;  // this range ends at the row's new key
  const int kend = has_new ? w.kend - 1 : w.kend;  // keys read from the pool

  const int64_t ldpk = (int64_t)a.KV * D, ldpv = a.ldv;
  const bf16* pk = a.pk + (int64_t)kh * D + t * (D / 4);
  const bf16* pv = a.pv + (int64_t)kh * a.vhs + g * (Dv / 8);
  // prow is the pool row of key j, or -1 past the range.
  auto prow = [&](int j) -> int {
    return j >= kend ? -1 : pool_row(a, tab, j);
  };
  // This lane's keys of chunk c: K rows g, g+8; V rows 2t, 2t+1, 2t+8, 2t+9.
  auto rows_of = [&](int c, int (&rk)[2], int (&rv)[4]) {
    const int j0 = kbeg + 16 * c;
    rk[0] = prow(j0 + g);
    rk[1] = prow(j0 + g + 8);
    rv[0] = prow(j0 + 2 * t);
    rv[1] = prow(j0 + 2 * t + 1);
    rv[2] = prow(j0 + 2 * t + 8);
    rv[3] = prow(j0 + 2 * t + 9);
  };
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 kr[2][KD], vr[4][VL];
  auto load_chunk = [&](const int (&rk)[2], const int (&rv)[4]) {
#pragma unroll
    for (int e = 0; e < 2; e++)
#pragma unroll
      for (int x = 0; x < KD; x++) kr[e][x] = rk[e] >= 0 ? mk::ld_stream(pk + (int64_t)rk[e] * ldpk + 8 * x) : zero;
#pragma unroll
    for (int e = 0; e < 4; e++)
#pragma unroll
      for (int x = 0; x < VL; x++) vr[e][x] = rv[e] >= 0 ? mk::ld_stream(pv + (int64_t)rv[e] * ldpv + 8 * x) : zero;
  };
  const int n = kend - kbeg, nch = (n + 15) >> 4;
  int rk[2], rv[4];
  if constexpr (NEW) {
    if (warp < nch) {  // the first chunk, under the previous kernel
      rows_of(warp, rk, rv);
      load_chunk(rk, rv);
    }
    mk::pdl_begin();
    // What the norm and rotation need besides q and k: the rotation's
    // scaled cosines and sines at the row's position, the norm weights.
    // (Read before the wait instead, they changed nothing: call 124.)
    const float fp = (float)a.rpos[row];
    for (int i = tid; i < a.rot_half; i += kNT) mk::rope_cs(i, fp, a.inv_freq, a.attn_factor, true, &rc[i], &rsn[i]);
    for (int d = tid; d < D; d += kNT) {
      if (a.qnw) nwq[d] = a.qnw[d];
      if (a.knw && has_new) nwk[d] = a.knw[d];
    }
    // All the prologue reads of the previous kernel's output, as one pass
    // of independent 16-byte loads into shared memory: q's heads (rows
    // 0..gc-1 of nq), and where this range ends at the new key, that key
    // (row kWG) and its value (nv, rounded to bf16 as the pool holds it).
    const int nh = gc + (has_new ? 1 : 0);
    constexpr int D4 = D / 4, Dv4 = Dv / 4;
    for (int x = tid; x < nh * D4; x += kNT) {
      const int hh = x / D4, c = x - hh * D4;
      const bool isk = hh == gc;
      const float* src = isk ? a.knew + (row * a.KV + kh) * D : a.q + (row * a.H + h0 + hh) * D;
      *reinterpret_cast<float4*>(&nq[isk ? kWG : hh][4 * c]) = *reinterpret_cast<const float4*>(src + 4 * c);
    }
    if (has_new) {
      for (int c = tid; c < Dv4; c += kNT) {
        const float4 v = *reinterpret_cast<const float4*>(a.vnew + (row * a.KV + kh) * Dv + 4 * c);
        nv[4 * c] = __bfloat162float(__float2bfloat16_rn(v.x));
        nv[4 * c + 1] = __bfloat162float(__float2bfloat16_rn(v.y));
        nv[4 * c + 2] = __bfloat162float(__float2bfloat16_rn(v.z));
        nv[4 * c + 3] = __bfloat162float(__float2bfloat16_rn(v.w));
      }
    }
    __syncthreads();
    // The norms and rotations, in place, from shared memory: warp w takes
    // heads w, w+4, … (index gc: the key, row kWG).
    for (int hh = warp; hh < nh; hh += 4) {
      const bool isk = hh == gc;
      float* r = nq[isk ? kWG : hh];
      const float* nw = isk ? (a.knw ? nwk : nullptr) : (a.qnw ? nwq : nullptr);
      mk::norm_rope_head(r, nw, scr[warp], r, D, a.rot_half, a.neox != 0, a.eps, true, lane,
                         [&](int i, float* c, float* sn) {
                           *c = rc[i];
                           *sn = rsn[i];
                         });
      __syncwarp();  // scr is the warp's next head's
    }
    __syncthreads();
    if (has_new) {
      const int64_t slot = a.slots[row];
      const bool writer = h0 == kh * a.G && slot >= 0;  // head chunk 0 stores the new key and value
      bf16* sk = const_cast<bf16*>(a.pk) + slot * ldpk + (int64_t)kh * D;
      bf16* sv = const_cast<bf16*>(a.pv) + slot * ldpv + (int64_t)kh * a.vhs;
      for (int c = tid; c < D; c += kNT) {
        const bf16 kb = __float2bfloat16_rn(nq[kWG][c]);
        nq[kWG][c] = __bfloat162float(kb);
        if (writer) sk[c] = kb;
      }
      if (writer)
        for (int c = tid; c < Dv; c += kNT) sv[c] = __float2bfloat16_rn(nv[c]);
    }
  }

  // q's B fragments, scaled by scale·log2 e, in shared memory (every warp
  // reads the same; registers are what limits the warps per SM): lane
  // (g, t) of k step s takes head g, d = t·D/4 + 4s + {0, 1} and + {2, 3}.
  for (int x = tid; x < KS * 32; x += kNT) {
    const int s = x >> 5, gl = (x & 31) >> 2, tl = x & 3;
    const float* qh = NEW ? &nq[gl < gc ? gl : 0][0] : a.q + (row * a.H + h0 + gl) * D;
    const float4 v = gl < gc ? *reinterpret_cast<const float4*>(qh + tl * (D / 4) + 4 * s)
                             : make_float4(0.f, 0.f, 0.f, 0.f);
    qf[s][x & 31] = make_uint2(pack_bf2(v.x * a.scale2, v.y * a.scale2), pack_bf2(v.z * a.scale2, v.w * a.scale2));
  }
  __syncthreads();
  // NEW: the new key's scores in warp 0, heads 2t and 2t+1 in lane (g, t)
  // (q rounded as the fragments round it: bf16 of q·scale·log2 e).
  float snew[2] = {0.0f, 0.0f};
  if (has_new && warp == 0) {
    float part = 0.0f;
    if (g < gc) {
      for (int d = t * (D / 4); d < (t + 1) * (D / 4); d++)
        part = fmaf(__bfloat162float(__float2bfloat16_rn(nq[g][d] * a.scale2)), nq[kWG][d], part);
    }
    part += __shfl_xor_sync(0xffffffffu, part, 1);
    part += __shfl_xor_sync(0xffffffffu, part, 2);
    snew[0] = __shfl_sync(0xffffffffu, part, (2 * t) * 4);
    snew[1] = __shfl_sync(0xffffffffu, part, (2 * t + 1) * 4);
  }

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // heads 2t, 2t+1 (l: this lane's keys)
  float o[MV][4];
#pragma unroll
  for (int mi = 0; mi < MV; mi++) o[mi][0] = o[mi][1] = o[mi][2] = o[mi][3] = 0.0f;
  if (!NEW && warp < nch) rows_of(warp, rk, rv);
  for (int c = warp; c < nch; c += 4) {
    if (!NEW || c != warp) load_chunk(rk, rv);
    if (c + 4 < nch) rows_of(c + 4, rk, rv);  // the next chunk's table lookups while these load

    // Sᵀ = K · Qᵀ: k step s takes words 2s (columns 2t, 2t+1) and 2s+1 (2t+8, 2t+9).
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
      const uint2 qb = qf[ks][lane];
      mma16816(s, word(kr[0][ks >> 1], (2 * ks) & 3), word(kr[1][ks >> 1], (2 * ks) & 3),
               word(kr[0][ks >> 1], (2 * ks + 1) & 3), word(kr[1][ks >> 1], (2 * ks + 1) & 3), qb.x, qb.y);
    }
    // s: (key g, head 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1).
    if (16 * c + g >= n) s[0] = s[1] = -INFINITY;
    if (16 * c + g + 8 >= n) s[2] = s[3] = -INFINITY;
#pragma unroll
    for (int e = 0; e < 2; e++) {
      float mx = fmaxf(s[e], s[e + 2]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const float mn = fmaxf(m[e], mx);  // finite: key 16c is in the range
      const float cr = exp2f(m[e] - mn);
      s[e] = exp2f(s[e] - mn);
      s[e + 2] = exp2f(s[e + 2] - mn);
      l[e] = l[e] * cr + s[e] + s[e + 2];
      m[e] = mn;
#pragma unroll
      for (int mi = 0; mi < MV; mi++) {
        o[mi][e] *= cr;
        o[mi][e + 2] *= cr;
      }
    }
    // Pᵀ's B fragments: keys 2t, 2t+1 (and +8) of head g.
    const uint32_t pb0 = movtrans(pack_bf2(s[0], s[1])), pb1 = movtrans(pack_bf2(s[2], s[3]));
    // Oᵀ += Vᵀ · Pᵀ: m tile mi is word mi of each key's V (low half: A row g, high: row g+8).
#pragma unroll
    for (int mi = 0; mi < MV; mi++) {
      const uint32_t w0 = word(vr[0][mi >> 2], mi & 3), w1 = word(vr[1][mi >> 2], mi & 3);
      const uint32_t w2 = word(vr[2][mi >> 2], mi & 3), w3 = word(vr[3][mi >> 2], mi & 3);
      mma16816(o[mi], __byte_perm(w0, w1, 0x5410), __byte_perm(w0, w1, 0x7632), __byte_perm(w2, w3, 0x5410),
               __byte_perm(w2, w3, 0x7632), pb0, pb1);
    }
  }

  // NEW: the new key joins warp 0's softmax (its value from shared memory:
  // columns g·Dv/8 + 2mi and + 1 of heads 2t + e are o[mi][e], o[mi][e+2]).
  if (has_new && warp == 0) {
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const float mn = fmaxf(m[e], snew[e]);
      const float cr = exp2f(m[e] - mn), p = exp2f(snew[e] - mn);
      l[e] = l[e] * cr + (g == 0 ? p : 0.0f);  // l is summed over g below: count p once
      m[e] = mn;
#pragma unroll
      for (int mi = 0; mi < MV; mi++) {
        o[mi][e] = fmaf(p, nv[g * (Dv / 8) + 2 * mi], o[mi][e] * cr);
        o[mi][e + 2] = fmaf(p, nv[g * (Dv / 8) + 2 * mi + 1], o[mi][e + 2] * cr);
      }
    }
  }

  // Merge the 4 warps: each head's max M over warps, outputs rescaled to it.
#pragma unroll
  for (int e = 0; e < 2; e++) {
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 4);
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 8);
    l[e] += __shfl_xor_sync(0xffffffffu, l[e], 16);
    if (g == 0) {
      mls[warp][2 * t + e][0] = m[e];
      mls[warp][2 * t + e][1] = l[e];
    }
  }
  __syncthreads();
#pragma unroll
  for (int e = 0; e < 2; e++) {
    const int h = 2 * t + e;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; w++) M = fmaxf(M, mls[w][h][0]);
    const float f = m[e] == -INFINITY ? 0.0f : exp2f(m[e] - M);
#pragma unroll
    for (int mi = 0; mi < MV; mi++) {
      red[warp][h][g * (Dv / 8) + 2 * mi] = o[mi][e] * f;
      red[warp][h][g * (Dv / 8) + 2 * mi + 1] = o[mi][e + 2] * f;
    }
  }
  __syncthreads();
  for (int x = tid; x < gc * Dv; x += kNT) {
    const int h = x / Dv, c = x - h * Dv;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < 4; w++) M = fmaxf(M, mls[w][h][0]);
    float ov = 0.0f, L = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; w++) {
      ov += red[w][h][c];
      const float mw = mls[w][h][0];
      if (mw != -INFINITY) L += mls[w][h][1] * exp2f(mw - M);
    }
    if (a.splits == 1) {
      if (a.sinks) {
        const float sk = a.sinks[h0 + h] * kLog2e;
        const float mn = fmaxf(M, sk);
        const float cr = exp2f(M - mn);
        L = L * cr + exp2f(sk - mn);
        ov *= cr;
      }
      put_out(a, (row * a.H + h0 + h) * Dv + c, ov / L);
    } else {
      a.wo[(((int64_t)b * a.H + h0 + h) * a.splits + split) * Dv + c] = ov;
      if (c == 0) {
        float* ml = a.wml + (((int64_t)b * a.H + h0 + h) * a.splits + split) * 2;
        ml[0] = M;
        ml[1] = L;
      }
    }
  }
}

// ---------------------------------------------------------------- big head dims
//
// paged_attn_big: head dims past the other kernels' 256, up to kBigMaxD for
// keys and kBigMaxDv for values — MLA's absorbed form (DeepSeek-V3: one KV
// head of 576 = latent 512 ‖ rope key 64, values the 512-wide latent, 128
// query heads on it). One CTA of 128 threads per (row, kv head, chunk of 16
// query heads, key split): q of the 16 heads in shared memory (float32,
// scaled by scale·log2 e), K and V tiles of 32 keys double-buffered with
// cp.async through the block table, everything float32 on the CUDA cores.
// Scores: thread (head h = tid/8, kk = tid%8) takes keys kk, kk+8, kk+16,
// kk+24 of the tile; its head's 8 threads reduce the tile's max and sum by
// shuffles (online softmax, base 2). P·V: thread t owns value columns
// 4t..4t+3 of all 16 heads (64 accumulators). Splits and the merge are
// paged_attn's (wo, wml; paged_attn_merge). Written in session 13 (no GPU
// left that session): kernels/decode_test.go's mla_* and big_* cases check
// it against the float64 reference.
constexpr int kBigGM = 16;    // query heads per CTA
constexpr int kBigTK = 32;    // keys per tile
constexpr int kBigMaxD = 768;  // key head dim at most (shared memory: smem_big)
constexpr int kBigMaxDv = 512;  // value head dim at most: 4 columns per thread
static_assert(kBigGM * 8 == kNT, "scores: 8 threads per query head");
static_assert(4 * kNT >= kBigMaxDv && kBigTK == 32, "P·V: 4 value columns per thread; scores: keys kk + 8u, u < 4");

// big_dims reports whether a shape needs paged_attn_big.
__host__ __device__ inline bool big_dims(int D, int Dv) { return D > 256 || Dv > 256; }

// Shared memory of paged_attn_big: Ks [2][kBigTK][D+8] bf16 | Vs [2][kBigTK][Dv+8] bf16 |
// qs [kBigGM][D] f32 | S [kBigGM][kBigTK] f32 | corr, mfin, lfin [kBigGM] | prow [2][kBigTK] int.
__host__ __device__ inline size_t smem_big(int D, int Dv) {
  return (size_t)2 * kBigTK * ((D + 8) + (Dv + 8)) * sizeof(bf16) +
         sizeof(float) * ((size_t)kBigGM * D + kBigGM * kBigTK + 3 * kBigGM) + sizeof(int) * 2 * kBigTK;
}

__global__ void __launch_bounds__(kNT) paged_attn_big(const AttnArgs a) {
  mk::pdl_begin();
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = a.D, Dv = a.Dv, ldk = D + 8, ldv = Dv + 8;
  bf16* Ks = reinterpret_cast<bf16*>(smem);
  bf16* Vs = Ks + 2 * kBigTK * ldk;
  float* qs = reinterpret_cast<float*>(Vs + 2 * kBigTK * ldv);
  float* S = qs + kBigGM * D;
  float* corr = S + kBigGM * kBigTK;
  float* mfin = corr + kBigGM;
  float* lfin = mfin + kBigGM;
  int* prow = reinterpret_cast<int*>(lfin + kBigGM);

  const int tid = threadIdx.x;
  const CtaWork w = cta_work(a, kBigGM);
  if (w.kbeg >= w.kend) return;  // past the row's used ranges (row_split)
  const int kbeg = w.kbeg, kend = w.kend;
  const int64_t ldpk = (int64_t)a.KV * D, ldpv = a.ldv;
  const bf16* pk = a.pk + (int64_t)w.kh * D;
  const bf16* pv = a.pv + (int64_t)w.kh * a.vhs;
  const int cprk = D >> 3, cprv = Dv >> 3;  // 16-byte chunks per K / V row
  const int n = kend - kbeg, ntiles = (n + kBigTK - 1) / kBigTK;

  // rows_of puts the pool rows of tile t's keys (-1 past the range) in
  // prow[st]; issue starts the copies of those rows into stage st.
  auto rows_of = [&](int t, int st) {
    if (tid < kBigTK) {
      const int j = kbeg + t * kBigTK + tid;
      prow[st * kBigTK + tid] = j < kend ? pool_row(a, w.tab, j) : -1;
    }
  };
  auto issue = [&](int st) {
    bf16* kd = Ks + st * kBigTK * ldk;
    bf16* vd = Vs + st * kBigTK * ldv;
    for (int x = tid; x < kBigTK * cprk; x += kNT) {
      const int r = x / cprk, c = x - r * cprk;
      const int pr = prow[st * kBigTK + r];
      if (pr >= 0) cp_async16(kd + r * ldk + c * 8, pk + (int64_t)pr * ldpk + c * 8);
    }
    for (int x = tid; x < kBigTK * cprv; x += kNT) {
      const int r = x / cprv, c = x - r * cprv;
      const int pr = prow[st * kBigTK + r];
      if (pr >= 0) cp_async16(vd + r * ldv + c * 8, pv + (int64_t)pr * ldpv + c * 8);
    }
    cp_commit();
  };

  rows_of(0, 0);
  __syncthreads();
  issue(0);
  for (int x = tid; x < kBigGM * D; x += kNT) {
    const int g = x / D, c = x - g * D;
    qs[x] = g < w.gc ? a.q[(w.row * a.H + w.h0 + g) * D + c] * a.scale2 : 0.0f;
  }

  const int h = tid >> 3, kk = tid & 7;  // the scores' head and key lane
  float mrun = -INFINITY, lrun = 0.0f;   // head h's softmax state, the same in its 8 threads
  const int c0 = 4 * tid;                // P·V: value columns c0..c0+3 of every head
  float acc[kBigGM][4];
#pragma unroll
  for (int g = 0; g < kBigGM; g++) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.0f;

  for (int t = 0; t < ntiles; t++) {
    const int st = t & 1;
    const int nk = min(kBigTK, n - t * kBigTK);
    if (t + 1 < ntiles) rows_of(t + 1, st ^ 1);  // stage st^1's last copies were issued a tile ago
    cp_wait_all();
    __syncthreads();  // tile t (and q) in; prow[st^1] written; P·V of t-1 done with stage st^1
    if (t + 1 < ntiles) issue(st ^ 1);

    // Scores of head h for keys kk + 8u, the tile's softmax step for head h.
    {
      const bf16* kb = Ks + st * kBigTK * ldk;
      const float* qh = qs + h * D;
      float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int c = 0; c < cprk; c++) {
        const float4 qa = *reinterpret_cast<const float4*>(qh + c * 8);
        const float4 qb = *reinterpret_cast<const float4*>(qh + c * 8 + 4);
#pragma unroll
        for (int u = 0; u < 4; u++) {
          const uint4 raw = *reinterpret_cast<const uint4*>(kb + (kk + 8 * u) * ldk + c * 8);
          float v = sc[u];
          v = fmaf(qa.x, bf_lo(raw.x), v);
          v = fmaf(qa.y, bf_hi(raw.x), v);
          v = fmaf(qa.z, bf_lo(raw.y), v);
          v = fmaf(qa.w, bf_hi(raw.y), v);
          v = fmaf(qb.x, bf_lo(raw.z), v);
          v = fmaf(qb.y, bf_hi(raw.z), v);
          v = fmaf(qb.z, bf_lo(raw.w), v);
          v = fmaf(qb.w, bf_hi(raw.w), v);
          sc[u] = v;
        }
      }
#pragma unroll
      for (int u = 0; u < 4; u++)
        if (kk + 8 * u >= nk) sc[u] = -INFINITY;  // past the range (those rows were not loaded)
      float mx = fmaxf(fmaxf(sc[0], sc[1]), fmaxf(sc[2], sc[3]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float mn = fmaxf(mrun, mx);  // finite: key 0 of the tile is in the range
      const float cr = exp2f(mrun - mn);  // 0 on the first tile
      float ps = 0.0f;
#pragma unroll
      for (int u = 0; u < 4; u++) {
        const float p = exp2f(sc[u] - mn);
        S[h * kBigTK + kk + 8 * u] = p;
        ps += p;
      }
      ps += __shfl_xor_sync(0xffffffffu, ps, 1);
      ps += __shfl_xor_sync(0xffffffffu, ps, 2);
      ps += __shfl_xor_sync(0xffffffffu, ps, 4);
      lrun = lrun * cr + ps;
      mrun = mn;
      if (kk == 0) corr[h] = cr;
    }
    __syncthreads();

    // acc = acc·corr + P·V over the tile's nk keys.
    if (c0 < Dv) {
#pragma unroll
      for (int g = 0; g < kBigGM; g++) {
        const float cr = corr[g];
        acc[g][0] *= cr;
        acc[g][1] *= cr;
        acc[g][2] *= cr;
        acc[g][3] *= cr;
      }
      const bf16* vb = Vs + st * kBigTK * ldv + c0;
      for (int j = 0; j < nk; j++) {
        const uint2 raw = *reinterpret_cast<const uint2*>(vb + j * ldv);
        const float v0 = bf_lo(raw.x), v1 = bf_hi(raw.x), v2 = bf_lo(raw.y), v3 = bf_hi(raw.y);
#pragma unroll
        for (int g = 0; g < kBigGM; g++) {
          const float p = S[g * kBigTK + j];
          acc[g][0] = fmaf(p, v0, acc[g][0]);
          acc[g][1] = fmaf(p, v1, acc[g][1]);
          acc[g][2] = fmaf(p, v2, acc[g][2]);
          acc[g][3] = fmaf(p, v3, acc[g][3]);
        }
      }
    }
  }

  if (kk == 0) {
    mfin[h] = mrun;
    lfin[h] = lrun;
  }
  __syncthreads();
  if (c0 >= Dv) return;
#pragma unroll
  for (int g = 0; g < kBigGM; g++) {
    if (g >= w.gc) continue;
    const float M = mfin[g];
    float L = lfin[g];
    if (a.splits == 1) {
      float f = 1.0f;
      if (a.sinks) {
        const float sk = a.sinks[w.h0 + g] * kLog2e;
        const float mn = fmaxf(M, sk);
        f = exp2f(M - mn);
        L = L * f + exp2f(sk - mn);
      }
      const float inv = f / L;
#pragma unroll
      for (int q = 0; q < 4; q++) put_out(a, (w.row * a.H + w.h0 + g) * Dv + c0 + q, acc[g][q] * inv);
    } else {
      float* o = a.wo + (((int64_t)w.b * a.H + w.h0 + g) * a.splits + w.split) * Dv + c0;
#pragma unroll
      for (int q = 0; q < 4; q++) o[q] = acc[g][q];
      if (c0 == 0) {
        float* ml = a.wml + (((int64_t)w.b * a.H + w.h0 + g) * a.splits + w.split) * 2;
        ml[0] = M;
        ml[1] = L;
      }
    }
  }
}

// ---------------------------------------------------------------- MLA on tensor cores
//
// paged_attn_mla: MLA's absorbed decode at DeepSeek-V2/V3's (and Kimi K2's)
// dims — one KV head of D = 576 (latent 512 ‖ rope key 64), values the
// 512-wide latent, many query heads on it — on the tensor cores (mma.sync
// m16n8k16, bf16 operands, float32 accumulators). paged_attn_big does this
// on the CUDA cores at 35 GB/s (H200, 128 heads, 1k context: 66 µs a
// layer): 64 query heads against one key are 2·64·(576 + 512) flops per
// 2 KB of K/V, a GEMM rather than a stream.
//
// One CTA of 8 warps per (row, kv head, chunk of 64 query heads, key split).
// Warps w and w+4 share the 16 heads 16·(w%4)..: warp w takes the first
// half of the score reduction (dims 0..287) and value columns 0..255, warp
// w+4 the second half of both. Per tile of 32 keys, each warp's partial
// scores [16 heads × 32 keys] go through shared memory to its partner (a
// named barrier per pair); both add the halves in the same order (the same
// sums, so the same softmax in both) and each multiplies the bf16 P by its
// 256 value columns (128 accumulators a thread). q (scaled by scale·log2 e,
// rounded to bf16), K and V sit in XOR-swizzled shared memory (ldmatrix
// without bank conflicts); K/V tiles are double-buffered with cp.async
// through the block table, rows past the range zero-filled. The running max
// is raised lazily (by more than kMlaSlack), as in flash.cu. Splits and the
// merge are paged_attn's (wo, wml; paged_attn_merge).
constexpr int kMlaD = 576, kMlaDv = 512;
constexpr int kMlaNT = 256;  // threads: 8 warps
constexpr int kMlaGM = 64;   // query heads per CTA: 4 pairs of warps × 16
constexpr int kMlaTK = 32;   // keys per tile: 4 n-tiles of 8
constexpr int kMlaWQ = kMlaD / 8, kMlaWV = kMlaDv / 8;  // 16-byte chunks per Q/K row, per V row
constexpr int kMlaKS = kMlaD / 32;                      // 16-wide k-steps in half of the scores (18)
constexpr int kMlaNO = kMlaDv / 16;                     // 8-wide n-tiles in half of the values (32)
constexpr float kMlaSlack = 8.0f;
static_assert(kMlaWQ % 8 == 0 && kMlaWV % 8 == 0, "whole swizzle groups of 8 chunks");
static_assert(kMlaD % 32 == 0 && kMlaDv % 32 == 0 && kMlaTK == 32, "halves of whole k-steps and n-pairs");
static_assert(kMlaGM == 16 * (kMlaNT / 64), "a pair of warps per 16 heads");

// mla_dims reports whether paged_attn_mla has these head dims.
__host__ __device__ inline bool mla_dims(int D, int Dv) { return D == kMlaD && Dv == kMlaDv; }

// Shared memory of paged_attn_mla: Qs [64][576] | Ks [2][32][576] | Vs [2][32][512] bf16 |
// Sx [8 warps][4 n-tiles][32 lanes][4] f32 | prow [2][32] int (229 632 bytes).
constexpr size_t kMlaSmem = sizeof(bf16) * ((size_t)kMlaGM * kMlaD + 2 * kMlaTK * (kMlaD + kMlaDv)) +
                            sizeof(float) * 8 * 4 * 32 * 4 + sizeof(int) * 2 * kMlaTK;

__device__ __forceinline__ void cp_async16z(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a)
               : "memory");
}
__device__ __forceinline__ uint32_t pack_bf(float lo, float hi) { return bf2_bits(__floats2bfloat162_rn(lo, hi)); }

// mla_off is the byte offset of 16-byte chunk c of row r in a swizzled tile
// of W chunks a row: chunk c lands at c ^ (r & 7) within its group of 8, so
// the 8 rows one ldmatrix phase reads hit 8 different bank groups.
template <int W>
__device__ __forceinline__ uint32_t mla_off(int r, int c) {
  return (uint32_t)(r * W + (c ^ (r & 7))) * 16u;
}

// mla_scores accumulates this warp's half HALF of S = Q·Kᵀ over a tile into
// s [4 n-tiles][4] (C fragments: heads g, g+8; keys 8ni + 2t4 + {0,1}).
// qa/ka are the lane's ldmatrix bases (rows fixed, chunk 0); every chunk a
// lane reads is c ^ (lane & 7) with c even + sub, so its swizzle is an XOR
// of the k-step's even chunk with a per-lane constant.
template <int HALF>
__device__ __forceinline__ void mla_scores(float (&s)[4][4], uint32_t qa, uint32_t ka, int lane) {
  const int key = lane & 7, qsub = lane >> 4, ksub = (lane >> 3) & 1;
#pragma unroll
  for (int k = 0; k < kMlaKS; k++) {
    const int c = 2 * (HALF * kMlaKS + k);  // the k-step's first chunk (even)
    uint32_t a[4], b[4], b2[4];
    ldsm4(a, qa + 16u * (uint32_t)((c + qsub) ^ key));
    ldsm4(b, ka + 16u * (uint32_t)((c + ksub) ^ key));                     // keys 0-15
    ldsm4(b2, ka + 16u * (uint32_t)((c + ksub) ^ key) + 16u * 16 * kMlaWQ);  // keys 16-31
    mma16816(s[0], a[0], a[1], a[2], a[3], b[0], b[1]);
    mma16816(s[1], a[0], a[1], a[2], a[3], b[2], b[3]);
    mma16816(s[2], a[0], a[1], a[2], a[3], b2[0], b2[1]);
    mma16816(s[3], a[0], a[1], a[2], a[3], b2[2], b2[3]);
  }
}

// VK: the values are the keys' first 512 columns (a.pv == a.pk): no V
// tiles, P·V reads the K tile (its rows kMlaWQ chunks apart).
template <bool VK>
__global__ void __launch_bounds__(kMlaNT, 1) paged_attn_mla(const AttnArgs a) {
  mk::pdl_begin();
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);
  bf16* Ks = Qs + kMlaGM * kMlaD;
  bf16* Vs = Ks + 2 * kMlaTK * kMlaD;
  float* Sx = reinterpret_cast<float*>(Vs + 2 * kMlaTK * kMlaDv);
  int* prow = reinterpret_cast<int*>(Sx + 8 * 4 * 32 * 4);
  const uint32_t sQ = (uint32_t)__cvta_generic_to_shared(Qs), sK = (uint32_t)__cvta_generic_to_shared(Ks),
                 sV = (uint32_t)__cvta_generic_to_shared(Vs);
  constexpr uint32_t kStK = kMlaTK * kMlaD * 2, kStV = kMlaTK * kMlaDv * 2;  // bytes per stage

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const CtaWork w = cta_work(a, kMlaGM);
  if (w.kbeg >= w.kend) return;  // past the row's used ranges (row_split)
  const int kbeg = w.kbeg, n = w.kend - w.kbeg, ntiles = (n + kMlaTK - 1) / kMlaTK;
  const int64_t ldpk = (int64_t)a.KV * kMlaD, ldpv = a.ldv;
  const bf16* pk = a.pk + (int64_t)w.kh * kMlaD;
  const bf16* pv = a.pv + (int64_t)w.kh * a.vhs;

  auto rows_of = [&](int t, int st) {
    if (tid < kMlaTK) {
      const int j = t * kMlaTK + tid;
      prow[st * kMlaTK + tid] = j < n ? pool_row(a, w.tab, kbeg + j) : -1;
    }
  };
  // issue starts the copies of stage st's rows (zeros past the range: P·V
  // multiplies them by 0, which must not meet NaN bit patterns).
  auto issue = [&](int st) {
    for (int x = tid; x < kMlaTK * kMlaWQ; x += kMlaNT) {
      const int r = x / kMlaWQ, c = x - r * kMlaWQ;
      const int pr = prow[st * kMlaTK + r];
      cp_async16z(sK + st * kStK + mla_off<kMlaWQ>(r, c), pr >= 0 ? pk + (int64_t)pr * ldpk + c * 8 : pk,
                  pr >= 0 ? 16 : 0);
    }
    if constexpr (!VK) {
      for (int x = tid; x < kMlaTK * kMlaWV; x += kMlaNT) {
        const int r = x / kMlaWV, c = x - r * kMlaWV;
        const int pr = prow[st * kMlaTK + r];
        cp_async16z(sV + st * kStV + mla_off<kMlaWV>(r, c), pr >= 0 ? pv + (int64_t)pr * ldpv + c * 8 : pv,
                    pr >= 0 ? 16 : 0);
      }
    }
    cp_commit();
  };

  rows_of(0, 0);
  __syncthreads();
  issue(0);
  // q of the CTA's heads, scaled into log2 units, bf16 (zeros past gc).
  for (int x = tid; x < kMlaGM * kMlaWQ; x += kMlaNT) {
    const int g = x / kMlaWQ, c = x - g * kMlaWQ;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (g < w.gc) {
      const float4* src = reinterpret_cast<const float4*>(a.q + (w.row * a.H + w.h0 + g) * kMlaD + c * 8);
      const float4 lo = src[0], hi = src[1];
      const float s2 = a.scale2;
      v = make_uint4(pack_bf(lo.x * s2, lo.y * s2), pack_bf(lo.z * s2, lo.w * s2), pack_bf(hi.x * s2, hi.y * s2),
                     pack_bf(hi.z * s2, hi.w * s2));
    }
    *reinterpret_cast<uint4*>(smem + mla_off<kMlaWQ>(g, c)) = v;
  }

  const int pair = warp & 3, half = warp >> 2, g = lane >> 2, t4 = lane & 3;
  // ldmatrix bases (chunk 0): A rows are the pair's 16 heads; K rows keys
  // 0-15 (lanes 16-31: keys 8-15); V rows keys 0-15 for ldmatrix.trans.
  const uint32_t qa = sQ + (uint32_t)(16 * pair + (lane & 15)) * kMlaWQ * 16;
  const uint32_t ka0 = sK + (uint32_t)((lane & 7) + ((lane >> 4) << 3)) * kMlaWQ * 16;
  constexpr int kVW = VK ? kMlaWQ : kMlaWV;          // chunks per row of the tile holding V
  constexpr uint32_t kVSt = VK ? kStK : kStV;          // its bytes per stage
  const int vr = (lane & 7) + (((lane >> 3) & 1) << 3), vsub = lane >> 4;
  const uint32_t va0 = (VK ? sK : sV) + (uint32_t)vr * kVW * 16;

  float o[kMlaNO][4];
#pragma unroll
  for (int i = 0; i < kMlaNO; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float4* mine = reinterpret_cast<float4*>(Sx) + warp * 128;
  const float4* theirs = reinterpret_cast<const float4*>(Sx) + (warp ^ 4) * 128;

  for (int t = 0; t < ntiles; t++) {
    const int st = t & 1;
    if (t + 1 < ntiles) rows_of(t + 1, st ^ 1);
    cp_wait_all();
    __syncthreads();  // tile t and q in; prow[st^1] written; the last tile done with stage st^1
    if (t + 1 < ntiles) issue(st ^ 1);

    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
    if (half == 0)
      mla_scores<0>(s, qa, ka0 + st * kStK, lane);
    else
      mla_scores<1>(s, qa, ka0 + st * kStK, lane);
#pragma unroll
    for (int i = 0; i < 4; i++) mine[i * 32 + lane] = make_float4(s[i][0], s[i][1], s[i][2], s[i][3]);
    asm volatile("bar.sync %0, 64;\n" ::"r"(1 + pair) : "memory");
    const int nk = min(kMlaTK, n - t * kMlaTK);
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float4 p = theirs[i * 32 + lane];
      // The first half plus the second, in that order in both warps.
      if (half == 0) {
        s[i][0] += p.x, s[i][1] += p.y, s[i][2] += p.z, s[i][3] += p.w;
      } else {
        s[i][0] = p.x + s[i][0], s[i][1] = p.y + s[i][1], s[i][2] = p.z + s[i][2], s[i][3] = p.w + s[i][3];
      }
#pragma unroll
      for (int e = 0; e < 4; e++)
        if (8 * i + 2 * t4 + (e & 1) >= nk) s[i][e] = -INFINITY;
    }

    // Online softmax over the tile (log2 units), the max raised lazily.
    float mx[2];
    bool raise = false;
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      float v = -INFINITY;
#pragma unroll
      for (int i = 0; i < 4; i++) v = fmaxf(v, fmaxf(s[i][2 * hh], s[i][2 * hh + 1]));
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
      v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
      mx[hh] = v;
      raise = raise || v > m[hh] + kMlaSlack;
    }
    if (__any_sync(0xffffffffu, raise)) {
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const float mn = fmaxf(m[hh], mx[hh]);
        const float cr = mn == -INFINITY ? 1.0f : exp2f(m[hh] - mn);
        m[hh] = mn;
        l[hh] *= cr;
#pragma unroll
        for (int i = 0; i < kMlaNO; i++) {
          o[i][2 * hh] *= cr;
          o[i][2 * hh + 1] *= cr;
        }
      }
    }
    uint32_t pa[2][4];
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const float base = m[hh] == -INFINITY ? 0.0f : m[hh];
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; i++) {
        s[i][2 * hh] = exp2f(s[i][2 * hh] - base);
        s[i][2 * hh + 1] = exp2f(s[i][2 * hh + 1] - base);
        sum += s[i][2 * hh] + s[i][2 * hh + 1];
      }
      l[hh] += sum;
    }
#pragma unroll
    for (int kj = 0; kj < 2; kj++) {
      pa[kj][0] = pack_bf(s[2 * kj][0], s[2 * kj][1]);
      pa[kj][1] = pack_bf(s[2 * kj][2], s[2 * kj][3]);
      pa[kj][2] = pack_bf(s[2 * kj + 1][0], s[2 * kj + 1][1]);
      pa[kj][3] = pack_bf(s[2 * kj + 1][2], s[2 * kj + 1][3]);
    }

    // O += P·V over this warp's 256 value columns (chunks 32·half ..).
    const uint32_t vb = va0 + st * kVSt;
#pragma unroll
    for (int kj = 0; kj < 2; kj++) {
#pragma unroll
      for (int dp = 0; dp < kMlaNO / 2; dp++) {
        const int c = 32 * half + 2 * dp + vsub;  // chunk of value columns 8c..8c+7
        uint32_t b[4];
        ldsm4t(b, vb + (uint32_t)kj * 16 * kVW * 16 + 16u * (uint32_t)(c ^ (lane & 7)));
        mma16816(o[2 * dp], pa[kj][0], pa[kj][1], pa[kj][2], pa[kj][3], b[0], b[1]);
        mma16816(o[2 * dp + 1], pa[kj][0], pa[kj][1], pa[kj][2], pa[kj][3], b[2], b[3]);
      }
    }
  }

  // Each row's sum over its quad; then the outputs (heads g, g+8 of the pair).
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 1);
    l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 2);
  }
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int hl = 16 * pair + g + 8 * hh;  // the head within the CTA's chunk
    if (hl >= w.gc) continue;
    const int h = w.h0 + hl;
    const int c0 = 256 * half + 2 * t4;
    if (a.splits == 1) {
      float f = 1.0f, L = l[hh];
      if (a.sinks) {
        const float sk = a.sinks[h] * kLog2e;
        const float mn = fmaxf(m[hh], sk);
        f = exp2f(m[hh] - mn);
        L = L * f + exp2f(sk - mn);
      }
      const float inv = f / L;
      float* out = a.out + (w.row * a.H + h) * kMlaDv + c0;
#pragma unroll
      for (int i = 0; i < kMlaNO; i++) {
        const float v0 = o[i][2 * hh] * inv, v1 = o[i][2 * hh + 1] * inv;
        *reinterpret_cast<float2*>(out + 8 * i) = make_float2(v0, v1);
        if (a.outb)
          *reinterpret_cast<uint32_t*>(a.outb + (w.row * a.H + h) * kMlaDv + c0 + 8 * i) = pack_bf(v0, v1);
      }
    } else {
      float* wo = a.wo + (((int64_t)w.b * a.H + h) * a.splits + w.split) * kMlaDv + c0;
#pragma unroll
      for (int i = 0; i < kMlaNO; i++) *reinterpret_cast<float2*>(wo + 8 * i) = make_float2(o[i][2 * hh], o[i][2 * hh + 1]);
      if (half == 0 && t4 == 0) {
        float* ml = a.wml + (((int64_t)w.b * a.H + h) * a.splits + w.split) * 2;
        ml[0] = m[hh];
        ml[1] = l[hh];
      }
    }
  }
}

// merge_weights is the first step of both merges: for row b and head h,
// the first warp writes each used range's weight exp2(max_s − max) to w
// and 1 / (Σ weight·sum, plus the sink) to inv. It returns the used ranges
// (row_split: the rest wrote nothing); the caller syncs before reading.
__device__ __forceinline__ int merge_weights(const AttnArgs& a, int b, int h, float* w, float* inv) {
  const int S = row_split(a, a.pos[b]).used;
  const float* ml = a.wml + ((int64_t)b * a.H + h) * a.splits * 2;
  if (threadIdx.x < 32) {
    float m = -INFINITY;
    for (int s = threadIdx.x; s < S; s += 32) m = fmaxf(m, ml[2 * s]);
    m = warp_max(m);
    float sk = -INFINITY;
    if (a.sinks) {
      sk = a.sinks[h] * kLog2e;
      m = fmaxf(m, sk);
    }
    float l = 0.0f;
    for (int s = threadIdx.x; s < S; s += 32) {
      const float ms = ml[2 * s];
      const float ws = ms == -INFINITY ? 0.0f : exp2f(ms - m);
      w[s] = ws;
      l += ws * ml[2 * s + 1];
    }
    l = warp_sum(l);
    if (a.sinks) l += exp2f(sk - m);
    if (threadIdx.x == 0) *inv = 1.0f / l;
  }
  return S;
}

// merge: one CTA per (row, head, 128 value columns) combines the splits' partial outputs by
// log-sum-exp, with the sink in the denominator.
__global__ void __launch_bounds__(kNT) paged_attn_merge(const AttnArgs a) {
  mk::pdl_begin();
  __shared__ float w[kMaxSplits];
  __shared__ float inv;
  const int b = blockIdx.x, h = blockIdx.y, Dv = a.Dv;
  const int S = merge_weights(a, b, h, w, &inv);
  const int64_t row = a.rows[b];
  __syncthreads();
  const float* o = a.wo + ((int64_t)b * a.H + h) * a.splits * Dv;
  for (int c = blockIdx.z * kNT + threadIdx.x; c < Dv; c += kNT * gridDim.z) {
    float v = 0.0f;
    // Unrolled so that several splits' loads are in flight at once.
#pragma unroll 8
    for (int s = 0; s < S; s++) v = fmaf(w[s], o[(int64_t)s * Dv + c], v);
    put_out(a, (row * a.H + h) * Dv + c, v * inv);
  }
}

// paged_attn_merge4 (the default where Dv is a multiple of 4;
// MK_PAGED_MERGE=1 keeps paged_attn_merge): the same merge with its splits
// spread over the CTA's 4 warps — warp w sums splits w, w+4, … of 128 value
// columns (a float4 a lane, 4 splits' loads in flight), and the 4 partial
// sums meet in shared memory in warp order. The one-warp-per-column merge
// walks all the splits in one thread (16 dependent rounds of 8 loads at
// 128 splits); this one walks a quarter of them with 4× wider loads. H200,
// batch 1 (kernels.test -bench PagedAttn, two alternations): warp 4k / 16k /
// 32k 21.5 / 34.5 / 50.5 → 18.2 / 31.2 / 47.5 µs, mla 4k 31.0 → 28.6 µs.
// EARLY (at ≤ mk::res_rows() rows; MK_MERGE_EARLY=0 turns it off): the next kernel's
// CTAs launch before this one waits, so a weight-resident o GEMV
// (gemv.cu) streams its rows into shared memory under the attention kernel.
template <bool EARLY>
__global__ void __launch_bounds__(kNT) paged_attn_merge4(const AttnArgs a) {
  if constexpr (EARLY)
    mk::pdl_begin_early();
  else
    mk::pdl_begin();
  __shared__ float w[kMaxSplits];
  __shared__ float inv;
  __shared__ float4 part[4][32];
  const int b = blockIdx.x, h = blockIdx.y, Dv = a.Dv;
  const int S = merge_weights(a, b, h, w, &inv);
  const int64_t row = a.rows[b];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  const float* o = a.wo + ((int64_t)b * a.H + h) * a.splits * Dv;
  const int c = blockIdx.z * kNT + 4 * lane;  // this lane's 4 columns
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c < Dv) {
#pragma unroll 4
    for (int s = warp; s < S; s += 4) {
      const float4 v = *reinterpret_cast<const float4*>(o + (int64_t)s * Dv + c);
      const float ws = w[s];
      acc.x = fmaf(ws, v.x, acc.x);
      acc.y = fmaf(ws, v.y, acc.y);
      acc.z = fmaf(ws, v.z, acc.z);
      acc.w = fmaf(ws, v.w, acc.w);
    }
  }
  part[warp][lane] = acc;
  __syncthreads();
  if (warp != 0 || c >= Dv) return;
  float4 t = part[0][lane];
#pragma unroll
  for (int q = 1; q < 4; q++) {
    const float4 u = part[q][lane];
    t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;
  }
  const float f = inv;
  const int64_t i = (row * a.H + h) * Dv + c;
  put_out(a, i, t.x * f);
  put_out(a, i + 1, t.y * f);
  put_out(a, i + 2, t.z * f);
  put_out(a, i + 3, t.w * f);
}

__global__ void kv_write_bf16(bf16* pk, bf16* pv, const float* k, const float* v, const int32_t* slots,
                              int64_t n, int64_t kw, int64_t vw) {
  mk::pdl_begin();
  const int64_t w = kw + vw;
  for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < n * w;
       x += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = x / w, c = x - i * w;
    const int64_t s = slots[i];
    if (s < 0) continue;  // a row of another pool
    if (c < kw) pk[s * kw + c] = __float2bfloat16_rn(k[i * kw + c]);
    else pv[s * vw + c - kw] = __float2bfloat16_rn(v[i * vw + c - kw]);
  }
}

// kv_write_bf16_v4 is kv_write_bf16 four values a thread (16-byte loads,
// 8-byte stores), a CTA a row at a time: for widths that are multiples of 4
// and 16-byte aligned tensors (kv_write_vec4). The same bits (RN).
__global__ void kv_write_bf16_v4(bf16* pk, bf16* pv, const float* k, const float* v, const int32_t* slots,
                                 int64_t n, int64_t kw, int64_t vw) {
  mk::pdl_begin();
  const int64_t q = (kw + vw) / 4;  // a row's float4s
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t s = slots[i];
    if (s < 0) continue;  // a row of another pool
    for (int64_t c4 = threadIdx.x; c4 < q; c4 += blockDim.x) {
      const int64_t c = 4 * c4;
      const bool key = c < kw;
      const float4 x = key ? *reinterpret_cast<const float4*>(k + i * kw + c)
                           : *reinterpret_cast<const float4*>(v + i * vw + (c - kw));
      bf16* dst = key ? pk + s * kw + c : pv + s * vw + (c - kw);
      *reinterpret_cast<uint2*>(dst) = make_uint2(mk::pack_bf16x2(x.x, x.y), mk::pack_bf16x2(x.z, x.w));
    }
  }
}

// kv_write_vec4 reports whether kv_write_bf16_v4 takes a call.
bool kv_write_vec4(uint64_t pool_k, uint64_t pool_v, uint64_t k, uint64_t v, int64_t kw, int64_t vw) {
  return kw % 4 == 0 && vw % 4 == 0 && k % 16 == 0 && v % 16 == 0 && pool_k % 8 == 0 && pool_v % 8 == 0;
}

using mk::sm_count;

using mk::smem_optin;

// Variant selects the kernel: 0 auto, 1 CUDA cores, 2 tensor cores
// (v_head_dim ≤ 128), 3 warp-split (head dims it has: warp_dims; other
// shapes take auto's choice among the first two). Auto takes the warp-split
// kernel where it has the head dims, else the tensor cores for groups of
// more than 4 query heads per kv head (v_head_dim ≤ 128), else the CUDA
// cores. Before the warp-split kernel, on the H200 (B=32, 32k context,
// D=128; 2026-11-29) the CUDA-core kernel read 3323 / 2934 / 2476 GB/s at
// G = 1 / 2 / 4 and 1217 at G = 8 (issue-bound: its cost grows with the
// group); the tensor-core one 2016-2024 at every G, with a 2-, 3- or
// 4-stage ring alike (2010 / 2022 / 1145 GB/s: the 4-stage ring halves its
// CTAs per SM), so loads in flight are not what holds it back.
int g_variant = 0;
// g_stages forces the tensor-core kernel's ring depth (2-4; 0: pick_stages).
int g_stages = 0;

// warp_dims reports whether paged_attn_warp is built for these head dims.
bool warp_dims(int head_dim, int v_head_dim) {
  return (head_dim == 64 && v_head_dim == 64) || (head_dim == 128 && v_head_dim == 128) ||
         (head_dim == 192 && v_head_dim == 128);
}

bool use_warp(int head_dim, int v_head_dim) {
  return (g_variant == 0 || g_variant == 3) && warp_dims(head_dim, v_head_dim);
}

bool use_mma(int v_head_dim, int group) {
  return g_variant == 2 || ((g_variant == 0 || g_variant == 3) && v_head_dim <= 128 && group > 4);
}

// Plan is the launch shape of one attention call.
struct Plan {
  bool mma, warp, big;
  bool mla;  // paged_attn_mla (big dims that are MLA's; big stays set)
  int GM, NV, NS, hchunks, splits, chunk;
  int minc, gran;  // AttnArgs' (row_split)
  int KD;  // the warp-split kernel's head_dim / 32
};

// KernelInfo caches a kernel's shared-memory opt-in and occupancy.
struct KernelInfo {
  size_t opted = 48 * 1024;
  size_t last = 0;
  int occ = 0;  // 0: not asked yet
};

template <typename Fn>
cudaError_t opt_in(Fn fn, KernelInfo& ki, size_t smem) {
  if (smem <= ki.opted) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e == cudaSuccess) ki.opted = smem;
  return e;
}

// occupancy_of is how many CTAs of fn with smem bytes fit on one SM.
template <typename Fn>
int occupancy_of(Fn fn, KernelInfo& ki, size_t smem, int threads = kNT) {
  if (ki.occ == 0 || smem != ki.last) {
    int v = 0;
    if (opt_in(fn, ki, smem) != cudaSuccess) cudaGetLastError();
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, fn, threads, smem) != cudaSuccess || v < 1) {
      cudaGetLastError();
      v = 1;
    }
    ki.last = smem;
    ki.occ = v;
  }
  return ki.occ;
}

template <int GM>
KernelInfo& info_simt() {
  static KernelInfo k;
  return k;
}
template <int NV, int NS>
KernelInfo& info_mma() {
  static KernelInfo k;
  return k;
}

template <int KD, int MV, bool NEW>
KernelInfo& info_warp() {
  static KernelInfo k;
  return k;
}
KernelInfo& info_big() {
  static KernelInfo k;
  return k;
}
template <bool VK>
KernelInfo& info_mla() {
  static KernelInfo k;
  return k;
}

// MmaKernel is one instance of paged_attn_mma (or paged_attn_warp) and its
// cached launch facts.
struct MmaKernel {
  void (*fn)(AttnArgs);
  KernelInfo* ki;
};

template <int NV>
MmaKernel mma_stages(int NS) {
  switch (NS) {
    case 2: return {paged_attn_mma<NV, 2>, &info_mma<NV, 2>()};
    case 3: return {paged_attn_mma<NV, 3>, &info_mma<NV, 3>()};
    default: return {paged_attn_mma<NV, 4>, &info_mma<NV, 4>()};
  }
}

MmaKernel mma_kernel(int NV, int NS) {
  switch (NV) {
    case 4: return mma_stages<4>(NS);
    case 8: return mma_stages<8>(NS);
    default: return mma_stages<16>(NS);
  }
}

// pick_stages is the tensor-core kernel's ring depth for these head dims:
// g_stages when set (or the deepest below it that fits in shared memory),
// else the depth with the most tiles in flight per SM, occupancy × (NS−1),
// the higher occupancy on ties (more warps to cover the compute).
// pick_stages is the tensor-core kernel's ring depth: 2 (double buffering)
// unless forced (mk_paged_attn_stages). Measured on the H200 (2026-11-29,
// B = 32 and 256 at 32k, D = 128): 2 stages 2010 / 2035 GB/s, 3 stages
// 2022 / 2060, 4 stages 1145 / 1164 (one CTA per SM). Deeper rings do not
// raise the read rate, so loads in flight are not this kernel's limit.
int pick_stages(int NV, int D, int Dv) {
  (void)NV;
  if (g_stages > 0) {
    const size_t cap = smem_optin();
    for (int ns = g_stages; ns > kMinStages; ns--)
      if (smem_bytes_mma(D, Dv, ns) <= cap) return ns;
  }
  return kMinStages;
}

// warp_kernel is paged_attn_warp for head_dim = 32·KD (warp_dims); fresh:
// its form that takes the rows' new tokens (mk_paged_decode_bf16).
MmaKernel warp_kernel(int KD, bool fresh = false) {
  if (fresh) {
    switch (KD) {
      case 2: return {paged_attn_warp<2, 4, true>, &info_warp<2, 4, true>()};
      case 6: return {paged_attn_warp<6, 8, true>, &info_warp<6, 8, true>()};
      default: return {paged_attn_warp<4, 8, true>, &info_warp<4, 8, true>()};
    }
  }
  switch (KD) {
    case 2: return {paged_attn_warp<2, 4, false>, &info_warp<2, 4, false>()};
    case 6: return {paged_attn_warp<6, 8, false>, &info_warp<6, 8, false>()};
    default: return {paged_attn_warp<4, 8, false>, &info_warp<4, 8, false>()};
  }
}

int occupancy(const Plan& p, size_t smem) {
  if (p.mla) return occupancy_of(paged_attn_mla<false>, info_mla<false>(), smem, kMlaNT);  // the same for <true>
  if (p.big) return occupancy_of(paged_attn_big, info_big(), smem);
  if (p.warp) {
    const MmaKernel k = warp_kernel(p.KD);
    return occupancy_of(k.fn, *k.ki, smem);
  }
  if (p.mma) {
    const MmaKernel k = mma_kernel(p.NV, p.NS);
    return occupancy_of(k.fn, *k.ki, smem);
  }
  switch (p.GM) {
    case 1: return occupancy_of(paged_attn<1>, info_simt<1>(), smem);
    case 2: return occupancy_of(paged_attn<2>, info_simt<2>(), smem);
    case 4: return occupancy_of(paged_attn<4>, info_simt<4>(), smem);
    default: return occupancy_of(paged_attn<kGMax>, info_simt<kGMax>(), smem);
  }
}

size_t plan_smem(const Plan& p, int D, int Dv) {
  if (p.mla) return kMlaSmem;
  if (p.big) return smem_big(D, Dv);
  if (p.warp) return 0;  // static shared memory only
  return p.mma ? smem_bytes_mma(D, Dv, p.NS) : smem_bytes(D, Dv, p.GM);
}

// plan picks the kernel, the head chunking and the key split: among splits s
// (ranges of at least kMinChunk keys, one tile for the warp-split kernel;
// whole tiles), the one that fills the
// GPU's CTA slots best over whole waves, discounted by the per-range
// overhead (about one tile of work).
Plan plan(int64_t n, int heads, int kv_heads, int head_dim, int v_head_dim, int max_keys, bool q16 = true) {
  Plan p{};
  const int G = heads / kv_heads;
  p.big = big_dims(head_dim, v_head_dim);  // whatever the variant: the others stop at 256
  p.mla = p.big && q16 && g_variant != 1 && mla_dims(head_dim, v_head_dim);  // variant 1: paged_attn_big
  p.warp = !p.big && q16 && use_warp(head_dim, v_head_dim);
  p.mma = !p.big && !p.warp && use_mma(v_head_dim, G);
  p.KD = head_dim / 32;
  p.GM = p.mla ? kMlaGM : p.big ? kBigGM : p.warp ? kWG : p.mma ? kGMma : G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : kGMax;
  p.NV = v_head_dim <= 32 ? 4 : v_head_dim <= 64 ? 8 : 16;
  p.NS = p.mma ? pick_stages(p.NV, head_dim, v_head_dim) : 2;
  p.hchunks = (G + p.GM - 1) / p.GM;
  p.splits = 1;
  p.chunk = max_keys > 0 ? max_keys : 1;
  if (max_keys <= 0) return p;
  const int64_t slots = (int64_t)occupancy(p, plan_smem(p, head_dim, v_head_dim)) * sm_count();
  const int64_t base = n * kv_heads * p.hchunks;
  // The warp-split kernel's ranges may be one tile: its warps take 16-key
  // chunks, so a short range costs a CTA little, and at small batches more
  // ranges put more of the KV read in flight at once.
  // So may paged_attn_mla's (two of its tiles): at batch 1 its 64-head CTAs
  // are too few to fill the GPU otherwise.
  const int min_chunk = p.warp || p.mla ? kTK : kMinChunk;
  p.minc = min_chunk;
  p.gran = p.warp ? 16 : p.mla ? kMlaTK : p.big ? kBigTK : kTK;  // the kernel's tile of keys
  const int smax = (int)std::min<int64_t>(kMaxSplits, (max_keys + min_chunk - 1) / min_chunk);
  double best = -1;
  for (int s = 1; s <= std::max(1, smax); s++) {
    const int chunk = ((max_keys + s - 1) / s + kTK - 1) / kTK * kTK;
    const int real = (max_keys + chunk - 1) / chunk;
    if (real != s) continue;  // the same as a smaller s after rounding
    const int64_t ctas = base * s;
    const int64_t waves = (ctas + slots - 1) / slots;
    const double tiles = (double)chunk / kTK;
    const double score = (double)ctas / (double)(waves * slots) * tiles / (tiles + 1.0);
    if (score > best * 1.02) {  // a longer split must win by more than noise
      best = score;
      p.splits = s;
      p.chunk = chunk;
    }
  }
  if (p.splits <= 1) {
    p.splits = 1;
    p.chunk = max_keys;
  }
  return p;
}

uint64_t work_bytes(int64_t n, int heads, int v_head_dim, int splits) {
  return splits <= 1 ? 0 : (uint64_t)n * heads * splits * ((uint64_t)v_head_dim + 2) * sizeof(float);
}

template <typename Fn>
int launch_fn(Fn fn, KernelInfo& ki, const AttnArgs& a, size_t smem, int64_t n, cudaStream_t st, int threads = kNT) {
  MK_CUDA(opt_in(fn, ki, smem));
  const int64_t grid = n * a.splits * a.KV * a.hchunks;
  MK_ARG(grid <= INT32_MAX, "paged_attn: %lld thread blocks", (long long)grid);
  (void)(mk::launch(fn, dim3((unsigned)grid), dim3(threads), smem, st, a));
  MK_LAUNCHED("paged_attn");
  return MK_OK;
}

int launch(const Plan& p, const AttnArgs& a, int64_t n, cudaStream_t st, bool fresh = false) {
  const size_t smem = plan_smem(p, a.D, a.Dv);
  if (p.mla) {
    MK_ARG(smem <= smem_optin(), "paged_attn: the MLA kernel needs %zu bytes of shared memory, the device offers %zu",
           smem, smem_optin());
    if (a.pv == a.pk && a.ldv == (int64_t)a.KV * a.D)
      return launch_fn(paged_attn_mla<true>, info_mla<true>(), a, smem, n, st, kMlaNT);
    return launch_fn(paged_attn_mla<false>, info_mla<false>(), a, smem, n, st, kMlaNT);
  }
  if (p.big) {
    MK_ARG(smem <= smem_optin(), "paged_attn: head dims %d/%d need %zu bytes of shared memory, the device offers %zu",
           a.D, a.Dv, smem, smem_optin());
    return launch_fn(paged_attn_big, info_big(), a, smem, n, st);
  }
  if (p.warp) {
    const MmaKernel k = warp_kernel(p.KD, fresh);
    return launch_fn(k.fn, *k.ki, a, smem, n, st);
  }
  if (p.mma) {
    const MmaKernel k = mma_kernel(p.NV, p.NS);
    return launch_fn(k.fn, *k.ki, a, smem, n, st);
  }
  switch (p.GM) {
    case 1: return launch_fn(paged_attn<1>, info_simt<1>(), a, smem, n, st);
    case 2: return launch_fn(paged_attn<2>, info_simt<2>(), a, smem, n, st);
    case 4: return launch_fn(paged_attn<4>, info_simt<4>(), a, smem, n, st);
    default: return launch_fn(paged_attn<kGMax>, info_simt<kGMax>(), a, smem, n, st);
  }
}

}  // namespace

#define DEC_ARG(fn, cond) MK_ARG(cond, "%s: bad argument (%s)", fn, #cond)

extern "C" {

int32_t mk_kv_write_bf16(uint64_t stream, uint64_t pool_k, uint64_t pool_v, uint64_t k, uint64_t v,
                         uint64_t slots, int64_t n, int64_t kw, int64_t vw) {
  const char* fn = "mk_kv_write_bf16";
  MK_THREAD(fn);
  // vw 0: keys only (values inside them; v and pool_v unused, may be 0).
  DEC_ARG(fn, n > 0 && kw > 0 && vw >= 0 && pool_k && k && slots && (vw == 0 || (pool_v && v)));
  if (kv_write_vec4(pool_k, pool_v, k, v, kw, vw)) {
    const int64_t blocks = std::min<int64_t>(n, (int64_t)sm_count() * 16);
    (void)(mk::launch(kv_write_bf16_v4, dim3((unsigned)blocks), dim3(128), 0, mk::as_stream(stream),
        mk::dev<bf16>(pool_k), mk::dev<bf16>(pool_v), mk::dev<float>(k), mk::dev<float>(v),
        mk::dev<int32_t>(slots), n, kw, vw));
    MK_LAUNCHED("kv_write_bf16_v4");
    return MK_OK;
  }
  int64_t blocks = (n * (kw + vw) + 255) / 256;
  if (blocks > (1 << 20)) blocks = 1 << 20;
  (void)(mk::launch(kv_write_bf16, dim3((unsigned)blocks), dim3(256), 0, mk::as_stream(stream),
      mk::dev<bf16>(pool_k), mk::dev<bf16>(pool_v), mk::dev<float>(k), mk::dev<float>(v),
      mk::dev<int32_t>(slots), n, kw, vw));
  MK_LAUNCHED("kv_write_bf16");
  return MK_OK;
}

int32_t mk_paged_attn_variant(int32_t variant) {
  const char* fn = "mk_paged_attn_variant";
  MK_THREAD(fn);
  MK_ARG(variant >= 0 && variant <= 3, "%s: variant %d is not 0, 1, 2 or 3", fn, variant);
  g_variant = variant;
  return MK_OK;
}

int32_t mk_paged_attn_stages(int32_t stages) {
  const char* fn = "mk_paged_attn_stages";
  MK_THREAD(fn);
  MK_ARG(stages == 0 || (stages >= kMinStages && stages <= kMaxStages), "%s: stages %d is not 0 or %d..%d", fn,
         stages, kMinStages, kMaxStages);
  g_stages = stages;
  return MK_OK;
}

int32_t mk_paged_attn_workspace(int64_t n, int32_t heads, int32_t kv_heads, int32_t head_dim,
                                int32_t v_head_dim, int32_t max_keys, uint64_t* bytes) {
  const char* fn = "mk_paged_attn_workspace";
  MK_THREAD(fn);
  DEC_ARG(fn, bytes && n > 0 && heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0 &&
                  head_dim <= kBigMaxD && v_head_dim > 0 && v_head_dim <= kBigMaxDv);
  const Plan p = plan(n, heads, kv_heads, head_dim, v_head_dim, max_keys);
  *bytes = work_bytes(n, heads, v_head_dim, p.splits);
  return MK_OK;
}

}  // extern "C"

namespace {

// paged_setup checks the arguments mk_paged_attn_bf16 and
// mk_paged_decode_bf16 share and fills the launch plan p and the kernels'
// arguments a (MK_OK, or the error).
int paged_setup(const char* fn, Plan& p, AttnArgs& a, uint64_t out, uint64_t out_bf16, uint64_t q, uint64_t pool_k,
                uint64_t pool_v, uint64_t rows, uint64_t pos, uint64_t table, uint64_t blocks, int64_t n,
                int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim, int32_t block_size,
                uint32_t scale_bits, int32_t window, uint64_t sinks, int32_t max_keys, uint64_t work,
                uint64_t work_size) {
  DEC_ARG(fn, n > 0 && n <= INT32_MAX && heads > 0 && kv_heads > 0 && heads % kv_heads == 0 &&
                  block_size > 0 && window >= 0);
  MK_ARG(head_dim > 0 && head_dim <= kBigMaxD && head_dim % 8 == 0 && v_head_dim > 0 && v_head_dim <= kBigMaxDv &&
             v_head_dim % 8 == 0,
         "%s: head_dim %d and v_head_dim %d must be multiples of 8 in [8, %d] and [8, %d]", fn, head_dim, v_head_dim,
         kBigMaxD, kBigMaxDv);
  DEC_ARG(fn, out && q && pool_k && rows && pos && table && blocks);
  // pool_v 0: each kv head's values are the first v_head_dim columns of its keys.
  MK_ARG(pool_v || v_head_dim <= head_dim, "%s: values inside keys need v_head_dim %d <= head_dim %d", fn, v_head_dim,
         head_dim);
  MK_ARG((pool_k | pool_v) % 16 == 0, "%s: pool_k and pool_v must be 16-byte aligned", fn);
  // The warp-split kernel reads q by 16 bytes (every caller's q is aligned;
  // one that is not gets another kernel, and perhaps fewer splits).
  p = plan(n, heads, kv_heads, head_dim, v_head_dim, max_keys, q % 16 == 0);
  MK_ARG(!(g_variant == 2 && v_head_dim > 128), "%s: the tensor-core kernel needs v_head_dim <= 128, not %d",
         fn, v_head_dim);
  if (p.splits > 1) {
    const uint64_t per = work_bytes(n, heads, v_head_dim, 2) / 2;
    uint64_t s = work ? work_size / per : 0;
    if (s < (uint64_t)p.splits) {  // a smaller workspace: fewer, longer ranges
      if (s < 2) {
        p.splits = 1;
        p.chunk = max_keys;
      } else {
        p.chunk = ((max_keys + (int)s - 1) / (int)s + kTK - 1) / kTK * kTK;
        p.splits = (max_keys + p.chunk - 1) / p.chunk;
      }
    }
  }
  a = AttnArgs{};
  a.out = mk::dev<float>(out);
  a.outb = out_bf16 ? mk::dev<bf16>(out_bf16) : nullptr;
  a.q = mk::dev<float>(q);
  a.pk = mk::dev<bf16>(pool_k);
  a.pv = mk::dev<bf16>(pool_v ? pool_v : pool_k);
  a.ldv = pool_v ? (int64_t)kv_heads * v_head_dim : (int64_t)kv_heads * head_dim;
  a.vhs = pool_v ? v_head_dim : head_dim;
  a.rows = mk::dev<int32_t>(rows);
  a.pos = mk::dev<int32_t>(pos);
  a.table = mk::dev<int32_t>(table);
  a.blocks = mk::dev<int32_t>(blocks);
  a.sinks = sinks ? mk::dev<float>(sinks) : nullptr;
  a.H = heads;
  a.KV = kv_heads;
  a.D = head_dim;
  a.Dv = v_head_dim;
  a.bs = block_size;
  a.bs_shift = (block_size & (block_size - 1)) == 0 ? __builtin_ctz((unsigned)block_size) : -1;
  a.window = window;
  a.G = heads / kv_heads;
  a.hchunks = p.hchunks;
  a.splits = p.splits;
  a.minc = p.minc > 0 ? p.minc : kTK;
  a.gran = p.gran > 0 ? p.gran : kTK;
  // MK_PAGED_FIXED=1 (comparisons): the plan's fixed ranges of p.chunk keys
  // whatever a row's context, as before row_split (a graph's bucket then
  // leaves most ranges of a short context empty).
  static const bool fixed = getenv("MK_PAGED_FIXED") != nullptr && getenv("MK_PAGED_FIXED")[0] == '1';
  if (fixed && p.splits > 1) a.minc = a.gran = p.chunk;
  const int cpr = std::max(head_dim, v_head_dim) / 8;
  int lg = 0;
  while ((1 << lg) < cpr && lg < 4) lg++;
  a.lg_tpr = lg;
  a.scale2 = mk::float_from_bits(scale_bits) * kLog2e;
  if (p.splits > 1) {
    a.wo = mk::dev<float>(work);
    a.wml = a.wo + (uint64_t)n * heads * p.splits * v_head_dim;
  }
  return MK_OK;
}

// launch_merge runs the merge of a split call (nothing when p.splits is 1).
int launch_merge(const Plan& p, const AttnArgs& a, int64_t n, cudaStream_t st) {
  if (p.splits == 1) return MK_OK;
  // A CTA per (row, head, 128 value columns): at MLA's 128 heads × 512
  // columns one CTA per head left the loads too few in flight (H200, 64
  // splits at batch 1: 33 µs for 17 MB).
  static const bool merge1 = getenv("MK_PAGED_MERGE") != nullptr && atoi(getenv("MK_PAGED_MERGE")) == 1;
  const dim3 mg((unsigned)n, (unsigned)a.H, (unsigned)((a.Dv + kNT - 1) / kNT));
  static const bool early_on = !mk::env_is("MK_MERGE_EARLY", '0');
  const bool early = early_on && n <= mk::res_rows();
  if (!merge1 && a.Dv % 4 == 0)  // 4 columns a lane: 128 columns a CTA, as the other's
    (void)(early ? mk::launch(paged_attn_merge4<true>, mg, dim3(kNT), 0, st, a)
                 : mk::launch(paged_attn_merge4<false>, mg, dim3(kNT), 0, st, a));
  else
    (void)(mk::launch(paged_attn_merge, mg, dim3(kNT), 0, st, a));
  MK_LAUNCHED("paged_attn_merge");
  return MK_OK;
}

// decode_fits reports whether mk_paged_decode_bf16 takes these dims.
bool decode_fits(int head_dim, int v_head_dim, int rot_dim) {
  return use_warp(head_dim, v_head_dim) && rot_dim >= 0 && rot_dim % 2 == 0 && rot_dim <= head_dim;
}

}  // namespace

extern "C" {

int32_t mk_paged_attn_bf16(uint64_t stream, uint64_t out, uint64_t out_bf16, uint64_t q, uint64_t pool_k,
                           uint64_t pool_v,
                           uint64_t rows, uint64_t pos, uint64_t table, uint64_t blocks, int64_t n,
                           int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim,
                           int32_t block_size, uint32_t scale_bits, int32_t window, uint64_t sinks,
                           int32_t max_keys, uint64_t work, uint64_t work_size) {
  const char* fn = "mk_paged_attn_bf16";
  MK_THREAD(fn);
  Plan p;
  AttnArgs a;
  int rc = paged_setup(fn, p, a, out, out_bf16, q, pool_k, pool_v, rows, pos, table, blocks, n, heads, kv_heads,
                       head_dim, v_head_dim, block_size, scale_bits, window, sinks, max_keys, work, work_size);
  if (rc != MK_OK) return rc;
  const cudaStream_t st = mk::as_stream(stream);
  rc = launch(p, a, n, st);
  if (rc != MK_OK) return rc;
  return launch_merge(p, a, n, st);
}

int32_t mk_paged_decode_fits(int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim,
                             int32_t rot_dim) {
  return heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && decode_fits(head_dim, v_head_dim, rot_dim) ? 1 : 0;
}

int32_t mk_paged_decode_bf16(uint64_t stream, uint64_t out, uint64_t out_bf16, uint64_t q, uint64_t pool_k,
                             uint64_t pool_v, uint64_t rows, uint64_t pos, uint64_t table, uint64_t blocks, int64_t n,
                             int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim,
                             int32_t block_size, uint32_t scale_bits, int32_t window, uint64_t sinks,
                             int32_t max_keys, uint64_t work, uint64_t work_size, const mk_decode_new* nw) {
  const char* fn = "mk_paged_decode_bf16";
  MK_THREAD(fn);
  MK_ARG(nw != nullptr, "%s: no new tokens (nw is null)", fn);
  const int rot = nw->rot_dim;
  MK_ARG(decode_fits(head_dim, v_head_dim, rot) && (q | nw->k | nw->v) % 16 == 0,
         "%s: head dims %d/%d with rot_dim %d (or q, k, v not 16-byte aligned) are not the fused kernel's (mk_paged_decode_fits)",
         fn, head_dim, v_head_dim, rot);
  DEC_ARG(fn, nw->k && nw->v && nw->slots && nw->rope_pos && pool_v && (rot == 0 || nw->inv_freq) &&
                  (nw->style == MK_ROPE_NEOX || nw->style == MK_ROPE_INTERLEAVED));
  Plan p;
  AttnArgs a;
  int rc = paged_setup(fn, p, a, out, out_bf16, q, pool_k, pool_v, rows, pos, table, blocks, n, heads, kv_heads,
                       head_dim, v_head_dim, block_size, scale_bits, window, sinks, max_keys, work, work_size);
  if (rc != MK_OK) return rc;
  MK_ARG(p.warp, "%s: the plan did not pick the warp-split kernel", fn);
  a.knew = mk::dev<float>(nw->k);
  a.vnew = mk::dev<float>(nw->v);
  a.slots = mk::dev<int32_t>(nw->slots);
  a.qnw = nw->q_norm ? mk::dev<float>(nw->q_norm) : nullptr;
  a.knw = nw->k_norm ? mk::dev<float>(nw->k_norm) : nullptr;
  a.rpos = mk::dev<int32_t>(nw->rope_pos);
  a.inv_freq = rot ? mk::dev<float>(nw->inv_freq) : nullptr;
  a.rot_half = rot / 2;
  a.neox = nw->style == MK_ROPE_NEOX;
  a.attn_factor = mk::float_from_bits(nw->attn_bits);
  a.eps = mk::float_from_bits(nw->eps_bits);
  const cudaStream_t st = mk::as_stream(stream);
  rc = launch(p, a, n, st, true);
  if (rc != MK_OK) return rc;
  return launch_merge(p, a, n, st);
}

}  // extern "C"
