// moe.cu — an MoE layer's routed experts on the GPU without host round trips:
//
//   mk_moe_route    router logits → top-k ids and weights (moe.Route's semantics)
//   mk_moe_experts  align (per-expert padded row lists, expert counters) →
//                   GEMM1 (grouped over experts, x rows gathered in the loader,
//                   SwiGLU in the epilogue) → GEMM2 (grouped) → combine
//
// The grouped GEMM is our own: mma.sync m16n8k16 bf16 → f32 on tensor cores,
// operands staged through a multi-stage cp.async pipeline into XOR-swizzled
// shared memory and read with ldmatrix. Each CTA owns one row tile of one
// expert (tile_expert[blockIdx.x], from the align kernel) and one column tile;
// row tiles past the actual count exit at once, so the grid is sized from T,
// K and E alone and needs nothing from the host.
//
// Three tile shapes (rows per CTA 16, 64, 128) are picked from the expected
// rows per active expert: decode-sized batches stream expert weights with
// 16-row tiles and many small CTAs; prefill-sized ones use 128×128 tiles.
#include <type_traits>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common.cuh"
#include "moe_gemm.cuh"
#include "norm.cuh"
#include "sysflag.cuh"
#include "wgmma.cuh"

namespace {

using bf16 = __nv_bfloat16;
using mkmoe::GemmArgs;
using mkmoe::activation;

// ---------------------------------------------------------------- routing

// ranks_before: a at ia before b at ib in a top-k (moe/route.go ranksBefore):
// larger first, NaN above every number, ties to the lower index.
__device__ __forceinline__ bool ranks_before(float a, int ia, float b, int ib) {
  if (a > b) return true;
  if (a < b) return false;
  if (a == b) return ia < ib;
  const bool an = a != a, bn = b != b;
  if (an != bn) return an;
  return ia < ib;
}

// rank_key maps (a, ia) to a 64-bit key whose unsigned order is the
// ranks_before order: the float's bits made monotonic (+0 and -0 equal,
// every NaN above every number) above the complemented index (ties to the
// lower index). Every key is > 0, so 0 can mean "none". One integer compare
// instead of ranks_before's branches.
__device__ __forceinline__ unsigned long long rank_key(float a, int ia) {
  const unsigned u = __float_as_uint(a);
  const unsigned m = a != a ? 0xffffffffu : a == 0.0f ? 0x80000000u : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((unsigned long long)m << 32) | (unsigned)~ia;
}

// Per-warp shared memory of the router: scores, choice, group scores [E]
// floats, selected ids and weights [K], taken and keep flags [E] bytes.
__host__ __device__ inline size_t route_warp_bytes(int E, int K) {
  size_t b = (size_t)3 * E * 4 + (size_t)2 * K * 4 + (size_t)2 * E;
  return (b + 15) / 16 * 16;
}

constexpr int kRouteWarps = 4;

// group_score is a group's score for group-limited routing: the sum of its
// two best choice scores c[0..gs) (ranks_before order).
__device__ __forceinline__ float group_score(const float* c, int gs) {
  unsigned long long k0 = 0, k1 = 0;
  int b0 = 0, b1 = 0;
  for (int i = 0; i < gs; i++) {
    const unsigned long long k = rank_key(c[i], i);
    if (k > k0) {
      k1 = k0;
      b1 = b0;
      k0 = k;
      b0 = i;
    } else if (k > k1) {
      k1 = k;
      b1 = i;
    }
  }
  return __fadd_rn(c[b0], c[b1]);
}

// One warp per token.
__global__ void moe_route_kernel(int32_t* ids, float* wts, const float* logits, const float* bias,
                                 int64_t T, int E, int K, int flags, int G, int TG, float scale) {
  mk::pdl_begin();
  extern __shared__ __align__(16) unsigned char route_sm[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = (int64_t)blockIdx.x * kRouteWarps + warp;
  if (t >= T) return;  // warp-uniform; no block-wide barrier below
  unsigned char* base = route_sm + warp * route_warp_bytes(E, K);
  float* scores = reinterpret_cast<float*>(base);
  float* choice_buf = scores + E;
  float* gsc = choice_buf + E;
  int* sel = reinterpret_cast<int*>(gsc + E);
  float* selw = reinterpret_cast<float*>(sel + K);
  unsigned char* taken = reinterpret_cast<unsigned char*>(selw + K);
  unsigned char* keep = taken + E;
  const float* row = logits + t * E;
  const bool sig = flags & MK_MOE_SIGMOID, stk = flags & MK_MOE_SOFTMAX_TOPK,
             norm = flags & MK_MOE_NORM_TOPK;
  const unsigned full = 0xffffffffu;

  // 1. scores (float64, rounded once, as moe.Route).
  if (sig) {
    for (int e = lane; e < E; e += 32) scores[e] = (float)(1.0 / (1.0 + exp(-(double)row[e])));
  } else if (stk) {
    for (int e = lane; e < E; e += 32) scores[e] = row[e];
  } else {
    double m = -INFINITY;
    bool nan = false;
    for (int e = lane; e < E; e += 32) {
      const float v = row[e];
      if (v != v) nan = true;
      else m = fmax(m, (double)v);
    }
    nan = __any_sync(full, nan);
    for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(full, m, o));
    double s = 0;
    for (int e = lane; e < E; e += 32) s += exp((double)row[e] - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(full, s, o);
    for (int e = lane; e < E; e += 32)
      scores[e] = nan ? __int_as_float(0x7fc00000) : (float)(exp((double)row[e] - m) / s);
  }
  __syncwarp();

  // 2–3. choice scores: bias, group mask.
  float* choice = scores;
  if (bias != nullptr || G > 0) {
    choice = choice_buf;
    for (int e = lane; e < E; e += 32) choice[e] = bias ? __fadd_rn(scores[e], bias[e]) : scores[e];
    __syncwarp();
  }
  if (G > 0) {
    const int gs = E / G;
    for (int g = lane; g < G; g += 32) {
      gsc[g] = group_score(choice + g * gs, gs);
      keep[g] = 0;
    }
    __syncwarp();
    if (lane == 0) {
      for (int j = 0; j < TG; j++) {
        int best = -1;
        for (int g = 0; g < G; g++)
          if (!keep[g] && (best < 0 || ranks_before(gsc[g], g, gsc[best], best))) best = g;
        keep[best] = 1;
      }
    }
    __syncwarp();
    for (int e = lane; e < E; e += 32)
      if (!keep[e / gs]) choice[e] = -INFINITY;
    __syncwarp();
  }

  // 4. top-k on the choice scores: K rounds of a warp arg-best.
  for (int e = lane; e < E; e += 32) taken[e] = 0;
  __syncwarp();
  for (int j = 0; j < K; j++) {
    float bv = 0;
    int bi = -1;
    for (int e = lane; e < E; e += 32) {
      if (taken[e]) continue;
      const float v = choice[e];
      if (bi < 0 || ranks_before(v, e, bv, bi)) {
        bv = v;
        bi = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(full, bv, o);
      const int oi = __shfl_xor_sync(full, bi, o);
      if (oi >= 0 && (bi < 0 || ranks_before(ov, oi, bv, bi))) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      sel[j] = bi;
      taken[bi] = 1;
    }
    __syncwarp();
  }

  // 5. weights from the un-biased scores; output order.
  if (lane == 0) {
    for (int j = 0; j < K; j++) selw[j] = scores[sel[j]];
    if (stk) {  // softmax over the k, as moe.softmax
      double m = -INFINITY;
      for (int j = 0; j < K; j++) {
        const double f = selw[j];
        if (f > m || f != f) {
          m = f;
          if (f != f) break;
        }
      }
      double sum = 0;
      for (int j = 0; j < K; j++) sum += exp((double)selw[j] - m);
      for (int j = 0; j < K; j++) selw[j] = (float)(exp((double)selw[j] - m) / sum);
    }
    if (norm) {
      float sum = 0;
      for (int j = 0; j < K; j++) sum = __fadd_rn(sum, selw[j]);
      if (sig) sum = __fadd_rn(sum, 1e-20f);
      for (int j = 0; j < K; j++) selw[j] = __fdiv_rn(selw[j], sum);
    }
    if (scale != 0.0f && scale != 1.0f)
      for (int j = 0; j < K; j++) selw[j] = __fmul_rn(selw[j], scale);
    for (int i = 1; i < K; i++)
      for (int j = i; j > 0 && ranks_before(selw[j], sel[j], selw[j - 1], sel[j - 1]); j--) {
        const float tw = selw[j];
        selw[j] = selw[j - 1];
        selw[j - 1] = tw;
        const int ti = sel[j];
        sel[j] = sel[j - 1];
        sel[j - 1] = ti;
      }
    for (int j = 0; j < K; j++) {
      ids[t * K + j] = sel[j];
      wts[t * K + j] = selw[j];
    }
  }
}

// moe_route_reg_kernel is moe_route_kernel for E ≤ 32·EPL and K ≤ 32 with
// the token's scores in registers (expert lane + 32·i in slot i of each
// lane): the top-k rounds are warp arg-bests over registers, lane j keeps
// the j-th choice, and the weights (softmax over the k, renormalisation,
// scaling) and the final order are computed by the k lanes in parallel,
// where moe_route_kernel runs them on lane 0 through shared memory (14 µs
// for one Qwen3 token, measured with ncu). Same results: ids equal, the
// float64 softmax sums in another order (weights equal to ~1e-16 relative
// before the float rounding). Shared memory is used for group-limited
// routing only.
//
// route_token_reg routes token t on the calling warp; route_sm is the
// block's shared memory, of which the warp uses slot warp (group-limited
// routing only). Lane j < K returns the expert it wrote and where (the
// token's slot, 0..K-1); the other lanes {-1, -1}.
struct RoutePick {
  int id, slot;
};
template <int EPL>
__device__ __forceinline__ RoutePick route_token_reg(int32_t* ids, float* wts, const float* logits, const float* bias,
                                                int64_t t, int E, int K, int flags, int G, int TG, float scale,
                                                unsigned char* route_sm, int warp) {
  const int lane = threadIdx.x % 32;
  const float* row = logits + t * E;
  const bool sig = flags & MK_MOE_SIGMOID, stk = flags & MK_MOE_SOFTMAX_TOPK,
             norm = flags & MK_MOE_NORM_TOPK;
  const unsigned full = 0xffffffffu;

  float v[EPL], sc[EPL], ch[EPL];
#pragma unroll
  for (int i = 0; i < EPL; i++) {
    const int e = lane + 32 * i;
    v[i] = e < E ? row[e] : 0.0f;
  }
  // 1. scores (float64, rounded once).
  if (sig) {
#pragma unroll
    for (int i = 0; i < EPL; i++) sc[i] = (float)(1.0 / (1.0 + exp(-(double)v[i])));
  } else if (stk) {
#pragma unroll
    for (int i = 0; i < EPL; i++) sc[i] = v[i];
  } else {
    double m = -INFINITY;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < EPL; i++)
      if (lane + 32 * i < E) {
        if (v[i] != v[i]) nan = true;
        else m = fmax(m, (double)v[i]);
      }
    nan = __any_sync(full, nan);
    for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(full, m, o));
    double ex[EPL], sum = 0;
#pragma unroll
    for (int i = 0; i < EPL; i++) {
      ex[i] = lane + 32 * i < E ? exp((double)v[i] - m) : 0.0;
      sum += ex[i];
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(full, sum, o);
#pragma unroll
    for (int i = 0; i < EPL; i++) sc[i] = nan ? __int_as_float(0x7fc00000) : (float)(ex[i] / sum);
  }
  // 2–3. choice scores: bias, group mask (through shared memory).
#pragma unroll
  for (int i = 0; i < EPL; i++) {
    const int e = lane + 32 * i;
    ch[i] = (bias != nullptr && e < E) ? __fadd_rn(sc[i], bias[e]) : sc[i];
  }
  if (G > 0) {
    float* choice = reinterpret_cast<float*>(route_sm) + (size_t)warp * (E + 2 * G);
    float* gsc = choice + E;
    int* keep = reinterpret_cast<int*>(gsc + G);
#pragma unroll
    for (int i = 0; i < EPL; i++)
      if (lane + 32 * i < E) choice[lane + 32 * i] = ch[i];
    __syncwarp();
    const int gs = E / G;
    for (int g = lane; g < G; g += 32) gsc[g] = group_score(choice + g * gs, gs);
    __syncwarp();
    // Group g is kept when fewer than TG groups rank before it.
    for (int g = lane; g < G; g += 32) {
      int before = 0;
      const unsigned long long kg = rank_key(gsc[g], g);
      for (int h = 0; h < G; h++) before += rank_key(gsc[h], h) > kg;
      keep[g] = before < TG;
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < EPL; i++) {
      const int e = lane + 32 * i;
      if (e < E && !keep[e / gs]) ch[i] = -INFINITY;
    }
  }

  // 4. top-k: K rounds of a warp max over the choices' rank keys (0: no
  // expert); lane j keeps the j-th pick, then fetches its unbiased
  // score from the lane that holds it. (With ranks_before's branches and
  // the score carried through the shuffles this was ~140 dependent
  // instructions a round: 8 µs for one Qwen3 token, ncu.)
  unsigned long long key[EPL];
#pragma unroll
  for (int i = 0; i < EPL; i++) {
    const int e = lane + 32 * i;
    key[i] = e < E ? rank_key(ch[i], e) : 0ull;
  }
  unsigned taken = 0;  // bit i: key[i] picked (a mask, so key[] stays in registers)
  auto local_best = [&]() {
    unsigned long long b = 0;
#pragma unroll
    for (int i = 0; i < EPL; i++) b = !((taken >> i) & 1u) && key[i] > b ? key[i] : b;
    return b;
  };
  unsigned long long lb = local_best();
  int my_id = -1;
  for (int j = 0; j < K; j++) {
    unsigned long long b = lb;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const unsigned long long ob = __shfl_xor_sync(full, b, o);
      b = ob > b ? ob : b;
    }
    const int id = (int)~(unsigned)b;  // K ≤ E: b is a real key
    if (lane == j) my_id = id;
    if ((id & 31) == lane) {
      taken |= 1u << (id >> 5);
      lb = local_best();
    }
  }
  float w = 0.0f;
#pragma unroll
  for (int i = 0; i < EPL; i++) {
    const float v = __shfl_sync(full, sc[i], my_id & 31);
    if (lane < K && (my_id >> 5) == i) w = v;
  }

  // 5. weights of the k picks (lanes < K), in pick order where order matters.
  if (stk) {  // softmax over the k: the max, or NaN when any is NaN
    const bool anynan = __any_sync(full, lane < K && w != w);
    double m = lane < K ? (double)w : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) m = fmax(m, __shfl_xor_sync(full, m, o));
    if (anynan) m = __longlong_as_double(0x7ff8000000000000ll);
    const double ex = lane < K ? exp((double)w - m) : 0.0;
    double sum = 0;
    for (int j = 0; j < K; j++) sum += __shfl_sync(full, ex, j);
    w = (float)(ex / sum);
  }
  if (norm) {
    float sum = 0;
    for (int j = 0; j < K; j++) sum = __fadd_rn(sum, __shfl_sync(full, w, j));
    if (sig) sum = __fadd_rn(sum, 1e-20f);
    w = __fdiv_rn(w, sum);
  }
  if (scale != 0.0f && scale != 1.0f) w = __fmul_rn(w, scale);
  // Output order: by descending weight, ties to the lower expert.
  int rank = 0;
  const unsigned long long wk = rank_key(w, my_id);
  for (int j = 0; j < K; j++) rank += __shfl_sync(full, wk, j) > wk;
  if (lane < K) {
    ids[t * K + rank] = my_id;
    wts[t * K + rank] = w;
    return RoutePick{my_id, rank};
  }
  return RoutePick{-1, -1};
}

template <int EPL>
__global__ void moe_route_reg_kernel(int32_t* ids, float* wts, const float* logits, const float* bias,
                                     int64_t T, int E, int K, int flags, int G, int TG, float scale) {
  mk::pdl_begin();
  extern __shared__ __align__(16) unsigned char route_sm[];
  const int warp = threadIdx.x / 32;
  const int64_t t = (int64_t)blockIdx.x * kRouteWarps + warp;
  if (t >= T) return;  // warp-uniform; no block-wide barrier below
  route_token_reg<EPL>(ids, wts, logits, bias, t, E, K, flags, G, TG, scale, route_sm, warp);
}

// ---------------------------------------------------------------- align

// One block: counts per expert, offsets padded to BM, the expert of every
// row tile, the padded row list (assignment a = t*K + k, or -1) and each
// assignment's row; counts_total += counts.
__device__ __forceinline__ void align_block(const int32_t* ids, int64_t n, int E, int BM, int32_t* off_g,
                                            int32_t* num_tiles, int32_t* tile_expert, int32_t* sorted,
                                            int32_t* slot_of, unsigned long long* counts_total, int* align_sm,
                                            int* zero, int zero_n) {
  for (int i = threadIdx.x; i < zero_n; i += blockDim.x) zero[i] = 0;  // GEMM1's split counters, if any
  int* cnt = align_sm;
  int* off = cnt + E;
  int* cur = off + E + 1;
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = cur[e] = 0;
  __syncthreads();
  // kAlignU ids a thread loaded before their atomics, so that a prefill's
  // 64 ids a thread (8192 tokens × top-8 over 1024 threads) are not 64
  // dependent load-then-atomic steps: the loads of a batch are in flight
  // together. The slot an assignment gets within its expert was already
  // the atomics' order, not the ids' (outputs do not depend on it).
  constexpr int kAlignU = 8;
  const int64_t bstep = (int64_t)blockDim.x * kAlignU;
  // batch loads the ids of assignments a0 + u·blockDim.x (-1 past n).
  auto batch = [&](int64_t a0, int (&ev)[kAlignU]) {
#pragma unroll
    for (int u = 0; u < kAlignU; u++) {
      const int64_t a = a0 + (int64_t)u * blockDim.x;
      ev[u] = a < n ? ids[a] : -1;
    }
  };
  for (int64_t a0 = threadIdx.x; a0 < n; a0 += bstep) {
    int ev[kAlignU];
    batch(a0, ev);
#pragma unroll
    for (int u = 0; u < kAlignU; u++)
      if (ev[u] >= 0 && ev[u] < E) atomicAdd(&cnt[ev[u]], 1);
  }
  __syncthreads();
  mkmoe::padded_scan(cnt, off, E, BM);
  if (threadIdx.x == 0) {
    *num_tiles = off[E] / BM;
    off_g[E] = off[E];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    off_g[e] = off[e];
    if (counts_total) counts_total[e] += (unsigned long long)cnt[e];
    for (int tl = off[e] / BM; tl < off[e + 1] / BM; tl++) tile_expert[tl] = e;
    for (int p = off[e] + cnt[e]; p < off[e + 1]; p++) sorted[p] = -1;
  }
  for (int64_t a0 = threadIdx.x; a0 < n; a0 += bstep) {
    int ev[kAlignU];
    batch(a0, ev);
#pragma unroll
    for (int u = 0; u < kAlignU; u++) {
      const int64_t a = a0 + (int64_t)u * blockDim.x;
      if (a >= n) break;
      const int e = ev[u];
      if (e >= 0 && e < E) {
        const int p = off[e] + atomicAdd(&cur[e], 1);
        sorted[p] = (int32_t)a;
        slot_of[a] = p;
      } else {
        slot_of[a] = -1;
      }
    }
  }
}

__global__ void moe_align_kernel(const int32_t* ids, int64_t n, int E, int BM, int32_t* off_g,
                                 int32_t* num_tiles, int32_t* tile_expert, int32_t* sorted,
                                 int32_t* slot_of, unsigned long long* counts_total, int* zero, int zero_n) {
  mk::pdl_begin();
  extern __shared__ int align_sm[];
  align_block(ids, n, E, BM, off_g, num_tiles, tile_expert, sorted, slot_of, counts_total, align_sm, zero, zero_n);
}

// ---- the align over many blocks (prefill: n ≥ kAlignMultiMin assignments)
//
// One block took 156 µs for Qwen3's 16384 tokens × top-8 (ncu, forty-sixth
// pass: 5.6 % of the layer) and 21 µs for 1024 tokens. Two launches of
// align_blocks(n) blocks instead, each block owning chunk consecutive
// assignments: moe_align_count_kernel counts its chunk's ids per expert
// into hist[b][e]; moe_align_place_kernel, in every block, sums hist
// (totals, and the blocks before it per expert), scans the padded offsets
// as the one-block align does, and places its own chunk's assignments from
// its first row of each expert on. So an expert's rows hold the blocks'
// assignments in block order (within a block in the shared atomics' order,
// as before: no output depends on it). Block b also writes the offsets,
// tile experts, padding rows and counts of experts b, b + nb, ...; block 0
// the totals and the split counters' zeros. No state survives a call.
constexpr int64_t kAlignMultiMin = 4096;  // from here on two launches of many blocks beat one block
constexpr int kAlignChunk = 1024;         // assignments a block owns (one a thread), up to kAlignMaxBlocks blocks
constexpr int kAlignMaxBlocks = 256;
constexpr int kAlignMultiMaxE = 1024;  // every block reads all of hist: [blocks][E]

// align_multi: whether n assignments over E experts take the align over
// many blocks; MK_MOE_ALIGN_MULTI=1 / 0 forces it (where E allows) or the
// one-block kernel (read once).
inline bool align_multi(int64_t n, int E) {
  static const int force = mk::env_force("MK_MOE_ALIGN_MULTI");
  if (E > kAlignMultiMaxE) return false;
  return force >= 0 ? force == 1 : n >= kAlignMultiMin;
}
__host__ __device__ inline int align_blocks(int64_t n) {
  const int64_t b = (n + kAlignChunk - 1) / kAlignChunk;
  return (int)(b < kAlignMaxBlocks ? b : kAlignMaxBlocks);
}
__host__ __device__ inline int64_t align_chunk(int64_t n) {
  const int nb = align_blocks(n);
  return (n + nb - 1) / nb;
}

// hist: [gridDim.x][E]; shared: E ints.
__global__ void __launch_bounds__(1024) moe_align_count_kernel(const int32_t* ids, int64_t n, int E, int64_t chunk,
                                                               int32_t* hist) {
  mk::pdl_begin();
  extern __shared__ int cnt_sm[];  // [E]
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt_sm[e] = 0;
  __syncthreads();
  const int64_t a0 = (int64_t)blockIdx.x * chunk, a1 = min(n, a0 + chunk);
  for (int64_t a = a0 + threadIdx.x; a < a1; a += blockDim.x) {
    const int e = ids[a];
    if (e >= 0 && e < E) atomicAdd(&cnt_sm[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist[(int64_t)blockIdx.x * E + e] = cnt_sm[e];
}

// shared: 3·E + 1 ints (tot, cur, off).
__global__ void __launch_bounds__(1024) moe_align_place_kernel(const int32_t* ids, int64_t n, int E, int BM,
    int64_t chunk, const int32_t* hist, int32_t* off_g, int32_t* num_tiles, int32_t* tile_expert, int32_t* sorted,
    int32_t* slot_of, unsigned long long* counts_total, int* zero, int zero_n) {
  mk::pdl_begin();
  extern __shared__ int place_sm[];
  int* tot = place_sm;  // [E] every block's assignments of expert e
  int* cur = tot + E;   // [E] the blocks' before this one, then this block's next row of e
  int* off = cur + E;   // [E + 1] padded offsets
  const int b = (int)blockIdx.x, nb = (int)gridDim.x;
  for (int e = threadIdx.x; e < E; e += blockDim.x) tot[e] = cur[e] = 0;
  __syncthreads();
  const int64_t hn = (int64_t)nb * E, below = (int64_t)b * E;  // hist entries: all, and the blocks' before b
  constexpr int U = 4;  // loads in flight before their atomics
  for (int64_t j0 = threadIdx.x; j0 < hn; j0 += (int64_t)U * blockDim.x) {
    int v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t j = j0 + (int64_t)u * blockDim.x;
      v[u] = j < hn ? hist[j] : 0;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t j = j0 + (int64_t)u * blockDim.x;
      if (j >= hn || v[u] == 0) continue;
      const int e = (int)(j % E);
      atomicAdd(&tot[e], v[u]);
      if (j < below) atomicAdd(&cur[e], v[u]);
    }
  }
  __syncthreads();
  mkmoe::padded_scan(tot, off, E, BM);
  for (int e = threadIdx.x; e < E; e += blockDim.x) cur[e] += off[e];
  for (int e = b; e < E; e += nb) {  // this block's experts
    const int t0 = off[e] / BM, t1 = off[e + 1] / BM;
    for (int tl = t0 + (int)threadIdx.x; tl < t1; tl += blockDim.x) tile_expert[tl] = e;
    for (int p = off[e] + tot[e] + (int)threadIdx.x; p < off[e + 1]; p += blockDim.x) sorted[p] = -1;
    if (threadIdx.x == 0) {
      off_g[e] = off[e];
      if (counts_total) counts_total[e] += (unsigned long long)tot[e];
    }
  }
  if (b == 0) {
    if (threadIdx.x == 0) {
      off_g[E] = off[E];
      *num_tiles = off[E] / BM;
    }
    for (int i = threadIdx.x; i < zero_n; i += blockDim.x) zero[i] = 0;  // GEMM1's split counters, if any
  }
  __syncthreads();
  const int64_t a0 = (int64_t)b * chunk, a1 = min(n, a0 + chunk);
  for (int64_t a = a0 + threadIdx.x; a < a1; a += blockDim.x) {
    const int e = ids[a];
    if (e >= 0 && e < E) {
      const int p = atomicAdd(&cur[e], 1);
      sorted[p] = (int32_t)a;
      slot_of[a] = p;
    } else {
      slot_of[a] = -1;
    }
  }
}

// moe_route_align_kernel routes T ≤ 32 tokens (one warp each, as
// moe_route_reg_kernel) and aligns their assignments (as moe_align_kernel)
// in one block of 1024 threads: a decode step's routing and align in one
// launch. The block's barrier makes the ids it wrote visible to the align.
template <int EPL>
__global__ void __launch_bounds__(1024, 1) moe_route_align_kernel(int32_t* ids, float* wts, const float* logits,
    const float* bias, int64_t T, int E, int K, int flags, int G, int TG, float scale, int BM, int32_t* off_g,
    int32_t* num_tiles, int32_t* tile_expert, int32_t* sorted, int32_t* slot_of,
    unsigned long long* counts_total, int* zero, int zero_n) {
  mk::pdl_begin();
  extern __shared__ __align__(16) unsigned char ra_sm[];
  const int warp = threadIdx.x / 32;
  if (warp < T) route_token_reg<EPL>(ids, wts, logits, bias, warp, E, K, flags, G, TG, scale, ra_sm, warp);
  __syncthreads();
  align_block(ids, T * K, E, BM, off_g, num_tiles, tile_expert, sorted, slot_of, counts_total,
              reinterpret_cast<int*>(ra_sm), zero, zero_n);
}

// moe_route_direct_kernel routes T ≤ 4 tokens (warp t routes token t, as
// moe_route_reg_kernel) and lays out the grouped GEMMs' rows itself, in
// one warp, so that no align launch runs between it and GEMM1: with T·K ≤
// 32 assignments every chosen expert has at most T ≤ BM rows, one row tile
// of its own. Lane a holds assignment a; the lanes with the same expert
// find each other (match.any), the first of them numbers the expert's tile
// (tiles in order of first appearance, where the align orders them by
// expert) and writes its expert, its padding rows (-1) and its counter;
// every lane writes its row (its rank among its expert's lanes) and its
// assignment's row. Every row's sums are the same in either tile order,
// and so is the combine (by slot_of, in k order).
template <int EPL>
__global__ void __launch_bounds__(128) moe_route_direct_kernel(int32_t* ids, float* wts, const float* logits,
    const float* bias, int T, int E, int K, int flags, int G, int TG, float scale, int BM, int32_t* num_tiles,
    int32_t* tile_expert, int32_t* sorted, int32_t* slot_of, unsigned long long* counts_total) {
  mk::pdl_begin();
  extern __shared__ __align__(16) unsigned char rd_sm[];
  __shared__ int ids_sh[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const RoutePick pk = route_token_reg<EPL>(ids, wts, logits, bias, warp, E, K, flags, G, TG, scale, rd_sm, warp);
  if (pk.slot >= 0) ids_sh[warp * K + pk.slot] = pk.id;
  __syncthreads();
  if (warp != 0) return;
  const unsigned full = 0xffffffffu;
  const int n = T * K, a = lane;
  const int e = a < n ? ids_sh[a] : -1;
  const bool ok = e >= 0 && e < E;  // (routing picks real experts; kept as the align's rule)
  const unsigned same = __match_any_sync(full, ok ? e : E + lane);  // lanes without a row: alone
  const int first = __ffs(same) - 1;
  const unsigned firsts = __ballot_sync(full, ok && lane == first);
  const int tile = __popc(firsts & ((1u << first) - 1u));
  const int row = tile * BM + __popc(same & ((1u << lane) - 1u));
  if (ok) sorted[row] = a;
  if (a < n) slot_of[a] = ok ? row : -1;
  if (ok && lane == first) {
    tile_expert[tile] = e;
    for (int r = tile * BM + __popc(same); r < tile * BM + BM; r++) sorted[r] = -1;
    if (counts_total != nullptr) atomicAdd(counts_total + e, (unsigned long long)__popc(same));
  }
  if (lane == 0) *num_tiles = __popc(firsts);
}

// ---------------------------------------------------------------- grouped GEMM

constexpr int BK = mkmoe::kTileK;  // 128-byte rows of 8 16-byte chunks, XOR-swizzled by row

__device__ __forceinline__ int swz(int row, int ch) { return mkmoe::swz64(row, ch); }

using mkmoe::cp_async16;
using mkmoe::cp_async_commit;
using mkmoe::cp_async_wait;


using mkmoe::mma16816;



// last_split counts this CTA's split of a work item in *cnt (one of
// ksplit) after its partial sums are written and reports, to every thread,
// whether it was the last, whose reads of the others' partials are then
// ordered after their writes (the threadFenceReduction pattern).
__device__ __forceinline__ bool last_split(int* cnt, int ksplit) {
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(cnt, 1) == ksplit - 1;
  __syncthreads();
  const bool l = last;
  if (l) __threadfence();
  return l;
}

// split_sum is the sum of the float2 at p over ksplit splits stride floats
// apart, split 0 first (partials written by other CTAs: read through L2).
__device__ __forceinline__ float2 split_sum(const float* p, int64_t stride, int ksplit) {
  float2 v = __ldcg(reinterpret_cast<const float2*>(p));
  for (int sp = 1; sp < ksplit; sp++) {
    const float2 u = __ldcg(reinterpret_cast<const float2*>(p + sp * stride));
    v.x += u.x;
    v.y += u.y;
  }
  return v;
}

// GATEUP: GEMM1 (A rows gathered from x by token, B tile = BN/2 gate rows then
// the BN/2 matching up rows, activation in the epilogue, bf16 out); else
// GEMM2 (A rows contiguous, f32 out).
//
// GEMM2 issues its first STAGES−1 weight stages before griddepcontrol.wait:
// weights are constants, and its tile list (num_tiles, tile_expert, sorted)
// was written by the align launch before GEMM1, which GEMM1 waited for
// before it let GEMM2 launch; those reads go through L2 (__ldcg). Under
// programmatic dependent launch GEMM2's weight stream so starts while
// GEMM1's last wave still runs; its A rows (GEMM1's output) are read after
// the wait.
template <int BM, int BN, int WM, int WN, int STAGES, bool GATEUP, bool PAIR = false>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32)
    moe_gemm_kernel(const GemmArgs p) {
  const bool earlyB = !GATEUP && p.early_b;
  if (!earlyB) mk::pdl_begin();
  if (GATEUP && p.split_cnt != nullptr && blockIdx.x == 0)  // GEMM2's split counters, for this call
    for (int i = threadIdx.x; i < p.split_cnt_n; i += blockDim.x) p.split_cnt[i] = 0;
  constexpr int WARPS_N = BN / WN, THREADS = (BM / WM) * WARPS_N * 32;
  constexpr int MF = WM / 16, NF = WN / 8;
  static_assert(NF % 2 == 0, "n fragments come in pairs");
  constexpr int A_CH = BM * 8, B_CH = BN * 8;  // 16-byte chunks per stage
  constexpr int A_PER = (A_CH + THREADS - 1) / THREADS, B_PER = B_CH / THREADS;
  static_assert(B_CH % THREADS == 0, "B chunks split evenly");

  // 1-D grid in groups of group_m row tiles (group_tile).
  const int tiles_mn = p.mt * p.nt;
  const int split = p.ksplit > 1 ? (int)blockIdx.x / tiles_mn : 0;  // dense mode's split over K
  const int pid = p.ksplit > 1 ? (int)blockIdx.x % tiles_mn : (int)blockIdx.x;
  int tile, ntile;
  mkmoe::group_tile(pid, p.group_m, p.mt, p.nt, tile, ntile);
  const int dense = p.dense_rows;  // > 0: a dense GEMM of that many rows (mk_gemm_skinny_bf16)
  if (tile >= (dense > 0 ? (dense + BM - 1) / BM : __ldcg(p.num_tiles))) return;
  extern __shared__ __align__(128) unsigned char gemm_sm[];
  bf16* sA = reinterpret_cast<bf16*>(gemm_sm);
  bf16* sB = sA + STAGES * BM * BK;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int e = dense > 0 ? 0 : __ldcg(p.tile_expert + tile);
  const int64_t m0 = (int64_t)tile * BM;
  const int64_t Kd = p.Kd, N = p.N;

  // Source rows of this thread's chunks (null: zero-fill).
  const bf16* a_src[A_PER];
  int a_dst[A_PER], a_ch[A_PER];
#pragma unroll
  for (int i = 0; i < A_PER; i++) {
    const int c = tid + i * THREADS;
    const int r = c / 8;
    a_ch[i] = c % 8;
    a_dst[i] = c < A_CH ? swz(r, a_ch[i]) : -1;
    a_src[i] = nullptr;
    if (c < A_CH) {
      const int32_t asg = dense > 0 ? (m0 + r < dense ? (int32_t)(m0 + r) : -1) : __ldcg(p.sorted + m0 + r);
      if (asg >= 0) a_src[i] = GATEUP ? p.A + (int64_t)(asg / p.topk) * Kd : p.A + (m0 + r) * Kd;
    }
  }
  const bf16* b_src[B_PER];
  int b_dst[B_PER], b_ch[B_PER];
#pragma unroll
  for (int i = 0; i < B_PER; i++) {
    const int c = tid + i * THREADS;
    const int r = c / 8;
    b_ch[i] = c % 8;
    b_dst[i] = swz(r, b_ch[i]);
    b_src[i] = mkmoe::tile_b_row<GATEUP, BN>(p.W, (int64_t)e * (GATEUP ? 2 * N : N), r, ntile, N, Kd);
  }

  // k tiles [kt0, kt0 + KT): all of them, or this CTA's split's.
  const int KT_all = (int)((Kd + BK - 1) / BK);
  const int kt0 = split * p.ktc;
  const int KT = p.ksplit > 1 ? max(0, min(KT_all - kt0, p.ktc)) : KT_all;
  auto loadA = [&](int stage, int kt) {
    const int64_t k0 = (int64_t)(kt0 + kt) * BK;
    bf16* a = sA + stage * BM * BK;
#pragma unroll
    for (int i = 0; i < A_PER; i++) {
      if (a_dst[i] < 0) continue;
      const int64_t k = k0 + a_ch[i] * 8;
      const bool v = a_src[i] != nullptr && k < Kd;
      cp_async16(a + a_dst[i], v ? a_src[i] + k : p.A, v);
    }
  };
  auto loadB = [&](int stage, int kt) {
    const int64_t k0 = (int64_t)(kt0 + kt) * BK;
    bf16* b = sB + stage * BN * BK;
#pragma unroll
    for (int i = 0; i < B_PER; i++) {
      const int64_t k = k0 + b_ch[i] * 8;
      const bool v = b_src[i] != nullptr && k < Kd;
      mkmoe::cp_async16_pf(b + b_dst[i], v ? b_src[i] + k : p.W, v, p.l2pf);
    }
  };
  float acc[MF][NF][4];
  mkmoe::zero_acc(acc);

  // Shared-memory rows of this warp's n fragments.
  auto brow = [&](int nf) -> int { return mkmoe::tile_brow<GATEUP, NF, WN, BN>(nf, wn); };

  // The paired ring (PAIR: the 16×64 decode tiles at an even depth, its own
  // instantiation, whose registers do not weigh on the plain ring's).
  static_assert(!PAIR || (BM == 16 && BN == 64 && STAGES % 2 == 0 && STAGES >= 4), "the paired decode tiles");
  mkmoe::PairB<BN, THREADS> pb;  // set and used by the paired ring only
  if constexpr (PAIR) {
    const bf16* we = p.W + (int64_t)e * (GATEUP ? 2 * N : N) * Kd;  // the expert's weights
    pb.init(tid, we, [&](int r) { return mkmoe::tile_b_row<GATEUP, BN>(we, 0, r, ntile, N, Kd); });
  }
  auto loadB2 = [&](int stage, int kt, bool two) {
    pb.load(sB + stage * BN * BK, (int64_t)(kt0 + kt) * BK, two, Kd, p.l2pf);
  };
  mkmoe::ring_run<STAGES, BM, BN, WM, PAIR>(acc, sA, sB, KT, wm, lane, loadA, loadB, loadB2, earlyB,
                                             [&] {
                                               if (earlyB) mk::pdl_begin();  // else done at the start
                                               return true;
                                             },
                                             brow);

  // Epilogue.
#pragma unroll
  for (int mf = 0; mf < MF; mf++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int64_t slot = m0 + wm * WM + mf * 16 + lane / 4 + 8 * h;
      if (dense > 0 ? slot >= dense : p.sorted[slot] < 0) continue;
      if (GATEUP && p.ksplit > 1) {  // this split's gate and up partial sums (MK_MOE_G1_SPLIT)
        float* pg = p.part + ((int64_t)split * p.mt * BM + slot) * 2 * N;
#pragma unroll
        for (int nf = 0; nf < NF / 2; nf++) {
          const int64_t j = (int64_t)ntile * (BN / 2) + wn * (WN / 2) + nf * 8 + (lane % 4) * 2;
          if (j >= N) continue;
          *reinterpret_cast<float2*>(pg + j) = make_float2(acc[mf][nf][2 * h], acc[mf][nf][2 * h + 1]);
          *reinterpret_cast<float2*>(pg + N + j) =
              make_float2(acc[mf][nf + NF / 2][2 * h], acc[mf][nf + NF / 2][2 * h + 1]);
        }
      } else if (GATEUP) {
        mkmoe::store_act_frags<NF, WN, BN>(reinterpret_cast<bf16*>(p.out) + slot * N, acc[mf], h, ntile, wn, lane,
                                           N, p.bias ? p.bias + (int64_t)e * 2 * N : nullptr, p.act, p.alpha,
                                           p.limit);
      } else {
        const bool partial = p.ksplit > 1;
        const int64_t plane = dense > 0 ? dense : (int64_t)p.mt * BM;  // rows of one split's partial sums
        const bool ybf = !partial && p.ybf;
        void* out = partial ? static_cast<void*>(p.part + ((int64_t)split * plane + slot) * N)
                  : ybf     ? static_cast<void*>(reinterpret_cast<bf16*>(p.out) + slot * N)
                            : static_cast<void*>(reinterpret_cast<float*>(p.out) + slot * N);
        const float* db = p.bias && !partial ? p.bias + (int64_t)e * N : nullptr;
        mkmoe::store_y_frags<NF, WN, BN>(out, acc[mf], h, ntile, wn, lane, N, db, ybf);
      }
    }
  }
  if (GATEUP && p.ksplit > 1 && dense == 0) {
    // The last split of this work item sums the gate and up partials, s in
    // order, adds the biases and writes the activation (as GEMM2's below).
    if (!last_split(p.g1_cnt + pid, p.ksplit)) return;
    const int64_t plane = (int64_t)p.mt * BM * 2 * N;
    const float* gb = p.bias ? p.bias + (int64_t)e * 2 * N : nullptr;
#pragma unroll
    for (int mf = 0; mf < MF; mf++) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int64_t slot = m0 + wm * WM + mf * 16 + lane / 4 + 8 * h;
        if (p.sorted[slot] < 0) continue;
        bf16* out = reinterpret_cast<bf16*>(p.out) + slot * N;
#pragma unroll
        for (int nf = 0; nf < NF / 2; nf++) {
          const int64_t j = (int64_t)ntile * (BN / 2) + wn * (WN / 2) + nf * 8 + (lane % 4) * 2;
          if (j >= N) continue;
          const float* pg = p.part + slot * 2 * N;
          float2 g = split_sum(pg + j, plane, p.ksplit), u = split_sum(pg + N + j, plane, p.ksplit);
          if (gb) {
            g.x += gb[j], g.y += gb[j + 1], u.x += gb[N + j], u.y += gb[N + j + 1];
          }
          *reinterpret_cast<__nv_bfloat162*>(out + j) = __floats2bfloat162_rn(
              activation(g.x, u.x, p.act, p.alpha, p.limit), activation(g.y, u.y, p.act, p.alpha, p.limit));
        }
      }
    }
    return;
  }
  if (GATEUP || p.ksplit <= 1 || dense > 0) return;
  // Grouped split mode: the last split of this work item to finish sums the
  // partials, s in order, and writes y (the threadFenceReduction pattern).
  if (!last_split(p.split_cnt + pid, p.ksplit)) return;
  const int64_t plane = (int64_t)p.mt * BM;
  const float* db = p.bias ? p.bias + (int64_t)e * N : nullptr;
#pragma unroll
  for (int mf = 0; mf < MF; mf++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int64_t slot = m0 + wm * WM + mf * 16 + lane / 4 + 8 * h;
      if (p.sorted[slot] < 0) continue;
#pragma unroll
      for (int nf = 0; nf < NF; nf++) {
        const int64_t n = (int64_t)ntile * BN + wn * WN + nf * 8 + (lane % 4) * 2;
        if (n >= N) continue;
        float2 v = split_sum(p.part + slot * N + n, plane * N, p.ksplit);
        if (db) {
          v.x += db[n];
          v.y += db[n + 1];
        }
        mkmoe::store_y2(p.out, slot * N + n, v, p.ybf);
      }
    }
  }
}

// ---------------------------------------------------------------- combine

// out [T, H] = Σ_k w[t,k] · y[slot_of[t*K+k]], k in order (fmaf from 0);
// blockIdx.x is the token, blockIdx.y a slice of its columns (several CTAs
// per token, so that a decode step's few tokens still spread over many
// SMs). The token's slots and weights are staged in shared memory once and
// each column's K expert rows are loaded kU at a time before they are
// summed: the loop of one slot load, then one row load, per k cost a
// dependent round trip each (ncu, one token: 8.0 µs at K = 8 on
// DeepSeek-V3's 7168 columns, 5.1 on Qwen3's, 3.4 at K = 2 on Mixtral).
// YBF: y holds bf16 rows and a thread sums 8 columns a step, each row's
// 16 bytes one load (4 columns, 8 bytes a load, kept the load count of the
// f32 rows and read them at 2.0 TB/s: Qwen3 at 16384 tokens, ncu,
// forty-sixth pass).
template <bool YBF>
__global__ void moe_combine_kernel(float* out, const void* y, const int32_t* slot_of, const float* w, int K,
                                   int64_t H) {
  mk::pdl_begin();
  constexpr int kC = 64, kU = 8;  // k staged in shared memory; rows in flight a column
  constexpr int C = YBF ? 8 : 4;  // columns a thread sums a step
  __shared__ int32_t c_slot[kC];
  __shared__ float c_w[kC];
  const int64_t t = blockIdx.x;
  const int64_t HC = H / C;  // H % 8 == 0
  const int kn = K < kC ? K : kC;
  for (int k = threadIdx.x; k < kn; k += blockDim.x) {
    c_slot[k] = slot_of[t * K + k];
    c_w[k] = w[t * K + k];
  }
  __syncthreads();
  for (int64_t c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; c < HC; c += (int64_t)gridDim.y * blockDim.x) {
    float s[C];
#pragma unroll
    for (int j = 0; j < C; j++) s[j] = 0.f;
    for (int k0 = 0; k0 < K; k0 += kU) {
      int32_t sl[kU];
      uint4 v[kU];  // f32: one float4's bits; bf16: 8 values
#pragma unroll
      for (int u = 0; u < kU; u++) {
        const int k = k0 + u;
        sl[u] = k >= K ? -1 : k < kC ? c_slot[k] : slot_of[t * K + k];
        v[u] = sl[u] >= 0 ? reinterpret_cast<const uint4*>(y)[(int64_t)sl[u] * HC + c] : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kU; u++) {
        if (sl[u] < 0) continue;
        const int k = k0 + u;
        const float wk = k < kC ? c_w[k] : w[t * K + k];
        const uint32_t b[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
        for (int j = 0; j < C; j++) {
          const float yv = YBF ? __uint_as_float(j % 2 ? b[j / 2] & 0xffff0000u : b[j / 2] << 16)
                               : __uint_as_float(b[j]);
          s[j] = fmaf(wk, yv, s[j]);
        }
      }
    }
    float4* o4 = reinterpret_cast<float4*>(out + t * H + c * C);
#pragma unroll
    for (int j = 0; j < C / 4; j++) o4[j] = make_float4(s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3]);
  }
}

// ---------------------------------------------------------------- decode-sized experts
//
// For a few tokens (T ≤ kGemvTokens, T·K ≤ 32) the grouped GEMMs' row tiles
// are mostly padding, and align and combine are two more launches. Instead
// two GEMV-style kernels stream each chosen expert's weights once (16-byte
// loads not kept in L1), however many of the tokens chose it:
//   up:   a CTA per (assignment p, 8 rows j); only the first assignment of
//         each expert works: its warps take gate row j and up row j against
//         the x of every token that chose the expert (staged in shared
//         memory), the activation → act[q, j] bf16 for each such q (rounded
//         as the grouped path's);
//   down: one warp per output column c: for each distinct expert, its Down
//         row c against act of the assignments that chose it, weighted, into
//         one sum per token (the combine folded in), + the weighted biases.
// The first version read an expert once per assignment. In `bench model`
// on Qwen3-30B-A3B's shapes the 4 tokens of a step chose about 9 distinct
// experts per layer, not 32 (its weight-bytes column), so that version read
// 3.5× the bytes and lost to the fused kernel by 47 µs a layer. Ids < 0
// (another rank's experts, mk_moe_localize) add nothing.
constexpr int kGemvTokens = 4, kGemvAssign = 32;
constexpr int kGemvWarps = 8;

// g_moe_gemv: -1 auto (gemv_path's rule), 0 off, 1 the two GEMV kernels,
// 2 one launch for routing and both (moe_decode_kernel), 3 the two GEMV
// kernels with the resident down kernel where it fits
// (moe_gemv_down_res_kernel); -2 (never set by mk_moe_gemv): MK_MOE_GEMV=0,
// 1, 2 or 3, else auto. History: in `bench model` (CUDA graphs, PDL) the
// fused kernel's decode steps were faster at 1-4 tokens on Qwen3-30B-A3B
// and DeepSeek-V3 shapes, and on Mixtral-8x7B at 2 (docs/PERF.md, seventh
// pass); mode 2 lost to both (eleventh pass); modes 1 and 3 lost to the
// grouped GEMMs again in the twenty-fourth pass (Qwen3-8l batch 1 ×1.19
// and ×1.02, batch 2 ×1.25; Mixtral-4l ×1.21–1.27); the forty-first pass's
// down kernel (batched loads) made mode 1 faster than the grouped GEMMs at
// one token on Mixtral's long expert rows only, which auto takes.
int g_moe_gemv = -2;

// gemv_mode is g_moe_gemv with the environment's default.
int gemv_mode() {
  if (g_moe_gemv >= -1) return g_moe_gemv;
  static int v = [] {
    const char* e = getenv("MK_MOE_GEMV");
    return e && e[0] >= '0' && e[0] <= '3' && e[1] == 0 ? e[0] - '0' : -1;
  }();
  return v;
}

// kGemvAutoI: auto takes the GEMV kernels for one token whose experts have
// at least this intermediate size (Mixtral-8x7B's 14336; Qwen3-30B-A3B's
// 768, DeepSeek-V3's 2048 and gpt-oss's 2880 stay on the grouped GEMMs,
// where the GEMV kernels measured 1.04–1.14× slower, forty-first pass).
// kernels.MoEGemvAutoInter mirrors it.
constexpr int64_t kGemvAutoI = 8192;

__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, float s) {
  const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
    s = fmaf(__uint_as_float(aw[i] << 16), __uint_as_float(bw[i] << 16), s);
    s = fmaf(__uint_as_float(aw[i] & 0xffff0000u), __uint_as_float(bw[i] & 0xffff0000u), s);
  }
  return s;
}

// expert_groups is run by warp 0 over the n ≤ 32 assignments' ids: first[q]
// is the first assignment with q's expert (q itself for the first), and the
// result the bit mask of first assignments.
__device__ __forceinline__ unsigned expert_groups(const int32_t* ids, int n, int* first) {
  const int lane = threadIdx.x & 31;
  const int e = lane < n ? ids[lane] : -1;
  int f = lane;
  for (int q = 0; q < 32; q++) {
    const int eq = __shfl_sync(0xffffffffu, e, q);
    if (q < lane && eq == e && f == lane) f = q;
  }
  if (lane < n) first[lane] = e < 0 ? -1 : f;
  return __ballot_sync(0xffffffffu, lane < n && e >= 0 && f == lane);
}

// distinct_experts is run by warp 0 over the n ≤ 32 assignments' ids: ue[g]
// is the g-th distinct expert (by first assignment), um[g] the mask of its
// assignments, *un their count (first: scratch of expert_groups).
__device__ __forceinline__ void distinct_experts(const int32_t* ids, int n, int* first, int* ue, unsigned* um,
                                                 int* un) {
  const int lane = threadIdx.x & 31;
  const unsigned firsts = expert_groups(ids, n, first);
  __syncwarp();
  if ((firsts >> lane) & 1u) {
    const int g = __popc(firsts & ((1u << lane) - 1u));
    ue[g] = ids[lane];
    unsigned m = 0;
    for (int q = lane; q < n; q++)
      if (first[q] == lane) m |= 1u << q;
    um[g] = m;
  }
  if (lane == 0) *un = __popc(firsts);
}

// gemv_up_row is a warp's share of the GEMV up phase: gate row j and up
// row j of expert e against the x rows of the expert's nt assignments qs
// (global or shared memory: assignment i's row starts at xs + xo[i], 16-byte chunks),
// the activation rounded to bf16 into act[qs[i], j] (lane 0).
__device__ __forceinline__ void gemv_up_row(bf16* act, const uint4* xs, const int* xo, const int* qs, int nt,
                                            int e, int64_t j, const bf16* gu, const float* gub, int64_t H,
                                            int64_t I, int act_kind, float alpha, float limit) {
  const int lane = threadIdx.x & 31;
  const int64_t P = H / 8;  // 16-byte chunks of a row
  const uint4* g = reinterpret_cast<const uint4*>(gu + ((int64_t)e * 2 * I + j) * H);
  const uint4* u = g + I * P;  // the up row j is I rows further
  float sg[kGemvTokens] = {0.f, 0.f, 0.f, 0.f}, su[kGemvTokens] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
  for (int64_t c = lane; c < P; c += 32) {
    const uint4 gv = mk::ld_stream(g + c), uv = mk::ld_stream(u + c);
#pragma unroll
    for (int i = 0; i < kGemvTokens; i++) {
      if (i < nt) {
        const uint4 xv = xs[xo[i] + c];
        sg[i] = dot8(gv, xv, sg[i]);
        su[i] = dot8(uv, xv, su[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kGemvTokens; i++) {
    if (i >= nt) break;
    float a = mk::warp_sum(sg[i]), b = mk::warp_sum(su[i]);
    if (lane == 0) {
      if (gub) {
        a += gub[(int64_t)e * 2 * I + j];
        b += gub[(int64_t)e * 2 * I + I + j];
      }
      act[(int64_t)qs[i] * I + j] = __float2bfloat16_rn(activation(a, b, act_kind, alpha, limit));
    }
  }
}

// down_col_out ends a warp's output column c of the GEMV down phase: each
// token's sum of the lanes' acc, + the weighted biases of its experts (ids
// < 0: another rank's, none), into out[t, c] from lane 0.
__device__ __forceinline__ void down_col_out(float* out, const float (&acc)[kGemvTokens], int64_t c, const float* w,
                                             const int32_t* ids, const float* db, int64_t H, int T, int K) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kGemvTokens; i++) {
    if (i >= T) break;
    float v = mk::warp_sum(acc[i]);
    if (lane == 0) {
      if (db)
        for (int k = 0; k < K; k++) {
          const int e = ids[i * K + k];
          if (e >= 0) v = fmaf(w[i * K + k], db[(int64_t)e * H + c], v);
        }
      out[i * H + c] = v;
    }
  }
}

// down_pre: the GEMV down phase loads the first assignment's activations
// with each batch of its row (MK_MOE_DOWN_PRE=0: after it; read once).
// Measured (forty-third pass, ab_moe.sh): 10–13 % off every GEMV layer at
// 1–4 tokens; Mixtral's one-token layer 0.211 → 0.186 ms.
static bool down_pre() {
  static const bool v = [] {
    const char* e = getenv("MK_MOE_DOWN_PRE");
    return !(e && e[0] == '0');
  }();
  return v;
}

// gemv_down_col is a warp's share of the GEMV down phase: output column c
// of every token, Σ over the un distinct experts ue[g] of its Down row c
// against act of the assignments in um[g] (at most one a token, so at most
// kGemvTokens), weighted by w (the combine), + the weighted biases of ids'
// experts; out[t, c] from lane 0. Each lane issues kDownB loads of the row
// before it uses any (the row streams from HBM; act comes from L2). Before
// the forty-first pass a lane had one row load in flight at a time, the
// assignments' loop between two loads, and the down phase ran at ~2 TB/s
// (Mixtral's one token: 117 µs for 235 MB, ncu).
constexpr int kDownB = 8;
__device__ __forceinline__ void gemv_down_col(float* out, const bf16* act, int64_t c, const int* ue,
                                              const unsigned* um, int un, const float* w, const int32_t* ids,
                                              const bf16* dn, const float* db, int64_t H, int64_t I, int T, int K,
                                              bool pre) {
  const int lane = threadIdx.x & 31;
  const int P = (int)(I / 8);
  float acc[kGemvTokens] = {0.f, 0.f, 0.f, 0.f};
  for (int g = 0; g < un; g++) {
    const uint4* row = reinterpret_cast<const uint4*>(dn + ((int64_t)ue[g] * H + c) * I);
    int qv[kGemvTokens] = {0, 0, 0, 0}, nq = 0;
    for (unsigned m = um[g]; m && nq < kGemvTokens; m &= m - 1) qv[nq++] = __ffs(m) - 1;
    float d[kGemvTokens] = {0.f, 0.f, 0.f, 0.f};
    const uint4* a0 = reinterpret_cast<const uint4*>(act + (int64_t)qv[0] * I);
    for (int p0 = lane; p0 < P; p0 += 32 * kDownB) {
      uint4 rv[kDownB], av0[kDownB];
#pragma unroll
      for (int b = 0; b < kDownB; b++) {
        const int p = p0 + 32 * b;
        rv[b] = p < P ? mk::ld_stream(row + p) : make_uint4(0u, 0u, 0u, 0u);
        // The first assignment's activations in the same flight as the
        // row (L2): read after the row, their round trip came on top of
        // every batch's (DeepSeek-V3's one token: 76 µs for 235 MB, ncu).
        if (pre) av0[b] = p < P ? __ldcg(a0 + p) : make_uint4(0u, 0u, 0u, 0u);
      }
      if (pre) {
#pragma unroll
        for (int b = 0; b < kDownB; b++) d[0] = dot8(rv[b], av0[b], d[0]);
      }
#pragma unroll
      for (int i = pre ? 1 : 0; i < kGemvTokens; i++) {
        if (i >= nq) break;
        const uint4* av = reinterpret_cast<const uint4*>(act + (int64_t)qv[i] * I);
#pragma unroll
        for (int b = 0; b < kDownB; b++) {
          const int p = p0 + 32 * b;
          if (p < P) d[i] = dot8(rv[b], __ldcg(av + p), d[i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kGemvTokens; i++) {
      if (i >= nq) break;
      const int t = qv[i] / K;
#pragma unroll
      for (int j = 0; j < kGemvTokens; j++)
        if (j == t) acc[j] = fmaf(w[qv[i]], d[i], acc[j]);
    }
  }
  down_col_out(out, acc, c, w, ids, db, H, T, K);
}

// grid (ceil(I / kGemvWarps), T·K); dynamic shared memory T·H bf16, or
// none with RES (the resident down kernel follows, MK_MOE_GEMV=3): then x
// is read from global memory (L1) rather than staged, so that this
// kernel's CTAs leave an SM room for the down kernel's rows, and it lets
// the down kernel launch once every CTA has passed its wait.
template <bool RES>
__global__ void __launch_bounds__(kGemvWarps * 32)
    moe_gemv_up_kernel(bf16* act, const bf16* x, const int32_t* ids, const bf16* gu, const float* gub, int64_t H,
                       int64_t I, int T, int K, int act_kind, float alpha, float limit, unsigned long long* counts) {
  if (RES)
    mk::pdl_begin();
  else
    mk::pdl_wait();  // many waves: no early launch of the down kernel
  extern __shared__ __align__(16) unsigned char xsm_raw[];
  __shared__ int first[kGemvAssign];
  const int p = blockIdx.y, n = T * K;
  const int e = ids[p];
  if (e < 0) return;  // not this rank's expert
  if (threadIdx.x < 32) expert_groups(ids, n, first);
  __syncthreads();
  if (first[p] != p) return;  // the expert's first assignment does the work
  // The tokens that chose e (at most one assignment each: a token's experts differ).
  int qs[kGemvTokens], nt = 0;
  for (int q = p; q < n && nt < kGemvTokens; q++)
    if (first[q] == p) qs[nt++] = q;
  if (counts && blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(counts + e, (unsigned long long)nt);
  const int64_t P = H / 8;  // 16-byte chunks of a row
  const int warp = threadIdx.x >> 5;
  const int64_t j = (int64_t)blockIdx.x * kGemvWarps + warp;
  if constexpr (RES) {
    // Rows j, j + 8·gridDim.x, …: the grid is one wave that leaves each SM
    // room for a down CTA (experts_run's upx), which can launch only once every
    // CTA of this one has passed its wait.
    int xo[kGemvTokens];  // the rows of x, in qs order (unrolled: registers)
#pragma unroll
    for (int i = 0; i < kGemvTokens; i++) xo[i] = i < nt ? (qs[i] / K) * (int)P : 0;
    for (int64_t jj = j; jj < I; jj += (int64_t)gridDim.x * kGemvWarps)
      gemv_up_row(act, reinterpret_cast<const uint4*>(x), xo, qs, nt, e, jj, gu, gub, H, I, act_kind, alpha, limit);
  } else {
    uint4* xs = reinterpret_cast<uint4*>(xsm_raw);
    for (int i = 0; i < nt; i++) {
      const uint4* xr = reinterpret_cast<const uint4*>(x + (int64_t)(qs[i] / K) * H);
      for (int64_t c = threadIdx.x; c < P; c += blockDim.x) xs[i * P + c] = xr[c];
    }
    __syncthreads();
    if (j >= I) return;
    const int xo[kGemvTokens] = {0, (int)P, 2 * (int)P, 3 * (int)P};  // the staged rows, in qs order
    gemv_up_row(act, xs, xo, qs, nt, e, j, gu, gub, H, I, act_kind, alpha, limit);
  }
}

// grid ceil(H / kGemvWarps): one warp per output column, every token.
//
// early: the grid is one wave (every CTA resident at once), so the next
// kernel may launch as soon as every CTA has passed its wait (it cannot
// take an SM slot one of these CTAs still needs).
__global__ void __launch_bounds__(kGemvWarps * 32)
    moe_gemv_down_kernel(float* out, const bf16* act, const int32_t* ids, const float* w, const bf16* dn,
                         const float* db, int64_t H, int64_t I, int T, int K, bool early, bool pre) {
  mk::pdl_wait();
  if (early) mk::pdl_begin();
  __shared__ int first[kGemvAssign], ue[kGemvAssign];
  __shared__ unsigned um[kGemvAssign];  // per distinct expert: its assignments
  __shared__ float sw[kGemvAssign];
  __shared__ int un;
  const int n = T * K;
  if (threadIdx.x < 32) {
    distinct_experts(ids, n, first, ue, um, &un);
    if ((int)threadIdx.x < n) sw[threadIdx.x] = w[threadIdx.x];
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  const int64_t c = (int64_t)blockIdx.x * kGemvWarps + warp;
  if (c >= H) return;
  gemv_down_col(out, act, c, ue, um, un, sw, ids, dn, db, H, I, T, K, pre);
}

// moe_gemv_down_res_kernel (MK_MOE_GEMV=3, where down_res_cols fits): the
// down phase with each CTA owning C consecutive output columns [c0, c0+C)
// of every token. Before its wait it finds the distinct chosen experts (the
// ids were written before the up kernel passed its own wait, which this
// launch follows) and warp 0's lanes bulk-copy the experts' down rows of
// its columns into shared memory, one mbarrier a column — so the down
// weights stream in under the up kernel rather than after it. After the
// wait it stages the activations [T·K, I] and each warp sums its columns:
// Σ over the distinct experts g and their assignments q of w[q]·(row ·
// act[q]), + the weighted biases, as gemv_down_col (in another order).
// Dynamic shared memory: down_res_bytes(C, T·K, I).
constexpr int64_t down_res_bytes(int64_t C, int64_t n, int64_t I) {
  return mkwg::mbar_bytes(C) + (n * C + n) * I * 2;  // barriers, rows [n][C][I], activations [n][I]
}
__global__ void __launch_bounds__(kGemvWarps * 32, 1)
    moe_gemv_down_res_kernel(float* out, const bf16* act, const int32_t* ids, const float* w, const bf16* dn,
                             const float* db, int64_t H, int64_t I, int T, int K, int C) {
  extern __shared__ __align__(128) unsigned char dres_sm[];
  __shared__ int first[kGemvAssign], ue[kGemvAssign];
  __shared__ unsigned um[kGemvAssign];
  __shared__ int un;
  const int n = T * K, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t c0 = (int64_t)blockIdx.x * C;
  const int cn = (int)(H - c0 < C ? H - c0 : (int64_t)C);
  uint64_t* bar = reinterpret_cast<uint64_t*>(dres_sm);                            // [C]
  bf16* rows = reinterpret_cast<bf16*>(dres_sm + mkwg::mbar_bytes(C));              // [n][C][I]: expert g's row c
  bf16* as = rows + (int64_t)n * C * I;                                              // [n][I]
  if (warp == 0) {
    distinct_experts(ids, n, first, ue, um, &un);  // ids: complete before this launch (above)
    __syncwarp();
    const int u = un;
    for (int c = lane; c < cn; c += 32) mkwg::mbar_init(bar + c, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncwarp();
    // Weights are constants: the copies go out before the wait, column by
    // column so that the first columns land first.
    for (int c = lane; c < cn; c += 32) {
      mkwg::mbar_expect_tx(bar + c, (uint32_t)(u * I * 2));
      for (int g = 0; g < u; g++)
        mkwg::bulk_g2s(rows + ((int64_t)g * C + c) * I, dn + ((int64_t)ue[g] * H + c0 + c) * I, (uint32_t)(I * 2),
                       bar + c);
    }
  }
  mk::pdl_begin();
  const int64_t P = I / 8;  // 16-byte chunks of a row
  for (int64_t q = threadIdx.x; q < (int64_t)n * P; q += blockDim.x)
    reinterpret_cast<uint4*>(as)[q] = __ldcg(reinterpret_cast<const uint4*>(act) + q);
  __syncthreads();  // act staged; ue, um, un and the barriers' inits visible to every warp
  const int u = un;
  for (int c = warp; c < cn; c += kGemvWarps) {
    mkwg::mbar_wait(bar + c, 0);
    float acc[kGemvTokens] = {0.f, 0.f, 0.f, 0.f};
    for (int g = 0; g < u; g++) {
      const uint4* rv = reinterpret_cast<const uint4*>(rows + ((int64_t)g * C + c) * I);
      for (unsigned m = um[g]; m; m &= m - 1) {
        const int q = __ffs(m) - 1;
        const uint4* av = reinterpret_cast<const uint4*>(as + (int64_t)q * I);
        float d = 0.0f;
        for (int64_t p = lane; p < P; p += 32) d = dot8(rv[p], av[p], d);
        const float wq = w[q];
        const int t = q / K;
#pragma unroll
        for (int i = 0; i < kGemvTokens; i++)
          if (i == t) acc[i] = fmaf(wq, d, acc[i]);
      }
    }
    down_col_out(out, acc, c0 + c, w, ids, db, H, T, K);
  }
}

// ---------------------------------------------------------------- decode-sized experts, one launch
//
// moe_decode_kernel (mk_moe_gemv(2), MK_MOE_GEMV=2): the GEMV path's up and
// down kernels, and with logits its routing, in ONE launch of at most as
// many CTAs as fit at once. Every CTA routes the T tokens itself
// (route_token_reg, the routing kernel's own code, into shared memory: the
// same ids and weights in every CTA; CTA 0 stores them and counts the
// experts), stages the T rows of x once, takes up items (distinct expert ×
// kGemvWarps rows, a warp a row, as moe_gemv_up_kernel) in a strided loop,
// waits at a grid barrier for every CTA's activations, then takes down
// items (kGemvWarps output columns, as moe_gemv_down_kernel). The sums are
// the two kernels' in the same order, so the output is theirs bit for bit.
//
// The barrier: *bar, zeroed before the launch, counts arrivals; the grid
// is at most what fits at once and the kernel never lets its dependents
// launch early (no pdl_begin), so no later kernel's CTAs hold the slots its
// own CTAs need. Every spin is bounded by timeout_ns: a timeout writes
// g_decode_err (once; mk_moe_decode_check reads and clears it) and the CTA
// leaves (the output is then not valid).
__device__ int g_decode_err[4];  // set, cta, arrivals seen, grid size

struct DecodeParams {
  float* out;     // [T, H] f32: the combined experts' output
  int32_t* ids;   // [T, K]: the routing's output (logits set) or its input
  float* wts;     // [T, K]
  bf16* act;      // [T·K, I]: the activations between the phases
  int* bar;       // the grid barrier's arrival counter (zeroed before the launch)
  const bf16* x;  // [T, H]
  const float* logits;  // [T, E], or null: ids and wts are given
  const float* bias;    // score bias [E] or null
  const bf16* gu;
  const float* gub;
  const bf16* dn;
  const float* db;
  unsigned long long* counts;
  int64_t H, I;
  long long timeout_ns;
  int T, E, K, flags, G, TG, act_kind;
  float scale, alpha, limit;
};

// decode_barrier returns once every CTA of the launch has arrived (true),
// or false when the bounded wait timed out (the record is written).
__device__ bool decode_barrier(const DecodeParams& p) {
  __shared__ int ok;
  __syncthreads();  // the CTA's stores are done (ordered before thread 0's fence)
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(p.bar, 1);
    const unsigned long long t0 = mk::globaltimer();
    ok = 1;
    for (unsigned it = 0;; ++it) {
      const int seen = mk::ld_acquire(p.bar);
      if (seen >= (int)gridDim.x) break;
      if (mk::ld_relaxed(&g_decode_err[0]) != 0 ||
          ((it & 15) == 15 && (long long)(mk::globaltimer() - t0) > p.timeout_ns)) {
        if (atomicCAS(&g_decode_err[0], 0, 1) == 0) {
          g_decode_err[1] = (int)blockIdx.x;
          g_decode_err[2] = seen;
          g_decode_err[3] = (int)gridDim.x;
          __threadfence();
        }
        ok = 0;
        break;
      }
      __nanosleep(64);
    }
  }
  __syncthreads();
  return ok != 0;
}

template <int EPL>
__global__ void __launch_bounds__(kGemvWarps * 32) moe_decode_kernel(const __grid_constant__ DecodeParams p) {
  mk::pdl_wait();  // reads the previous kernel's x and logits; never triggers its dependents early
  extern __shared__ __align__(16) unsigned char dsm[];  // x of the T tokens, then the routing's scratch
  __shared__ int32_t ids_sh[kGemvAssign];
  __shared__ float w_sh[kGemvAssign];
  __shared__ int first[kGemvAssign], ue[kGemvAssign];
  __shared__ unsigned um[kGemvAssign];  // per distinct expert: its assignments
  __shared__ int un;
  const int n = p.T * p.K;
  const int warp = threadIdx.x >> 5;
  const int64_t P = p.H / 8;  // 16-byte chunks of an x row
  uint4* xs = reinterpret_cast<uint4*>(dsm);

  // 1. The routing (every CTA the same), the x rows, the expert groups.
  if (p.logits != nullptr) {
    if (warp < p.T)
      route_token_reg<EPL>(ids_sh, w_sh, p.logits, p.bias, warp, p.E, p.K, p.flags, p.G, p.TG, p.scale,
                           dsm + (size_t)p.T * p.H * 2, warp);
  } else {
    for (int q = threadIdx.x; q < n; q += blockDim.x) {
      ids_sh[q] = p.ids[q];
      w_sh[q] = p.wts[q];
    }
  }
  const uint4* xg = reinterpret_cast<const uint4*>(p.x);
  for (int64_t c = threadIdx.x; c < p.T * P; c += blockDim.x) xs[c] = xg[c];
  __syncthreads();
  if (warp == 0) distinct_experts(ids_sh, n, first, ue, um, &un);
  if (blockIdx.x == 0 && threadIdx.x < n) {
    const int q = threadIdx.x, e = ids_sh[q];
    if (p.logits != nullptr) {
      p.ids[q] = e;
      p.wts[q] = w_sh[q];
    }
    if (p.counts != nullptr && e >= 0) atomicAdd(p.counts + e, 1ull);
  }
  __syncthreads();

  // 2. Up: item (distinct expert g, rows j0..j0+kGemvWarps-1), a warp a row.
  const int64_t nbx = (p.I + kGemvWarps - 1) / kGemvWarps;
  const int64_t up_items = (int64_t)un * nbx;
  for (int64_t it = blockIdx.x; it < up_items; it += gridDim.x) {
    const int g = (int)(it / nbx);
    const int64_t j = (it - (int64_t)g * nbx) * kGemvWarps + warp;
    if (j >= p.I) continue;  // warp-uniform; nothing below waits on the block
    int qs[kGemvTokens], nt = 0;
    int xo[kGemvTokens] = {0, 0, 0, 0};
    for (unsigned m = um[g]; m != 0u && nt < kGemvTokens; m &= m - 1, nt++) {
      qs[nt] = __ffs(m) - 1;
      xo[nt] = (qs[nt] / p.K) * (int)P;  // its token's staged row
    }
    gemv_up_row(p.act, xs, xo, qs, nt, ue[g], j, p.gu, p.gub, p.H, p.I, p.act_kind, p.alpha, p.limit);
  }

  // 3. Every CTA's activations are written.
  if (!decode_barrier(p)) return;

  // 4. Down: item = kGemvWarps output columns, a warp a column, every token.
  const int64_t items = (p.H + kGemvWarps - 1) / kGemvWarps;
  for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
    const int64_t c = it * kGemvWarps + warp;
    if (c >= p.H) continue;
    gemv_down_col(p.out, p.act, c, ue, um, un, w_sh, ids_sh, p.dn, p.db, p.H, p.I, p.T, p.K, true);
  }
}

// ---------------------------------------------------------------- localize

__global__ void moe_localize_kernel(int32_t* ids, int64_t n, int lo, int hi, unsigned long long* counts, int E) {
  mk::pdl_begin();
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int e = ids[i];
    if (counts && e >= 0 && e < E) atomicAdd(counts + e, 1ull);  // every rank's experts, before the rewrite
    ids[i] = e >= lo && e < hi ? e - lo : -1;
  }
}

// ---------------------------------------------------------------- random fill

__device__ __forceinline__ uint64_t splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void moe_fill_kernel(bf16* dst, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const uint64_t r = splitmix(seed ^ (uint64_t)i * 0xd1b54a32d192ed03ull);
    float s = 0;
    for (int q = 0; q < 4; q++) s += (float)((r >> (16 * q)) & 0xffff) * (1.0f / 65536.0f);
    dst[i] = __float2bfloat16_rn((s - 2.0f) * 1.7320508f * scale);
  }
}

// ---------------------------------------------------------------- configurations

struct Cfg {
  int bm, bn, threads, stages;
};
// 0: decode (16-row tiles), 1: 64-row, 2: prefill (128×128), 3: prefill
// (128×256), 4: 32-row tiles (8–24 rows per expert: an expert of 17–32
// rows reads its weights once, where 16-row tiles read them twice), 5:
// 64×256 wgmma tiles (w64_max; the mma.sync 64×128 tiles of 1 where the
// wgmma kernel cannot run).
constexpr Cfg kCfg[6] = {{16, 64, 128, 6},   {64, 128, 128, 4}, {128, 128, 256, 4},
                         {128, 256, 256, 4}, {32, 64, 128, 6},  {64, 256, 384, 4}};

bool wide_tiles();

// big_avg: expected rows per active expert above which the 128-row tiles
// (wgmma on sm_90a) run; MK_MOE_BIG_AVG overrides the default 24. It was
// 48 (the 64-row mma.sync tiles from 24 to 48 rows): session 18, grouped
// layers by graph replay, same call, 24 against 48: DeepSeek-V3 ×0.74–0.77
// at 1024 tokens, ×0.66 at 1536, Mixtral ×0.97 at 128 and 160, Qwen3 ×1.02
// at 512 and 640 (the one loss), so the 64-row tiles run only when the
// variable asks for them. Session 19 tried 8 from hidden size 6144 on: the
// DeepSeek-V3 layer alone (uniformly random routing) was ×0.69–0.95 at 8–24
// rows, but DeepSeek-V3-4l's decode steps, whose routing is skewed, were
// 4 % slower at batch 256, 11 % at 384 and level at 512 (calls 99–104), so
// the default is 24 for every shape again.
double big_avg() {
  static double b = [] {
    const char* v = getenv("MK_MOE_BIG_AVG");
    const double x = v ? atof(v) : 0;
    return x > 0 ? x : 24.0;
  }();
  return b;
}

// bm32: the 32-row tiles for 8 < rows per expert ≤ 24 (MK_MOE_BM32=0: the
// 16-row tiles there, for comparisons).
bool bm32() {
  static const bool b = !mk::env_is("MK_MOE_BM32", '0');
  return b;
}

// w64_max: expected rows per active expert up to which the rows past
// big_avg run on the 64-row wgmma tiles (cfg 5) instead of the 128-row
// ones, whose padding doubles the tensor-core work at 64 rows an expert
// and quadruples it at 32; above ~48 many experts would need two 64-row
// tiles (their weights then read twice from L2). MK_MOE_W64_MAX overrides
// the default 48 (0: off). Measured (H200, twenty-first pass, grouped
// layers by graph replay, against off): Qwen3-30B-A3B 512 / 768 tokens
// (32 / 48 rows an expert) ×0.87 / ×0.88, Mixtral 128 tokens (32) ×0.93;
// at 64 rows (max 96) Qwen3 1024 ×0.98 but Mixtral 256 ×1.08; DeepSeek-V3
// 1024 / 1536 tokens (hidden 7168) ×1.01 / ×1.03, so hidden sizes above
// kW64MaxH keep the 128-row tiles.
constexpr int64_t kW64MaxH = 4096;
double w64_max() {
  static double m = [] {
    const char* v = getenv("MK_MOE_W64_MAX");
    return v ? atof(v) : 48.0;
  }();
  return m;
}

int pick_cfg(int64_t T, int K, int E, int64_t H) {
  const int64_t n = T * K;
  const int64_t active = n < E ? n : E;
  const double avg = (double)n / (double)(active > 0 ? active : 1);
  if (T <= 16) return 0;
  if (avg > big_avg() && avg <= w64_max() && H <= kW64MaxH && wide_tiles()) return 5;
  if (avg > big_avg()) return wide_tiles() ? 3 : 2;  // (a big_avg under 24 takes rows from the 32-row tiles, under 8 from the 16-row ones)
  if (avg <= 8) return 0;
  if (avg <= 24) return bm32() ? 4 : 0;
  return 1;
}

// Workspace layout. g2s > 1: GEMM2 splits its reduction g2s ways (part
// holds the partial sums, g2cnt a counter per GEMM2 work item: tiles × g2nt).
struct Layout {
  int cfg, g2s, g1s;
  bool ybf;       // y holds bf16 rows (y_bf16)
  double avg;     // expected rows per active expert (dec_wide)
  int64_t active;  // experts expected to get rows: min(T·K, E)
  int64_t rows, tiles, g2nt, g1nt;
  size_t off, num, tile_expert, sorted, slot_of, act, y, bar, wctr, ahist, part, g2cnt, part1, g1cnt, total;
};

// g1_splits is GEMM1's split of its reduction (kd = H columns) for the
// mma.sync decode tiles (cfg 0): MK_MOE_G1_SPLIT=n (2 to 4), else 1 (one
// Qwen3 token's GEMM1 runs 32 k steps a CTA for 18 µs of ncu time, where
// its 50 MB take 12, but splitting it moved nothing: Qwen3-8l's batch-1
// step ×1.00 with 2 splits, ×1.03 with 4; twenty-first pass). A function
// of the shape alone, as g2_splits.
int g1_splits(int cfg, int64_t kd) {
  static const int forced = [] {
    const char* v = getenv("MK_MOE_G1_SPLIT");
    const int n = v ? atoi(v) : 0;
    return n >= 2 && n <= 4 ? n : 1;
  }();
  if (cfg != 0 || forced < 2) return 1;
  const int64_t kt = (kd + BK - 1) / BK;
  const int64_t ktc = (kt + forced - 1) / forced;
  return (int)((kt + ktc - 1) / ktc);  // no empty split
}

size_t up256(size_t x) { return (x + 255) / 256 * 256; }

// g2_splits is GEMM2's split of its reduction (kd = I columns) for the
// mma.sync tiles of configuration cfg: a function of the shape alone, so a
// token's sums do not depend on the batch within a configuration. A long
// reduction over few column tiles leaves the GPU's slots unevenly filled
// (Mixtral, one token: 128 CTAs of 1.8 MB each on 132 SMs, 3.7 TB/s under
// ncu; 64 tokens, 32-row tiles: 768 CTAs, 1.9 waves, 3.1 TB/s), so from 64
// k tiles (I ≥ 4096) each work item is split in two; the last to finish
// sums them. Two, not more (session 18, Mixtral, whole layers by graph
// replay, against no split: 2 splits ×0.89 / ×1.02 / ×0.95 at 1 / 16 / 64
// tokens, 4 splits ×0.96 / ×1.04 / ×0.97; Mixtral-4l decode at batch 1
// 1.14–1.15 ms against 1.30–1.31 with none and 1.22–1.25 with four: four
// splits of 56 k tiles ran 6-stage CTAs in 1.3 waves). The wgmma tiles
// (cfg 3) keep one. MK_MOE_G2_SPLIT=n forces n (1: off) on the mma.sync
// tiles.
int g2_splits(int cfg, int64_t kd) {
  static const int forced = [] {
    const char* v = getenv("MK_MOE_G2_SPLIT");
    const int n = v ? atoi(v) : 0;
    return n >= 1 && n <= 8 ? n : 0;
  }();
  if (cfg != 0 && cfg != 1 && cfg != 4) return 1;
  const int64_t kt = (kd + BK - 1) / BK;
  int sp = forced ? forced : kt >= 64 ? 2 : 1;
  if (sp < 2) return 1;
  const int64_t ktc = (kt + sp - 1) / sp;
  return (int)((kt + ktc - 1) / ktc);  // no empty split
}

// y_bf16 says whether GEMM2 writes its rows (y) in bf16 for tiles of
// configuration cfg: the 128×256 prefill tiles (cfg 3), where GEMM2's
// f32 writes and the combine's reads of them are a large share of a layer
// (Qwen3-30B-A3B at 16384 tokens, ncu, forty-sixth pass: the combine 336
// µs reading 1.07 GB of a 2.8 ms layer). Rounding each expert's output to
// bf16 before the weighted sum is what vLLM's fused_moe does too (its
// GEMM2 writes bf16). MK_MOE_Y_BF16=1 / 0 forces (every configuration /
// none); read once.
bool y_bf16(int cfg) {
  static const int force = mk::env_force("MK_MOE_Y_BF16");
  return force >= 0 ? force == 1 : cfg == 3;
}

Layout layout(int64_t T, int K, int E, int64_t H, int64_t I) {
  Layout L;
  L.cfg = pick_cfg(T, K, E, H);
  const int64_t bm = kCfg[L.cfg].bm, n = T * K;
  const int64_t active = n < E ? n : E;
  L.avg = (double)n / (double)(active > 0 ? active : 1);
  L.active = active;
  L.rows = (n + active * (bm - 1) + bm - 1) / bm * bm;
  L.tiles = L.rows / bm;
  size_t o = 0;
  L.off = o;
  o = up256(o + (size_t)(E + 1) * 4);
  L.num = o;
  o = up256(o + 4);
  L.tile_expert = o;
  o = up256(o + (size_t)L.tiles * 4);
  L.sorted = o;
  o = up256(o + (size_t)L.rows * 4);
  L.slot_of = o;
  o = up256(o + (size_t)n * 4);
  L.act = o;
  o = up256(o + (size_t)L.rows * I * 2);
  L.y = o;
  L.ybf = y_bf16(L.cfg);
  o = up256(o + (size_t)L.rows * H * 4);  // f32 either way: GEMM1's row copy (ascratch) uses it too
  L.bar = o;  // moe_decode_kernel's grid barrier
  o = up256(o + 4);
  L.wctr = o;  // the persistent wgmma grids' work-item counters (GemmArgs.tile_ctr): GEMM1's, GEMM2's
  o = up256(o + 2 * 4);
  L.ahist = o;  // the align over many blocks: [align_blocks(n)][E] counts
  if (align_multi(n, E)) o = up256(o + (size_t)align_blocks(n) * E * 4);
  L.g2s = g2_splits(L.cfg, I);
  L.g2nt = (H + kCfg[L.cfg].bn - 1) / kCfg[L.cfg].bn;
  L.part = o;
  if (L.g2s > 1) o = up256(o + (size_t)L.g2s * L.rows * H * 4);
  L.g2cnt = o;
  if (L.g2s > 1) o = up256(o + (size_t)L.tiles * L.g2nt * 4);
  L.g1s = g1_splits(L.cfg, H);
  L.g1nt = (I + kCfg[L.cfg].bn / 2 - 1) / (kCfg[L.cfg].bn / 2);
  L.part1 = o;
  if (L.g1s > 1) o = up256(o + (size_t)L.g1s * L.rows * 2 * I * 4);
  L.g1cnt = o;
  if (L.g1s > 1) o = up256(o + (size_t)L.tiles * L.g1nt * 4);
  L.total = o;
  return L;
}

// route_slow: MK_MOE_ROUTE_SLOW=1 keeps moe_route_kernel for every shape
// (measurements against the register kernel).
bool route_slow() {
  static const bool v = mk::env_is("MK_MOE_ROUTE_SLOW", '1');
  return v;
}

// wide_tiles: the prefill regime uses 128×256 CTA tiles (64×64 per warp);
// MK_MOE_WIDE=0 selects 128×128 (64×32 per warp) for measurements.
bool wide_tiles() {
  static const bool w = !mk::env_is("MK_MOE_WIDE", '0');
  return w;
}

// route_direct_on: mk_moe_route_experts routes a decode step's tokens
// (direct_fits) with moe_route_direct_kernel, which also writes the row
// layout, and runs no align (MK_MOE_ROUTE_DIRECT=0 turns it off). Written in
// the twenty-fourth pass (kernel stamps put the align at 3.4 µs of a
// Qwen3-8l batch-1 layer, a dependent launch between the routing and
// GEMM1); measured in the twenty-fifth, whole steps against the align path:
// Qwen3-8l batch 1 / 2 / 4 ×0.982 / 0.991 / 0.992, Mixtral-4l ×0.990 /
// 0.994 / 0.997.
bool route_direct_on() {
  static const bool on = !mk::env_is("MK_MOE_ROUTE_DIRECT", '0');
  return on;
}

// direct_fits: moe_route_direct_kernel's limits — at most 4 tokens (a warp
// each), T·K ≤ 32 assignments (a lane each), and an expert's rows (≤ T)
// within one tile of bm rows.
bool direct_fits(int64_t t, int k, int bm) { return t >= 1 && t <= 4 && t * k <= 32 && t <= bm; }

// route_align_on: mk_moe_route_experts routes and aligns a decode step's
// tokens in one launch when MK_MOE_ROUTE_ALIGN=1. Off by default: measured
// in whole Qwen3-30B-A3B decode steps (ninth pass) the one launch took 10.9
// µs a layer under ncu against 7.8 + 3.6 for the two, and the steps were
// 3 % slower at batch 1 (a block of 1024 threads waits for a whole SM's
// thread slots, where the two small launches start early under
// programmatic dependent launch; twentieth and twenty-fourth passes: ×1.008
// and ×1.007–1.014).
bool route_align_on() {
  static const bool on = mk::env_is("MK_MOE_ROUTE_ALIGN", '1');
  return on;
}

// early_b: GEMM2 issues its first weight stages before the PDL wait
// (MK_MOE_EARLY_B=0: after it, for comparisons).
int early_b() {
  static const int w = mk::env_is("MK_MOE_EARLY_B", '0') ? 0 : 1;
  return w;
}

// l2pf: the L2 prefetch size of the mma.sync tiles' weight copies: 256
// (MK_MOE_L2PF=128 for 128, =0 for none). Written before measuring
// (twenty-fourth pass): ncu puts one Qwen3 token's GEMM1 at 2.7 TB/s and
// GEMM2 at 2.2 (50 and 25 MB): each k tile asks DRAM for 128 bytes of each
// of a CTA's 64 weight rows; 256-byte requests halve the requests for the
// same bytes and put twice the bytes in flight a request. Measured (H200,
// grouped layers by graph replay at 1 / 16 / 64 / 256 tokens, against
// none): Qwen3 ×0.989 / 0.994 / 0.987 / 0.983, Mixtral ×0.994 / 0.998 /
// 0.968 / 0.998, DeepSeek-V3 ×1.003 / 1.001 / 0.993 / 0.958; decode steps
// ×0.991–0.999 (docs/PERF.md, twenty-fourth pass).
int l2pf() {
  static const int w = mkmoe::l2pf_env("MK_MOE_L2PF", 256);
  return w;
}

// use_wgmma: the prefill regime runs the sm_90a wgmma kernel when linked in;
// MK_MOE_WGMMA=0 keeps mma.sync (measurements).
bool use_wgmma() {
  static const bool w = !mk::env_is("MK_MOE_WGMMA", '0');
  return w;
}

// dec_stages_forced is MK_MOE_DEC_ST (3, 4, 6 or 8), else 0.
int dec_stages_forced() {
  static const int n = [] {
    const char* v = getenv("MK_MOE_DEC_ST");
    const int x = v ? atoi(v) : 0;
    return x == 3 || x == 4 || x == 6 || x == 8 ? x : 0;
  }();
  return n;
}

// dec_stages is the cp.async ring depth of the decode-sized tiles (16×64,
// config 0) for a reduction over kd columns (per CTA: a split's in dense
// mode). At a few tokens a layer's
// expert GEMM is a stream of weights. Measured in session 13 (H200, `bench
// moe --path grouped`, whole layer at 1 / 4 / 16 tokens, ms): 8 stages
// (two CTAs an SM) against 6 (three) won on Mixtral (k = 4096 and 14336:
// 0.231 / 0.556 / 0.698 against 0.247 / 0.533 / 0.756) and DeepSeek-V3 (k
// = 7168 and 2048: 0.234 against 0.278 at one token, level at 4 and 16) and
// lost on Qwen3 (k = 2048 and 768: 0.073 / 0.126 / 0.255 against 0.066 /
// 0.114 / 0.246); 12 stages (one CTA an SM) lost everywhere, by 14–40 %.
// So 8 stages for long reductions (kd ≥ 4096: 64 or more k steps, where the
// deeper prologue pays for itself), 6 otherwise; dec_fit may take fewer.
// MK_MOE_DEC_ST=3, 4, 6 or 8 forces a depth (measurements).
int dec_stages(int64_t kd) {
  if (const int f = dec_stages_forced()) return f;
  return kd >= 4096 ? 8 : 6;
}

// dec_fit: the 16×64 decode tiles of a short reduction (kd < 4096: the
// 6-stage ring) take a shallower one (4 or 3 stages: 5 and 7 CTAs an SM
// instead of 3, by shared memory) when that runs their grid in fewer waves
// and the default takes at most kFitWaves: a grid of a few waves spends
// its last one with most SMs idle or part-filled while the HBM stream
// drains (ncu, thirty-sixth pass: DeepSeek-V3's one-token GEMM2, 896 CTAs
// in 2.26 waves, 3.34 TB/s where its GEMM1 in 1.94 read 4.03). Of the
// depths with the fewest waves the deepest is taken. Measured (forty-third
// pass, whole layers by graph replay, against MK_MOE_DEC_FIT=0):
// DeepSeek-V3 at 1 token ×0.947 (0.199 → 0.188 ms; its GEMM2 alone under
// ncu 70.9 → 59.4 µs), Qwen3 at 2 / 4 tokens ×0.933 / ×0.946, level
// elsewhere; DeepSeek-V3-4l's batch-1 decode step ×0.984. Cutting the
// 8-stage rings of long reductions too (MK_MOE_DEC_FIT=2) lost 2–6 % on
// DeepSeek-V3 and Mixtral at 1–4 tokens (DeepSeek-V3's one-token layer
// ×1.046), though ncu timed those GEMMs alone as fast or faster.
// MK_MOE_DEC_FIT=0 keeps the default depth; MK_MOE_DEC_ST (3, 4, 6 or 8)
// forces one either way; MK_MOE_DEC_FIT_WAVES=n (2 to 16) moves the
// kFitWaves bound (not measured past 4 yet: Qwen3's 16-token layer, whose
// GEMM1 grid bound is 3072 CTAs, ~8 waves, is the case to try).
int dec_fit() {
  static const int v = [] {
    const char* e = getenv("MK_MOE_DEC_FIT");
    return e && (e[0] == '0' || e[0] == '2') && e[1] == 0 ? e[0] - '0' : 1;
  }();
  return v;
}

// fit_waves is dec_fit's bound on the default depth's waves: kFitWaves, or
// MK_MOE_DEC_FIT_WAVES.
constexpr int64_t kFitWaves = 4;
int64_t fit_waves() {
  static const int64_t n = [] {
    const char* v = getenv("MK_MOE_DEC_FIT_WAVES");
    const int x = v ? atoi(v) : 0;
    return x >= 2 && x <= 16 ? (int64_t)x : kFitWaves;
  }();
  return n;
}

// fit_stages is dec_fit's choice for a grid of ncta CTAs whose default
// depth is st; occ(s) is the CTAs an SM at depth s.
template <typename Occ>
int fit_stages(int st, int64_t ncta, Occ occ) {
  if (dec_stages_forced() || dec_fit() == 0 || (st > 6 && dec_fit() != 2)) return st;
  const int64_t sms = mk::sm_count();
  auto waves = [&](int s) {
    const int64_t slots = (int64_t)occ(s) * sms;
    return slots > 0 ? (ncta + slots - 1) / slots : INT64_MAX;
  };
  const int64_t w0 = waves(st);
  if (w0 <= 1 || w0 > fit_waves()) return st;
  int best = st;
  int64_t bw = w0;
  for (const int s : {6, 4, 3}) {
    if (s >= st) continue;
    const int64_t w = waves(s);
    if (w < bw) {
      bw = w;
      best = s;
    }
  }
  return best;
}

// dec_wide says whether the decode tiles (config 0) of a layer with avg
// expected rows per active expert, over active experts, run 128 columns a
// CTA (4 warps of 16×32, 4 stages: three CTAs an SM) instead of 64: from 6
// rows over at least 64 experts. Measured (thirty-seventh pass, graph
// replays): DeepSeek-V3 at 256 tokens (8 rows × 256 experts) ×0.944,
// Mixtral at 32 (8 rows × 8 experts) ×1.066, 1-token layers ×1.13–1.24;
// so wide tiles only where the narrow ones make tens of thousands of
// short CTAs. MK_MOE_DEC_BN=64
// or 128 forces one (measurements; MK_MOE_DEC_ST=6 gives the wide tiles 6
// stages, two CTAs an SM), MK_MOE_DEC_BN_G=1 or 2 keeps the wide tiles to
// that GEMM.
bool dec_wide(double avg, int64_t active, bool gu) {
  static const int forced = [] {
    const char* v = getenv("MK_MOE_DEC_BN");
    const int n = v ? atoi(v) : 0;
    return n == 64 || n == 128 ? n : 0;
  }();
  static const int only = [] {
    const char* v = getenv("MK_MOE_DEC_BN_G");
    return v ? atoi(v) : 0;
  }();
  if (only == 1 || only == 2) {
    if (gu != (only == 1)) return false;
  }
  if (forced) return forced == 128;
  return avg >= 6 && active >= 64;
}

// gemm_prep sets the instantiation's shared-memory limit (once; the library
// runs on one thread) and returns its CTAs an SM (0 if it cannot run).
template <int BM, int BN, int WM, int WN, int ST, bool GU, bool PAIR = false>
int gemm_prep() {
  static const int occ = [] {
    auto kern = moe_gemm_kernel<BM, BN, WM, WN, ST, GU, PAIR>;
    const int sm = ST * (BM + BN) * BK * 2;
    int n = 0;
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, sm) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, (BM / WM) * (BN / WN) * 32, sm) != cudaSuccess) {
      (void)cudaGetLastError();  // not left for a later launch check to report
      return 0;
    }
    return n;
  }();
  return occ;
}

// dec_depth calls f with the 16×64 decode tiles' ring depth st (8, 4 or 3;
// anything else 6) as a compile-time constant (std::integral_constant).
template <typename F>
int dec_depth(int st, F f) {
  switch (st) {
    case 8: return f(std::integral_constant<int, 8>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 3: return f(std::integral_constant<int, 3>{});
    default: return f(std::integral_constant<int, 6>{});
  }
}

template <int BM, int BN, int WM, int WN, int ST, bool GU>
int launch_gemm(const GemmArgs& a, int64_t tiles, int64_t ntiles, cudaStream_t s, int64_t mt = 0) {
  constexpr bool pairable = BM == 16 && BN == 64 && ST % 2 == 0 && ST >= 4;
  const bool pair = pairable && mkmoe::dec_pair();
  auto kern = pair ? moe_gemm_kernel<BM, BN, WM, WN, ST, GU, pairable> : moe_gemm_kernel<BM, BN, WM, WN, ST, GU>;
  const size_t sm = (size_t)ST * (BM + BN) * BK * 2;
  const int occ = pair ? gemm_prep<BM, BN, WM, WN, ST, GU, pairable>() : gemm_prep<BM, BN, WM, WN, ST, GU>();
  MK_ARG(occ > 0, "mk_moe_experts: the %dx%d tile kernel (%d stages) cannot run here", BM, BN, ST);
  MK_ARG(tiles * ntiles < (1ll << 31), "mk_moe_experts: %lld × %lld tiles", (long long)tiles, (long long)ntiles);
  GemmArgs g = a;
  g.mt = (int)(mt > 0 ? mt : tiles);
  g.nt = (int)ntiles;
  g.group_m = mkmoe::group_m();
  g.early_b = early_b();
  g.l2pf = l2pf();
  (void)(mk::launch(kern, dim3((unsigned)(tiles * ntiles)), dim3((BM / WM) * (BN / WN) * 32), sm, s, g));
  MK_LAUNCHED(GU ? "moe_gemm (gate/up)" : "moe_gemm (down)");
  return MK_OK;
}

// run_gemm launches cfg's GEMM over tiles row tiles × the column tiles;
// mt (when > 0) is the row tiles of one K split when tiles counts them
// over every split (dense mode).
template <bool GU>
int run_gemm(int cfg, const GemmArgs& a, int64_t tiles, cudaStream_t s, int64_t mt = 0, bool wide = false) {
  const int bn = cfg == 0 && wide ? 128 : kCfg[cfg].bn;
  const int64_t cols = GU ? bn / 2 : bn;
  const int64_t nt = (a.N + cols - 1) / cols;
  if ((cfg == 3 || cfg == 5) && use_wgmma() && mkmoe::wgmma_gemm != nullptr) {
    GemmArgs g = a;
    g.mt = (int)tiles;
    g.nt = (int)nt;
    g.group_m = mkmoe::group_m();
    const int rc = mkmoe::wgmma_gemm(g, GU, tiles, nt, s, kCfg[cfg].bm);
    if (rc != -1) return rc;  // -1: not available here, use mma.sync
  }
  if (cfg == 5) {  // the same 64-row tiles on mma.sync (cfg 1's kernel: 128 columns, so twice the column tiles)
    const int64_t nt1 = (a.N + (GU ? 64 : 128) - 1) / (GU ? 64 : 128);
    return launch_gemm<64, 128, 32, 64, 4, GU>(a, tiles, nt1, s, mt);
  }
  switch (cfg) {
    case 0:  // decode-sized tiles
      if (bn == 128) {
        static const bool st6 = mk::env_is("MK_MOE_DEC_ST", '6');  // read once, as dec_stages does
        return st6 ? launch_gemm<16, 128, 16, 32, 6, GU>(a, tiles, nt, s, mt)
                   : launch_gemm<16, 128, 16, 32, 4, GU>(a, tiles, nt, s, mt);
      }
      {
        int st = dec_stages(a.ksplit > 1 ? (int64_t)a.ktc * BK : a.Kd);  // a split's k columns (dense mode)
        if (a.dense_rows == 0)
          st = fit_stages(st, tiles * nt, [](int d) {
            return dec_depth(d, [](auto D) { return gemm_prep<16, 64, 16, 16, decltype(D)::value, GU>(); });
          });
        return dec_depth(st, [&](auto D) {
          return launch_gemm<16, 64, 16, 16, decltype(D)::value, GU>(a, tiles, nt, s, mt);
        });
      }
    case 4: return launch_gemm<32, 64, 32, 16, 6, GU>(a, tiles, nt, s, mt);
    case 1: return launch_gemm<64, 128, 32, 64, 4, GU>(a, tiles, nt, s, mt);
    case 2: return launch_gemm<128, 128, 64, 32, 4, GU>(a, tiles, nt, s, mt);
    default: return launch_gemm<128, 256, 64, 64, 4, GU>(a, tiles, nt, s, mt);
  }
}

// skinny_splits is mk_gemm_skinny_bf16's split over K for n columns of k:
// enough CTAs for two waves of the 64-column tiles (264 on the H200's 132
// SMs, one row tile), at least 4 k tiles (256 columns) a split. A function
// of n and k only, so that a row's sum is the same whatever m is.
int skinny_splits(int64_t n, int64_t k) {
  const int64_t nt = (n + 63) / 64, kt = (k + BK - 1) / BK;
  int64_t s = (264 + nt - 1) / nt;
  s = std::min<int64_t>(s, kt / 4);
  if (s < 2) return 1;
  const int64_t ktc = (kt + s - 1) / s;
  return (int)((kt + ktc - 1) / ktc);  // no empty split
}

// skinny_reduce_kernel: c [m, n] = Σ_s part[s] (+ bias), s in order.
__global__ void skinny_reduce_kernel(float* c, const float* part, const float* bias, int64_t m, int64_t n, int S) {
  mk::pdl_begin();
  const int64_t n4 = m * n / 4, plane = m * n / 4;
  const float4* p4 = reinterpret_cast<const float4*>(part);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
    float4 v = p4[i];
    for (int s = 1; s < S; s++) {
      const float4 u = p4[s * plane + i];
      v.x += u.x;
      v.y += u.y;
      v.z += u.z;
      v.w += u.w;
    }
    if (bias) {
      const float4 b = reinterpret_cast<const float4*>(bias)[(i * 4) % n / 4];
      v.x += b.x;
      v.y += b.y;
      v.z += b.z;
      v.w += b.w;
    }
    reinterpret_cast<float4*>(c)[i] = v;
  }
}

#include "moe_fp4.cuh"

}  // namespace

extern "C" {

int32_t mk_moe_localize(uint64_t stream, uint64_t ids, int64_t n, int32_t lo, int32_t hi, uint64_t counts,
                        int32_t e) {
  MK_THREAD("mk_moe_localize");
  MK_ARG(n >= 0 && (n == 0 || ids) && 0 <= lo && lo <= hi && (!counts || e > 0),
         "mk_moe_localize: n=%lld ids=%p lo=%d hi=%d counts=%p E=%d", (long long)n, (void*)ids, lo, hi,
         (void*)counts, e);
  if (n == 0) return MK_OK;
  const int grid = (int)std::min<int64_t>(1024, (n + 255) / 256);
  (void)(mk::launch(moe_localize_kernel, dim3(grid), dim3(256), 0, mk::as_stream(stream), mk::dev<int32_t>(ids), n, lo,
      hi, counts ? mk::dev<unsigned long long>(counts) : nullptr, (int)e));
  MK_LAUNCHED("moe_localize");
  return MK_OK;
}

// route_check is mk_moe_route's argument check.
int32_t route_check(uint64_t ids, uint64_t weights, uint64_t logits, int64_t t, int32_t e, int32_t k,
                    int32_t flags, int32_t num_groups, int32_t topk_groups, uint32_t scaling_bits) {
  MK_ARG(t > 0 && e > 0 && e <= 2048 && k > 0 && k <= e,
         "mk_moe_route: T=%lld E=%d K=%d (want T >= 1, 1 <= E <= 2048, 1 <= K <= E)", (long long)t, e, k);
  MK_ARG(ids && weights && logits, "mk_moe_route: null ids, weights or logits");
  MK_ARG((flags & ~7) == 0, "mk_moe_route: unknown flags %#x", flags);
  MK_ARG(!((flags & MK_MOE_SOFTMAX_TOPK) && (flags & MK_MOE_SIGMOID)),
         "mk_moe_route: SoftmaxTopK needs softmax scoring");
  if (num_groups > 0) {
    MK_ARG(e % num_groups == 0 && e / num_groups >= 2 && topk_groups >= 1 && topk_groups <= num_groups,
           "mk_moe_route: %d groups, top %d groups, for %d experts", num_groups, topk_groups, e);
  } else {
    MK_ARG(num_groups == 0 && topk_groups == 0, "mk_moe_route: num_groups=%d topk_groups=%d", num_groups,
           topk_groups);
  }
  const float scale = mk::float_from_bits(scaling_bits);
  MK_ARG(std::isfinite(scale), "mk_moe_route: scaling factor %g", scale);
  return MK_OK;
}

int32_t mk_moe_route(uint64_t stream, uint64_t ids, uint64_t weights, uint64_t logits,
                     uint64_t score_bias, int64_t t, int32_t e, int32_t k, int32_t flags,
                     int32_t num_groups, int32_t topk_groups, uint32_t scaling_bits) {
  MK_THREAD("mk_moe_route");
  const int32_t rc = route_check(ids, weights, logits, t, e, k, flags, num_groups, topk_groups, scaling_bits);
  if (rc != MK_OK) return rc;
  const float scale = mk::float_from_bits(scaling_bits);
  if (e <= 256 && k <= 32 && !route_slow()) {
    const int64_t blocks = (t + kRouteWarps - 1) / kRouteWarps;
    MK_ARG(blocks < (1ll << 31), "mk_moe_route: T=%lld too large", (long long)t);
    const size_t rsm = num_groups > 0 ? (size_t)kRouteWarps * (e + 2 * num_groups) * 4 : 0;
    const int epl = (e + 31) / 32;
    auto go = [&](auto kern) {
      (void)(mk::launch(kern, dim3((unsigned)blocks), dim3(kRouteWarps * 32), rsm, mk::as_stream(stream),
          mk::dev<int32_t>(ids), mk::dev<float>(weights), mk::dev<const float>(logits),
          score_bias ? mk::dev<const float>(score_bias) : nullptr, t, e, k, flags, num_groups, topk_groups, scale));
    };
    if (epl <= 1) go(moe_route_reg_kernel<1>);
    else if (epl <= 2) go(moe_route_reg_kernel<2>);
    else if (epl <= 4) go(moe_route_reg_kernel<4>);
    else go(moe_route_reg_kernel<8>);
    MK_LAUNCHED("moe_route");
    return MK_OK;
  }
  const size_t sm = kRouteWarps * route_warp_bytes(e, k);
  static size_t attr = 48 << 10;
  if (sm > attr) {
    MK_CUDA(cudaFuncSetAttribute(moe_route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attr = sm;
  }
  const int64_t blocks = (t + kRouteWarps - 1) / kRouteWarps;
  MK_ARG(blocks < (1ll << 31), "mk_moe_route: T=%lld too large", (long long)t);
  (void)(mk::launch(moe_route_kernel, dim3((unsigned)blocks), dim3(kRouteWarps * 32), sm, mk::as_stream(stream),
      mk::dev<int32_t>(ids), mk::dev<float>(weights), mk::dev<const float>(logits),
      score_bias ? mk::dev<const float>(score_bias) : nullptr, t, e, k, flags, num_groups, topk_groups, scale));
  MK_LAUNCHED("moe_route");
  return MK_OK;
}

int32_t mk_moe_workspace(int64_t t, int32_t k, int32_t e, int64_t h, int64_t i, uint64_t* bytes,
                         int32_t* tile_m) {
  MK_ARG(t > 0 && k > 0 && e > 0 && k <= e && h > 0 && i > 0,
         "mk_moe_workspace: T=%lld K=%d E=%d H=%lld I=%lld", (long long)t, k, e, (long long)h, (long long)i);
  MK_ARG(bytes && tile_m, "mk_moe_workspace: null result pointer");
  const Layout L = layout(t, k, e, h, i);
  *bytes = L.total;
  *tile_m = kCfg[L.cfg].bm;
  return MK_OK;
}

// experts_check is mk_moe_experts's argument check but out (which
// mk_moe_route_experts may leave 0).
static int32_t experts_check(uint64_t x, uint64_t ids, uint64_t weights, int64_t t, int32_t k, int32_t e, int64_t h,
                             int64_t i, uint64_t gate_up, uint64_t down, int32_t act_kind, uint64_t ws,
                             uint64_t ws_bytes) {
  MK_ARG(t > 0 && k > 0 && e > 0 && k <= e && h > 0 && i > 0,
         "mk_moe_experts: T=%lld K=%d E=%d H=%lld I=%lld", (long long)t, k, e, (long long)h, (long long)i);
  MK_ARG(h % 8 == 0 && i % 8 == 0, "mk_moe_experts: H=%lld and I=%lld must be multiples of 8", (long long)h,
         (long long)i);
  MK_ARG(e <= 12000, "mk_moe_experts: E=%d, at most 12000", e);
  MK_ARG(x && ids && weights && gate_up && down && ws, "mk_moe_experts: null pointer argument");
  MK_ARG(act_kind == MK_MOE_SWIGLU || act_kind == MK_MOE_SWIGLU_CLAMPED, "mk_moe_experts: act_kind %d",
         act_kind);
  const Layout L = layout(t, k, e, h, i);
  MK_ARG(ws_bytes >= L.total, "mk_moe_experts: workspace of %llu bytes, %llu needed",
         (unsigned long long)ws_bytes, (unsigned long long)L.total);
  MK_ARG(L.tiles < (1ll << 31), "mk_moe_experts: too many rows");
  return MK_OK;
}

// Fp4Src is the FP4 experts experts_run dequantizes after its align.
struct Fp4Src {
  const uint8_t *gu_codes, *gu_scales, *dn_codes, *dn_scales;
};

// RouteIn is the routing of mk_moe_route_experts's fused launch.
struct RouteIn {
  const float* logits;
  const float* bias;
  int flags, groups, topk_groups;
  float scale;
};

// down_res_cols is the output columns a CTA of moe_gemv_down_res_kernel
// owns for n assignments (the most distinct experts) of H × I down
// matrices — one CTA an SM — or 0 when its rows and activations do not fit
// in shared memory with 16 KB to spare for the up kernel's CTAs that share
// its SMs (the register-fed down kernel then).
static int down_res_cols(int64_t n, int64_t H, int64_t I) {
  const int64_t C = (H + mk::sm_count() - 1) / mk::sm_count();
  const int64_t bytes = down_res_bytes(C, n, I) + 1024;  // + its static shared memory
  return I % 8 == 0 && bytes + (16 << 10) <= (int64_t)mk::smem_optin() ? (int)C : 0;
}

// gemv_path reports whether mk_moe_experts takes the decode-sized GEMV
// kernels for t tokens of top-k over experts of intermediate size i.
static bool gemv_path(int64_t t, int32_t k, int64_t i) {
  if (t > kGemvTokens || t * k > kGemvAssign) return false;
  const int m = gemv_mode();
  return m < 0 ? t == 1 && i >= kGemvAutoI : m != 0;
}

// decode_timeout_ns bounds moe_decode_kernel's barrier wait.
constexpr long long kDecodeTimeoutNs = 1000000000ll;

// decode_route_in_kernel says whether moe_decode_kernel routes itself:
// the register routing's sizes, as mk_moe_route's fast kernel (the same
// code, so the same ids and weights as routing first).
static bool decode_route_in_kernel(int32_t e, int32_t k) { return e <= 256 && k <= 32 && !route_slow(); }

// decode_run is the GEMV path of mode 2: one moe_decode_kernel launch (it
// routes when route is set), the barrier counter zeroed before it.
static int32_t decode_run(uint64_t stream, uint64_t out, uint64_t x, uint64_t ids, uint64_t weights, int64_t t,
                          int32_t k, int32_t e, int64_t h, int64_t i, uint64_t gate_up, uint64_t gate_up_bias,
                          uint64_t down, uint64_t down_bias, int32_t act_kind, uint32_t alpha_bits,
                          uint32_t limit_bits, uint64_t counts, unsigned char* w, const Layout& L,
                          const RouteIn* route) {
  MK_ARG(out, "mk_moe_experts: the one-launch GEMV path combines itself: out must be set");
  MK_ARG(route == nullptr || decode_route_in_kernel(e, k), "mk_moe_experts: E=%d K=%d: route first", e, k);
  cudaStream_t s = mk::as_stream(stream);
  DecodeParams p{};
  p.out = mk::dev<float>(out);
  p.ids = mk::dev<int32_t>(ids);
  p.wts = mk::dev<float>(weights);
  p.act = reinterpret_cast<bf16*>(w + L.act);
  p.bar = reinterpret_cast<int*>(w + L.bar);
  p.x = mk::dev<const bf16>(x);
  p.gu = mk::dev<const bf16>(gate_up);
  p.gub = gate_up_bias ? mk::dev<const float>(gate_up_bias) : nullptr;
  p.dn = mk::dev<const bf16>(down);
  p.db = down_bias ? mk::dev<const float>(down_bias) : nullptr;
  p.counts = counts ? mk::dev<unsigned long long>(counts) : nullptr;
  p.H = h;
  p.I = i;
  p.timeout_ns = kDecodeTimeoutNs;
  p.T = (int)t;
  p.E = e;
  p.K = k;
  p.act_kind = act_kind;
  p.alpha = mk::float_from_bits(alpha_bits);
  p.limit = mk::float_from_bits(limit_bits);
  size_t smem = (size_t)t * h * 2;
  if (route != nullptr) {
    p.logits = route->logits;
    p.bias = route->bias;
    p.flags = route->flags;
    p.G = route->groups;
    p.TG = route->topk_groups;
    p.scale = route->scale;
    if (p.G > 0) smem += (size_t)t * (e + 2 * p.G) * 4;
  }
  const int epl = (e + 31) / 32;
  using Kern = void (*)(DecodeParams);
  const Kern kern = epl <= 1 ? moe_decode_kernel<1> : epl <= 2 ? moe_decode_kernel<2>
                  : epl <= 4 ? moe_decode_kernel<4> : moe_decode_kernel<8>;
  static size_t attr[4] = {48 << 10, 48 << 10, 48 << 10, 48 << 10};
  const int ai = epl <= 1 ? 0 : epl <= 2 ? 1 : epl <= 4 ? 2 : 3;
  if (smem > attr[ai]) {
    MK_CUDA(cudaFuncSetAttribute(reinterpret_cast<const void*>(kern), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem));
    attr[ai] = smem;
  }
  int occ = 0, dev = 0, sms = 0;
  MK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, reinterpret_cast<const void*>(kern), kGemvWarps * 32,
                                                        smem));
  MK_CUDA(cudaGetDevice(&dev));
  MK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  MK_ARG(occ > 0, "mk_moe_experts: H=%lld: the one-launch GEMV kernel does not fit a multiprocessor", (long long)h);
  // Enough CTAs for the larger phase, at most what fits at once (the barrier).
  const int64_t up = t * k * ((i + kGemvWarps - 1) / kGemvWarps), dn = (h + kGemvWarps - 1) / kGemvWarps;
  const int64_t grid = std::min<int64_t>((int64_t)occ * sms, std::max(up, dn));
  MK_CUDA(cudaMemsetAsync(p.bar, 0, sizeof(int), s));
  (void)(mk::launch(kern, dim3((unsigned)grid), dim3(kGemvWarps * 32), smem, s, p));
  MK_LAUNCHED("moe_decode");
  return MK_OK;
}

// experts_run is mk_moe_experts after its checks; with route, the align
// launch also routes the tokens (moe_route_align_kernel: t ≤ 32, E ≤ 256,
// K ≤ 32, not the GEMV path), writing ids and weights first; with direct as
// well (direct_fits, no GEMM1 split), moe_route_direct_kernel routes the
// tokens and lays out their rows instead, and no align runs.
static int32_t experts_run(uint64_t stream, uint64_t out, uint64_t x, uint64_t ids, uint64_t weights,
                           int64_t t, int32_t k, int32_t e, int64_t h, int64_t i, uint64_t gate_up,
                           uint64_t gate_up_bias, uint64_t down, uint64_t down_bias, int32_t act_kind,
                           uint32_t alpha_bits, uint32_t limit_bits, uint64_t counts, uint64_t ws,
                           const RouteIn* route, bool direct = false, const Fp4Src* fp4 = nullptr) {
  const Layout L = layout(t, k, e, h, i);
  cudaStream_t s = mk::as_stream(stream);
  unsigned char* w = mk::dev<unsigned char>(ws);
  if (fp4 == nullptr && gemv_path(t, k, i) && gemv_mode() == 2) return decode_run(stream, out, x, ids, weights, t, k, e, h, i, gate_up,
                                                        gate_up_bias, down, down_bias, act_kind, alpha_bits,
                                                        limit_bits, counts, w, L, route);
  if (fp4 == nullptr && gemv_path(t, k, i)) {
    // Decode-sized: act (the workspace's, ≥ T·K rows) between two GEMV kernels.
    bf16* act = reinterpret_cast<bf16*>(w + L.act);
    const int C = gemv_mode() == 3 ? down_res_cols(t * k, h, i) : 0;  // > 0: the resident down kernel
    const size_t xsm = C > 0 ? 0 : (size_t)t * h * 2;
    static size_t up_attr = 48 << 10;
    if (xsm > up_attr) {
      MK_CUDA(cudaFuncSetAttribute(moe_gemv_up_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)xsm));
      up_attr = xsm;
    }
    MK_ARG((i + kGemvWarps - 1) / kGemvWarps < (1ll << 31) && (h + kGemvWarps - 1) / kGemvWarps < (1ll << 31),
           "mk_moe_experts: H=%lld I=%lld too large", (long long)h, (long long)i);
    // With the resident down kernel the up grid is at most 3 CTAs an SM
    // (one wave beside a down CTA: 3 × 64 + 60 registers a thread, 64 K
    // for 256 threads each with the allocation rounded to 8: exactly an
    // SM's file, ptxas 12.4),
    // its warps taking rows in a grid-stride loop.
    const int64_t nbx = (i + kGemvWarps - 1) / kGemvWarps;
    const int64_t upx = C > 0 ? std::max<int64_t>(1, std::min<int64_t>(nbx, 3 * mk::sm_count() / (t * k))) : nbx;
    (void)(mk::launch(C > 0 ? moe_gemv_up_kernel<true> : moe_gemv_up_kernel<false>,
        dim3((unsigned)upx, (unsigned)(t * k)),
        dim3(kGemvWarps * 32), xsm, s, act, mk::dev<const bf16>(x), mk::dev<const int32_t>(ids),
        mk::dev<const bf16>(gate_up), gate_up_bias ? mk::dev<const float>(gate_up_bias) : nullptr, h, i, (int)t,
        (int)k, (int)act_kind, mk::float_from_bits(alpha_bits), mk::float_from_bits(limit_bits),
        counts ? mk::dev<unsigned long long>(counts) : nullptr));
    MK_LAUNCHED("moe_gemv_up");
    if (C > 0) {
      const size_t dsm = (size_t)down_res_bytes(C, t * k, i);
      static size_t down_attr = 48 << 10;
      if (dsm > down_attr) {
        MK_CUDA(cudaFuncSetAttribute(moe_gemv_down_res_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dsm));
        down_attr = dsm;
      }
      (void)(mk::launch(moe_gemv_down_res_kernel, dim3((unsigned)((h + C - 1) / C)), dim3(kGemvWarps * 32), dsm, s,
          mk::dev<float>(out), (const bf16*)act, mk::dev<const int32_t>(ids), mk::dev<const float>(weights),
          mk::dev<const bf16>(down), down_bias ? mk::dev<const float>(down_bias) : nullptr, h, i, (int)t, (int)k,
          C));
      MK_LAUNCHED("moe_gemv_down_res");
      return MK_OK;
    }
    const int64_t nbd = (h + kGemvWarps - 1) / kGemvWarps;
    const bool early = nbd <= (int64_t)(2048 / (kGemvWarps * 32)) * mk::sm_count();  // one wave (threads bound it)
    (void)(mk::launch(moe_gemv_down_kernel, dim3((unsigned)nbd),
        dim3(kGemvWarps * 32), 0, s, mk::dev<float>(out), (const bf16*)act, mk::dev<const int32_t>(ids),
        mk::dev<const float>(weights), mk::dev<const bf16>(down), down_bias ? mk::dev<const float>(down_bias) : nullptr,
        h, i, (int)t, (int)k, early, down_pre()));
    MK_LAUNCHED("moe_gemv_down");
    return MK_OK;
  }
  int32_t* off = reinterpret_cast<int32_t*>(w + L.off);
  int32_t* num = reinterpret_cast<int32_t*>(w + L.num);
  int32_t* tile_expert = reinterpret_cast<int32_t*>(w + L.tile_expert);
  int32_t* sorted = reinterpret_cast<int32_t*>(w + L.sorted);
  int32_t* slot_of = reinterpret_cast<int32_t*>(w + L.slot_of);
  bf16* act = reinterpret_cast<bf16*>(w + L.act);
  float* y = reinterpret_cast<float*>(w + L.y);
  const int bm = kCfg[L.cfg].bm;
  int* g1cnt = L.g1s > 1 ? reinterpret_cast<int*>(w + L.g1cnt) : nullptr;  // zeroed by the align
  const int g1cnt_n = L.g1s > 1 ? (int)(L.tiles * L.g1nt) : 0;

  const size_t asm_bytes = (size_t)(3 * e + 1) * 4;
  if (route != nullptr && direct && direct_fits(t, k, bm) && L.g1s <= 1) {
    const size_t rsm = route->groups > 0 ? (size_t)t * (e + 2 * route->groups) * 4 : 0;
    const int epl = (e + 31) / 32;
    auto go = [&](auto kern) {
      (void)(mk::launch(kern, dim3(1), dim3((unsigned)(32 * t)), rsm, s, mk::dev<int32_t>(ids),
          mk::dev<float>(weights), route->logits, route->bias, (int)t, (int)e, (int)k, route->flags, route->groups,
          route->topk_groups, route->scale, bm, num, tile_expert, sorted, slot_of,
          mk::dev<unsigned long long>(counts)));
    };
    if (epl <= 1) go(moe_route_direct_kernel<1>);
    else if (epl <= 2) go(moe_route_direct_kernel<2>);
    else if (epl <= 4) go(moe_route_direct_kernel<4>);
    else go(moe_route_direct_kernel<8>);
    MK_LAUNCHED("moe_route_direct");
  } else if (route != nullptr) {
    // Routing and align in one block (ids and weights written first; the
    // align's shared memory reuses the routing's after the barrier).
    const size_t rsm = std::max(asm_bytes, route->groups > 0 ? (size_t)32 * (e + 2 * route->groups) * 4 : 0);
    const int epl = (e + 31) / 32;
    auto go = [&](auto kern) {
      (void)(mk::launch(kern, dim3(1), dim3(1024), rsm, s, mk::dev<int32_t>(ids), mk::dev<float>(weights),
          route->logits, route->bias, t, (int)e, (int)k, route->flags, route->groups, route->topk_groups,
          route->scale, bm, off, num, tile_expert, sorted, slot_of, mk::dev<unsigned long long>(counts), g1cnt,
          g1cnt_n));
    };
    if (epl <= 1) go(moe_route_align_kernel<1>);
    else if (epl <= 2) go(moe_route_align_kernel<2>);
    else if (epl <= 4) go(moe_route_align_kernel<4>);
    else go(moe_route_align_kernel<8>);
    MK_LAUNCHED("moe_route_align");
  } else if (align_multi(t * k, e)) {
    const int nb = align_blocks(t * k);
    const int64_t chunk = align_chunk(t * k);
    int32_t* hist = reinterpret_cast<int32_t*>(w + L.ahist);
    // E ≤ kAlignMultiMaxE: (3·E + 1) ints fit the default 48 KB.
    (void)(mk::launch(moe_align_count_kernel, dim3((unsigned)nb), dim3(1024), (size_t)e * 4, s,
        mk::dev<const int32_t>(ids), t * k, e, chunk, hist));
    MK_LAUNCHED("moe_align_count");
    (void)(mk::launch(moe_align_place_kernel, dim3((unsigned)nb), dim3(1024), asm_bytes, s, mk::dev<const int32_t>(ids),
        t * k, e, bm, chunk, (const int32_t*)hist, off, num, tile_expert, sorted, slot_of,
        mk::dev<unsigned long long>(counts), g1cnt, g1cnt_n));
    MK_LAUNCHED("moe_align_place");
  } else {
    static size_t align_attr = 48 << 10;
    if (asm_bytes > align_attr) {
      MK_CUDA(cudaFuncSetAttribute(moe_align_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)asm_bytes));
      align_attr = asm_bytes;
    }
    (void)(mk::launch(moe_align_kernel, dim3(1), dim3(1024), asm_bytes, s, mk::dev<const int32_t>(ids), t * k, e, bm,
        off, num, tile_expert, sorted, slot_of, mk::dev<unsigned long long>(counts), g1cnt, g1cnt_n));
    MK_LAUNCHED("moe_align");
  }
  const bool fp4_gemm = fp4 != nullptr && fp4_path(t, k, e) == kFp4Gemm;
  if (fp4 != nullptr && !fp4_gemm) {
    // FP4 weights: the experts with rows, dequantized into gate_up and down
    // (the workspace's scratch) for the grouped GEMMs.
    auto deq = [&](uint64_t dst, const uint8_t* codes, const uint8_t* scales, int64_t rpe, int64_t kd) {
      return mk::launch(fp4_dequant_kernel, dim3((unsigned)(4 * mk::sm_count())), dim3(256), (size_t)e * 4, s,
                        mk::dev<bf16>(dst), codes, scales, rpe, kd, (const int32_t*)off, (int)e);
    };
    (void)deq(gate_up, fp4->gu_codes, fp4->gu_scales, 2 * i, h);
    MK_LAUNCHED("fp4_dequant");
    (void)deq(down, fp4->dn_codes, fp4->dn_scales, h, i);
    MK_LAUNCHED("fp4_dequant");
  }

  GemmArgs g1{};
  g1.A = mk::dev<const bf16>(x);
  g1.W = mk::dev<const bf16>(gate_up);
  g1.bias = gate_up_bias ? mk::dev<const float>(gate_up_bias) : nullptr;
  g1.sorted = sorted;
  g1.tile_expert = tile_expert;
  g1.num_tiles = num;
  g1.out = act;
  g1.Kd = h;
  g1.N = i;
  g1.experts = e;
  g1.topk = k;
  g1.act = act_kind;
  g1.alpha = mk::float_from_bits(alpha_bits);
  g1.limit = mk::float_from_bits(limit_bits);
  // The wgmma GEMM1 may copy its gathered rows into tile order first
  // (MK_MOE_G1_TMA=1): into y, which GEMM2 writes only after GEMM1 is done
  // ([rows, H] f32 holds [rows, H] bf16 twice over).
  g1.ascratch = reinterpret_cast<bf16*>(y);
  if (L.g2s > 1) {  // GEMM1 zeroes GEMM2's split counters
    g1.split_cnt = reinterpret_cast<int*>(w + L.g2cnt);
    g1.split_cnt_n = (int)(L.tiles * L.g2nt);
  }
  int* wctr = nullptr;  // dyn_sched: the 128-row wgmma tiles' counters, zeroed for this call
  if (L.cfg == 3 && !fp4_gemm && mkmoe::dyn_sched(i)) {
    wctr = reinterpret_cast<int*>(w + L.wctr);
    MK_CUDA(cudaMemsetAsync(wctr, 0, 2 * sizeof(int), s));
    g1.tile_ctr = wctr;
  }
  int rc;
  if (fp4_gemm) {
    rc = run_gemm_fp4<true>(bm, g1, fp4->gu_codes, fp4->gu_scales, L.tiles, s);
  } else if (L.g1s > 1) {
    const int64_t kt = (h + BK - 1) / BK;
    g1.ksplit = L.g1s;
    g1.ktc = (int)((kt + L.g1s - 1) / L.g1s);
    g1.part = reinterpret_cast<float*>(w + L.part1);
    g1.g1_cnt = g1cnt;
    rc = run_gemm<true>(L.cfg, g1, L.tiles * L.g1s, s, L.tiles, dec_wide(L.avg, L.active, true));
  } else {
    rc = run_gemm<true>(L.cfg, g1, L.tiles, s, 0, dec_wide(L.avg, L.active, true));
  }
  if (rc != MK_OK) return rc;

  GemmArgs g2 = g1;
  g2.ascratch = nullptr;
  g2.ksplit = 1, g2.ktc = 0, g2.part = nullptr, g2.g1_cnt = nullptr;  // (GEMM1's split is its own)
  g2.A = act;
  g2.W = mk::dev<const bf16>(down);
  g2.bias = down_bias ? mk::dev<const float>(down_bias) : nullptr;
  g2.out = y;
  g2.ybf = L.ybf;
  g2.Kd = i;
  g2.N = h;
  g2.tile_ctr = wctr ? wctr + 1 : nullptr;
  if (fp4_gemm) {
    rc = run_gemm_fp4<false>(bm, g2, fp4->dn_codes, fp4->dn_scales, L.tiles, s);
  } else if (L.g2s > 1) {
    const int64_t kt = (i + BK - 1) / BK;
    g2.ksplit = L.g2s;
    g2.ktc = (int)((kt + L.g2s - 1) / L.g2s);
    g2.part = reinterpret_cast<float*>(w + L.part);
    rc = run_gemm<false>(L.cfg, g2, L.tiles * L.g2s, s, L.tiles, dec_wide(L.avg, L.active, false));
  } else {
    rc = run_gemm<false>(L.cfg, g2, L.tiles, s, 0, dec_wide(L.avg, L.active, false));
  }
  if (rc != MK_OK) return rc;

  MK_ARG(t < (1ll << 31), "mk_moe_experts: T=%lld too large", (long long)t);
  if (!out) return MK_OK;  // the caller combines (mk_moe_combine_add_rmsnorm_f32)
  {
    // Column slices of 128 threads' steps (4 columns a step, 8 from bf16
    // rows); up to 16 per token (one step a thread up to 8192 columns),
    // fewer when the tokens alone fill the GPU.
    const int64_t cols = L.ybf ? 8 : 4;  // a thread's columns a step
    const int64_t slices = std::max<int64_t>(1, std::min<int64_t>((h / cols + 127) / 128, t >= 256 ? 1 : 16));
    (void)(mk::launch(L.ybf ? moe_combine_kernel<true> : moe_combine_kernel<false>, dim3((unsigned)t,
        (unsigned)slices), dim3(128), 0, s, mk::dev<float>(out), (const void*)y, slot_of,
        mk::dev<const float>(weights), k, h));
  }
  MK_LAUNCHED("moe_combine");
  return MK_OK;
}

int32_t mk_moe_experts(uint64_t stream, uint64_t out, uint64_t x, uint64_t ids, uint64_t weights,
                       int64_t t, int32_t k, int32_t e, int64_t h, int64_t i, uint64_t gate_up,
                       uint64_t gate_up_bias, uint64_t down, uint64_t down_bias, int32_t act_kind,
                       uint32_t alpha_bits, uint32_t limit_bits, uint64_t counts, uint64_t ws,
                       uint64_t ws_bytes) {
  MK_THREAD("mk_moe_experts");
  MK_ARG(out, "mk_moe_experts: null out");
  const int32_t rc = experts_check(x, ids, weights, t, k, e, h, i, gate_up, down, act_kind, ws, ws_bytes);
  if (rc != MK_OK) return rc;
  return experts_run(stream, out, x, ids, weights, t, k, e, h, i, gate_up, gate_up_bias, down, down_bias, act_kind,
                     alpha_bits, limit_bits, counts, ws, nullptr);
}

int32_t mk_moe_route_experts(uint64_t stream, uint64_t out, uint64_t x, uint64_t ids, uint64_t weights,
                             uint64_t logits, uint64_t score_bias, int64_t t, int32_t k, int32_t e, int32_t flags,
                             int32_t num_groups, int32_t topk_groups, uint32_t scaling_bits, int64_t h, int64_t i,
                             uint64_t gate_up, uint64_t gate_up_bias, uint64_t down, uint64_t down_bias,
                             int32_t act_kind, uint32_t alpha_bits, uint32_t limit_bits, uint64_t counts,
                             uint64_t ws, uint64_t ws_bytes) {
  MK_THREAD("mk_moe_route_experts");
  int32_t rc = route_check(ids, weights, logits, t, e, k, flags, num_groups, topk_groups, scaling_bits);
  if (rc != MK_OK) return rc;
  rc = experts_check(x, ids, weights, t, k, e, h, i, gate_up, down, act_kind, ws, ws_bytes);
  if (rc != MK_OK) return rc;
  MK_ARG(out || !gemv_path(t, k, i), "mk_moe_route_experts: out 0 (no combine) on the GEMV path, which combines itself");
  const RouteIn r{mk::dev<const float>(logits), score_bias ? mk::dev<const float>(score_bias) : nullptr, flags,
                  num_groups, topk_groups, mk::float_from_bits(scaling_bits)};
  if (gemv_path(t, k, i) && gemv_mode() == 2 && decode_route_in_kernel(e, k))
    return experts_run(stream, out, x, ids, weights, t, k, e, h, i, gate_up, gate_up_bias, down, down_bias, act_kind,
                       alpha_bits, limit_bits, counts, ws, &r);  // one launch routes and runs the experts
  if (direct_fits(t, k, kCfg[pick_cfg(t, k, e, h)].bm) && e <= 256 && !route_slow() && !gemv_path(t, k, i) &&
      route_direct_on())
    return experts_run(stream, out, x, ids, weights, t, k, e, h, i, gate_up, gate_up_bias, down, down_bias, act_kind,
                       alpha_bits, limit_bits, counts, ws, &r, true);  // routing lays out the rows: no align
  if (t > 32 || e > 256 || k > 32 || route_slow() || gemv_path(t, k, i) || !route_align_on()) {
    rc = mk_moe_route(stream, ids, weights, logits, score_bias, t, e, k, flags, num_groups, topk_groups, scaling_bits);
    if (rc != MK_OK) return rc;
    return experts_run(stream, out, x, ids, weights, t, k, e, h, i, gate_up, gate_up_bias, down, down_bias,
                       act_kind, alpha_bits, limit_bits, counts, ws, nullptr);
  }
  return experts_run(stream, out, x, ids, weights, t, k, e, h, i, gate_up, gate_up_bias, down, down_bias, act_kind,
                     alpha_bits, limit_bits, counts, ws, &r);
}

int32_t mk_moe_combine_add_rmsnorm_f32(uint64_t stream, uint64_t sum, uint64_t out, uint64_t out_bf16, uint64_t x,
                                       uint64_t weights, uint64_t ws, uint64_t ws_bytes, int64_t t, int32_t k,
                                       int32_t e, int64_t h, int64_t i, uint64_t norm_w, uint32_t eps_bits) {
  MK_THREAD("mk_moe_combine_add_rmsnorm_f32");
  MK_ARG(t > 0 && k > 0 && e > 0 && k <= e && h > 0 && i > 0 && h % 8 == 0 && i % 8 == 0 && e <= 12000 &&
             t < (1ll << 31),
         "mk_moe_combine_add_rmsnorm_f32: T=%lld K=%d E=%d H=%lld I=%lld", (long long)t, k, e, (long long)h,
         (long long)i);
  MK_ARG(sum && out && x && weights && ws && norm_w, "mk_moe_combine_add_rmsnorm_f32: null pointer argument");
  MK_ARG(!gemv_path(t, k, i), "mk_moe_combine_add_rmsnorm_f32: the GEMV path leaves no expert rows to combine");
  const Layout L = layout(t, k, e, h, i);
  MK_ARG(ws_bytes >= L.total, "mk_moe_combine_add_rmsnorm_f32: workspace of %llu bytes, %llu needed",
         (unsigned long long)ws_bytes, (unsigned long long)L.total);
  unsigned char* w = mk::dev<unsigned char>(ws);
  const mkf32::CombineIn cb{w + L.y, reinterpret_cast<const int32_t*>(w + L.slot_of), mk::dev<const float>(weights),
                            (int)k, L.ybf};
  MK_ARG(mkf32::combine_add_rmsnorm(mk::as_stream(stream), mk::dev<float>(sum), mk::dev<float>(out),
                                    out_bf16 ? mk::dev<bf16>(out_bf16) : nullptr, mk::dev<const float>(x), cb, t, h,
                                    mk::dev<const float>(norm_w), mk::float_from_bits(eps_bits)),
         "mk_moe_combine_add_rmsnorm_f32: H=%lld or the alignment of the rows does not fit the kernel", (long long)h);
  MK_LAUNCHED("rmsnorm_f32_reg (combine)");
  return MK_OK;
}

int32_t mk_gemm_skinny_workspace(int64_t m, int64_t n, int64_t k, uint64_t* bytes) {
  MK_THREAD("mk_gemm_skinny_workspace");
  MK_ARG(bytes && m >= 1 && m <= 64 && n >= 8 && k >= 8, "mk_gemm_skinny_workspace: M=%lld N=%lld K=%lld",
         (long long)m, (long long)n, (long long)k);
  const int s = skinny_splits(n, k);
  *bytes = s > 1 ? (uint64_t)s * (uint64_t)m * (uint64_t)n * 4 : 0;
  return MK_OK;
}

int32_t mk_gemm_skinny_bf16(uint64_t stream, uint64_t c, uint64_t a, uint64_t w, uint64_t bias, int64_t m, int64_t n,
                            int64_t k, uint64_t work, uint64_t work_bytes) {
  MK_THREAD("mk_gemm_skinny_bf16");
  MK_ARG(m >= 1 && m <= 64 && n >= 8 && n % 8 == 0 && n < (1ll << 30) && k >= 8 && k % 8 == 0,
         "mk_gemm_skinny_bf16: M=%lld N=%lld K=%lld (want 1 <= M <= 64, N and K multiples of 8)", (long long)m,
         (long long)n, (long long)k);
  MK_ARG(c && a && w, "mk_gemm_skinny_bf16: null c, a or w");
  MK_ARG(a % 16 == 0 && w % 16 == 0 && c % 8 == 0 && bias % 4 == 0,
         "mk_gemm_skinny_bf16: a and w must be 16-byte aligned, c 8-byte");
  GemmArgs g{};
  g.A = mk::dev<const bf16>(a);
  g.W = mk::dev<const bf16>(w);
  g.bias = bias ? mk::dev<const float>(bias) : nullptr;
  g.out = mk::dev<float>(c);
  g.Kd = k;
  g.N = n;
  g.topk = 1;
  g.dense_rows = (int)m;
  const int cfg = m <= 16 ? 0 : 4;  // 16- or 32-row tiles (two of them past 32 rows, neighbours in L2)
  const int64_t tiles = (m + kCfg[cfg].bm - 1) / kCfg[cfg].bm;
  const int S = skinny_splits(n, k);
  cudaStream_t s = mk::as_stream(stream);
  if (S <= 1) return run_gemm<false>(cfg, g, tiles, s);
  MK_ARG(work && work_bytes >= (uint64_t)S * (uint64_t)m * (uint64_t)n * 4,
         "mk_gemm_skinny_bf16: workspace of %llu bytes, %llu needed (mk_gemm_skinny_workspace)",
         (unsigned long long)work_bytes, (unsigned long long)S * m * n * 4);
  const int KT = (int)((k + BK - 1) / BK);
  g.ksplit = S;
  g.ktc = (KT + S - 1) / S;
  g.part = mk::dev<float>(work);
  g.bias = nullptr;
  const int rc = run_gemm<false>(cfg, g, tiles * S, s, tiles);
  if (rc != MK_OK) return rc;
  const int64_t n4 = m * n / 4;
  const int grid = (int)std::min<int64_t>((n4 + 255) / 256, 1024);
  (void)(mk::launch(skinny_reduce_kernel, dim3(grid), dim3(256), 0, s, mk::dev<float>(c), (const float*)g.part,
      bias ? mk::dev<const float>(bias) : nullptr, m, n, S));
  MK_LAUNCHED("skinny_reduce");
  return MK_OK;
}

int32_t mk_moe_gemv(int32_t on) {
  MK_THREAD("mk_moe_gemv");
  MK_ARG(on >= -1 && on <= 3, "mk_moe_gemv: %d is not -1, 0, 1, 2 or 3", on);
  g_moe_gemv = on;
  return MK_OK;
}

int32_t mk_moe_decode_check(int32_t* rec) {
  MK_THREAD("mk_moe_decode_check");
  MK_ARG(rec, "mk_moe_decode_check: null rec");
  MK_CUDA(cudaDeviceSynchronize());
  MK_CUDA(cudaMemcpyFromSymbol(rec, g_decode_err, sizeof(g_decode_err)));
  if (rec[0] != 0) {
    const int zero[4] = {0, 0, 0, 0};
    MK_CUDA(cudaMemcpyToSymbol(g_decode_err, zero, sizeof(zero)));
  }
  return MK_OK;
}

int32_t mk_moe_fill_bf16(uint64_t stream, uint64_t dst, int64_t n, uint64_t seed, uint32_t scale_bits) {
  MK_THREAD("mk_moe_fill_bf16");
  MK_ARG(n > 0 && dst, "mk_moe_fill_bf16: n=%lld dst=%#llx", (long long)n, (unsigned long long)dst);
  int64_t blocks = (n + 255) / 256;
  if (blocks > 65536) blocks = 65536;
  moe_fill_kernel<<<(unsigned)blocks, 256, 0, mk::as_stream(stream)>>>(mk::dev<bf16>(dst), n, seed,
                                                                       mk::float_from_bits(scale_bits));
  MK_LAUNCHED("moe_fill");
  return MK_OK;
}

// ------------------------------------------------------------- FP4 experts

static int32_t fp4_check(const char* fn, uint64_t codes, uint64_t scales, int64_t n, int64_t k) {
  MK_ARG(codes && scales, "%s: null codes or scales", fn);
  MK_ARG(n > 0 && k > 0 && k % 64 == 0, "%s: [%lld, %lld] (K a positive multiple of 64)", fn, (long long)n,
         (long long)k);
  MK_ARG(codes % 16 == 0 && scales % 2 == 0, "%s: codes must be 16-byte and scales 2-byte aligned", fn);
  return MK_OK;
}

int32_t mk_fp4_dequant_bf16(uint64_t stream, uint64_t dst, uint64_t codes, uint64_t scales, int64_t n, int64_t k) {
  MK_THREAD("mk_fp4_dequant_bf16");
  const int32_t rc = fp4_check("mk_fp4_dequant_bf16", codes, scales, n, k);
  if (rc != MK_OK) return rc;
  MK_ARG(dst && dst % 16 == 0, "mk_fp4_dequant_bf16: dst null or not 16-byte aligned");
  const int64_t units = n * (k / 64);
  const unsigned gx = (unsigned)std::min<int64_t>((4 * units + 255) / 256, 8 * mk::sm_count());
  (void)(mk::launch(fp4_dequant_kernel, dim3(gx), dim3(256), 4, mk::as_stream(stream), mk::dev<bf16>(dst),
                    mk::dev<const uint8_t>(codes), mk::dev<const uint8_t>(scales), n, k, (const int32_t*)nullptr, 1));
  MK_LAUNCHED("fp4_dequant");
  return MK_OK;
}

// Fp4GemvWs is the GEMV path's workspace: the activations [T·K, I] bf16,
// the down kernel's parts [G][T][H] f32 (G = min(T·K, E)) and its
// column-tile counters [H/16].
struct Fp4GemvWs {
  size_t part, cnt, total;
  int64_t groups;
};
static Fp4GemvWs fp4_gemv_ws(int64_t t, int32_t k, int32_t e, int64_t h, int64_t i) {
  Fp4GemvWs w;
  w.groups = std::min<int64_t>(t * k, e);
  w.part = up256((size_t)t * k * i * 2);
  w.cnt = w.part + up256((size_t)w.groups * t * h * 4);
  w.total = w.cnt + up256((size_t)(h / 16) * 4);
  return w;
}

// fp4_scratch is the bf16 copy of every expert the GEMM path dequantizes
// into, at the end of the workspace.
static size_t fp4_scratch(int32_t e, int64_t h, int64_t i) { return (size_t)e * 3 * h * i * 2; }

int32_t mk_moe_fp4_path(int64_t t, int32_t k, int32_t e, int32_t* path) {
  MK_ARG(t > 0 && k > 0 && e > 0 && k <= e, "mk_moe_fp4_path: T=%lld K=%d E=%d", (long long)t, k, e);
  MK_ARG(path, "mk_moe_fp4_path: null result pointer");
  *path = fp4_path(t, k, e);
  return MK_OK;
}

int32_t mk_moe_workspace_fp4(int64_t t, int32_t k, int32_t e, int64_t h, int64_t i, uint64_t* bytes) {
  MK_ARG(t > 0 && k > 0 && e > 0 && k <= e && h > 0 && i > 0,
         "mk_moe_workspace_fp4: T=%lld K=%d E=%d H=%lld I=%lld", (long long)t, k, e, (long long)h, (long long)i);
  MK_ARG(bytes, "mk_moe_workspace_fp4: null result pointer");
  const int32_t path = fp4_path(t, k, e);
  if (path == kFp4Gemv) {
    *bytes = fp4_gemv_ws(t, k, e, h, i).total;
    return MK_OK;
  }
  *bytes = up256(layout(t, k, e, h, i).total) + (path == kFp4Gemm ? 0 : fp4_scratch(e, h, i));
  return MK_OK;
}

int32_t mk_moe_experts_fp4(uint64_t stream, uint64_t out, uint64_t x, uint64_t ids, uint64_t weights, int64_t t,
                           int32_t k, int32_t e, int64_t h, int64_t i, uint64_t gu_codes, uint64_t gu_scales,
                           uint64_t gate_up_bias, uint64_t dn_codes, uint64_t dn_scales, uint64_t down_bias,
                           int32_t act_kind, uint32_t alpha_bits, uint32_t limit_bits, uint64_t counts, uint64_t ws,
                           uint64_t ws_bytes) {
  MK_THREAD("mk_moe_experts_fp4");
  MK_ARG(out && x && ids && weights && ws, "mk_moe_experts_fp4: null pointer argument");
  MK_ARG(t > 0 && k > 0 && e > 0 && k <= e && e <= 12000, "mk_moe_experts_fp4: T=%lld K=%d E=%d", (long long)t, k,
         e);
  int32_t rc = fp4_check("mk_moe_experts_fp4 (gate_up)", gu_codes, gu_scales, (int64_t)e * 2 * i, h);
  if (rc != MK_OK) return rc;
  rc = fp4_check("mk_moe_experts_fp4 (down)", dn_codes, dn_scales, (int64_t)e * h, i);
  if (rc != MK_OK) return rc;
  MK_ARG(act_kind == MK_MOE_SWIGLU || act_kind == MK_MOE_SWIGLU_CLAMPED, "mk_moe_experts_fp4: act_kind %d", act_kind);
  uint64_t need = 0;
  rc = mk_moe_workspace_fp4(t, k, e, h, i, &need);
  if (rc != MK_OK) return rc;
  MK_ARG(ws_bytes >= need, "mk_moe_experts_fp4: workspace of %llu bytes, %llu needed", (unsigned long long)ws_bytes,
         (unsigned long long)need);
  cudaStream_t s = mk::as_stream(stream);
  if (fp4_path(t, k, e) == kFp4Gemv) {
    const Fp4GemvWs W = fp4_gemv_ws(t, k, e, h, i);
    unsigned char* wsb = mk::dev<unsigned char>(ws);
    bf16* act = reinterpret_cast<bf16*>(wsb);
    float* part = reinterpret_cast<float*>(wsb + W.part);
    int* cnt = reinterpret_cast<int*>(wsb + W.cnt);
    // Dynamic shared memory beside each kernel's static (up to ~12 KB): the
    // opt-in is set to what the call needs once it passes 32 KB.
    const size_t xsm = (size_t)t * h * 2, asm_ = (size_t)t * i * 2;
    static size_t up_attr = 32 << 10, down_attr = 32 << 10;
    if (xsm > up_attr) {
      MK_CUDA(cudaFuncSetAttribute(moe_fp4_up_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)xsm));
      up_attr = xsm;
    }
    if (asm_ > down_attr) {
      MK_CUDA(cudaFuncSetAttribute(moe_fp4_down_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)asm_));
      down_attr = asm_;
    }
    const int32_t* pids = mk::dev<const int32_t>(ids);
    (void)(mk::launch(moe_fp4_up_kernel, dim3((unsigned)(i / 16), (unsigned)(t * k)), dim3(kF4Warps * 32), xsm, s,
        act, cnt, (int)(h / 16), mk::dev<const bf16>(x), pids, mk::dev<const uint8_t>(gu_codes),
        mk::dev<const uint8_t>(gu_scales), gate_up_bias ? mk::dev<const float>(gate_up_bias) : nullptr, h, i, (int)t,
        (int)k, (int)act_kind, mk::float_from_bits(alpha_bits), mk::float_from_bits(limit_bits),
        counts ? mk::dev<unsigned long long>(counts) : nullptr));
    MK_LAUNCHED("moe_fp4_up");
    (void)(mk::launch(moe_fp4_down_kernel, dim3((unsigned)(h / 16), (unsigned)std::min<int64_t>(t * k, e)),
        dim3(kF4Warps * 32), asm_, s, mk::dev<float>(out), part, cnt, (const bf16*)act, pids,
        mk::dev<const float>(weights), mk::dev<const uint8_t>(dn_codes), mk::dev<const uint8_t>(dn_scales),
        down_bias ? mk::dev<const float>(down_bias) : nullptr, h, i, (int)t, (int)k));
    MK_LAUNCHED("moe_fp4_down");
    return MK_OK;
  }
  const size_t base = up256(layout(t, k, e, h, i).total);
  const uint64_t gu = ws + base, dn = gu + (uint64_t)e * 2 * i * h * 2;
  const Fp4Src src{mk::dev<const uint8_t>(gu_codes), mk::dev<const uint8_t>(gu_scales),
                   mk::dev<const uint8_t>(dn_codes), mk::dev<const uint8_t>(dn_scales)};
  return experts_run(stream, out, x, ids, weights, t, k, e, h, i, gu, gate_up_bias, dn, down_bias, act_kind,
                     alpha_bits, limit_bits, counts, ws, nullptr, false, &src);
}

}  // extern "C"
