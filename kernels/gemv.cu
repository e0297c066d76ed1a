// gemv.cu — skinny GEMMs for decode-sized batches: C [M, N] f32 = A [M, K]
// · B [N, K]ᵀ (+ bias [N]) with B bf16 and M ≤ 8 rows of A, in bf16
// (mk_gemv_bf16, the fast profile's dense projections) or float32
// (mk_moe_router_f32, the MoE router, which may also write A rounded to
// bf16 for the experts).
//
// At M ≤ 8 a projection is a stream of B's bytes: cuBLASLt's kernels for
// these shapes took 6.3 µs for a 2 MB k projection and 8 + 2.6 µs (split-K
// and its reduction) for the 16.7 MB o projection of Qwen3-30B-A3B at one
// token (ncu, H200), where the bytes take 0.5 and 4 µs. Here one warp owns
// one row of B (one output column): each lane loads 16-byte pieces of the
// row (not cached in L1), eight at a time and the next eight while it
// multiplies, so a warp has up to 8 KB in flight; A's rows are staged in
// shared memory once per CTA of 8 warps (a first version read them through
// L1 from every warp: at M = 8 the re-reads took 30 µs for a 16 MB weight).
// The M sums are reduced across the warp at the end. Products and sums are
// float32.
//
// One launch may serve up to kMaxSegs projections of the same A (q, k and v
// of a decode step: mk_gemv_bf16_multi), each its own B, C, bias and N; the
// CTAs are numbered through the segments in order. Weights are constants, so
// a CTA issues its first batch of B loads before griddepcontrol.wait: under
// programmatic dependent launch the weight stream starts while the kernel
// before (which writes A) still runs.
#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "common.cuh"
#include "wgmma.cuh"

namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 8;                // rows of B per CTA
constexpr int kCH = 8;                   // 16-byte pieces of B per lane per batch
constexpr int kMaxM = 8;
constexpr int kMaxSegs = 3;
constexpr size_t kStageBytes = 64 << 10;  // A staged in shared memory, per chunk of columns

__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  f[0] = __uint_as_float(u.x << 16);
  f[1] = __uint_as_float(u.x & 0xffff0000u);
  f[2] = __uint_as_float(u.y << 16);
  f[3] = __uint_as_float(u.y & 0xffff0000u);
  f[4] = __uint_as_float(u.z << 16);
  f[5] = __uint_as_float(u.z & 0xffff0000u);
  f[6] = __uint_as_float(u.w << 16);
  f[7] = __uint_as_float(u.w & 0xffff0000u);
}

// load_batch fills w with one batch of a lane's pieces of a row of B: pieces
// base + lane + 32·j (j < kCH) of rc, zero at or past P or when !on.
__device__ __forceinline__ void load_batch(uint4 (&w)[kCH], const uint4* rc, int base, int P, bool on, int lane) {
#pragma unroll
  for (int j = 0; j < kCH; j++) {
    const int p = base + lane + 32 * j;
    w[j] = on && p < P ? mk::ld_stream(rc + p) : make_uint4(0, 0, 0, 0);
  }
}

// a8 is A's 8 values at column 8p of a staged row (shared memory).
__device__ __forceinline__ void a8(const bf16* row, int p, float (&f)[8]) {
  unpack8(reinterpret_cast<const uint4*>(row)[p], f);
}
__device__ __forceinline__ void a8(const float* row, int p, float (&f)[8]) {
  const float4 x = reinterpret_cast<const float4*>(row)[2 * p];
  const float4 y = reinterpret_cast<const float4*>(row)[2 * p + 1];
  f[0] = x.x, f[1] = x.y, f[2] = x.z, f[3] = x.w, f[4] = y.x, f[5] = y.y, f[6] = y.z, f[7] = y.w;
}

// fma8 adds the 8 weights in u (bf16) times A's 8 values at column 8p of
// each of the M rows staged at As (a row every ld elements) to acc, in
// column order.
template <typename TA, int MT>
__device__ __forceinline__ void fma8(float (&acc)[MT], const uint4& u, const TA* As, int64_t ld, int p, int M) {
  float wf[8];
  unpack8(u, wf);
#pragma unroll
  for (int m = 0; m < MT; m++) {
    if (m < M) {
      float af[8];
      a8(As + (int64_t)m * ld, p, af);
#pragma unroll
      for (int i = 0; i < 8; i++) acc[m] = fmaf(af[i], wf[i], acc[m]);
    }
  }
}

// round_a writes float A [M, K] rounded to bf16 into ab (when ab is set),
// each 8 values by one thread of the grid; bf16 A: nothing to do.
template <typename TA>
__device__ __forceinline__ void round_a(const TA* A, bf16* ab, int M, int K) {
  if constexpr (sizeof(TA) == 4) {
    if (ab != nullptr) {
      const int64_t pieces = (int64_t)M * (K / 8);
      for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < pieces;
           q += (int64_t)gridDim.x * blockDim.x) {
        const float4 x = __ldg(reinterpret_cast<const float4*>(A + q * 8));
        const float4 y = __ldg(reinterpret_cast<const float4*>(A + q * 8) + 1);
        __nv_bfloat162 h[4] = {__floats2bfloat162_rn(x.x, x.y), __floats2bfloat162_rn(x.z, x.w),
                               __floats2bfloat162_rn(y.x, y.y), __floats2bfloat162_rn(y.z, y.w)};
        reinterpret_cast<uint4*>(ab)[q] = *reinterpret_cast<uint4*>(h);
      }
    }
  }
}

// One projection of a launch: C [M, N] (+ bias [N]) from B [N, K]; its CTAs
// are [first, first + ceil(N / kWarps)).
struct GemvSeg {
  float* C;
  const bf16* B;
  const float* bias;
  int N, first;
};
struct GemvSegs {
  GemvSeg s[kMaxSegs];
  int n;
};

// The CTA's warps each own one row of B (one output column). Per chunk of
// KC columns: the warps issue their first 8 pieces of B, the CTA stages A's
// M × KC block in shared memory, then each lane multiplies its pieces
// against the M staged rows while the next 8 pieces load.
template <typename TA, int MT, bool DB>
__global__ void __launch_bounds__(kWarps * 32, DB ? 1 : 4)
    gemv_kernel(const GemvSegs segs, const TA* A, bf16* ab, int M, int K, int KC) {
  extern __shared__ __align__(16) unsigned char gsm[];
  TA* As = reinterpret_cast<TA*>(gsm);  // [M][KC]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int vec = 16 / sizeof(TA);  // A's elements per 16 bytes
  GemvSeg sg = segs.s[0];  // this CTA's projection (no dynamic index into the parameters)
#pragma unroll
  for (int i = 1; i < kMaxSegs; i++)
    if (i < segs.n && (int)blockIdx.x >= segs.s[i].first) sg = segs.s[i];
  const int N = sg.N;
  const int n = ((int)blockIdx.x - sg.first) * kWarps + warp;
  const bool active = n < N;  // every thread stages A and meets the barriers
  const uint4* row = reinterpret_cast<const uint4*>(sg.B + (int64_t)(active ? n : 0) * K);
  uint4 w[kCH], nx[DB ? kCH : 1];
  // The first chunk's first pieces of B: weights, read before the wait.
  load_batch(w, row, 0, min(KC, K) / 8, active, lane);
  mk::pdl_begin();
  round_a(A, ab, M, K);
  float acc[MT];
#pragma unroll
  for (int m = 0; m < MT; m++) acc[m] = 0.0f;
  for (int c0 = 0; c0 < K; c0 += KC) {
    const int kc = min(KC, K - c0), P = kc / 8;
    const uint4* rc = row + c0 / 8;
    if (c0 > 0) load_batch(w, rc, 0, P, active, lane);
    __syncthreads();  // the previous chunk's readers are done with As
    const int rowv = kc / vec;
    for (int q = threadIdx.x; q < M * rowv; q += blockDim.x) {
      const int m = q / rowv, c = q - m * rowv;
      reinterpret_cast<uint4*>(As + (int64_t)m * KC)[c] =
          __ldg(reinterpret_cast<const uint4*>(A + (int64_t)m * K + c0) + c);
    }
    __syncthreads();
    if (active) {
      for (int base = 0; base < P; base += 32 * kCH) {
        if constexpr (DB) load_batch(nx, rc, base + 32 * kCH, P, true, lane);  // the next batch in flight meanwhile
#pragma unroll
        for (int j = 0; j < kCH; j++) {
          const int p = base + lane + 32 * j;
          if (p < P) fma8(acc, w[j], As, KC, p, M);
        }
        if constexpr (DB) {
#pragma unroll
          for (int j = 0; j < kCH; j++) w[j] = nx[j];
        } else if (base + 32 * kCH < P) {  // (never for one batch per chunk)
          load_batch(w, rc, base + 32 * kCH, P, true, lane);
        }
      }
    }
  }
  if (!active) return;
  const float b = sg.bias != nullptr ? sg.bias[n] : 0.0f;
#pragma unroll
  for (int m = 0; m < MT; m++) {
    if (m < M) {
      float v = acc[m];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) sg.C[(int64_t)m * N + n] = v + b;
    }
  }
}

// ---- the weight-resident variant (at M ≤ res_rows() where it fits; MK_GEMV_SMEM=0 turns it off) ----
//
// The kernel above keeps one batch of 4 KB a warp in flight: 32 warps an SM
// hold ~17 MB on 132 SMs, less than Qwen3's q/k/v (21 MB, 640 CTAs for 528
// slots: 1.2 waves of loads). Here one CTA an SM owns R consecutive rows
// of B (the segments' rows numbered through in order) and, before the
// programmatic-launch wait, warp 0 issues a bulk copy (cp.async.bulk, TMA's
// 1-D form) of each of them into shared memory, each completing on its own
// mbarrier: the whole projection is in flight at once, from while the
// kernel before (which writes A) still runs. After the wait A is staged,
// and warp w multiplies rows w, w+8, … from shared memory as each lands.
// M ≤ mk::res_rows() (4; MK_GEMV_SMEM_ROWS 1–4); taken where the rows
// and A fit (smem_rows, MK_GEMV_SMEM_MAX).
constexpr int kResWarps = 8;

// res_bytes is gemv_res_kernel's dynamic shared memory: R rows' barriers,
// the R rows of K bf16, then M rows of A of elem bytes.
constexpr int64_t res_bytes(int64_t R, int64_t M, int64_t K, int64_t elem) {
  return mkwg::mbar_bytes(R) + R * K * 2 + M * K * elem;
}

template <typename TA, int MT>
__global__ void __launch_bounds__(kResWarps * 32, 1)
    gemv_res_kernel(const GemvSegs segs, const TA* A, bf16* ab, int M, int K, int R, int Ntot, bool split, int cb) {
  extern __shared__ __align__(128) unsigned char rsm[];
  uint64_t* bar = reinterpret_cast<uint64_t*>(rsm);                   // [R]: one a group of cb rows
  bf16* W = reinterpret_cast<bf16*>(rsm + mkwg::mbar_bytes(R));       // [R][K]
  TA* As = reinterpret_cast<TA*>(W + (int64_t)R * K);                 // [M][K]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r0 = blockIdx.x * R, rn = max(0, min(R, Ntot - r0));
  // seg_of: segment and row within it (n) of global row r.
  auto seg_of = [&](int r, int& n) -> GemvSeg {
    GemvSeg sg = segs.s[0];
    int first = 0;
#pragma unroll
    for (int i = 0; i < kMaxSegs; i++) {
      if (i < segs.n && r >= first) {
        sg = segs.s[i];
        n = r - first;
      }
      if (i < segs.n) first += segs.s[i].N;
    }
    return sg;
  };
  // Warp 0's lanes each own groups lane, lane+32, … of cb consecutive rows
  // (one bulk copy a group, two where a segment ends inside it): init their
  // barriers, then (weights are constants) issue their copies before the
  // wait. A barrier a group lets a warp start on its row when that group
  // has landed, not when the whole projection has (one barrier for all:
  // Qwen3's q/k/v 8.2 → 9.5 µs). Groups, not rows: the H200's bulk copies
  // of 4 KB stream at 2.6 TB/s, of 8–16 KB at 4.4 (scripts/bulk_probe.cu).
  const int ng = (rn + cb - 1) / cb;
  if (warp == 0) {
    for (int q = lane; q < ng; q += 32) mkwg::mbar_init(bar + q, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncwarp();
    for (int q = lane; q < ng; q += 32) {
      const int i0 = q * cb, i1 = min(rn, i0 + cb);
      mkwg::mbar_expect_tx(bar + q, (uint32_t)(i1 - i0) * (uint32_t)K * 2u);
      for (int i = i0; i < i1;) {
        int n = 0;
        const GemvSeg sg = seg_of(r0 + i, n);
        const int run = min(i1 - i, sg.N - n);
        mkwg::bulk_g2s(W + (int64_t)i * K, sg.B + (int64_t)n * K, (uint32_t)run * (uint32_t)K * 2u, bar + q);
        i += run;
      }
    }
  }
  mk::pdl_begin();
  round_a(A, ab, M, K);
  constexpr int vec = 16 / sizeof(TA);
  const int rowv = K / vec;
  for (int q = threadIdx.x; q < M * rowv; q += blockDim.x)
    reinterpret_cast<uint4*>(As)[q] = __ldg(reinterpret_cast<const uint4*>(A) + q);
  __syncthreads();  // A staged; the barriers' inits are visible to every warp
  const int P = K / 8;
  // G warps a row when the CTA has fewer rows than warps (a router's 1–2
  // rows: one warp alone walked a 7168-column row while seven idled), each
  // over its own part of the columns, the parts summed in warp order.
  // (split: MK_GEMV_RES_SPLIT=0 turns it off, a kernel argument.)
  const int G = !split || rn >= kResWarps ? 1 : rn >= 4 ? 2 : rn >= 2 ? 4 : 8;
  const int groups = kResWarps / G, grp = warp / G, part = warp % G;
  const int p0 = (int)((int64_t)part * P / G), p1 = (int)((int64_t)(part + 1) * P / G);
  __shared__ float red[kResWarps][MT];
  for (int i0 = 0; i0 < rn; i0 += groups) {  // the same trips in every warp (barriers below when G > 1)
    const int i = i0 + grp;
    float acc[MT];
#pragma unroll
    for (int m = 0; m < MT; m++) acc[m] = 0.0f;
    if (i < rn) {
      mkwg::mbar_wait(bar + i / cb, 0);
      const uint4* wr = reinterpret_cast<const uint4*>(W + (int64_t)i * K);
      for (int p = p0 + lane; p < p1; p += 32) fma8(acc, wr[p], As, K, p, M);
#pragma unroll
      for (int m = 0; m < MT; m++) acc[m] = mk::warp_sum(acc[m]);
    }
    if (G > 1) {
      if (lane == 0) {
#pragma unroll
        for (int m = 0; m < MT; m++) red[warp][m] = acc[m];
      }
      __syncthreads();
      if (part == 0) {
#pragma unroll
        for (int m = 0; m < MT; m++) {
          acc[m] = red[warp][m];
          for (int q = 1; q < G; q++) acc[m] += red[warp + q][m];
        }
      }
      __syncthreads();  // red is free for the next trip
    }
    if (i < rn && part == 0 && lane == 0) {
      int n = 0;
      const GemvSeg sg = seg_of(r0 + i, n);
      const float b = sg.bias != nullptr ? sg.bias[n] : 0.0f;
#pragma unroll
      for (int m = 0; m < MT; m++)
        if (m < M) sg.C[(int64_t)m * sg.N + n] = acc[m] + b;
    }
  }
}

// res_max_bytes: MK_GEMV_SMEM_MAX (read once; comparisons) caps a CTA's
// rows of B in shared memory, in bytes; default no cap.
int64_t res_max_bytes() {
  static const int64_t v = [] {
    const char* e = getenv("MK_GEMV_SMEM_MAX");
    return e ? atoll(e) : INT64_MAX;
  }();
  return v;
}

// smem_rows is the rows a CTA of gemv_res_kernel owns for Ntot rows of K
// columns and M rows of A of elem bytes on this GPU (one CTA an SM), or 0
// when they do not fit in shared memory (the register-fed kernel then).
int smem_rows(int64_t Ntot, int M, int K, size_t elem) {
  const int64_t optin = (int64_t)mk::smem_optin();
  const int64_t R = (Ntot + mk::sm_count() - 1) / mk::sm_count();
  // (+ 256: the kernel's static shared memory, red, within the same limit)
  return res_bytes(R, M, K, (int64_t)elem) + 256 <= optin && R * K * 2 <= res_max_bytes() ? (int)R : 0;
}

// copy_bytes: the most bytes of one bulk copy of gemv_res_kernel's rows,
// whole rows (at least one): MK_GEMV_COPY_KB (read once; 0 = a row a
// copy, as before the thirty-ninth pass), default 16.
int64_t copy_bytes() {
  static const int64_t v = [] {
    const char* e = getenv("MK_GEMV_COPY_KB");
    return e ? (int64_t)atoi(e) * 1024 : (int64_t)16384;
  }();
  return v;
}

// res_on: the weight-resident kernel is taken where it fits, at M ≤
// mk::res_rows() (4 unless MK_GEMV_SMEM_ROWS says otherwise);
// MK_GEMV_SMEM=0 (read once) turns it off.
bool res_on() {
  static const bool on = !mk::env_is("MK_GEMV_SMEM", '0');
  return on;
}

template <typename TA, int MT>
int launch_res(cudaStream_t s, GemvSegs g, const TA* A, bf16* ab, int M, int K, int R, int Ntot) {
  auto kern = gemv_res_kernel<TA, MT>;
  const size_t sm = (size_t)res_bytes(R, M, K, sizeof(TA));
  static size_t opted = 0;  // per instantiation; the library runs on one thread
  if (sm > opted) {
    MK_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    opted = sm;
  }
  const int grid = (Ntot + R - 1) / R;
  static const bool split = !mk::env_is("MK_GEMV_RES_SPLIT", '0');
  const int cb = std::max(1, (int)(copy_bytes() / ((int64_t)K * 2)));
  (void)(mk::launch(kern, dim3((unsigned)grid), dim3(kResWarps * 32), sm, s, g, A, ab, M, K, R, Ntot, split, cb));
  return MK_OK;
}

template <typename TA, int MT, bool DB>
int launch_mt(cudaStream_t s, GemvSegs g, const TA* A, bf16* ab, int M, int K) {
  auto kern = gemv_kernel<TA, MT, DB>;
  // Columns per chunk: as many as fit kStageBytes for M rows, a multiple of 8.
  const int KC = (int)std::min<int64_t>(K, (int64_t)(kStageBytes / ((size_t)M * sizeof(TA))) / 8 * 8);
  const size_t sm = (size_t)M * KC * sizeof(TA);
  static bool attr = false;  // per instantiation; the library runs on one thread
  if (!attr) {
    MK_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kStageBytes));
    attr = true;
  }
  int grid = 0;
  for (int i = 0; i < g.n; i++) {
    g.s[i].first = grid;
    grid += (g.s[i].N + kWarps - 1) / kWarps;
  }
  (void)(mk::launch(kern, dim3((unsigned)grid), dim3(kWarps * 32), sm, s, g, A, ab, M, K, KC));
  return MK_OK;
}

// single_k is the most columns the single-batch kernels take:
// MK_GEMV_SINGLE_K (0: never; comparisons), default 4096.
int single_k() {
  static const int k = [] {
    const char* v = getenv("MK_GEMV_SINGLE_K");
    return v ? atoi(v) : 4096;
  }();
  return k;
}

template <typename TA>
int launch_gemv(cudaStream_t s, const GemvSegs& g, const TA* A, bf16* ab, int M, int K) {
  if (res_on() && M <= mk::res_rows()) {
    int64_t Ntot = 0;
    for (int i = 0; i < g.n; i++) Ntot += g.s[i].N;
    if (const int R = smem_rows(Ntot, M, K, sizeof(TA)); R > 0 && Ntot <= INT32_MAX) {
      if (M <= 1) return launch_res<TA, 1>(s, g, A, ab, M, K, R, (int)Ntot);
      if (M <= 2) return launch_res<TA, 2>(s, g, A, ab, M, K, R, (int)Ntot);
      return launch_res<TA, 4>(s, g, A, ab, M, K, R, (int)Ntot);
    }
  }
  // At one or two rows the second batch in flight is left out up to
  // single_k() columns: without it the kernel fits 64 registers, 4 CTAs (32
  // warps, each with one batch of up to 4 KB in flight) per SM instead of 2
  // (16 warps, two batches each), so a 4096-row projection runs in one wave.
  if (K <= single_k()) {
    if (M <= 1) return launch_mt<TA, 1, false>(s, g, A, ab, M, K);
    if (M <= 2) return launch_mt<TA, 2, false>(s, g, A, ab, M, K);
  }
  if (M <= 1) return launch_mt<TA, 1, true>(s, g, A, ab, M, K);
  if (M <= 2) return launch_mt<TA, 2, true>(s, g, A, ab, M, K);
  if (M <= 4) return launch_mt<TA, 4, true>(s, g, A, ab, M, K);
  return launch_mt<TA, 8, true>(s, g, A, ab, M, K);
}

GemvSegs one_seg(float* C, const bf16* B, const float* bias, int N) {
  GemvSegs g = {};
  g.s[0] = GemvSeg{C, B, bias, N, 0};
  g.n = 1;
  return g;
}

bool aligned16(uint64_t p) { return (p & 15) == 0; }

}  // namespace

extern "C" {

int32_t mk_gemv_bf16(uint64_t stream, uint64_t c, uint64_t a, uint64_t b, int64_t m, int64_t n, int64_t k) {
  const char* fn = "mk_gemv_bf16";
  MK_THREAD(fn);
  MK_ARG(m >= 1 && m <= kMaxM && n >= 1 && n <= INT32_MAX / 2 && k >= 8 && k % 8 == 0 && k <= INT32_MAX / 2,
         "%s: M=%lld N=%lld K=%lld (want 1 <= M <= %d, K a multiple of 8)", fn, (long long)m, (long long)n,
         (long long)k, kMaxM);
  MK_ARG(c && a && b, "%s: null operand", fn);
  MK_ARG(aligned16(a) && aligned16(b), "%s: A and B must be 16-byte aligned", fn);
  const int rc = launch_gemv<bf16>(mk::as_stream(stream), one_seg(mk::dev<float>(c), mk::dev<const bf16>(b), nullptr, (int)n),
                                  mk::dev<const bf16>(a), nullptr, (int)m, (int)k);
  if (rc != MK_OK) return rc;
  MK_LAUNCHED("gemv_bf16");
  return MK_OK;
}

int32_t mk_gemv_bf16_multi(uint64_t stream, uint64_t a, int64_t m, int64_t k, uint64_t c0, uint64_t b0,
                           uint64_t bias0, int64_t n0, uint64_t c1, uint64_t b1, uint64_t bias1, int64_t n1,
                           uint64_t c2, uint64_t b2, uint64_t bias2, int64_t n2) {
  const char* fn = "mk_gemv_bf16_multi";
  MK_THREAD(fn);
  MK_ARG(m >= 1 && m <= kMaxM && k >= 8 && k % 8 == 0 && k <= INT32_MAX / 2,
         "%s: M=%lld K=%lld (want 1 <= M <= %d, K a multiple of 8)", fn, (long long)m, (long long)k, kMaxM);
  MK_ARG(a && aligned16(a), "%s: A null or not 16-byte aligned", fn);
  const uint64_t cs[kMaxSegs] = {c0, c1, c2}, bs[kMaxSegs] = {b0, b1, b2}, biases[kMaxSegs] = {bias0, bias1, bias2};
  const int64_t ns[kMaxSegs] = {n0, n1, n2};
  GemvSegs g = {};
  int64_t blocks = 0;
  for (int i = 0; i < kMaxSegs; i++) {
    if (ns[i] == 0) continue;
    MK_ARG(ns[i] > 0 && ns[i] <= INT32_MAX / 2 && cs[i] && bs[i] && aligned16(bs[i]),
           "%s: projection %d: N=%lld, C %p, B %p (want N >= 0, B 16-byte aligned)", fn, i, (long long)ns[i],
           (void*)cs[i], (void*)bs[i]);
    g.s[g.n++] = GemvSeg{mk::dev<float>(cs[i]), mk::dev<const bf16>(bs[i]),
                         biases[i] ? mk::dev<const float>(biases[i]) : nullptr, (int)ns[i], 0};
    blocks += (ns[i] + kWarps - 1) / kWarps;
  }
  MK_ARG(g.n > 0 && blocks < INT32_MAX, "%s: no projection (every N is 0) or too many rows", fn);
  const int rc = launch_gemv<bf16>(mk::as_stream(stream), g, mk::dev<const bf16>(a), nullptr, (int)m, (int)k);
  if (rc != MK_OK) return rc;
  MK_LAUNCHED("gemv_bf16_multi");
  return MK_OK;
}

int32_t mk_moe_router_f32(uint64_t stream, uint64_t logits, uint64_t x, uint64_t w, uint64_t bias, uint64_t xb,
                          int64_t t, int32_t e, int64_t h) {
  const char* fn = "mk_moe_router_f32";
  MK_THREAD(fn);
  MK_ARG(t >= 1 && t <= kMaxM && e >= 1 && h >= 8 && h % 8 == 0 && h <= INT32_MAX / 2,
         "%s: T=%lld E=%d H=%lld (want 1 <= T <= %d, E >= 1, H a multiple of 8)", fn, (long long)t, e,
         (long long)h, kMaxM);
  MK_ARG(logits && x && w, "%s: null logits, x or W", fn);
  MK_ARG(aligned16(x) && aligned16(w) && (xb == 0 || aligned16(xb)), "%s: x, W and xb must be 16-byte aligned", fn);
  const int rc = launch_gemv<float>(mk::as_stream(stream),
                                   one_seg(mk::dev<float>(logits), mk::dev<const bf16>(w),
                                           bias ? mk::dev<const float>(bias) : nullptr, e),
                                   mk::dev<const float>(x), xb ? mk::dev<bf16>(xb) : nullptr, (int)t, (int)h);
  if (rc != MK_OK) return rc;
  MK_LAUNCHED("moe_router");
  return MK_OK;
}

}  // extern "C"
