// f32ops.cu — the float32-activation ops of the CUDA model backend
// (backend/cuda): RMSNorm with a float32 weight, element-wise add/clamp/bias,
// SwiGLU (plain and gpt-oss clamped), RoPE, column copies by head, row
// gather/scatter-add, the sigmoid-gated add of shared experts, the paged KV
// write and a paged causal attention.
//
// First versions: exact (float32 throughout, float64 where the CPU reference
// uses it), not fast. One thread per element or one block per row.
#include <algorithm>
#include <type_traits>
#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "norm.cuh"
#include "normrope.cuh"

namespace {

using bf16 = __nv_bfloat16;

constexpr int kT = 256;

unsigned grid_n(int64_t n) {
  int64_t b = (n + kT - 1) / kT;
  if (b < 1) b = 1;
  if (b > (1 << 20)) b = 1 << 20;
  return (unsigned)b;
}

#define GRID_STRIDE(i, n) \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

using mk::warp_sum_d;

// rms_scale is 1 / sqrt(mean + eps) of a group's sum of squares, ss being
// each thread's share: a warp sum, then one over the warps (part: 32
// doubles of shared memory). Every thread of the block gets it.
__device__ __forceinline__ float rms_scale(double ss, double* part, int64_t group, float eps) {
  ss = warp_sum_d(ss);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    double t = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0;
    t = warp_sum_d(t);
    if (threadIdx.x == 0) part[0] = t;
  }
  __syncthreads();
  const float mean = (float)(part[0] / (double)group);
  return (float)(1.0 / sqrt((double)(mean + eps)));
}

// One block (256 threads) per group: sum of float32 squares accumulated in
// float64, as the CPU reference does. ADD: the group of x + r (float32
// adds, written to sum) is normalised instead of x's, with the same
// arithmetic as mk_add_f32 followed by mk_rmsnorm_f32.
template <bool ADD>
__global__ void rmsnorm_f32(float* out, const float* x, const float* r, float* sum, const float* w, int64_t group,
                            float eps, bf16* ob) {
  mk::pdl_begin();
  __shared__ double part[32];
  const int64_t g = blockIdx.x;
  const float* xs = x + g * group;
  float* os = out + g * group;
  double ss = 0;
  for (int64_t j = threadIdx.x; j < group; j += blockDim.x) {
    float v = xs[j];
    if (ADD) {
      v = v + r[g * group + j];
      sum[g * group + j] = v;
    }
    ss += (double)__fmul_rn(v, v);
  }
  const float rs = rms_scale(ss, part, group, eps);
  // With ADD each thread reads back the sums it wrote itself.
  const float* vs = ADD ? sum + g * group : xs;
  for (int64_t j = threadIdx.x; j < group; j += blockDim.x) {
    const float y = __fmul_rn(w[j], __fmul_rn(vs[j], rs));
    os[j] = y;
    if (ob) ob[g * group + j] = __float2bfloat16_rn(y);
  }
}

// rmsnorm_f32_reg is rmsnorm_f32 for groups of at most 4·VPT·blockDim
// values with group % 4 == 0 and 16-byte aligned rows: each thread keeps its
// float4s in registers, so every load of the row is in flight at once and
// the row is not read back after the reduction (the loop form above waits
// on one load per iteration: 6–8 µs for a 2048-wide row, measured with ncu).
// Same arithmetic per element: float32 adds and products, the sum of
// squares in float64 (a different summation order: the rounding differs in
// the last bits of a double).
//
// With cb.y (ADD only) the added row is not r but a MoE layer's combine,
// Σ_k cb.w[g,k]·cb.y[cb.slot_of[g·K+k]] in k order with fmaf from 0, as
// moe.cu's combine kernel sums it: the same bits as that kernel then this
// one, without the round trip of the combined rows or the launch.
//
// early (at ≤ mk::res_rows() rows; MK_NORM_EARLY=0 turns it off): the next kernel's
// CTAs launch before this one waits, so a weight-resident GEMV after it
// (gemv.cu) streams its rows under the kernel before this one.
template <bool ADD, int VPT>
__global__ void rmsnorm_f32_reg(float* out, const float* x, const float* r, float* sum, const float* w,
                                int64_t group, float eps, bf16* ob, const mkf32::CombineIn cb, bool early) {
  const int64_t n4 = group / 4;
  const float4* w4 = reinterpret_cast<const float4*>(w);
  float4 wv[VPT];  // the weight is a constant: loaded before the wait
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    const int64_t j = threadIdx.x + (int64_t)i * blockDim.x;
    if (j < n4) wv[i] = w4[j];
  }
  if (early)
    mk::pdl_begin_early();
  else
    mk::pdl_begin();
  __shared__ double part[32];
  constexpr int KC = 32;          // k staged at a time
  __shared__ int32_t c_slot[KC];  // cb's slots and weights of row g, k in [kc, kc + KC)
  __shared__ float c_w[KC];
  const int64_t g = blockIdx.x;
  const float4* xs = reinterpret_cast<const float4*>(x + g * group);
  const float4* rs4 = reinterpret_cast<const float4*>(ADD ? r + g * group : x);
  float4 v[VPT];
  double ss = 0;
  // Every load of the row is issued before the first store (sum may alias
  // nothing the compiler can prove, so a store between loads would order
  // them: one memory latency per float4 and per k, ~5 µs a call under ncu).
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    const int64_t j = threadIdx.x + (int64_t)i * blockDim.x;
    v[i] = j < n4 ? xs[j] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (ADD) {
    float4 b[VPT];
    if (cb.y != nullptr) {
      // The row's slots and weights through shared memory (KC at a time),
      // then the expert rows KU k at a time, all VPT float4s of each in
      // flight.
#pragma unroll
      for (int i = 0; i < VPT; i++) b[i] = make_float4(0.f, 0.f, 0.f, 0.f);
      constexpr int KU = VPT >= 8 ? 2 : 8 / VPT;
      for (int kc = 0; kc < cb.K; kc += KC) {
        const int kn = min(KC, cb.K - kc);
        if (kc > 0) __syncthreads();  // every thread is done with the previous chunk
        for (int k = threadIdx.x; k < kn; k += blockDim.x) {
          c_slot[k] = cb.slot_of[g * cb.K + kc + k];
          c_w[k] = cb.w[g * cb.K + kc + k];
        }
        __syncthreads();
        for (int k0 = 0; k0 < kn; k0 += KU) {
          float4 yv[KU][VPT];
#pragma unroll
          for (int u = 0; u < KU; u++) {
            const int32_t slot = k0 + u < kn ? c_slot[k0 + u] : -1;
#pragma unroll
            for (int i = 0; i < VPT; i++) {
              const int64_t j = threadIdx.x + (int64_t)i * blockDim.x;
              yv[u][i] = slot >= 0 && j < n4 ? mkf32::y4_at(cb.y, slot, n4, j, cb.ybf) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
          }
#pragma unroll
          for (int u = 0; u < KU; u++) {
            if (k0 + u >= kn || c_slot[k0 + u] < 0) continue;  // dropped: no term (k order kept)
            const float wk = c_w[k0 + u];
#pragma unroll
            for (int i = 0; i < VPT; i++) {
              b[i].x = fmaf(wk, yv[u][i].x, b[i].x);
              b[i].y = fmaf(wk, yv[u][i].y, b[i].y);
              b[i].z = fmaf(wk, yv[u][i].z, b[i].z);
              b[i].w = fmaf(wk, yv[u][i].w, b[i].w);
            }
          }
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < VPT; i++) {
        const int64_t j = threadIdx.x + (int64_t)i * blockDim.x;
        b[i] = j < n4 ? rs4[j] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
#pragma unroll
    for (int i = 0; i < VPT; i++) {
      const int64_t j = threadIdx.x + (int64_t)i * blockDim.x;
      if (j < n4) {
        v[i].x = v[i].x + b[i].x;
        v[i].y = v[i].y + b[i].y;
        v[i].z = v[i].z + b[i].z;
        v[i].w = v[i].w + b[i].w;
        reinterpret_cast<float4*>(sum + g * group)[j] = v[i];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    const int64_t j = threadIdx.x + (int64_t)i * blockDim.x;
    if (j < n4)
      ss += (double)__fmul_rn(v[i].x, v[i].x) + (double)__fmul_rn(v[i].y, v[i].y) +
            (double)__fmul_rn(v[i].z, v[i].z) + (double)__fmul_rn(v[i].w, v[i].w);
  }
  const float rsq = rms_scale(ss, part, group, eps);
  float4* o4 = reinterpret_cast<float4*>(out + g * group);
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    const int64_t j = threadIdx.x + (int64_t)i * blockDim.x;
    if (j < n4) {
      const float4 ww = wv[i];
      const float4 y = make_float4(__fmul_rn(ww.x, __fmul_rn(v[i].x, rsq)), __fmul_rn(ww.y, __fmul_rn(v[i].y, rsq)),
                                   __fmul_rn(ww.z, __fmul_rn(v[i].z, rsq)), __fmul_rn(ww.w, __fmul_rn(v[i].w, rsq)));
      o4[j] = y;
      if (ob) {  // the bf16 rounding too (8 bytes per float4)
        __nv_bfloat162 h[2] = {__floats2bfloat162_rn(y.x, y.y), __floats2bfloat162_rn(y.z, y.w)};
        reinterpret_cast<uint2*>(ob + g * group)[j] = *reinterpret_cast<uint2*>(h);
      }
    }
  }
}

// launch_rmsnorm runs rmsnorm_f32_reg when the shape and alignment allow
// (a warp-multiple of threads, at most 256, with at most 8 float4s each),
// else the loop kernel.
// With cb.y (a MoE combine as the added row) only the register kernel
// serves, and false means the shape or alignment refused it (nothing ran).
template <bool ADD>
bool launch_rmsnorm(cudaStream_t s, float* out, const float* x, const float* r, float* sum, const float* w,
                    int64_t segs, int64_t group, float eps, bf16* ob = nullptr, const mkf32::CombineIn cb = {}) {
  const auto al = [](const void* p) { return ((uintptr_t)p & 15) == 0; };
  const int64_t n4 = group / 4;
  if (group % 4 == 0 && n4 <= 8 * 256 && al(out) && al(x) && al(w) && (!ADD || (al(r) && al(sum))) &&
      ((uintptr_t)ob & 7) == 0 && al(cb.y)) {
    const int threads = (int)std::min<int64_t>(256, (n4 + 31) / 32 * 32);
    const int64_t vpt = (n4 + threads - 1) / threads;
    const unsigned grid = (unsigned)segs;
    static const bool early_on = !mk::env_is("MK_NORM_EARLY", '0');
    const bool early = early_on && segs <= mk::res_rows();
    if (vpt <= 1) (void)(mk::launch(rmsnorm_f32_reg<ADD, 1>, dim3(grid), dim3(threads), 0, s, out, x, r, sum, w, group, eps, ob, cb, early));
    else if (vpt <= 2) (void)(mk::launch(rmsnorm_f32_reg<ADD, 2>, dim3(grid), dim3(threads), 0, s, out, x, r, sum, w, group, eps, ob, cb, early));
    else if (vpt <= 4) (void)(mk::launch(rmsnorm_f32_reg<ADD, 4>, dim3(grid), dim3(threads), 0, s, out, x, r, sum, w, group, eps, ob, cb, early));
    else (void)(mk::launch(rmsnorm_f32_reg<ADD, 8>, dim3(grid), dim3(threads), 0, s, out, x, r, sum, w, group, eps, ob, cb, early));
    return true;
  }
  if (cb.y != nullptr) return false;
  (void)(mk::launch(rmsnorm_f32<ADD>, dim3((unsigned)segs), dim3(kT), 0, s, out, x, r, sum, w, group, eps, ob));
  return true;
}

// hi = bf16(x), lo = bf16(x - hi); x - hi is exact in float32. With
// 16-byte aligned pointers (vec), 8 values a step (as ops.cu's
// f32_to_bf16); the scalar loop takes the tail and unaligned calls.
__global__ void split_bf16(bf16* hi, bf16* lo, const float* x, int64_t n, int vec) {
  mk::pdl_begin();
  const int64_t stride = (int64_t)gridDim.x * blockDim.x, tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vec) {
    const int64_t n8 = n / 8;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int64_t i = tid; i < n8; i += stride) {
      const float4 a = __ldcs(x4 + 2 * i), b = __ldcs(x4 + 2 * i + 1);
      const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      uint32_t h[4], l[4];
#pragma unroll
      for (int j = 0; j < 4; j++) {
        h[j] = mk::pack_bf16x2(v[2 * j], v[2 * j + 1]);
        const __nv_bfloat162 hb = *reinterpret_cast<const __nv_bfloat162*>(&h[j]);
        l[j] = mk::pack_bf16x2(v[2 * j] - __low2float(hb), v[2 * j + 1] - __high2float(hb));
      }
      reinterpret_cast<uint4*>(hi)[i] = make_uint4(h[0], h[1], h[2], h[3]);
      reinterpret_cast<uint4*>(lo)[i] = make_uint4(l[0], l[1], l[2], l[3]);
    }
    done = n8 * 8;
  }
  for (int64_t i = done + tid; i < n; i += stride) {
    const float v = x[i];
    const bf16 h = __float2bfloat16_rn(v);
    hi[i] = h;
    lo[i] = __float2bfloat16_rn(v - __bfloat162float(h));
  }
}

__global__ void add_f32(float* out, const float* a, const float* b, int64_t n) {
  mk::pdl_begin();
  GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void fill_f32(float* out, float v, int64_t n) {
  mk::pdl_begin();
  GRID_STRIDE(i, n) out[i] = v;
}

__global__ void clamp_f32(float* out, const float* x, int64_t n, float lim) {
  mk::pdl_begin();
  GRID_STRIDE(i, n) {
    float v = x[i];
    if (v > lim) v = lim;
    else if (v < -lim) v = -lim;
    out[i] = v;
  }
}

__global__ void bias_add_f32(float* x, const float* b, int64_t rows, int64_t cols) {
  mk::pdl_begin();
  GRID_STRIDE(i, rows * cols) x[i] += b[i % cols];
}

// kind 0: silu(g)*u; kind 1: gpt-oss clamped.
__global__ void swiglu_f32(float* out, const float* in, int64_t t, int64_t inter, int kind,
                           float alpha, float lim) {
  mk::pdl_begin();
  GRID_STRIDE(idx, t * inter) {
    const int64_t r = idx / inter, i = idx - r * inter;
    const float* row = in + r * 2 * inter;
    float g = row[i], u = row[inter + i];
    if (kind == 0) {
      out[idx] = __fmul_rn((float)((double)g / (1.0 + exp(-(double)g))), u);
    } else {
      if (g > lim) g = lim;
      if (u > lim) u = lim;
      else if (u < -lim) u = -lim;
      const float glu = (float)((double)g / (1.0 + exp(-(double)alpha * (double)g)));
      out[idx] = __fmul_rn(u + 1.0f, glu);
    }
  }
}

// In place; one thread per (row, head, pair).
__global__ void rope_f32(float* x, const int32_t* pos, int64_t t, int64_t heads, int64_t head_dim,
                         int64_t half, int style, const float* inv, float attn) {
  mk::pdl_begin();
  GRID_STRIDE(idx, t * heads * half) {
    const int64_t i = idx % half, rh = idx / half, h = rh % heads, r = rh / heads;
    const float a = __fmul_rn(inv[i], (float)pos[r]);
    const float c = __fmul_rn((float)cos((double)a), attn);
    const float s = __fmul_rn((float)sin((double)a), attn);
    float* v = x + r * heads * head_dim + h * head_dim;
    float* p1 = style == MK_ROPE_NEOX ? v + i : v + 2 * i;
    float* p2 = style == MK_ROPE_NEOX ? v + half + i : v + 2 * i + 1;
    const float x1 = *p1, x2 = *p2;
    *p1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    *p2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
  }
}

// norm_rope_f32: out = RoPE(RMSNorm(x) per head) in one launch for up to
// two tensors of the same rows (q and k: the second's heads follow the
// first's). A CTA takes one row and up to hpb of its heads: its threads
// first put the row's rotation factors (rope_cs, one per pair, shared by
// every head of the row) in shared memory, then each warp runs heads
// (norm_rope_head: the head's values in shared memory, the sum of squares,
// the rotation of the normalised values). outb, where set, gets the
// output rounded to bf16 as well (q for the prefill attention kernel).
// Exact (fast false): the arithmetic of rmsnorm_f32 followed by rope_f32
// element for element (the float64 sum's order aside: float64 sums, cos and
// sin). Fast: float32 sums, rsqrtf and sincosf (within a few ulp of the
// exact values; the fast profile rounds q and k to bf16 after this). w null
// skips the norm (an out-of-place rope_f32). head_dim ≤ kNormRopeMaxD.
constexpr int kNormRopeMaxD = 256, kNormRopeWarps = 4;
struct NormRopePart {
  float* out;
  const float* x;
  const float* w;
  int64_t heads;
  bf16* outb;  // or null
};
__global__ void __launch_bounds__(kNormRopeWarps * 32)
    norm_rope_f32(NormRopePart p0, NormRopePart p1, const int32_t* pos, int64_t head_dim, int64_t half, int style,
                  const float* inv, float attn, float eps, bool fast, int hpb) {
  mk::pdl_begin();
  __shared__ float buf[kNormRopeWarps][kNormRopeMaxD];
  __shared__ float tab[kNormRopeMaxD];  // pair i's cosine at 2i, sine at 2i + 1
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x;
  const float fp = (float)pos[r];
  for (int i = threadIdx.x; i < half; i += blockDim.x) mk::rope_cs(i, fp, inv, attn, fast, &tab[2 * i], &tab[2 * i + 1]);
  __syncthreads();
  const int64_t nh = p0.heads + p1.heads, h1 = min((int64_t)(blockIdx.y + 1) * hpb, nh);
  for (int64_t hh = (int64_t)blockIdx.y * hpb + warp; hh < h1; hh += kNormRopeWarps) {
    const bool second = hh >= p0.heads;  // (fields picked one by one: a reference to a parameter is a local copy)
    const int64_t rh = second ? r * p1.heads + hh - p0.heads : r * p0.heads + hh;
    const float* x = second ? p1.x : p0.x;
    const float* w = second ? p1.w : p0.w;
    float* out = second ? p1.out : p0.out;
    bf16* outb = second ? nullptr : p0.outb;
    mk::norm_rope_head(x + rh * head_dim, w, buf[warp], out + rh * head_dim, (int)head_dim, (int)half,
                       style == MK_ROPE_NEOX, eps, fast, lane,
                       [&](int i, float* c, float* sn) {
                         *c = tab[2 * i];
                         *sn = tab[2 * i + 1];
                       },
                       outb != nullptr ? outb + rh * head_dim : nullptr);
    __syncwarp();  // the warp's scratch is read by other lanes before the next head writes it
  }
}

__global__ void copy_cols_f32(float* dst, int64_t dld, int64_t doff, int64_t dhs, const float* src,
                              int64_t sld, int64_t soff, int64_t shs, int64_t rows, int64_t heads,
                              int64_t width) {
  mk::pdl_begin();
  GRID_STRIDE(idx, rows * heads * width) {
    const int64_t c = idx % width, rh = idx / width, h = rh % heads, r = rh / heads;
    dst[r * dld + h * dhs + doff + c] = src[r * sld + h * shs + soff + c];
  }
}

// copy_cols_rows is copy_cols_f32 a row at a time (blockIdx.y strides the
// rows, blockIdx.x and the threads a row's heads × width / V units of V
// floats): one 32-bit division a unit instead of three 64-bit ones an
// element (the MLA prefill's splits and concatenations move ~900 M floats
// a DeepSeek-V3 layer at 8k tokens). V = 4 (float4) where every width,
// stride and offset is a multiple of 4 and the pointers 16-byte aligned
// (an 8-byte aligned bf16 dst). TO: float, or bf16 (each value rounded to
// nearest even: mk_copy_cols_bf16, ABI 24).
template <int V, typename TO = float>
__global__ void copy_cols_rows(TO* dst, int64_t dld, int64_t doff, int64_t dhs, const float* src, int64_t sld,
                               int64_t soff, int64_t shs, int64_t rows, int heads, int width) {
  mk::pdl_begin();
  using T = typename std::conditional<V == 4, float4, float>::type;
  const unsigned w = (unsigned)(width / V), n = (unsigned)heads * w;  // units a head, a row
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    TO* drow = dst + r * dld + doff;
    const float* srow = src + r * sld + soff;
    for (unsigned u = blockIdx.x * blockDim.x + threadIdx.x; u < n; u += gridDim.x * blockDim.x) {
      const unsigned h = u / w, c = (u - h * w) * V;
      const T x = *reinterpret_cast<const T*>(srow + h * shs + c);
      if constexpr (std::is_same<TO, float>::value) {
        *reinterpret_cast<T*>(drow + h * dhs + c) = x;
      } else if constexpr (V == 4) {
        __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
        uint2 v;
        v.x = *reinterpret_cast<uint32_t*>(&lo);
        v.y = *reinterpret_cast<uint32_t*>(&hi);
        *reinterpret_cast<uint2*>(drow + h * dhs + c) = v;
      } else {
        drow[h * dhs + c] = __float2bfloat16_rn(x);
      }
    }
  }
}

// gathered is element c of row r of src [src_rows, cols] as a float, NaN
// for a row outside [0, src_rows).
template <typename T>
__device__ __forceinline__ float gathered(const T* src, int32_t r, int64_t c, int64_t cols, int64_t src_rows) {
  if (r < 0 || (int64_t)r >= src_rows) return nanf("");
  if constexpr (sizeof(T) == 2) {
    return __bfloat162float(src[(int64_t)r * cols + c]);
  } else {
    return src[(int64_t)r * cols + c];
  }
}

// FeedIds is where gather_rows_feed takes each row's id: ids[i], or the
// token of row feed[i] = ids[n + i] of the previous step's sampling results
// when that is >= 0.
struct FeedIds {
  const int32_t* ids;    // [2n]: host ids, then feed rows (-1: the host id)
  const int32_t* picks;  // [pick_rows, stride]: the token is word 0 of a row
  int64_t stride, pick_rows, n;
};

// The id of row i: -1 (then a NaN row) for a feed row out of range.
__device__ __forceinline__ int32_t feed_id(const FeedIds& f, int64_t i) {
  const int32_t r = f.ids[f.n + i];
  if (r < 0) return f.ids[i];
  return (int64_t)r < f.pick_rows ? f.picks[(int64_t)r * f.stride] : -1;
}

// gather_rows with ids from feed_id (tokens the previous step sampled on the
// device, read here instead of on the host). An id outside [0, src_rows)
// gives a row of NaN.
template <typename T>
__global__ void gather_rows_feed(float* dst, const T* src, const FeedIds f, int64_t cols, int64_t src_rows) {
  mk::pdl_begin();
  GRID_STRIDE(k, f.n * cols) {
    const int64_t i = k / cols;
    dst[k] = gathered(src, feed_id(f, i), k - i * cols, cols, src_rows);
  }
}

// An index outside [0, src_rows) gives a row of NaN.
template <typename T>
__global__ void gather_rows(float* dst, const T* src, const int32_t* idx, int64_t n, int64_t cols,
                            int64_t src_rows) {
  mk::pdl_begin();
  GRID_STRIDE(k, n * cols) {
    const int64_t i = k / cols;
    dst[k] = gathered(src, idx[i], k - i * cols, cols, src_rows);
  }
}

__global__ void scatter_add_rows(float* out, const float* src, const int32_t* idx, const float* w,
                                 int64_t n, int64_t cols) {
  mk::pdl_begin();
  GRID_STRIDE(k, n * cols) {
    const int64_t i = k / cols, c = k - i * cols;
    atomicAdd(out + (int64_t)idx[i] * cols + c, __fmul_rn(w[i], src[k]));
  }
}

__global__ void gated_add(float* out, const float* x, const float* gate, int64_t rows, int64_t cols) {
  mk::pdl_begin();
  GRID_STRIDE(k, rows * cols) {
    const int64_t r = k / cols;
    float s = 1.0f;
    if (gate) s = (float)(1.0 / (1.0 + exp(-(double)gate[r])));
    out[k] += __fmul_rn(s, x[k]);
  }
}

__global__ void kv_write(float* pk, float* pv, const float* k, const float* v, const int32_t* slots,
                         int64_t n, int64_t kw, int64_t vw) {
  mk::pdl_begin();
  const int64_t w = kw + vw;
  GRID_STRIDE(q, n * w) {
    const int64_t i = q / w, c = q - i * w;
    const int64_t s = slots[i];
    if (s < 0) continue;  // a row of another pool
    if (c < kw) pk[s * kw + c] = k[i * kw + c];
    else pv[s * vw + c - kw] = v[i * vw + c - kw];
  }
}

constexpr int kAT = 128;  // attention threads per block = keys per tile

// One block per (listed query row, head). rows[b]: the q/out row;
// pos[b]: its position (it sees keys max(0, pos-window+1)..pos);
// table[b]: the offset of its sequence's block table in blocks[].
__global__ void attention_f32(float* out, const float* q, const float* pk, const float* pv,
                              const int32_t* rows, const int32_t* pos, const int32_t* table,
                              const int32_t* blocks, int H, int KV, int D, int Dv, int bs,
                              float scale, int window, const float* sinks) {
  extern __shared__ float sm[];
  float* qs = sm;           // [D]
  float* acc = qs + D;      // [Dv]
  float* p = acc + Dv;      // [kAT]
  __shared__ float red[kAT / 32];
  const int b = blockIdx.x, h = blockIdx.y, kh = h / (H / KV);
  const int64_t row = rows[b];
  const int i = pos[b];
  const int32_t* tab = blocks + table[b];
  const int lo = window > 0 ? max(0, i - window + 1) : 0;
  for (int c = threadIdx.x; c < D; c += blockDim.x) qs[c] = q[(row * H + h) * D + c];
  for (int c = threadIdx.x; c < Dv; c += blockDim.x) acc[c] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  __syncthreads();
  for (int j0 = lo; j0 <= i; j0 += kAT) {
    const int j = j0 + threadIdx.x;
    float s = -INFINITY;
    if (j <= i) {
      const int64_t slot = (int64_t)tab[j / bs] * bs + j % bs;
      const float* kr = pk + (slot * KV + kh) * D;
      float d = 0.0f;
      for (int c = 0; c < D; c++) d = fmaf(qs[c], kr[c], d);
      s = d * scale;
    }
    // tile max
    float v = s;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    float tm = red[0];
    for (int w = 1; w < kAT / 32; w++) tm = fmaxf(tm, red[w]);
    __syncthreads();
    const float mn = fmaxf(m, tm);
    const float e = j <= i ? expf(s - mn) : 0.0f;
    p[threadIdx.x] = e;
    float se = e;
    for (int o = 16; o > 0; o >>= 1) se += __shfl_xor_sync(0xffffffffu, se, o);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = se;
    __syncthreads();
    float ts = 0.0f;
    for (int w = 0; w < kAT / 32; w++) ts += red[w];
    const float corr = expf(m - mn);  // m = -inf at first: 0
    l = l * corr + ts;
    m = mn;
    const int nk = min(kAT, i - j0 + 1);
    for (int c = threadIdx.x; c < Dv; c += blockDim.x) {
      float a = acc[c] * corr;
      for (int jj = 0; jj < nk; jj++) {
        const int jk = j0 + jj;
        const int64_t slot = (int64_t)tab[jk / bs] * bs + jk % bs;
        a = fmaf(p[jj], pv[(slot * KV + kh) * Dv + c], a);
      }
      acc[c] = a;
    }
    __syncthreads();
  }
  if (sinks) {
    const float sk = sinks[h];
    const float mn = fmaxf(m, sk);
    const float corr = expf(m - mn);
    l = l * corr + expf(sk - mn);
    for (int c = threadIdx.x; c < Dv; c += blockDim.x) acc[c] *= corr;
  }
  const float inv = 1.0f / l;
  for (int c = threadIdx.x; c < Dv; c += blockDim.x) out[(row * H + h) * Dv + c] = acc[c] * inv;
}

}  // namespace

namespace mkf32 {
bool combine_add_rmsnorm(cudaStream_t s, float* sum, float* out, bf16* ob, const float* x, const CombineIn& cb,
                         int64_t T, int64_t H, const float* w, float eps) {
  return launch_rmsnorm<true>(s, out, x, nullptr, sum, w, T, H, eps, ob, cb);
}
}  // namespace mkf32

#define F32_ARG(fn, cond) MK_ARG(cond, "%s: bad argument (%s)", fn, #cond)

extern "C" {

int32_t mk_rmsnorm_f32(uint64_t stream, uint64_t out, uint64_t x, uint64_t w, int64_t rows,
                       int64_t cols, int64_t group, uint32_t eps_bits) {
  const char* fn = "mk_rmsnorm_f32";
  MK_THREAD(fn);
  F32_ARG(fn, rows > 0 && cols > 0 && group > 0 && cols % group == 0 && out && x && w);
  const int64_t segs = rows * (cols / group);
  F32_ARG(fn, segs <= INT32_MAX);
  launch_rmsnorm<false>(mk::as_stream(stream), mk::dev<float>(out), mk::dev<float>(x), nullptr, nullptr,
                        mk::dev<float>(w), segs, group, mk::float_from_bits(eps_bits));
  MK_LAUNCHED("rmsnorm_f32");
  return MK_OK;
}

int32_t mk_add_rmsnorm_f32(uint64_t stream, uint64_t sum, uint64_t out, uint64_t x, uint64_t r, uint64_t w,
                           int64_t rows, int64_t cols, uint32_t eps_bits, uint64_t outb) {
  const char* fn = "mk_add_rmsnorm_f32";
  MK_THREAD(fn);
  F32_ARG(fn, rows > 0 && rows <= INT32_MAX && cols > 0 && sum && out && x && r && w);
  launch_rmsnorm<true>(mk::as_stream(stream), mk::dev<float>(out), mk::dev<float>(x), mk::dev<float>(r),
                       mk::dev<float>(sum), mk::dev<float>(w), rows, cols, mk::float_from_bits(eps_bits),
                       outb ? mk::dev<bf16>(outb) : nullptr);
  MK_LAUNCHED("add_rmsnorm_f32");
  return MK_OK;
}

int32_t mk_split_bf16(uint64_t stream, uint64_t hi, uint64_t lo, uint64_t x, int64_t n) {
  MK_THREAD("mk_split_bf16");
  F32_ARG("mk_split_bf16", n > 0 && hi && lo && x);
  const int vec = (hi % 16 == 0 && lo % 16 == 0 && x % 16 == 0) ? 1 : 0;
  (void)(mk::launch(split_bf16, dim3(grid_n(vec ? (n + 7) / 8 : n)), dim3(kT), 0, mk::as_stream(stream), mk::dev<bf16>(hi), mk::dev<bf16>(lo),
                    mk::dev<float>(x), n, vec));
  MK_LAUNCHED("split_bf16");
  return MK_OK;
}

int32_t mk_add_f32(uint64_t stream, uint64_t out, uint64_t a, uint64_t b, int64_t n) {
  MK_THREAD("mk_add_f32");
  F32_ARG("mk_add_f32", n > 0 && out && a && b);
  (void)(mk::launch(add_f32, dim3(grid_n(n)), dim3(kT), 0, mk::as_stream(stream), mk::dev<float>(out), mk::dev<float>(a),
                                                      mk::dev<float>(b), n));
  MK_LAUNCHED("add_f32");
  return MK_OK;
}

int32_t mk_fill_f32(uint64_t stream, uint64_t out, int64_t n, uint32_t value_bits) {
  MK_THREAD("mk_fill_f32");
  F32_ARG("mk_fill_f32", n > 0 && out);
  (void)(mk::launch(fill_f32, dim3(grid_n(n)), dim3(kT), 0, mk::as_stream(stream), mk::dev<float>(out), mk::float_from_bits(value_bits), n));
  MK_LAUNCHED("fill_f32");
  return MK_OK;
}

int32_t mk_clamp_f32(uint64_t stream, uint64_t out, uint64_t x, int64_t n, uint32_t limit_bits) {
  MK_THREAD("mk_clamp_f32");
  F32_ARG("mk_clamp_f32", n > 0 && out && x);
  (void)(mk::launch(clamp_f32, dim3(grid_n(n)), dim3(kT), 0, mk::as_stream(stream), mk::dev<float>(out), mk::dev<float>(x), n,
                                                        mk::float_from_bits(limit_bits)));
  MK_LAUNCHED("clamp_f32");
  return MK_OK;
}

int32_t mk_bias_add_f32(uint64_t stream, uint64_t x, uint64_t bias, int64_t rows, int64_t cols) {
  MK_THREAD("mk_bias_add_f32");
  F32_ARG("mk_bias_add_f32", rows > 0 && cols > 0 && x && bias);
  (void)(mk::launch(bias_add_f32, dim3(grid_n(rows * cols)), dim3(kT), 0, mk::as_stream(stream), mk::dev<float>(x),
                                                                     mk::dev<float>(bias), rows, cols));
  MK_LAUNCHED("bias_add_f32");
  return MK_OK;
}

int32_t mk_swiglu_f32(uint64_t stream, uint64_t out, uint64_t in, int64_t t, int64_t i,
                      int32_t kind, uint32_t alpha_bits, uint32_t limit_bits) {
  MK_THREAD("mk_swiglu_f32");
  F32_ARG("mk_swiglu_f32", t > 0 && i > 0 && out && in && (kind == 0 || kind == 1));
  (void)(mk::launch(swiglu_f32, dim3(grid_n(t * i)), dim3(kT), 0, mk::as_stream(stream),
      mk::dev<float>(out), mk::dev<float>(in), t, i, kind, mk::float_from_bits(alpha_bits),
      mk::float_from_bits(limit_bits)));
  MK_LAUNCHED("swiglu_f32");
  return MK_OK;
}

int32_t mk_rope_f32(uint64_t stream, uint64_t x, uint64_t pos, int64_t t, int64_t heads,
                    int64_t head_dim, int64_t rot_dim, int32_t style, uint64_t inv_freq,
                    uint32_t attn_bits) {
  MK_THREAD("mk_rope_f32");
  F32_ARG("mk_rope_f32", t > 0 && heads > 0 && rot_dim > 0 && rot_dim % 2 == 0 &&
                             rot_dim <= head_dim && x && pos && inv_freq &&
                             (style == MK_ROPE_NEOX || style == MK_ROPE_INTERLEAVED));
  const int64_t half = rot_dim / 2;
  (void)(mk::launch(rope_f32, dim3(grid_n(t * heads * half)), dim3(kT), 0, mk::as_stream(stream),
      mk::dev<float>(x), mk::dev<int32_t>(pos), t, heads, head_dim, half, style,
      mk::dev<float>(inv_freq), mk::float_from_bits(attn_bits)));
  MK_LAUNCHED("rope_f32");
  return MK_OK;
}

int32_t mk_norm_rope_f32(uint64_t stream, uint64_t out, uint64_t x, uint64_t w, int64_t heads, uint64_t out2,
                         uint64_t x2, uint64_t w2, int64_t heads2, uint64_t pos, int64_t t, int64_t head_dim,
                         int64_t rot_dim, int32_t style, uint64_t inv_freq, uint32_t attn_bits, uint32_t eps_bits,
                         int32_t flags, uint64_t out_bf16) {
  MK_THREAD("mk_norm_rope_f32");
  F32_ARG("mk_norm_rope_f32", t > 0 && heads > 0 && heads2 >= 0 && head_dim > 0 && head_dim <= kNormRopeMaxD &&
                                  rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= head_dim && out && x &&
                                  (heads2 == 0 || (out2 && x2)) && pos && inv_freq && (flags & ~1) == 0 &&
                                  (style == MK_ROPE_NEOX || style == MK_ROPE_INTERLEAVED));
  F32_ARG("mk_norm_rope_f32", t < (1ll << 31));
  // Up to 16 heads a CTA from 1024 rows on (the rotation factors computed
  // once for 16 heads), else 4 (one a warp: enough CTAs for few rows).
  const int hpb = t >= 1024 ? 16 : kNormRopeWarps;
  const int64_t chunks = (heads + heads2 + hpb - 1) / hpb;
  const NormRopePart p0{mk::dev<float>(out), mk::dev<const float>(x), w ? mk::dev<const float>(w) : nullptr, heads,
                        out_bf16 ? mk::dev<bf16>(out_bf16) : nullptr};
  const NormRopePart p1{heads2 ? mk::dev<float>(out2) : nullptr, heads2 ? mk::dev<const float>(x2) : nullptr,
                        heads2 && w2 ? mk::dev<const float>(w2) : nullptr, heads2, nullptr};
  (void)(mk::launch(norm_rope_f32, dim3((unsigned)t, (unsigned)chunks), dim3(kNormRopeWarps * 32), 0,
      mk::as_stream(stream), p0, p1, mk::dev<int32_t>(pos), head_dim, rot_dim / 2, style, mk::dev<float>(inv_freq),
      mk::float_from_bits(attn_bits), mk::float_from_bits(eps_bits), (flags & MK_NORM_ROPE_FAST) != 0, hpb));
  MK_LAUNCHED("norm_rope_f32");
  return MK_OK;
}

int32_t mk_copy_cols_bf16(uint64_t stream, uint64_t dst, int64_t dld, int64_t doff, int64_t dhs,
                          uint64_t src, int64_t sld, int64_t soff, int64_t shs, int64_t rows,
                          int64_t heads, int64_t width) {
  MK_THREAD("mk_copy_cols_bf16");
  F32_ARG("mk_copy_cols_bf16", rows > 0 && heads > 0 && width > 0 && dst && src);
  F32_ARG("mk_copy_cols_bf16", heads * width < (1ll << 31));
  cudaStream_t st = mk::as_stream(stream);
  const bool v4 = width % 4 == 0 && dld % 4 == 0 && doff % 4 == 0 && dhs % 4 == 0 && sld % 4 == 0 &&
                  soff % 4 == 0 && shs % 4 == 0 && dst % 8 == 0 && src % 16 == 0;
  const int64_t units = heads * (v4 ? width / 4 : width);
  const dim3 grid((unsigned)std::min<int64_t>((units + kT - 1) / kT, 64), (unsigned)std::min<int64_t>(rows, 65535));
  if (v4)
    (void)(mk::launch(copy_cols_rows<4, bf16>, grid, dim3(kT), 0, st, mk::dev<bf16>(dst), dld, doff, dhs,
        mk::dev<float>(src), sld, soff, shs, rows, (int)heads, (int)width));
  else
    (void)(mk::launch(copy_cols_rows<1, bf16>, grid, dim3(kT), 0, st, mk::dev<bf16>(dst), dld, doff, dhs,
        mk::dev<float>(src), sld, soff, shs, rows, (int)heads, (int)width));
  MK_LAUNCHED("copy_cols_rows (bf16)");
  return MK_OK;
}

int32_t mk_copy_cols_f32(uint64_t stream, uint64_t dst, int64_t dld, int64_t doff, int64_t dhs,
                         uint64_t src, int64_t sld, int64_t soff, int64_t shs, int64_t rows,
                         int64_t heads, int64_t width) {
  MK_THREAD("mk_copy_cols_f32");
  F32_ARG("mk_copy_cols_f32", rows > 0 && heads > 0 && width > 0 && dst && src);
  cudaStream_t st = mk::as_stream(stream);
  if (heads * width < (1ll << 31) && width < (1ll << 31)) {  // a row's units fit 32 bits: copy_cols_rows
    const bool v4 = width % 4 == 0 && dld % 4 == 0 && doff % 4 == 0 && dhs % 4 == 0 && sld % 4 == 0 &&
                    soff % 4 == 0 && shs % 4 == 0 && dst % 16 == 0 && src % 16 == 0;
    const int64_t units = heads * (v4 ? width / 4 : width);
    const dim3 grid((unsigned)std::min<int64_t>((units + kT - 1) / kT, 64), (unsigned)std::min<int64_t>(rows, 65535));
    if (v4)
      (void)(mk::launch(copy_cols_rows<4>, grid, dim3(kT), 0, st, mk::dev<float>(dst), dld, doff, dhs,
          mk::dev<float>(src), sld, soff, shs, rows, (int)heads, (int)width));
    else
      (void)(mk::launch(copy_cols_rows<1>, grid, dim3(kT), 0, st, mk::dev<float>(dst), dld, doff, dhs,
          mk::dev<float>(src), sld, soff, shs, rows, (int)heads, (int)width));
    MK_LAUNCHED("copy_cols_rows");
    return MK_OK;
  }
  (void)(mk::launch(copy_cols_f32, dim3(grid_n(rows * heads * width)), dim3(kT), 0, st,
      mk::dev<float>(dst), dld, doff, dhs, mk::dev<float>(src), sld, soff, shs, rows, heads, width));
  MK_LAUNCHED("copy_cols_f32");
  return MK_OK;
}

int32_t mk_gather_rows_f32(uint64_t stream, uint64_t dst, uint64_t src, int32_t src_dtype,
                           uint64_t idx, int64_t n, int64_t cols, int64_t src_rows) {
  MK_THREAD("mk_gather_rows_f32");
  F32_ARG("mk_gather_rows_f32", n > 0 && cols > 0 && src_rows > 0 && dst && src && idx &&
                                    (src_dtype == MK_DTYPE_F32 || src_dtype == MK_DTYPE_BF16));
  cudaStream_t s = mk::as_stream(stream);
  if (src_dtype == MK_DTYPE_F32)
    (void)(mk::launch(gather_rows<float>, dim3(grid_n(n * cols)), dim3(kT), 0, s, mk::dev<float>(dst), mk::dev<float>(src),
                                                       mk::dev<int32_t>(idx), n, cols, src_rows));
  else
    (void)(mk::launch(gather_rows<bf16>, dim3(grid_n(n * cols)), dim3(kT), 0, s, mk::dev<float>(dst), mk::dev<bf16>(src),
                                                      mk::dev<int32_t>(idx), n, cols, src_rows));
  MK_LAUNCHED("gather_rows");
  return MK_OK;
}

int32_t mk_gather_rows_feed_f32(uint64_t stream, uint64_t dst, uint64_t src, int32_t src_dtype, uint64_t idx,
                                uint64_t picks, int64_t pick_stride, int64_t pick_rows, int64_t n, int64_t cols,
                                int64_t src_rows) {
  MK_THREAD("mk_gather_rows_feed_f32");
  F32_ARG("mk_gather_rows_feed_f32", n > 0 && cols > 0 && src_rows > 0 && dst && src && idx && picks &&
                                         pick_stride > 0 && pick_rows > 0 &&
                                         (src_dtype == MK_DTYPE_F32 || src_dtype == MK_DTYPE_BF16));
  cudaStream_t s = mk::as_stream(stream);
  const FeedIds f{mk::dev<int32_t>(idx), mk::dev<int32_t>(picks), pick_stride, pick_rows, n};
  if (src_dtype == MK_DTYPE_F32)
    (void)(mk::launch(gather_rows_feed<float>, dim3(grid_n(n * cols)), dim3(kT), 0, s, mk::dev<float>(dst),
                      mk::dev<float>(src), f, cols, src_rows));
  else
    (void)(mk::launch(gather_rows_feed<bf16>, dim3(grid_n(n * cols)), dim3(kT), 0, s, mk::dev<float>(dst),
                      mk::dev<bf16>(src), f, cols, src_rows));
  MK_LAUNCHED("gather_rows_feed");
  return MK_OK;
}

int32_t mk_scatter_add_rows_f32(uint64_t stream, uint64_t out, uint64_t src, uint64_t idx,
                                uint64_t w, int64_t n, int64_t cols) {
  MK_THREAD("mk_scatter_add_rows_f32");
  F32_ARG("mk_scatter_add_rows_f32", n > 0 && cols > 0 && out && src && idx && w);
  (void)(mk::launch(scatter_add_rows, dim3(grid_n(n * cols)), dim3(kT), 0, mk::as_stream(stream),
      mk::dev<float>(out), mk::dev<float>(src), mk::dev<int32_t>(idx), mk::dev<float>(w), n, cols));
  MK_LAUNCHED("scatter_add_rows");
  return MK_OK;
}

int32_t mk_gated_add_f32(uint64_t stream, uint64_t out, uint64_t x, uint64_t gate, int64_t rows,
                         int64_t cols) {
  MK_THREAD("mk_gated_add_f32");
  F32_ARG("mk_gated_add_f32", rows > 0 && cols > 0 && out && x);
  (void)(mk::launch(gated_add, dim3(grid_n(rows * cols)), dim3(kT), 0, mk::as_stream(stream),
      mk::dev<float>(out), mk::dev<float>(x), gate ? mk::dev<float>(gate) : nullptr, rows, cols));
  MK_LAUNCHED("gated_add");
  return MK_OK;
}

int32_t mk_kv_write_f32(uint64_t stream, uint64_t pool_k, uint64_t pool_v, uint64_t k, uint64_t v,
                        uint64_t slots, int64_t n, int64_t kw, int64_t vw) {
  MK_THREAD("mk_kv_write_f32");
  F32_ARG("mk_kv_write_f32", n > 0 && kw > 0 && vw > 0 && pool_k && pool_v && k && v && slots);
  (void)(mk::launch(kv_write, dim3(grid_n(n * (kw + vw))), dim3(kT), 0, mk::as_stream(stream),
      mk::dev<float>(pool_k), mk::dev<float>(pool_v), mk::dev<float>(k), mk::dev<float>(v),
      mk::dev<int32_t>(slots), n, kw, vw));
  MK_LAUNCHED("kv_write");
  return MK_OK;
}

int32_t mk_attention_f32(uint64_t stream, uint64_t out, uint64_t q, uint64_t pool_k,
                         uint64_t pool_v, uint64_t rows, uint64_t pos, uint64_t table,
                         uint64_t blocks, int64_t n, int32_t heads, int32_t kv_heads,
                         int32_t head_dim, int32_t v_head_dim, int32_t block_size,
                         uint32_t scale_bits, int32_t window, uint64_t sinks) {
  const char* fn = "mk_attention_f32";
  MK_THREAD(fn);
  F32_ARG(fn, n > 0 && n <= INT32_MAX && heads > 0 && kv_heads > 0 && heads % kv_heads == 0 &&
                  head_dim > 0 && v_head_dim > 0 && block_size > 0 && window >= 0 && heads <= 65535);
  F32_ARG(fn, out && q && pool_k && pool_v && rows && pos && table && blocks);
  const size_t smem = sizeof(float) * ((size_t)head_dim + v_head_dim + kAT);
  F32_ARG(fn, smem <= 48 * 1024);
  dim3 grid((unsigned)n, (unsigned)heads);
  attention_f32<<<grid, kAT, smem, mk::as_stream(stream)>>>(
      mk::dev<float>(out), mk::dev<float>(q), mk::dev<float>(pool_k), mk::dev<float>(pool_v),
      mk::dev<int32_t>(rows), mk::dev<int32_t>(pos), mk::dev<int32_t>(table),
      mk::dev<int32_t>(blocks), heads, kv_heads, head_dim, v_head_dim, block_size,
      mk::float_from_bits(scale_bits), window, sinks ? mk::dev<float>(sinks) : nullptr);
  MK_LAUNCHED("attention_f32");
  return MK_OK;
}

}  // extern "C"
