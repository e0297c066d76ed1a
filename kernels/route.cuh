// route.cuh — one token's MoE routing on one warp (moe.Route's semantics):
// the device code that mk_moe_route's kernels and the fused layer's plan
// launch (moe_fused.cu) share, so that both write the same ids and weight
// bits.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "mkernel.h"

namespace mkroute {

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


// route_token_reg is moe_route_kernel's routing (moe.cu) for E ≤ 32·EPL
// and K ≤ 32 (moe_route_reg_kernel's, and the fused plan's) with
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


// Host side (moe.cu): mk_moe_route's argument check, and whether
// MK_MOE_ROUTE_SLOW=1 keeps every routing on moe_route_kernel.
int32_t check_args(uint64_t ids, uint64_t weights, uint64_t logits, int64_t t, int32_t e, int32_t k, int32_t flags,
                   int32_t num_groups, int32_t topk_groups, uint32_t scaling_bits);
bool slow();

}  // namespace mkroute
