// moe_fp4.cuh — internal to moe.cu (included inside its anonymous
// namespace): FP4 expert weights, MXFP4's values held at 4.25 bits.
//
// Format (mk_moe.h, kernels.PackFP4): a matrix [N, K], K a multiple of 64,
// is two arrays —
//   codes  [N, K/2] bytes, each row in blocks of 64 values (32 bytes);
//   scales [N, K/32] bytes, E8M0: group g of a row (values 32g … 32g+31)
//          is scaled by 2^(scales[g] − 127), 1 ≤ scales[g] ≤ 240.
// A code is an E2M1 nibble (bit 3 the sign, bits 2…0 the magnitude: 0, ½,
// 1, 1½, 2, 3, 4, 6). Inside a block the codes are ordered for the
// tensor cores' A fragment (mma m16n8k16): thread c (0…3) of a quad reads
// bytes 8c … 8c+7, two little-endian words w = 0, 1; word w holds the
// values 16q + 4c + j of the block for q = 2w, 2w+1 (the block's k16
// chunks) and j = 0…3, at nibbles
//   0: (2w, 0)  1: (2w, 2)  2: (2w+1, 0)  3: (2w+1, 2)
//   4: (2w, 1)  5: (2w, 3)  6: (2w+1, 1)  7: (2w+1, 3)
// so that nibbles p and p + 4 are a pair of neighbouring values, which one
// shift and two masks turn into an f16x2 (fp4_pair). Word w of a block is
// exactly group 2b + w's share of thread c.
//
// The GEMV kernels (a few tokens) run f16 mma.sync on the decoded codes:
// an f16 with the E2M1 bits placed in its exponent's low two bits and its
// mantissa's top bit is the E2M1 value · 2^-14 (0.5 becomes a subnormal,
// which the tensor cores keep), and the rows of x are staged in shared
// memory as f16 scaled by a power of two per row (its largest magnitude
// in [2^14, 2^15)), so no product is rounded: sums of products in fp32,
// each group's sum times 2^(scale − 127 + 14), each row's times its
// power of two. Larger batches dequantize the chosen experts to bf16
// (exact) into the workspace and run the grouped bf16 GEMMs.

#include <cuda_fp16.h>

// Warps of a GEMV CTA (they split the reduction). Four, so that a layer
// of one token's CTAs (gpt-oss-120b: 720 each kernel) are resident at once:
// with eight, the up kernel's 98 registers a thread left two CTAs an SM
// and ran in ~3 waves (call 197).
constexpr int kF4Warps = 4;
constexpr int kF4Tokens = 8;  // the mma's N: tokens (up) or tokens (down) a CTA serves
constexpr int kF4Assign = 32; // assignments T·K the GEMV path serves (warp-wide masks)

// fp4_pair is the f16x2 (values · 2^-14) of nibbles k and k + 4 of w.
__device__ __forceinline__ uint32_t fp4_pair(uint32_t w, int k) {
  const uint32_t t = w >> (4 * k);
  return ((t << 9) & 0x0E000E00u) | ((t << 12) & 0x80008000u);
}

// fp4_factor is the float 2^(s − 127 + 14) of a group's E8M0 scale s (the
// f16 codes' 2^-14 undone).
__device__ __forceinline__ float fp4_factor(uint32_t s) { return __uint_as_float((s + 14u) << 23); }

// fp4_bf16x4 is chunk h's four values (pairs 2h and 2h + 1 of word w) as
// bf16, times f (a group's fp4_factor: exact), packed in order.
__device__ __forceinline__ uint2 fp4_bf16x4(uint32_t w, int h, float f) {
  uint32_t o[2];
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const uint32_t pr = fp4_pair(w, 2 * h + half);
    const float2 fv = __half22float2(*reinterpret_cast<const __half2*>(&pr));
    const __nv_bfloat162 bv = __floats2bfloat162_rn(fv.x * f, fv.y * f);
    o[half] = *reinterpret_cast<const uint32_t*>(&bv);
  }
  return make_uint2(o[0], o[1]);
}

__device__ __forceinline__ uint2 ld_stream8(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// f16_shift is the power of two a row of largest magnitude m is divided by
// on its way into f16: m · 2^-s in [2^14, 2^15) (0 for 0, inf or NaN).
__device__ __forceinline__ int f16_shift(float m) {
  if (!(m > 0.0f) || !isfinite(m)) return 0;
  int ex;
  (void)frexpf(m, &ex);  // m = f · 2^ex, f in [0.5, 1)
  return ex - 1 - 14;
}

// F4Rows is a warp's m16 tile of one FP4 matrix: rows r0 + g and r0 + g + 8
// (g = lane / 4) as thread c = lane % 4 reads them.
struct F4Rows {
  const uint8_t* c0;  // codes of row r0 + g, at this thread's 8 bytes of block 0
  const uint8_t* c8;
  const uint8_t* s0;  // scales of row r0 + g
  const uint8_t* s8;
};

__device__ __forceinline__ F4Rows f4_rows(const uint8_t* codes, const uint8_t* scales, int64_t r0, int64_t K) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int64_t rb = K / 2, rs = K / 32;
  return F4Rows{codes + (r0 + g) * rb + 8 * c, codes + (r0 + g + 8) * rb + 8 * c, scales + (r0 + g) * rs,
                scales + (r0 + g + 8) * rs};
}

// F4Block is one block of an F4Rows tile in registers.
struct F4Block {
  uint2 w0, w8;       // the thread's code words of rows g and g + 8
  uint32_t s0, s8;    // the block's two group scales of each row (byte 0: group 2b, byte 1: 2b + 1)
};

__device__ __forceinline__ F4Block f4_load(const F4Rows& r, int64_t b) {
  F4Block k;
  k.w0 = ld_stream8(r.c0 + b * 32);
  k.w8 = ld_stream8(r.c8 + b * 32);
  k.s0 = *reinterpret_cast<const uint16_t*>(r.s0 + 2 * b);
  k.s8 = *reinterpret_cast<const uint16_t*>(r.s8 + 2 * b);
  return k;
}

// f4_mma_block adds one block of the tile times the f16 columns xv (the
// B fragments of the block's four k16 chunks: x[n][16q + 4c … + 3], n =
// lane / 4) to acc, group by group with each group's factor.
__device__ __forceinline__ void f4_mma_block(float (&acc)[4], const F4Block& k, const uint2 (&xv)[4]) {
#pragma unroll
  for (int wd = 0; wd < 2; wd++) {
    const uint32_t a0w = wd ? k.w0.y : k.w0.x, a8w = wd ? k.w8.y : k.w8.x;
    float t[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const uint32_t a[4] = {fp4_pair(a0w, 2 * h), fp4_pair(a8w, 2 * h), fp4_pair(a0w, 2 * h + 1),
                             fp4_pair(a8w, 2 * h + 1)};
      mk::mma16816<true>(t, a, xv[2 * wd + h].x, xv[2 * wd + h].y);
    }
    const float f0 = fp4_factor((k.s0 >> (8 * wd)) & 0xFFu), f8 = fp4_factor((k.s8 >> (8 * wd)) & 0xFFu);
    acc[0] = fmaf(t[0], f0, acc[0]);
    acc[1] = fmaf(t[1], f0, acc[1]);
    acc[2] = fmaf(t[2], f8, acc[2]);
    acc[3] = fmaf(t[3], f8, acc[3]);
  }
}

// f4_x loads the B fragments of block b from the staged f16 row xrow (or
// zeros when the thread's column is absent).
__device__ __forceinline__ void f4_x(uint2 (&xv)[4], const __half* xrow, bool present, int64_t b) {
  const int c = threadIdx.x & 3;
#pragma unroll
  for (int q = 0; q < 4; q++)
    xv[q] = present ? *reinterpret_cast<const uint2*>(xrow + b * 64 + 16 * q + 4 * c) : make_uint2(0u, 0u);
}

// f4_reduce sums the warps' fragments acc (nacc of them) in warp order
// into warp 0's, through red [kF4Warps][nacc][32][4] floats. Ends with the
// block synchronised; only warp 0's acc holds the sums.
template <int NACC>
__device__ __forceinline__ void f4_reduce(float (&acc)[NACC][4], float* red) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int a = 0; a < NACC; a++)
#pragma unroll
    for (int i = 0; i < 4; i++) red[((warp * NACC + a) * 32 + lane) * 4 + i] = acc[a][i];
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int a = 0; a < NACC; a++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        float s = red[(a * 32 + lane) * 4 + i];
        for (int v = 1; v < kF4Warps; v++) s += red[((v * NACC + a) * 32 + lane) * 4 + i];
        acc[a][i] = s;
      }
  }
}

// stage_rows writes n ≤ kF4Tokens bf16 rows of len values (rows[i] the
// source row of staged row i, or null: left unwritten) into dst [n][len]
// as f16, each times 2^-s_i (s_i = f16_shift of its largest magnitude),
// with every thread of the block, and leaves 2^s_i in mul[i]. smax:
// kF4Tokens words of shared memory. Ends with the block synchronised.
__device__ __forceinline__ void stage_rows(__half* dst, const bf16* const* rows, int n, int64_t len, float* mul,
                                           unsigned* smax) {
  if (threadIdx.x < kF4Tokens) smax[threadIdx.x] = 0u;
  __syncthreads();
  const int64_t per = len / 8, total = n * per;
  for (int64_t idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const int i = (int)(idx / per);
    if (rows[i] == nullptr) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(rows[i] + (idx - i * per) * 8);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
    float m = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++)
      m = fmaxf(m, fmaxf(fabsf(__uint_as_float(u[k] << 16)), fabsf(__uint_as_float(u[k] & 0xffff0000u))));
    if (m > 0.0f) ::atomicMax(smax + i, __float_as_uint(m));  // non-negative floats order as their bits
  }
  __syncthreads();
  if (threadIdx.x < n) mul[threadIdx.x] = ldexpf(1.0f, f16_shift(__uint_as_float(smax[threadIdx.x])));
  __syncthreads();
  for (int64_t idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const int i = (int)(idx / per);
    if (rows[i] == nullptr) continue;
    const int64_t c = (idx - i * per) * 8;
    const uint4 v = *reinterpret_cast<const uint4*>(rows[i] + c);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
    const float inv = 1.0f / mul[i];  // a power of two: exact
    uint32_t o[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
      const __half2 h = __floats2half2_rn(__uint_as_float(u[k] << 16) * inv, __uint_as_float(u[k] & 0xffff0000u) * inv);
      o[k] = *reinterpret_cast<const uint32_t*>(&h);
    }
    *reinterpret_cast<uint4*>(dst + (int64_t)i * len + c) = make_uint4(o[0], o[1], o[2], o[3]);
  }
  __syncthreads();
}

// moe_fp4_up_kernel: grid (I / 16, T·K), kF4Warps warps; dynamic shared
// memory nt · H f16 (nt ≤ T the expert's tokens). CTA (x, p) serves the
// expert of assignment p if p is its first assignment: gate rows 16x … and
// the same up rows, against the rows of x of the expert's tokens (at most
// kF4Tokens: a token's experts differ), the activation into act[q, j] in
// bf16 as the bf16 GEMV kernels write it. The CTAs of row 0 first zero the
// down kernel's ncnt column-tile counters.
__global__ void __launch_bounds__(kF4Warps * 32, 6)
    moe_fp4_up_kernel(bf16* act, int* cnt, int ncnt, const bf16* x, const int32_t* ids, const uint8_t* codes,
                      const uint8_t* scales, const float* gub, int64_t H, int64_t I, int T, int K, int act_kind,
                      float alpha, float limit, unsigned long long* counts) {
  mk::pdl_begin();
  if (blockIdx.y == 0)
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < ncnt; i += gridDim.x * blockDim.x) cnt[i] = 0;
  extern __shared__ __align__(16) unsigned char f4sm[];
  __shared__ int first[kF4Assign], sq[kF4Tokens], snt;
  __shared__ const bf16* srows[kF4Tokens];
  __shared__ float xs_scale[kF4Tokens];
  __shared__ unsigned smax[kF4Tokens];
  __shared__ float red[kF4Warps * 2 * 32 * 4];
  const int p = blockIdx.y, n = T * K;
  const int e = ids[p];
  if (e < 0) return;  // not this rank's expert
  if (threadIdx.x < 32) {
    expert_groups(ids, n, first);
    __syncwarp();
    if (threadIdx.x == 0) {
      int nt = 0;
      for (int q = p; q < n && nt < kF4Tokens; q++)
        if (first[q] == p) {
          sq[nt] = q;
          srows[nt++] = x + (int64_t)(q / K) * H;
        }
      snt = nt;
    }
  }
  __syncthreads();
  if (first[p] != p) return;  // the expert's first assignment does the work
  const int nt = snt;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  if (counts && blockIdx.x == 0 && threadIdx.x == 0) ::atomicAdd(counts + e, (unsigned long long)nt);
  const int64_t j0 = (int64_t)blockIdx.x * 16, nb = H / 64;
  const F4Rows gr = f4_rows(codes, scales, (int64_t)e * 2 * I + j0, H);
  const F4Rows ur = f4_rows(codes, scales, (int64_t)e * 2 * I + I + j0, H);
  // The first two blocks' weights in flight while x is staged.
  int64_t b = warp;
  F4Block g1, u1, g2, u2;
  if (b < nb) g1 = f4_load(gr, b), u1 = f4_load(ur, b);
  if (b + kF4Warps < nb) g2 = f4_load(gr, b + kF4Warps), u2 = f4_load(ur, b + kF4Warps);
  __half* xs = reinterpret_cast<__half*>(f4sm);
  stage_rows(xs, srows, nt, H, xs_scale, smax);
  const bool present = g < nt;
  const __half* xrow = xs + (int64_t)(present ? g : 0) * H;
  float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
  // Two blocks a trip, each buffer refilled right after its use: two
  // loads in flight without moving blocks between registers (2–3 % faster
  // than rotating them at 4–8 tokens, call 201).
  for (; b < nb; b += 2 * kF4Warps) {
    uint2 xv[4];
    f4_x(xv, xrow, present, b);
    f4_mma_block(acc[0], g1, xv);
    f4_mma_block(acc[1], u1, xv);
    if (b + 2 * kF4Warps < nb) g1 = f4_load(gr, b + 2 * kF4Warps), u1 = f4_load(ur, b + 2 * kF4Warps);
    if (b + kF4Warps >= nb) break;
    f4_x(xv, xrow, present, b + kF4Warps);
    f4_mma_block(acc[0], g2, xv);
    f4_mma_block(acc[1], u2, xv);
    if (b + 3 * kF4Warps < nb) g2 = f4_load(gr, b + 3 * kF4Warps), u2 = f4_load(ur, b + 3 * kF4Warps);
  }
  f4_reduce<2>(acc, red);
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int64_t j = j0 + g + (i >= 2 ? 8 : 0);
    const int tok = 2 * c + (i & 1);
    if (tok >= nt || j >= I) continue;
    float a = acc[0][i] * xs_scale[tok], u = acc[1][i] * xs_scale[tok];
    if (gub) {
      a += gub[(int64_t)e * 2 * I + j];
      u += gub[(int64_t)e * 2 * I + I + j];
    }
    act[(int64_t)sq[tok] * I + j] = __float2bfloat16_rn(activation(a, u, act_kind, alpha, limit));
  }
}

// moe_fp4_down_kernel: grid (H / 16, G) with G ≥ the distinct chosen
// experts (T·K capped at E), kF4Warps warps; dynamic shared memory T · I
// f16. CTA (x, g) multiplies the g-th distinct expert's Down rows 16x …
// 16x + 15 by the activations of its tokens (the mma's column n is token
// n) and writes each token's column times its weight (the combine) to
// part [G][T][H]; the last CTA of column tile x to finish (cnt[x], zeroed
// by the up kernel) sums the experts' parts in expert order with the
// weighted biases into out[t, c] for every token t.
__global__ void __launch_bounds__(kF4Warps * 32, 8)
    moe_fp4_down_kernel(float* out, float* part, int* cnt, const bf16* act, const int32_t* ids, const float* w,
                        const uint8_t* codes, const uint8_t* scales, const float* db, int64_t H, int64_t I, int T,
                        int K) {
  extern __shared__ __align__(16) unsigned char f4sm[];
  __shared__ int first[kF4Assign], ue[kF4Assign];
  __shared__ unsigned um[kF4Assign];
  __shared__ int un, last;
  __shared__ const bf16* srows[kF4Tokens];
  __shared__ float mul[kF4Tokens];
  __shared__ unsigned smax[kF4Tokens];
  __shared__ float red[kF4Warps * 32 * 4];
  const int n = T * K;
  // ids and w are the routing's, complete before the up kernel passed its
  // wait (which launched this kernel): read before this kernel's own wait,
  // with the first weights, so that they stream under the up kernel.
  if (threadIdx.x < 32) distinct_experts(ids, n, first, ue, um, &un);
  __syncthreads();
  const int gi = blockIdx.y;
  if (gi >= un) {
    mk::pdl_wait();
    return;
  }
  const int e = ue[gi];
  const unsigned m = um[gi];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int64_t r0 = (int64_t)blockIdx.x * 16, nb = I / 64;
  const F4Rows dr = f4_rows(codes, scales, (int64_t)e * H + r0, I);
  int64_t b = warp;
  F4Block k1, k2;
  if (b < nb) k1 = f4_load(dr, b);
  if (b + kF4Warps < nb) k2 = f4_load(dr, b + kF4Warps);
  if (threadIdx.x < kF4Tokens) {
    const int t = threadIdx.x;
    int q = -1;
    for (unsigned mm = m; mm; mm &= mm - 1) {
      const int qq = __ffs(mm) - 1;
      if (qq / K == t) q = qq;
    }
    srows[t] = t < T && q >= 0 ? act + (int64_t)q * I : nullptr;
  }
  mk::pdl_wait();  // act is the up kernel's
  __syncthreads();
  __half* xs = reinterpret_cast<__half*>(f4sm);
  stage_rows(xs, srows, T, I, mul, smax);
  const bool present = g < T && srows[g] != nullptr;
  const __half* xrow = xs + (int64_t)(g < T ? g : 0) * I;
  float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  for (; b < nb; b += kF4Warps) {
    const F4Block k = k1;
    k1 = k2;
    if (b + 2 * kF4Warps < nb) k2 = f4_load(dr, b + 2 * kF4Warps);
    uint2 xv[4];
    f4_x(xv, xrow, present, b);
    f4_mma_block(acc[0], k, xv);
  }
  f4_reduce<1>(acc, red);
  if (warp == 0) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int64_t col = r0 + g + (i >= 2 ? 8 : 0);
      const int tok = 2 * c + (i & 1);
      if (tok >= T || col >= H || srows[tok] == nullptr) continue;
      int q = 0;
      for (unsigned mm = m; mm; mm &= mm - 1)
        if ((__ffs(mm) - 1) / K == tok) q = __ffs(mm) - 1;
      part[((int64_t)gi * T + tok) * H + col] = acc[0][i] * mul[tok] * w[q];
    }
    __threadfence();
  }
  __syncthreads();
  if (threadIdx.x == 0) last = ::atomicAdd(cnt + blockIdx.x, 1) == un - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int idx = threadIdx.x; idx < T * 16; idx += blockDim.x) {
    const int t = idx / 16;
    const int64_t col = r0 + idx % 16;
    if (col >= H) continue;
    float v = 0.0f;
    const unsigned long long tm = ((1ull << K) - 1ull) << (t * K);  // token t's assignments
    for (int g2 = 0; g2 < un; g2++)
      if ((unsigned long long)um[g2] & tm) v += ::__ldcg(part + ((int64_t)g2 * T + t) * H + col);
    if (db)
      for (int k = 0; k < K; k++) {
        const int ek = ids[t * K + k];
        if (ek >= 0) v = fmaf(w[t * K + k], db[(int64_t)ek * H + col], v);
      }
    out[(int64_t)t * H + col] = v;
  }
}

// fp4_dequant_kernel writes bf16 rows from FP4 rows over a grid-stride
// loop, a quad of threads a block of 64 values: thread c reads its 8 code
// bytes (a warp 256 contiguous bytes) and writes its four runs of 4
// values (a quad one 32-byte sector a run). The matrix is E experts of rpe
// rows; with off (the align's [E + 1] row offsets) only the experts with
// rows are written. Dynamic shared memory: E ints (the experts with rows,
// in expert order in every CTA). Exact: every FP4 value is a bf16.
__global__ void __launch_bounds__(256)
    fp4_dequant_kernel(bf16* dst, const uint8_t* codes, const uint8_t* scales, int64_t rpe, int64_t K,
                       const int32_t* off, int E) {
  mk::pdl_wait();
  extern __shared__ int elist[];
  __shared__ int ne;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int base = 0;
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int e = e0 + lane;
      const bool has = e < E && (off == nullptr || off[e + 1] != off[e]);
      const unsigned bal = __ballot_sync(0xffffffffu, has);
      if (has) elist[base + __popc(bal & ((1u << lane) - 1u))] = e;
      base += __popc(bal);
    }
    if (lane == 0) ne = base;
  }
  __syncthreads();
  const int64_t nb = K / 64, units = rpe * nb * 4, total = (int64_t)ne * units;
  for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; it < total; it += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = it / units, u = (it - j * units) >> 2;
    const int c = (int)(it & 3);
    const int64_t r = (int64_t)elist[j] * rpe + u / nb, b = u % nb;
    const uint2 wv = __ldg(reinterpret_cast<const uint2*>(codes + r * (K / 2) + b * 32 + 8 * c));
    const uint32_t sc = *reinterpret_cast<const uint16_t*>(scales + r * (K / 32) + 2 * b);
    bf16* d = dst + r * K + b * 64 + 4 * c;
#pragma unroll
    for (int wd = 0; wd < 2; wd++) {
      const uint32_t w = wd ? wv.y : wv.x;
      const float f = fp4_factor((sc >> (8 * wd)) & 0xFFu);
#pragma unroll
      for (int h = 0; h < 2; h++)  // chunk q = 2wd + h: values 16q + 4c + (0 … 3)
        *reinterpret_cast<uint2*>(d + 16 * (2 * wd + h)) = fp4_bf16x4(w, h, f);
    }
  }
}

// moe_gemm_fp4_kernel is moe_gemm_kernel's grouped GEMM (no split, no
// dense mode) with FP4 weights, the decoding done in shared memory: each
// k tile of 64 columns is one FP4 block of each weight row, so the cp.async
// ring stages the rows' 32 code bytes (a quarter of bf16's) beside A's
// rows, and once a stage lands the CTA decodes it (exactly: E2M1 ·
// 2^(scale − 127) is a bf16) into a bf16 tile in moe_gemm_kernel's
// swizzled layout, which mma_stage reads as it reads
// bf16 weights. The rows' scales ([BN][Kd/32] bytes) are loaded once,
// before the ring. The path for experts of up to 16 rows on average
// (fp4_path): it decodes each weight tile once a row tile, where the
// dequantized path writes and reads every chosen expert in bf16. Dynamic
// shared memory: fp4_gemm_smem.
template <int BM, int BN>
constexpr size_t fp4_gemm_smem(int stages, int64_t Kd) {
  return (size_t)stages * BM * BK * 2 + (size_t)BN * BK * 2 + (size_t)stages * BN * 32 + (size_t)BN * (Kd / 32);
}
template <int BM, int BN, int WM, int WN, int STAGES, bool GATEUP>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32)
    moe_gemm_fp4_kernel(const GemmArgs p, const uint8_t* Wc, const uint8_t* Ws) {
  mk::pdl_begin();
  constexpr int WARPS_N = BN / WN, THREADS = (BM / WM) * WARPS_N * 32;
  constexpr int MF = WM / 16, NF = WN / 8;
  constexpr int A_CH = BM * 8, A_PER = (A_CH + THREADS - 1) / THREADS;
  constexpr int C_CH = BN * 2, C_PER = (C_CH + THREADS - 1) / THREADS;  // 16-byte chunks of codes a stage
  constexpr int U = BN * 4, U_PER = (U + THREADS - 1) / THREADS;        // decoding units: (row, quad thread)
  int tile, ntile;
  mkmoe::group_tile((int)blockIdx.x, p.group_m, p.mt, p.nt, tile, ntile);
  if (tile >= ::__ldcg(p.num_tiles)) return;
  extern __shared__ __align__(128) unsigned char gemm_sm[];
  bf16* sA = reinterpret_cast<bf16*>(gemm_sm);  // [STAGES][BM·BK]
  bf16* sB = sA + STAGES * BM * BK;              // [BN·BK]: the decoded k tile
  uint8_t* sC = reinterpret_cast<uint8_t*>(sB + BN * BK);  // [STAGES][BN·32]: codes
  uint8_t* sS = sC + STAGES * BN * 32;                     // [BN][Kd/32]: scales
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int e = ::__ldcg(p.tile_expert + tile);
  const int64_t m0 = (int64_t)tile * BM, Kd = p.Kd, N = p.N, rb = Kd / 2, rs = Kd / 32;
  const bf16* a_src[A_PER];
  int a_dst[A_PER], a_ch[A_PER];
#pragma unroll
  for (int i = 0; i < A_PER; i++) {
    const int c = tid + i * THREADS, r = c / 8;
    a_ch[i] = c % 8;
    a_dst[i] = c < A_CH ? swz(r, a_ch[i]) : -1;
    a_src[i] = nullptr;
    if (c < A_CH) {
      const int32_t asg = ::__ldcg(p.sorted + m0 + r);
      if (asg >= 0) a_src[i] = GATEUP ? p.A + (int64_t)(asg / p.topk) * Kd : p.A + (m0 + r) * Kd;
    }
  }
  // The weight row of tile row r (tile_b_row's), or -1 past N.
  auto wrow = [&](int r) -> int64_t {
    const int64_t row0 = (int64_t)e * (GATEUP ? 2 * N : N);
    if (GATEUP) {
      const int64_t j = (int64_t)ntile * (BN / 2) + (r % (BN / 2));
      return j < N ? row0 + (r < BN / 2 ? 0 : N) + j : -1;
    }
    const int64_t n = (int64_t)ntile * BN + r;
    return n < N ? row0 + n : -1;
  };
  const uint8_t* c_src[C_PER];
#pragma unroll
  for (int i = 0; i < C_PER; i++) {
    const int c = tid + i * THREADS;
    const int64_t w = c < C_CH ? wrow(c / 2) : -1;
    c_src[i] = w >= 0 ? Wc + w * rb + (c % 2) * 16 : nullptr;
  }
  for (int i = tid; i < BN * rs; i += THREADS) {
    const int64_t w = wrow(i / (int)rs);
    sS[i] = w >= 0 ? Ws[w * rs + i % rs] : (uint8_t)127;
  }
  const int KT = (int)(Kd / BK);
  auto load = [&](int stage, int kt) {
    const int64_t k0 = (int64_t)kt * BK;
    bf16* a = sA + stage * BM * BK;
#pragma unroll
    for (int i = 0; i < A_PER; i++) {
      if (a_dst[i] < 0) continue;
      const bool v = a_src[i] != nullptr;
      cp_async16(a + a_dst[i], v ? a_src[i] + k0 + a_ch[i] * 8 : p.A, v);
    }
    uint8_t* cs = sC + stage * BN * 32;
#pragma unroll
    for (int i = 0; i < C_PER; i++) {
      const int c = tid + i * THREADS;
      if (c >= C_CH) continue;
      const bool v = c_src[i] != nullptr;
      cp_async16(cs + c * 16, v ? c_src[i] + (int64_t)kt * 32 : Wc, v);
    }
  };
  // decode writes stage's codes (k tile kt) as bf16 into sB: unit (r, c)
  // is quad thread c's 8 bytes of row r, the values 16q + 4c + j.
  auto decode = [&](int stage, int kt) {
    const uint8_t* cs = sC + stage * BN * 32;
#pragma unroll
    for (int i = 0; i < U_PER; i++) {
      const int u = tid + i * THREADS;
      if (u >= U) continue;
      const int r = u / 4, c = u % 4;
      const uint2 wv = *reinterpret_cast<const uint2*>(cs + r * 32 + 8 * c);
#pragma unroll
      for (int wd = 0; wd < 2; wd++) {
        const uint32_t w = wd ? wv.y : wv.x;
        const float f = fp4_factor(sS[r * rs + 2 * kt + wd]);
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int q = 2 * wd + h;  // values 16q + 4c … 16q + 4c + 3: chunk 2q + c/2, from element 4·(c%2)
          *reinterpret_cast<uint2*>(sB + swz(r, 2 * q + c / 2) + 4 * (c % 2)) = fp4_bf16x4(w, h, f);
        }
      }
    }
  };
  float acc[MF][NF][4];
  mkmoe::zero_acc(acc);
  auto brow = [&](int nf) -> int { return mkmoe::tile_brow<GATEUP, NF, WN, BN>(nf, wn); };
  // One decoded tile, two barriers a k tile. Decoding tile k + 1 into a
  // second tile while tile k is multiplied, one barrier a k tile, ran 15–20
  // % slower (call 203): the codes then ran two k tiles ahead of the
  // decoding instead of three, and the second tile cost occupancy.
  mkmoe::ring_prologue<STAGES>(KT, load);
  for (int kt = 0; kt < KT; kt++) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed; every warp is done with sB and the stage load() refills
    const int nk = kt + STAGES - 1;
    if (nk < KT) load(nk % STAGES, nk);
    cp_async_commit();
    decode(kt % STAGES, kt);
    __syncthreads();
    mkmoe::mma_stage<MF, NF, WM>(acc, sA + (kt % STAGES) * BM * BK, sB, wm, lane, brow);
  }
  cp_async_wait<0>();
#pragma unroll
  for (int mf = 0; mf < MF; mf++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int64_t slot = m0 + wm * WM + mf * 16 + lane / 4 + 8 * h;
      if (p.sorted[slot] < 0) continue;
      if (GATEUP) {
        mkmoe::store_act_frags<NF, WN, BN>(reinterpret_cast<bf16*>(p.out) + slot * N, acc[mf], h, ntile, wn, lane, N,
                                           p.bias ? p.bias + (int64_t)e * 2 * N : nullptr, p.act, p.alpha, p.limit);
        continue;
      }
      void* out = p.ybf ? static_cast<void*>(reinterpret_cast<bf16*>(p.out) + slot * N)
                        : static_cast<void*>(reinterpret_cast<float*>(p.out) + slot * N);
      mkmoe::store_y_frags<NF, WN, BN>(out, acc[mf], h, ntile, wn, lane, N, p.bias ? p.bias + (int64_t)e * N : nullptr,
                                       p.ybf);
    }
  }
}

// launch_gemm_fp4 runs moe_gemm_fp4_kernel over a's tiles.
template <int BM, int BN, int WM, int WN, bool GU>
int launch_gemm_fp4(const GemmArgs& a, const uint8_t* Wc, const uint8_t* Ws, int64_t tiles, cudaStream_t s) {
  constexpr int ST = 4;
  auto kern = moe_gemm_fp4_kernel<BM, BN, WM, WN, ST, GU>;
  const size_t sm = fp4_gemm_smem<BM, BN>(ST, a.Kd);
  static size_t attr = 48 << 10;  // per instantiation; the library runs on one thread
  if (sm > attr) {
    MK_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attr = sm;
  }
  const int64_t cols = GU ? BN / 2 : BN, nt = (a.N + cols - 1) / cols;
  MK_ARG(tiles * nt < (1ll << 31), "mk_moe_experts_fp4: %lld × %lld tiles", (long long)tiles, (long long)nt);
  GemmArgs g = a;
  g.mt = (int)tiles;
  g.nt = (int)nt;
  g.group_m = mkmoe::group_m();
  (void)(mk::launch(kern, dim3((unsigned)(tiles * nt)), dim3((BM / WM) * (BN / WN) * 32), sm, s, g, Wc, Ws));
  MK_LAUNCHED(GU ? "moe_gemm_fp4 (gate/up)" : "moe_gemm_fp4 (down)");
  return MK_OK;
}

// run_gemm_fp4 picks moe_gemm_fp4_kernel's tile for the align's row tile bm
// (the same row tiles as the bf16 configurations).
template <bool GU>
int run_gemm_fp4(int bm, const GemmArgs& a, const uint8_t* Wc, const uint8_t* Ws, int64_t tiles, cudaStream_t s) {
  switch (bm) {
    case 16: return launch_gemm_fp4<16, 64, 16, 16, GU>(a, Wc, Ws, tiles, s);
    case 32: return launch_gemm_fp4<32, 64, 32, 16, GU>(a, Wc, Ws, tiles, s);
    case 64: return launch_gemm_fp4<64, 128, 32, 64, GU>(a, Wc, Ws, tiles, s);
    default: return launch_gemm_fp4<128, 128, 64, 32, GU>(a, Wc, Ws, tiles, s);
  }
}

// fp4_chunk is the most tokens the GEMV kernels serve: kF4Tokens, with at
// most kF4Assign assignments. (Chunks of that for up to 32 tokens ran
// slower than the FP4 grouped GEMM at every size from 9 tokens, call 202:
// docs/PERF.md.)
int64_t fp4_chunk(int32_t k) { return std::min<int64_t>(kF4Tokens, kF4Assign / k); }

// Fp4Path is how mk_moe_experts_fp4 runs a batch (mk_moe.h's MK_FP4_PATH_*).
enum Fp4Path : int32_t { kFp4Gemv = 0, kFp4Gemm = 1, kFp4Dequant = 2 };

// fp4_forced is MK_FP4_PATH (gemv, gemm or dequant: measurements), or -1.
int32_t fp4_forced() {
  static const int32_t v = [] {
    const char* s = std::getenv("MK_FP4_PATH");
    if (s == nullptr) return -1;
    return !std::strcmp(s, "gemv") ? (int32_t)kFp4Gemv
           : !std::strcmp(s, "gemm") ? (int32_t)kFp4Gemm
           : !std::strcmp(s, "dequant") ? (int32_t)kFp4Dequant
                                         : -1;
  }();
  return v;
}

// kF4GemmRows is the most rows an expert (t·k ÷ e on average) the FP4
// grouped GEMM serves: it decodes every weight tile once for each row tile
// of its expert, so past a row tile or two the dequantized path (each
// chosen expert written once in bf16, then the bf16 GEMMs) is faster.
constexpr int64_t kF4GemmRows = 16;

// fp4_path picks the path for t tokens of top-k over e experts: the GEMV
// kernels up to fp4_chunk(k) tokens (at 8 tokens they tie with the GEMM);
// the FP4 grouped GEMM while the experts average at most kF4GemmRows rows;
// the dequantized path beyond. At gpt-oss-120b's and gpt-oss-20b's layers
// (call 202, docs/PERF.md "FP4 experts on the H200") each boundary is
// where the faster path changes. MK_FP4_PATH forces one (gemv only where
// it is allowed).
int32_t fp4_path(int64_t t, int32_t k, int32_t e) {
  const bool gemv_ok = k <= kF4Assign && t <= fp4_chunk(k);
  const int32_t f = fp4_forced();
  if (f == kFp4Gemm || f == kFp4Dequant || (f == kFp4Gemv && gemv_ok)) return f;
  if (gemv_ok) return kFp4Gemv;
  return t * k <= kF4GemmRows * e ? kFp4Gemm : kFp4Dequant;
}
