// moe_route.cuh — one token's top-k routing by one warp, shared by
// moe.cu's routing kernel (mk_moe_route) and the router GEMV's last CTA
// (gemv.cu, mk_moe_router_route): moe.Route's semantics (moe/route.go).
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

#include "common.cuh"
#include "mk_moe.h"

namespace mkmoe {

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

// group_score is a group's score for group-limited routing: the sum of its
// two best choice scores c[0..gs) (ranks_before order).
__device__ __forceinline__ float group_score(const float* c, int gs) {
  int b0 = -1, b1 = -1;
  for (int i = 0; i < gs; i++) {
    if (b0 < 0 || ranks_before(c[i], i, c[b0], b0)) {
      b1 = b0;
      b0 = i;
    } else if (b1 < 0 || ranks_before(c[i], i, c[b1], b1)) {
      b1 = i;
    }
  }
  return __fadd_rn(c[b0], c[b1]);
}

// route_token routes token t of one warp: row [E] its router logits, bias
// [E] or null (selection only), gsm the warp's (E + 2·G) floats of shared
// memory (G > 0 only) → ids[t·K ..] and wts[t·K ..], by descending weight,
// ties to the lower expert. E ≤ 32·EPL, K ≤ 32. Scores in registers
// (expert lane + 32·i in slot i of each lane): the top-k rounds are warp
// arg-bests over registers, lane j keeps the j-th choice, and the weights
// (softmax over the k, renormalisation, scaling) and the final order are
// computed by the k lanes in parallel. Softmax and sigmoid in float64,
// rounded once.
template <int EPL>
__device__ __forceinline__ void route_token(int32_t* ids, float* wts, const float* row, const float* bias,
                                            int64_t t, int E, int K, int flags, int G, int TG, float scale,
                                            float* gsm) {
  const int lane = threadIdx.x % 32;
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
    float* choice = gsm;
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
      for (int h = 0; h < G; h++)
        if (h != g && ranks_before(gsc[h], h, gsc[g], g)) before++;
      keep[g] = before < TG;
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < EPL; i++) {
      const int e = lane + 32 * i;
      if (e < E && !keep[e / gs]) ch[i] = -INFINITY;
    }
  }

  // 4. top-k: K rounds of a warp arg-best over (choice, expert), carrying the
  // unbiased score; lane j keeps the j-th pick.
  unsigned taken = 0;
#pragma unroll
  for (int i = 0; i < EPL; i++)
    if (lane + 32 * i >= E) taken |= 1u << i;
  float lbv = 0.0f, lbs = 0.0f;
  int lbi = -1;
  auto local_best = [&]() {
    lbi = -1;
#pragma unroll
    for (int i = 0; i < EPL; i++) {
      const int e = lane + 32 * i;
      if (!((taken >> i) & 1u) && (lbi < 0 || ranks_before(ch[i], e, lbv, lbi))) {
        lbv = ch[i];
        lbi = e;
        lbs = sc[i];
      }
    }
  };
  local_best();
  int my_id = -1;
  float w = 0.0f;
  for (int j = 0; j < K; j++) {
    float bv = lbv, bs = lbs;
    int bi = lbi;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(full, bv, o), os = __shfl_xor_sync(full, bs, o);
      const int oi = __shfl_xor_sync(full, bi, o);
      if (oi >= 0 && (bi < 0 || ranks_before(ov, oi, bv, bi))) {
        bv = ov;
        bi = oi;
        bs = os;
      }
    }
    if (lane == j) {
      my_id = bi;
      w = bs;
    }
    if (bi >= 0 && (bi & 31) == lane) {
      taken |= 1u << (bi >> 5);
      local_best();
    }
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
  for (int j = 0; j < K; j++) {
    const float wj = __shfl_sync(full, w, j);
    const int ij = __shfl_sync(full, my_id, j);
    if (j != lane && ranks_before(wj, ij, w, my_id)) rank++;
  }
  if (lane < K) {
    ids[t * K + rank] = my_id;
    wts[t * K + rank] = w;
  }
}

// route_token_any is route_token with EPL picked from E ≤ 256.
__device__ __forceinline__ void route_token_any(int32_t* ids, float* wts, const float* row, const float* bias,
                                                int64_t t, int E, int K, int flags, int G, int TG, float scale,
                                                float* gsm) {
  if (E <= 32) route_token<1>(ids, wts, row, bias, t, E, K, flags, G, TG, scale, gsm);
  else if (E <= 64) route_token<2>(ids, wts, row, bias, t, E, K, flags, G, TG, scale, gsm);
  else if (E <= 128) route_token<4>(ids, wts, row, bias, t, E, K, flags, G, TG, scale, gsm);
  else route_token<8>(ids, wts, row, bias, t, E, K, flags, G, TG, scale, gsm);
}

}  // namespace mkmoe
