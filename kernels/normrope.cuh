// normrope.cuh — one head's RMSNorm then RoPE by one warp: the body of
// mk_norm_rope_f32 (f32ops.cu), shared with the decode attention that runs
// it on the new token itself (decode.cu, mk_paged_decode_bf16), so that both
// give the same bits.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common.cuh"

namespace mk {

// warp_sum_d is the float64 sum of v over a full warp, in every lane.
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// rope_cs gives the rotation's scaled cosine and sine for pair i at
// position fp: angle fp·inv[i] (float32), cos and sin by sincosf (fast) or
// in float64 (exact), times attn.
__device__ __forceinline__ void rope_cs(int i, float fp, const float* inv, float attn, bool fast, float* c,
                                        float* sn) {
  const float a = __fmul_rn(inv[i], fp);
  if (fast) {
    sincosf(a, sn, c);
    *c *= attn;
    *sn *= attn;
  } else {
    *c = __fmul_rn((float)cos((double)a), attn);
    *sn = __fmul_rn((float)sin((double)a), attn);
  }
}

// norm_rope_head: o[j] = RoPE(RMSNorm(x)·w)[j] for one head of head_dim
// values, by one full warp (lane = its lane), and ob[j] the same rounded
// to bf16 (RN) when ob is not null. w null skips the norm. v is
// the warp's scratch of head_dim floats (shared memory); o may be global or
// shared memory, x itself (in place) but not v. The rotation takes the first 2·half values: neox
// pairs (i, half+i), else (2i, 2i+1); cs(i, &c, &sn) gives pair i's scaled
// cosine and sine (rope_cs, or a table of its values).
// Exact (fast false): the arithmetic of rmsnorm_f32 then rope_f32 element
// for element (float64 sum of squares; cs's cos and sin); fast: float32
// sums and rsqrtf (a few ulp from the exact values).
template <typename CS>
__device__ __forceinline__ void norm_rope_head(const float* x, const float* w, float* v, float* o, int head_dim,
                                               int half, bool neox, float eps, bool fast, int lane, CS cs,
                                               __nv_bfloat16* ob = nullptr) {
  float rs = 1.0f;
  if (fast) {
    float ss = 0;
    // Unrolled so that a head's loads (4 at head dim 128) are all in flight
    // before the first sum waits for its value (the same order of sums).
#pragma unroll 4
    for (int j = lane; j < head_dim; j += 32) {
      const float a = x[j];
      v[j] = a;
      ss = fmaf(a, a, ss);
    }
    rs = rsqrtf(warp_sum(ss) / (float)head_dim + eps);
  } else {
    double ss = 0;
#pragma unroll 4
    for (int j = lane; j < head_dim; j += 32) {
      const float a = x[j];
      v[j] = a;
      ss += (double)__fmul_rn(a, a);
    }
    if (w) {
      ss = warp_sum_d(ss);
      const float mean = (float)(ss / (double)head_dim);
      rs = (float)(1.0 / sqrt((double)(mean + eps)));
    }
  }
  if (w) {
#pragma unroll 4
    for (int j = lane; j < head_dim; j += 32) v[j] = __fmul_rn(w[j], __fmul_rn(v[j], rs));
  }
  __syncwarp();
#pragma unroll 4
  for (int j = lane; j < head_dim; j += 32) {
    float y = v[j];
    if (j < 2 * half) {
      const int i = neox ? (j < half ? j : j - half) : j / 2;
      const bool second = neox ? j >= half : (j & 1);
      float c, sn;
      cs(i, &c, &sn);
      const float x1 = neox ? v[i] : v[2 * i], x2 = neox ? v[half + i] : v[2 * i + 1];
      y = second ? __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, sn)) : __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, sn));
    }
    o[j] = y;
    if (ob != nullptr) ob[j] = __float2bfloat16_rn(y);
  }
}

}  // namespace mk
