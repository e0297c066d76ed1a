// ops.cu — element-wise and row-wise ops on bf16 storage with float32 math:
// RMSNorm (plain and fused with the residual add), embedding lookup, SwiGLU
// (plain and the clamped gpt-oss form), RoPE and f32⇄bf16 conversion.
//
// These are first, plain versions: correct on any shape, scalar loads, one
// pass to reduce and one to write. Tuning (16-byte loads, fusion into the
// persistent kernels) comes later, measured against the copy ceiling.
#include <cmath>

#include "common.cuh"

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// block_sum returns the sum of v over the block to every thread; blockDim.x
// must be a multiple of 32. Call it once per kernel (it reuses its buffer).
__device__ float block_sum(float v) {
  __shared__ float part[32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  v = warp_sum(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
  if (warp == 0) v = warp_sum(v);
  if (threadIdx.x == 0) part[0] = v;
  __syncthreads();
  return part[0];
}

// grid_for gives a grid for n independent items handled grid-stride.
unsigned grid_for(int64_t n, int per_block) {
  int64_t b = (n + per_block - 1) / per_block;
  if (b < 1) b = 1;
  if (b > (1 << 20)) b = 1 << 20;
  return (unsigned)b;
}

// ---- RMSNorm ----

// rmsnorm_warp: one warp per segment of `group` columns (small groups, e.g. q/k norms).
__global__ void rmsnorm_warp(bf16* out, const bf16* x, const bf16* w, int64_t segs, int group,
                             float eps) {
  const int64_t seg = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (seg >= segs) return;  // uniform across the warp
  const bf16* xs = x + seg * group;
  bf16* os = out + seg * group;
  float ss = 0.0f;
  for (int j = lane; j < group; j += 32) {
    float v = __bfloat162float(xs[j]);
    ss += v * v;
  }
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / (float)group + eps);
  for (int j = lane; j < group; j += 32)
    os[j] = __float2bfloat16_rn(__bfloat162float(xs[j]) * r * __bfloat162float(w[j]));
}

// rmsnorm_block: one block per segment (wide groups, e.g. the hidden size).
__global__ void rmsnorm_block(bf16* out, const bf16* x, const bf16* w, int group, float eps) {
  const int64_t seg = blockIdx.x;
  const bf16* xs = x + seg * group;
  bf16* os = out + seg * group;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < group; j += blockDim.x) {
    float v = __bfloat162float(xs[j]);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float r = rsqrtf(ss / (float)group + eps);
  for (int j = threadIdx.x; j < group; j += blockDim.x)
    os[j] = __float2bfloat16_rn(__bfloat162float(xs[j]) * r * __bfloat162float(w[j]));
}

// add_rmsnorm: resid = bf16(resid + x); out = rmsnorm(resid) * w. One block per row;
// each thread re-reads only the elements it wrote itself.
__global__ void add_rmsnorm(bf16* resid, const bf16* x, const bf16* w, bf16* out, int cols,
                            float eps) {
  const int64_t row = blockIdx.x;
  bf16* rs = resid + row * cols;
  const bf16* xs = x + row * cols;
  bf16* os = out + row * cols;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    bf16 h = __float2bfloat16_rn(__bfloat162float(rs[j]) + __bfloat162float(xs[j]));
    rs[j] = h;
    float v = __bfloat162float(h);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float r = rsqrtf(ss / (float)cols + eps);
  for (int j = threadIdx.x; j < cols; j += blockDim.x)
    os[j] = __float2bfloat16_rn(__bfloat162float(rs[j]) * r * __bfloat162float(w[j]));
}

// ---- embedding ----

template <bool kVec>
__global__ void embedding(bf16* out, const bf16* table, const int32_t* ids, int64_t hidden,
                          int64_t vocab) {
  const int64_t i = blockIdx.x;
  const int32_t id = ids[i];
  bf16* o = out + i * hidden;
  if (id < 0 || (int64_t)id >= vocab) {
    const bf16 nan = __float2bfloat16_rn(nanf(""));
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) o[j] = nan;
    return;
  }
  const bf16* src = table + (int64_t)id * hidden;
  if (kVec) {  // hidden % 8 == 0 and both rows 16-byte aligned
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* o4 = reinterpret_cast<uint4*>(o);
    for (int64_t j = threadIdx.x; j < hidden / 8; j += blockDim.x) o4[j] = s4[j];
  } else {
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) o[j] = src[j];
  }
}

// ---- SwiGLU ----

__device__ __forceinline__ float sigmoidf(float z) { return 1.0f / (1.0f + expf(-z)); }

__global__ void swiglu(bf16* out, const bf16* in, int64_t t, int64_t inter) {
  const int64_t n = t * inter;
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = idx / inter, i = idx - r * inter;
    const bf16* row = in + r * 2 * inter;
    const float g = __bfloat162float(row[i]), u = __bfloat162float(row[inter + i]);
    out[idx] = __float2bfloat16_rn(g * sigmoidf(g) * u);
  }
}

__global__ void swiglu_oss(bf16* out, const bf16* in, int64_t t, int64_t inter, float alpha,
                           float limit, int interleaved) {
  const int64_t n = t * inter;
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = idx / inter, i = idx - r * inter;
    const bf16* row = in + r * 2 * inter;
    float g, u;
    if (interleaved) {
      g = __bfloat162float(row[2 * i]);
      u = __bfloat162float(row[2 * i + 1]);
    } else {
      g = __bfloat162float(row[i]);
      u = __bfloat162float(row[inter + i]);
    }
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    out[idx] = __float2bfloat16_rn((u + 1.0f) * (g * sigmoidf(g * alpha)));
  }
}

// ---- RoPE ----

// rope: one thread per (row, head, pair). The products are rounded separately
// (no fused multiply-add), as transformers' q*cos + rotate_half(q)*sin.
__global__ void rope(bf16* x, const int32_t* pos, int64_t t, int64_t heads, int64_t head_dim,
                     int64_t half, int style, const float* inv_freq, float attn) {
  const int64_t n = t * heads * half;
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = idx % half;
    const int64_t rh = idx / half;  // row * heads + head
    const int64_t r = rh / heads;
    bf16* v = x + rh * head_dim;
    const float angle = __fmul_rn((float)pos[r], inv_freq[j]);
    float s, c;
    sincosf(angle, &s, &c);
    c = __fmul_rn(c, attn);
    s = __fmul_rn(s, attn);
    const int64_t i1 = style == MK_ROPE_NEOX ? j : 2 * j;
    const int64_t i2 = style == MK_ROPE_NEOX ? j + half : 2 * j + 1;
    const float x1 = __bfloat162float(v[i1]), x2 = __bfloat162float(v[i2]);
    v[i1] = __float2bfloat16_rn(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
    v[i2] = __float2bfloat16_rn(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
  }
}

// ---- conversions ----

// f32_to_bf16: dst = bf16(src), RN. With 16-byte aligned pointers (vec),
// 8 values a step: two float4 loads and one 16-byte store (the scalar
// version, 4-byte loads and 2-byte stores, moved 1.3 TB/s at 8192 × 4096:
// twenty-sixth pass, ncu); the scalar loop takes the tail and unaligned
// calls.
__global__ void f32_to_bf16(bf16* dst, const float* src, int64_t n, int vec) {
  mk::pdl_begin();
  const int64_t stride = (int64_t)gridDim.x * blockDim.x, tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vec) {
    const int64_t n8 = n / 8;
    const float4* s4 = reinterpret_cast<const float4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    for (int64_t i = tid; i < n8; i += stride) {
      const float4 a = __ldcs(s4 + 2 * i), b = __ldcs(s4 + 2 * i + 1);
      uint4 o;
      o.x = mk::pack_bf16x2(a.x, a.y);
      o.y = mk::pack_bf16x2(a.z, a.w);
      o.z = mk::pack_bf16x2(b.x, b.y);
      o.w = mk::pack_bf16x2(b.z, b.w);
      d4[i] = o;
    }
    done = n8 * 8;
  }
  for (int64_t i = done + tid; i < n; i += stride) dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void bf16_to_f32(float* dst, const bf16* src, int64_t n) {
  mk::pdl_begin();
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = __bfloat162float(src[i]);
}

}  // namespace

extern "C" {

int32_t mk_rmsnorm_bf16(uint64_t stream, uint64_t out, uint64_t x, uint64_t w, int64_t rows,
                        int64_t cols, int64_t group, uint32_t eps_bits) {
  MK_THREAD("mk_rmsnorm_bf16");
  MK_ARG(rows > 0 && cols > 0 && group > 0 && cols % group == 0 && group <= INT32_MAX,
         "mk_rmsnorm_bf16: bad shape rows=%lld cols=%lld group=%lld (cols must be a multiple of group)",
         (long long)rows, (long long)cols, (long long)group);
  MK_ARG(out != 0 && x != 0 && w != 0, "mk_rmsnorm_bf16: NULL pointer");
  const float eps = mk::float_from_bits(eps_bits);
  MK_ARG(eps >= 0.0f, "mk_rmsnorm_bf16: eps %g is negative or NaN", (double)eps);
  const int64_t segs = rows * (cols / group);
  cudaStream_t s = mk::as_stream(stream);
  if (group <= 1024) {
    const int per_block = kThreads / 32;
    const int64_t blocks = (segs + per_block - 1) / per_block;
    MK_ARG(blocks <= INT32_MAX, "mk_rmsnorm_bf16: %lld segments is too many", (long long)segs);
    rmsnorm_warp<<<(unsigned)blocks, kThreads, 0, s>>>(mk::dev<bf16>(out), mk::dev<bf16>(x),
                                                       mk::dev<bf16>(w), segs, (int)group, eps);
    MK_LAUNCHED("rmsnorm_warp");
  } else {
    MK_ARG(segs <= INT32_MAX, "mk_rmsnorm_bf16: %lld segments is too many", (long long)segs);
    rmsnorm_block<<<(unsigned)segs, 512, 0, s>>>(mk::dev<bf16>(out), mk::dev<bf16>(x),
                                                 mk::dev<bf16>(w), (int)group, eps);
    MK_LAUNCHED("rmsnorm_block");
  }
  return MK_OK;
}

int32_t mk_add_rmsnorm_bf16(uint64_t stream, uint64_t resid, uint64_t x, uint64_t w,
                            uint64_t out, int64_t rows, int64_t cols, uint32_t eps_bits) {
  MK_THREAD("mk_add_rmsnorm_bf16");
  MK_ARG(rows > 0 && cols > 0 && rows <= INT32_MAX && cols <= INT32_MAX,
         "mk_add_rmsnorm_bf16: bad shape rows=%lld cols=%lld", (long long)rows, (long long)cols);
  MK_ARG(resid != 0 && x != 0 && w != 0 && out != 0, "mk_add_rmsnorm_bf16: NULL pointer");
  const float eps = mk::float_from_bits(eps_bits);
  MK_ARG(eps >= 0.0f, "mk_add_rmsnorm_bf16: eps %g is negative or NaN", (double)eps);
  add_rmsnorm<<<(unsigned)rows, 512, 0, mk::as_stream(stream)>>>(
      mk::dev<bf16>(resid), mk::dev<bf16>(x), mk::dev<bf16>(w), mk::dev<bf16>(out), (int)cols,
      eps);
  MK_LAUNCHED("add_rmsnorm");
  return MK_OK;
}

int32_t mk_embedding_bf16(uint64_t stream, uint64_t out, uint64_t table, uint64_t ids,
                          int64_t n, int64_t hidden, int64_t vocab) {
  MK_THREAD("mk_embedding_bf16");
  MK_ARG(n > 0 && hidden > 0 && vocab > 0 && n <= INT32_MAX,
         "mk_embedding_bf16: bad shape n=%lld hidden=%lld vocab=%lld", (long long)n,
         (long long)hidden, (long long)vocab);
  MK_ARG(out != 0 && table != 0 && ids != 0, "mk_embedding_bf16: NULL pointer");
  cudaStream_t s = mk::as_stream(stream);
  const bool vec = hidden % 8 == 0 && out % 16 == 0 && table % 16 == 0;
  if (vec) {
    embedding<true><<<(unsigned)n, kThreads, 0, s>>>(mk::dev<bf16>(out), mk::dev<bf16>(table),
                                                     mk::dev<int32_t>(ids), hidden, vocab);
  } else {
    embedding<false><<<(unsigned)n, kThreads, 0, s>>>(mk::dev<bf16>(out), mk::dev<bf16>(table),
                                                      mk::dev<int32_t>(ids), hidden, vocab);
  }
  MK_LAUNCHED("embedding");
  return MK_OK;
}

int32_t mk_swiglu_bf16(uint64_t stream, uint64_t out, uint64_t in, int64_t t, int64_t i) {
  MK_THREAD("mk_swiglu_bf16");
  MK_ARG(t > 0 && i > 0, "mk_swiglu_bf16: bad shape T=%lld I=%lld", (long long)t, (long long)i);
  MK_ARG(out != 0 && in != 0, "mk_swiglu_bf16: NULL pointer");
  swiglu<<<grid_for(t * i, kThreads), kThreads, 0, mk::as_stream(stream)>>>(
      mk::dev<bf16>(out), mk::dev<bf16>(in), t, i);
  MK_LAUNCHED("swiglu");
  return MK_OK;
}

int32_t mk_swiglu_oss_bf16(uint64_t stream, uint64_t out, uint64_t in, int64_t t, int64_t i,
                           uint32_t alpha_bits, uint32_t limit_bits, int32_t interleaved) {
  MK_THREAD("mk_swiglu_oss_bf16");
  MK_ARG(t > 0 && i > 0, "mk_swiglu_oss_bf16: bad shape T=%lld I=%lld", (long long)t,
         (long long)i);
  MK_ARG(out != 0 && in != 0, "mk_swiglu_oss_bf16: NULL pointer");
  MK_ARG(interleaved == 0 || interleaved == 1, "mk_swiglu_oss_bf16: interleaved must be 0 or 1");
  const float alpha = mk::float_from_bits(alpha_bits), limit = mk::float_from_bits(limit_bits);
  MK_ARG(std::isfinite(alpha) && limit > 0.0f,
         "mk_swiglu_oss_bf16: alpha %g must be finite and limit %g positive", (double)alpha,
         (double)limit);
  swiglu_oss<<<grid_for(t * i, kThreads), kThreads, 0, mk::as_stream(stream)>>>(
      mk::dev<bf16>(out), mk::dev<bf16>(in), t, i, alpha, limit, interleaved);
  MK_LAUNCHED("swiglu_oss");
  return MK_OK;
}

int32_t mk_rope_bf16(uint64_t stream, uint64_t x, uint64_t pos, int64_t t, int64_t heads,
                     int64_t head_dim, int64_t rot_dim, int32_t style, uint64_t inv_freq,
                     uint32_t attn_factor_bits) {
  MK_THREAD("mk_rope_bf16");
  MK_ARG(t > 0 && heads > 0 && head_dim > 0 && rot_dim > 0 && rot_dim % 2 == 0 &&
             rot_dim <= head_dim,
         "mk_rope_bf16: bad shape T=%lld heads=%lld head_dim=%lld rot_dim=%lld (rot_dim must "
         "be even and at most head_dim)",
         (long long)t, (long long)heads, (long long)head_dim, (long long)rot_dim);
  MK_ARG(style == MK_ROPE_NEOX || style == MK_ROPE_INTERLEAVED, "mk_rope_bf16: bad style %d",
         style);
  MK_ARG(x != 0 && pos != 0 && inv_freq != 0, "mk_rope_bf16: NULL pointer");
  const float attn = mk::float_from_bits(attn_factor_bits);
  MK_ARG(std::isfinite(attn), "mk_rope_bf16: attn_factor is not finite");
  const int64_t half = rot_dim / 2;
  rope<<<grid_for(t * heads * half, kThreads), kThreads, 0, mk::as_stream(stream)>>>(
      mk::dev<bf16>(x), mk::dev<int32_t>(pos), t, heads, head_dim, half, style,
      mk::dev<float>(inv_freq), attn);
  MK_LAUNCHED("rope");
  return MK_OK;
}

int32_t mk_convert_f32_to_bf16(uint64_t stream, uint64_t dst, uint64_t src, int64_t n) {
  MK_THREAD("mk_convert_f32_to_bf16");
  MK_ARG(n > 0 && dst != 0 && src != 0, "mk_convert_f32_to_bf16: bad n=%lld or NULL pointer",
         (long long)n);
  const int vec = (dst % 16 == 0 && src % 16 == 0) ? 1 : 0;
  (void)(mk::launch(f32_to_bf16, dim3(grid_for(vec ? (n + 7) / 8 : n, kThreads)), dim3(kThreads), 0,
      mk::as_stream(stream), mk::dev<bf16>(dst), mk::dev<float>(src), n, vec));
  MK_LAUNCHED("f32_to_bf16");
  return MK_OK;
}

int32_t mk_convert_bf16_to_f32(uint64_t stream, uint64_t dst, uint64_t src, int64_t n) {
  MK_THREAD("mk_convert_bf16_to_f32");
  MK_ARG(n > 0 && dst != 0 && src != 0, "mk_convert_bf16_to_f32: bad n=%lld or NULL pointer",
         (long long)n);
  (void)(mk::launch(bf16_to_f32, dim3(grid_for(n, kThreads)), dim3(kThreads), 0, mk::as_stream(stream),
      mk::dev<float>(dst), mk::dev<bf16>(src), n));
  MK_LAUNCHED("bf16_to_f32");
  return MK_OK;
}

}  // extern "C"
