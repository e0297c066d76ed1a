// layer.cu — the persistent decode layer (mk_layer.h): one pre-norm decoder
// layer of one decode token in one launch of one CTA per SM.
//
// Why: at batch 1 a Qwen3-30B-A3B layer reads 114 MB of weights (27 µs at
// 4.24 TB/s) but took ~67 µs as a chain of ~10 kernels (docs/PERF.md,
// "GPU, thirty-eighth pass"): every kernel ramps its DRAM stream up from
// nothing and drains it at its end, and the phases that read little (the
// attention, the routing) leave HBM idle. Here every CTA streams the
// weights it will need through one ring of shared-memory slots filled by
// bulk copies (cp.async.bulk) from a producer warp, in the order the layer
// uses them: its q/k/v rows, its o rows and its router rows from the start
// (they are constants: the copies start before the previous kernel ends,
// under programmatic dependent launch), then, once the routing is known,
// its gate/up row pairs and its down rows of the chosen experts. The
// attention and routing phases run while the o and router rows land; the
// experts' 75 MB are one stream with no kernel boundary inside.
//
// Phases and their dependencies (counters in `sync`, one a phase, each
// reaching gridDim.x — or the attention units — before the next phase reads what
// every CTA wrote; a CTA's 8 consumer warps take the ring's chunks in
// turn, chunk i by warp i % 8):
//   Q  h = RMSNorm(x) in every CTA; its q/k/v rows → qkv (global)
//   A  attention unit (kv head g, key range part): q/k norms and RoPE of the
//      new token, its key and value stored by part 0, a partial softmax
//      over its keys; once every unit of kv head g is in, each merges a
//      slice of the partials → attn
//   O  its o rows: x1 = x + attn·woᵀ
//   R  h1 = RMSNorm(x1) in every CTA; its router rows → logits
//   T  top-k by ranks in every CTA (the same bits everywhere); CTA 0 counts
//   E1 its (expert, row) pairs of gate and up: act = silu(g)·u
//   E2 its output rows of every chosen expert's down: out = x1 + Σ w·(down·act)
// The last CTA to finish zeroes the counters for the next launch.
//
// Every CTA must be resident at once (they wait for each other): one CTA
// an SM (its shared memory allows no second), gridDim.x = the SM count.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.cuh"
#include "mk_layer.h"
#include "normrope.cuh"
#include "wgmma.cuh"

namespace {

using bf16 = __nv_bfloat16;

// dp is a device address of the ABI as a pointer (host and device code).
template <typename T>
__host__ __device__ __forceinline__ T* dp(uint64_t p) {
  return reinterpret_cast<T*>(p);
}

constexpr int kCW = 8;                     // consumer warps
constexpr int kCT = kCW * 32;              // consumer threads
constexpr int kThreads = kCT + 32;         // + the producer warp
// Bytes of one ring slot: bulk copies of 4 KB stream at most 2.6 TB/s on
// the H200, 8–16 KB ones 4.4 (scripts/bulk_probe.cu; docs/PERF.md, "GPU,
// thirty-ninth pass"), so a slot holds two rows of gate and two of up.
constexpr uint32_t kSlot = 16384;
constexpr int kTK = 64;                    // keys of one attention tile
constexpr int kD = 128;                    // head dim
constexpr int kMaxG = 16;                  // query heads a kv head
constexpr int kMaxK = 16;                  // experts a token
constexpr int kMaxE = 1024;                // experts
constexpr int kMaxSlots = 32;
constexpr int kHR = 2048 / kCT;         // most hidden values a consumer thread holds (hidden <= 2048)
enum : int { kSQ = 0, kSA = 1, kSO = 2, kSR = 3, kSE1 = 4, kSExit = 5, kSGrp = 8, kSyncWords = 256 };

// LayerK is the kernel's parameter: the caller's mk_layer plus what the
// launch derived (ring depth, units a kv head, workspace and shared-memory
// offsets).
struct LayerK {
  mk_layer a;
  int S;   // ring slots
  int N;   // most chunks in flight (issued, not landed)
  int U;   // attention units a kv head
  int RN;  // most output rows a CTA owns (O and E2)
  int vecN;
  float *qkv, *part_o, *part_ml, *attn, *x1, *logits, *act;
  unsigned long long* st;  // [gridDim.x][16] phase stamps (MK_LAYER_STAMPS), or null
  int twice;               // MK_LAYER_TWICE: the merge and the routing run twice (stamps 15, 14 after the first)
  uint32_t o_ring, o_vec, o_qs, o_tmp, o_kv, o_ml, o_yk, o_kvt, o_rt, o_red, o_cst, o_xr;
};

struct RouteSm {
  int ids[kMaxK];
  float w[kMaxK];
  volatile int ready;
};

// Chunk is one bulk copy (or two, E1's gate and up rows) into one slot: n
// rows starting at row r of its phase.
struct Chunk {
  const bf16 *s0, *s1;
  uint32_t b0, b1;
  int r, n, k;
};

__device__ __forceinline__ void cbar() { asm volatile("bar.sync 1, %0;\n" ::"n"(kCT) : "memory"); }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int atom_add_acq_rel(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// cwait: every consumer thread returns once *p >= target (thread 0 polls).
__device__ __forceinline__ void cwait(const int* p, int target) {
  if (threadIdx.x == 0) {
    while (ld_acquire(p) < target) {
    }
  }
  cbar();
}
// csignal: every consumer thread's writes so far, then one count on *p.
__device__ __forceinline__ void csignal(int* p) {
  __threadfence();
  cbar();
  if (threadIdx.x == 0) atom_add_acq_rel(p, 1);
}

// evict_first is an L2 policy for bytes read once (weights, the KV
// cache): without it the layer's 114 MB stream evicts the kernel's own
// code and small shared data from L2 every layer, and the one-shot phases
// (attention, routing) then fetch their instructions from DRAM.
__device__ __forceinline__ uint64_t evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
__device__ __forceinline__ void bulk_g2s_ef(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t pol) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
          mkwg::sm_addr(dst)),
      "l"(src), "r"(bytes), "r"(mkwg::sm_addr(bar)), "l"(pol)
      : "memory");
}
__device__ __forceinline__ void cp16(void* dst, const void* src, uint64_t pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(mkwg::sm_addr(dst)), "l"(src),
               "l"(pol)
               : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// load_tile: this thread's part of keys [jt, jt+nk) of kv head g (all but
// the new one at pos) copied into kt and vt [kTK][D] by cp.async: key
// tid/4, dims 32·(tid%4)…, 64 bytes of each.
__device__ __forceinline__ void load_tile(bf16* kt, bf16* vt, const bf16* pk, const bf16* pv, const int* blocks,
                                          int tab, int bs, int kw, int g, int jt, int nk, int pos, int tid,
                                          uint64_t pol) {
  const int kk = tid / 4, qd = tid % 4, j = jt + kk;
  if (kk < nk && j != pos) {
    const int64_t row = (int64_t)__ldcg(blocks + tab + j / bs) * bs + j % bs;
    const bf16* ks = pk + row * kw + g * kD + qd * 32;
    const bf16* vs = pv + row * kw + g * kD + qd * 32;
#pragma unroll
    for (int q = 0; q < 4; q++) {
      cp16(kt + kk * kD + qd * 32 + 8 * q, ks + 8 * q, pol);
      cp16(vt + kk * kD + qd * 32 + 8 * q, vs + 8 * q, pol);
    }
  }
  cp_commit();
}

__device__ __forceinline__ void fma8(float& acc, const uint4& u, const float* v) {
  const float4 a = *reinterpret_cast<const float4*>(v);
  const float4 b = *reinterpret_cast<const float4*>(v + 4);
  acc = fmaf(__uint_as_float(u.x << 16), a.x, acc);
  acc = fmaf(__uint_as_float(u.x & 0xffff0000u), a.y, acc);
  acc = fmaf(__uint_as_float(u.y << 16), a.z, acc);
  acc = fmaf(__uint_as_float(u.y & 0xffff0000u), a.w, acc);
  acc = fmaf(__uint_as_float(u.z << 16), b.x, acc);
  acc = fmaf(__uint_as_float(u.z & 0xffff0000u), b.y, acc);
  acc = fmaf(__uint_as_float(u.w << 16), b.z, acc);
  acc = fmaf(__uint_as_float(u.w & 0xffff0000u), b.w, acc);
}

// dot_rows4: out[j] = w[j] · v [K] for the n <= 4 rows w[j] (bf16, shared
// memory) by one warp, in every lane: lane l sums the 8-value pieces l,
// l + 64, … and l + 32, l + 96, … of a row in two chains, then the warp
// adds its lanes' sums by shuffles. The rows' chains interleave and v's
// values are read once for all of them: one row after another was one
// long chain of dependent FMAs and shuffles per warp (~1.8 µs for ten
// 768-column rows, estimated), which bounded how fast a CTA freed its
// ring slots.
__device__ __forceinline__ void dot_rows4(const bf16* const (&w)[4], int n, const float* v, int K, int lane,
                                          float (&out)[4]) {
  float a0[4] = {0, 0, 0, 0}, a1[4] = {0, 0, 0, 0};
  const int P = K / 8;
  int p = lane;
  for (; p + 32 < P; p += 64) {
#pragma unroll
    for (int j = 0; j < 4; j++)
      if (j < n) {
        const uint4* wr = reinterpret_cast<const uint4*>(w[j]);
        fma8(a0[j], wr[p], v + 8 * p);
        fma8(a1[j], wr[p + 32], v + 8 * (p + 32));
      }
  }
  if (p < P) {
#pragma unroll
    for (int j = 0; j < 4; j++)
      if (j < n) fma8(a0[j], reinterpret_cast<const uint4*>(w[j])[p], v + 8 * p);
  }
#pragma unroll
  for (int j = 0; j < 4; j++) out[j] = a0[j] + a1[j];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
    for (int j = 0; j < 4; j++) out[j] += __shfl_xor_sync(0xffffffffu, out[j], o);
  }
}

// dot_chunk: a chunk's nrows rows (w [nrows][K], shared memory) against v,
// four at a time (dot_rows4); put(r, y) takes row r's value y, in lane
// r % 4 of the warp.
template <typename F>
__device__ __forceinline__ void dot_chunk(const bf16* w, int nrows, const float* v, int K, int lane, F&& put) {
  for (int r = 0; r < nrows; r += 4) {
    const int n = min(4, nrows - r);
    const bf16* const rows[4] = {w + (size_t)r * K, w + (size_t)(r + 1) * K, w + (size_t)(r + 2) * K,
                                 w + (size_t)(r + 3) * K};
    float y[4];
    dot_rows4(rows, n, v, K, lane, y);
    if (lane < n) put(r + lane, lane == 0 ? y[0] : lane == 1 ? y[1] : lane == 2 ? y[2] : y[3]);
  }
}

// The chunk walks: each calls f(chunk) for this CTA's chunks of a phase in
// order and returns their count; the producer and the consumers walk the
// same sequence. E1 and E2 need the routed ids (rt) for their addresses
// only: their counts do not depend on them.
template <typename F>
__device__ int walk_q(const LayerK& p, int c, int G, F&& f) {
  const mk_layer& a = p.a;
  const int H = a.hidden, Nq = a.heads * kD, Nk = a.kv_heads * kD, N = Nq + 2 * Nk;
  const int rpc = (int)(kSlot / (uint32_t)(H * 2));
  const int r0 = (int)((int64_t)c * N / G), r1 = (int)((int64_t)(c + 1) * N / G);
  int i = 0;
  for (int r = r0; r < r1; i++) {
    const int end = min(r1, r < Nq ? Nq : r < Nq + Nk ? Nq + Nk : N);
    const int n = min(rpc, end - r);
    const bf16* base = r < Nq             ? dp<const bf16>(a.wq) + (int64_t)r * H
                       : r < Nq + Nk      ? dp<const bf16>(a.wk) + (int64_t)(r - Nq) * H
                                          : dp<const bf16>(a.wv) + (int64_t)(r - Nq - Nk) * H;
    f(Chunk{base, nullptr, (uint32_t)(n * H * 2), 0, r, n, 0});
    r += n;
  }
  return i;
}

// rows_of: a CTA's share [r0, r1) of N rows.
__device__ __forceinline__ void rows_of(int N, int c, int G, int& r0, int& r1) {
  r0 = (int)((int64_t)c * N / G);
  r1 = (int)((int64_t)(c + 1) * N / G);
}

// walk_rows: rows [r0, r1) of a weight [*, K] in chunks of whole rows.
template <typename F>
__device__ int walk_rows(const bf16* w, int K, int r0, int r1, int k, F&& f) {
  const int rpc = (int)(kSlot / (uint32_t)(K * 2));
  int i = 0;
  for (int r = r0; r < r1; i++) {
    const int n = min(rpc, r1 - r);
    f(Chunk{w + (int64_t)r * K, nullptr, (uint32_t)(n * K * 2), 0, r, n, k});
    r += n;
  }
  return i;
}

template <typename F>
__device__ int walk_o(const LayerK& p, int c, int G, F&& f) {
  int r0, r1;
  rows_of(p.a.hidden, c, G, r0, r1);
  return walk_rows(dp<const bf16>(p.a.wo), p.a.heads * kD, r0, r1, 0, f);
}

template <typename F>
__device__ int walk_r(const LayerK& p, int c, int G, F&& f) {
  int r0, r1;
  rows_of(p.a.experts, c, G, r0, r1);
  return walk_rows(dp<const bf16>(p.a.gate), p.a.hidden, r0, r1, 0, f);
}

// walk_e1: pairs [p0, p1) of the K·I (chosen expert k, row j) pairs: gate
// rows j.. and up rows j.. of expert ids[k] in one slot.
template <typename F>
__device__ int walk_e1(const LayerK& p, const int* ids, int c, int G, F&& f) {
  const mk_layer& a = p.a;
  const int H = a.hidden, I = a.inter;
  const int rpc = (int)(kSlot / (uint32_t)(4 * H));
  int p0, p1;
  rows_of(a.top_k * I, c, G, p0, p1);
  const bf16* gu = dp<const bf16>(a.gate_up);
  int i = 0;
  for (int q = p0; q < p1; i++) {
    const int k = q / I, j = q % I;
    const int n = min(rpc, min(I - j, p1 - q));
    const bf16* e = gu + (ids ? (int64_t)ids[k] : 0) * 2 * I * H;
    f(Chunk{e + (int64_t)j * H, e + (int64_t)(I + j) * H, (uint32_t)(n * H * 2), (uint32_t)(n * H * 2), q, n, k});
    q += n;
  }
  return i;
}

// walk_e2: this CTA's output rows of every chosen expert's down.
template <typename F>
__device__ int walk_e2(const LayerK& p, const int* ids, int c, int G, F&& f) {
  const mk_layer& a = p.a;
  const int H = a.hidden, I = a.inter;
  int r0, r1;
  rows_of(H, c, G, r0, r1);
  int i = 0;
  for (int k = 0; k < a.top_k; k++) {
    const bf16* e = dp<const bf16>(a.down) + (ids ? (int64_t)ids[k] : 0) * H * I;
    i += walk_rows(e, I, r0, r1, k, f);
  }
  return i;
}

// ConsumerWalk hands chunk i of a phase to warp i % 8 (counting from the
// phase's first chunk index): f(chunk, slot) after the slot has landed,
// then gives the slot back.
struct Ring {
  uint64_t* full;
  uint64_t* empty;
  unsigned char* ring;
  int S;
};

template <typename F>
struct Consume {
  Ring r;
  int base;  // the phase's first chunk index
  int warp, lane;
  F f;
  int i = 0;
  __device__ void operator()(const Chunk& ch) {
    const int idx = base + i++;
    if ((idx % kCW) != warp) return;
    const int s = idx % r.S;
    mkwg::mbar_wait(r.full + s, (unsigned)((idx / r.S) & 1));
    f(ch, reinterpret_cast<const bf16*>(r.ring + (size_t)s * kSlot));
    __syncwarp();
    if (lane == 0) mkwg::mbar_arrive(r.empty + s);
  }
};
template <typename F>
__device__ Consume<F> consume(Ring r, int base, int warp, int lane, F f) {
  return Consume<F>{r, base, warp, lane, f};
}

// block_norm: v[i] = v[i]·rsqrt(mean(v²) + eps)·w[i] over n <= 2048
// values in shared memory, by the consumer threads; thread t holds w[i] for
// i = t + j·kCT in w[j] (loaded before the kernel's wait: a constant).
__device__ void block_norm(float* v, const float (&w)[kHR], int n, float eps, float* red) {
  const int t = threadIdx.x;
  float ss = 0;
#pragma unroll
  for (int j = 0; j < kHR; j++)
    if (t + j * kCT < n) ss = fmaf(v[t + j * kCT], v[t + j * kCT], ss);
  ss = mk::warp_sum(ss);
  if (t % 32 == 0) red[t / 32] = ss;
  cbar();
  float tot = 0;
#pragma unroll
  for (int i = 0; i < kCW; i++) tot += red[i];
  const float rs = rsqrtf(tot / (float)n + eps);
#pragma unroll
  for (int j = 0; j < kHR; j++)
    if (t + j * kCT < n) v[t + j * kCT] = v[t + j * kCT] * rs * w[j];
  cbar();
}

// load_h: v[i] = src[i] for i < n <= 2048 (through L2: other CTAs wrote
// it), every load in flight at once.
__device__ __forceinline__ void load_h(float* v, const float* src, int n) {
  float r[kHR];
#pragma unroll
  for (int j = 0; j < kHR; j++) {
    const int i = threadIdx.x + j * kCT;
    r[j] = i < n ? __ldcg(src + i) : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kHR; j++)
    if (threadIdx.x + j * kCT < n) v[threadIdx.x + j * kCT] = r[j];
}

// load_vec4: v[i] = src[i] for i < n (n a multiple of 4; through L2:
// other CTAs wrote it), 8 float4 loads a thread in flight at a time — one
// L2 round trip for up to 8192 values (a loop of dependent 4-value loads
// cost one round trip each, ~1 µs apiece under the weight stream).
__device__ __forceinline__ void load_vec4(float* v, const float* src, int n) {
  constexpr int kB = 8;
  for (int base = 0; base < n; base += kB * kCT * 4) {
    float4 r[kB];
#pragma unroll
    for (int j = 0; j < kB; j++) {
      const int i = base + (threadIdx.x + j * kCT) * 4;
      r[j] = i < n ? __ldcg(reinterpret_cast<const float4*>(src + i)) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kB; j++) {
      const int i = base + (threadIdx.x + j * kCT) * 4;
      if (i < n) *reinterpret_cast<float4*>(v + i) = r[j];
    }
  }
}

__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
// STAMP records phase point i of this CTA (thread 0) when stamps are on.
#define STAMP(i)                                                                   \
  do {                                                                             \
    if (p.st != nullptr && threadIdx.x == 0) p.st[blockIdx.x * 16 + (i)] = gtime(); \
  } while (0)

__device__ __forceinline__ float bf16r(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

__global__ void __launch_bounds__(kThreads, 1) layer_kernel(const __grid_constant__ LayerK p) {
  extern __shared__ __align__(128) unsigned char sm[];
  const mk_layer& a = p.a;
  const int G = gridDim.x, c = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int H = a.hidden, HQ = a.heads, KV = a.kv_heads, Gq = HQ / KV, E = a.experts, K = a.top_k, I = a.inter;
  const int S = p.S;
  STAMP(13);
  Ring ring{reinterpret_cast<uint64_t*>(sm), reinterpret_cast<uint64_t*>(sm) + S, sm + p.o_ring, S};
  float* vec = reinterpret_cast<float*>(sm + p.o_vec);
  RouteSm* rt = reinterpret_cast<RouteSm*>(sm + p.o_rt);
  int* sync = dp<int>(a.sync);

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; s++) {
      mkwg::mbar_init(ring.full + s, 1);
      mkwg::mbar_init(ring.empty + s, 1);
    }
    rt->ready = 0;
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // ---- the producer: weights into the ring, in the consumers' order ----
  if (warp == kCW) {
    if (lane == 0) {
      int i = 0;
      const uint64_t pol = evict_first();
      auto issue = [&](const Chunk& ch) {
        const int s = i % S, round = i / S;
        if (round > 0) mkwg::mbar_wait(ring.empty + s, (unsigned)((round - 1) & 1));
        if (i >= p.N) {  // chunk i − N has landed: at most N in flight
          const int j = i - p.N;
          mkwg::mbar_wait(ring.full + j % S, (unsigned)((j / S) & 1));
        }
        unsigned char* dst = ring.ring + (size_t)s * kSlot;
        mkwg::mbar_expect_tx(ring.full + s, ch.b0 + ch.b1);
        bulk_g2s_ef(dst, ch.s0, ch.b0, ring.full + s, pol);
        if (ch.b1) bulk_g2s_ef(dst + ch.b0, ch.s1, ch.b1, ring.full + s, pol);
        i++;
      };
      walk_q(p, c, G, issue);
      walk_o(p, c, G, issue);
      walk_r(p, c, G, issue);
      while (rt->ready == 0) {
      }
      __threadfence_block();
      walk_e1(p, rt->ids, c, G, issue);
      walk_e2(p, rt->ids, c, G, issue);
    }
    return;
  }

  // ---- the consumers ----
  const int tid = threadIdx.x;
  const float eps = __uint_as_float(a.eps_bits);
  const uint64_t pol = evict_first();
  // The first key tile of this CTA's attention unit, in flight from now:
  // the cache's older keys and the step's metadata are not written by the
  // kernel before this one (mk_decode.h's rule for the decode kernel).
  bf16* kt = reinterpret_cast<bf16*>(sm + p.o_kvt);  // [kTK][D]
  bf16* vt = kt + kTK * kD;                          // [kTK][D]
  const int pos = __ldcg(dp<const int>(a.pos)), tab = __ldcg(dp<const int>(a.table));
  const int* blocks = dp<const int>(a.blocks);
  const int kw = KV * kD, bs = a.block_size, nkeys = pos + 1, L = (nkeys + p.U - 1) / p.U;
  const bf16* pk = dp<const bf16>(a.pool_k);
  const bf16* pv = dp<const bf16>(a.pool_v);
  const bool unit = c < KV * p.U;  // this CTA runs attention unit c: kv head c / U, part c % U
  if (unit) {
    const int j0 = min(nkeys, (c % p.U) * L), j1 = min(nkeys, j0 + L);
    load_tile(kt, vt, pk, pv, blocks, tab, bs, kw, c / p.U, j0, min(kTK, j1 - j0), pos, tid, pol);
  }
  // The layer's constants, before the wait (every dependent load later on
  // the critical path costs an L2 round trip under a saturated DRAM
  // stream): the norm weights in registers, the q/k norms and the RoPE
  // frequencies in shared memory.
  const int half = a.rot_dim / 2;
  float* cst = reinterpret_cast<float*>(sm + p.o_cst);  // [D] q norm, [D] k norm, [D/2] inv freq
  float inw[kHR], pnw[kHR];
  {
    const float* qn = dp<const float>(a.q_norm);
    const float* kn = dp<const float>(a.k_norm);
    const float* ivf = dp<const float>(a.inv_freq);
    if (tid < kD) {
      cst[tid] = qn ? qn[tid] : 0.0f;
      cst[kD + tid] = kn ? kn[tid] : 0.0f;
      if (tid < half) cst[2 * kD + tid] = ivf[tid];
    }
    const float* iw = dp<const float>(a.in_norm);
    const float* pw = dp<const float>(a.post_norm);
#pragma unroll
    for (int j = 0; j < kHR; j++) {
      const int i = tid + j * kCT;
      inw[j] = i < H ? iw[i] : 0.0f;
      pnw[j] = i < H ? pw[i] : 0.0f;
    }
  }
  int r0, r1;  // this CTA's output rows (O and E2)
  rows_of(H, c, G, r0, r1);
  float* xr = reinterpret_cast<float*>(sm + p.o_xr);  // [RN] x, then x1, of rows r0..r1
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  STAMP(0);
  const float* x = dp<const float>(a.x);
  // Q: h = RMSNorm(x)·in_norm, then this CTA's q/k/v rows.
  load_h(vec, x, H);
  for (int i = tid; i < r1 - r0; i += kCT) xr[i] = __ldcg(x + r0 + i);
  cbar();
  block_norm(vec, inw, H, eps, reinterpret_cast<float*>(sm + p.o_red));
  bool land = !p.twice;  // stamp 14: warp 0's first q/k/v chunk landed (stamps 14 and 15 are the merge's and routing's repeats with MK_LAYER_TWICE)
  const int nq = walk_q(p, c, G, consume(ring, 0, warp, lane, [&](const Chunk& ch, const bf16* w) {
    if (land) STAMP(14);
    land = false;
    dot_chunk(w, ch.n, vec, H, lane, [&](int r, float y) { p.qkv[ch.r + r] = y; });
  }));
  STAMP(1);
  csignal(sync + kSQ);

  // A: attention unit (kv head g, part of its keys), then its slice of
  // kv head g's merge once every unit of g is in.
  if (unit) {
    cwait(sync + kSQ, G);
    STAMP(2);
    const int slot = __ldcg(dp<const int>(a.slot)), rpos = __ldcg(dp<const int>(a.rope_pos));
    const float scale = __uint_as_float(a.scale_bits), attnf = __uint_as_float(a.attn_bits);
    const float* invf = cst + 2 * kD;
    const float* qnw = a.q_norm ? cst : nullptr;
    const float* knw = a.k_norm ? cst + kD : nullptr;
    const bool neox = a.style == MK_ROPE_NEOX;
    float* qs = reinterpret_cast<float*>(sm + p.o_qs);    // [Gq][D]
    float* tmp = reinterpret_cast<float*>(sm + p.o_tmp);  // [kCW][D] warp scratch, then [Gq][kTK] scores
    float* ks = reinterpret_cast<float*>(sm + p.o_kv);    // [D] the new key (bf16 values)
    float* vs = ks + kD;                                  // [D] the new value (bf16 values)
    float* ml = reinterpret_cast<float*>(sm + p.o_ml);    // [Gq][4]: m, l, corr
    auto cs = [&](int i, float* co, float* sn) { mk::rope_cs(i, (float)rpos, invf, attnf, true, co, sn); };
    const int g = c / p.U, part = c % p.U;
    const int j0 = min(nkeys, part * L), j1 = min(nkeys, j0 + L);
    {  // q heads of this kv head, the new key and value: every load in flight at once (L2: other CTAs wrote them)
      constexpr int kQR = kMaxG * kD / kCT;
      float qv[kQR];
#pragma unroll
      for (int j = 0; j < kQR; j++) {
        const int i = tid + j * kCT;
        qv[j] = i < Gq * kD ? __ldcg(p.qkv + (size_t)g * Gq * kD + i) : 0.0f;
      }
      const float kx = tid < kD ? __ldcg(p.qkv + (size_t)HQ * kD + g * kD + tid) : 0.0f;
      const float vx = tid < kD ? __ldcg(p.qkv + (size_t)(HQ + KV) * kD + g * kD + tid) : 0.0f;
#pragma unroll
      for (int j = 0; j < kQR; j++)
        if (tid + j * kCT < Gq * kD) qs[tid + j * kCT] = qv[j];
      if (tid < kD) {
        ks[tid] = kx;
        vs[tid] = bf16r(vx);
      }
    }
    cbar();
    for (int h = warp; h < Gq; h += kCW)
      mk::norm_rope_head(qs + h * kD, qnw, tmp + warp * kD, qs + h * kD, kD, half, neox, eps, true, lane, cs);
    if (warp == kCW - 1) {
      mk::norm_rope_head(ks, knw, tmp + warp * kD, ks, kD, half, neox, eps, true, lane, cs);
      __syncwarp();
      for (int d = lane; d < kD; d += 32) ks[d] = bf16r(ks[d]);
    }
    if (tid < Gq) {
      ml[tid * 4 + 0] = -INFINITY;
      ml[tid * 4 + 1] = 0.0f;
    }
    cbar();
    if (part == 0 && slot >= 0 && tid < kD) {
      bf16* dk = dp<bf16>(a.pool_k) + (int64_t)slot * kw + g * kD;
      bf16* dv = dp<bf16>(a.pool_v) + (int64_t)slot * kw + g * kD;
      dk[tid] = __float2bfloat16_rn(ks[tid]);
      dv[tid] = __float2bfloat16_rn(vs[tid]);
    }
    // Thread t accumulates dims 4·(t%32).. of heads t/32 and t/32 + 8.
    const int hA = tid / 32, hB = hA + 8, d4 = (tid % 32) * 4;
    float accA[4] = {0, 0, 0, 0}, accB[4] = {0, 0, 0, 0};
    float* sc = tmp;  // [Gq][kTK]
    for (int jt = j0; jt < j1; jt += kTK) {
      const int nk = min(kTK, j1 - jt);
      if (jt != j0) load_tile(kt, vt, pk, pv, blocks, tab, bs, kw, g, jt, nk, pos, tid, pol);
      cp_wait_all();
      cbar();
      {  // scores: 4 threads a key, 32 dims each (the new key from ks, its value into vt)
        const int kk = tid / 4, qd = tid % 4;
        float kv[32];
        if (kk < nk && jt + kk == pos) {
#pragma unroll
          for (int d = 0; d < 32; d++) kv[d] = ks[qd * 32 + d];
#pragma unroll
          for (int d = 0; d < 32; d++) vt[kk * kD + qd * 32 + d] = __float2bfloat16_rn(vs[qd * 32 + d]);
        } else if (kk < nk) {
          const uint4* kr = reinterpret_cast<const uint4*>(kt + kk * kD + qd * 32);
#pragma unroll
          for (int q = 0; q < 4; q++) {
            const uint4 k4 = kr[q];
            kv[8 * q + 0] = __uint_as_float(k4.x << 16);
            kv[8 * q + 1] = __uint_as_float(k4.x & 0xffff0000u);
            kv[8 * q + 2] = __uint_as_float(k4.y << 16);
            kv[8 * q + 3] = __uint_as_float(k4.y & 0xffff0000u);
            kv[8 * q + 4] = __uint_as_float(k4.z << 16);
            kv[8 * q + 5] = __uint_as_float(k4.z & 0xffff0000u);
            kv[8 * q + 6] = __uint_as_float(k4.w << 16);
            kv[8 * q + 7] = __uint_as_float(k4.w & 0xffff0000u);
          }
        } else {
#pragma unroll
          for (int d = 0; d < 32; d++) kv[d] = 0.0f;
        }
        for (int h = 0; h < Gq; h++) {
          const float* qh = qs + h * kD + qd * 32;
          float s = 0;
#pragma unroll
          for (int d = 0; d < 32; d++) s = fmaf(qh[d], kv[d], s);
          s += __shfl_xor_sync(0xffffffffu, s, 1);
          s += __shfl_xor_sync(0xffffffffu, s, 2);
          if (qd == 0 && kk < nk) sc[h * kTK + kk] = s * scale;
        }
      }
      cbar();
      for (int h = warp; h < Gq; h += kCW) {  // the running softmax of head h
        const float s0 = lane < nk ? sc[h * kTK + lane] : -INFINITY;
        const float s1 = lane + 32 < nk ? sc[h * kTK + lane + 32] : -INFINITY;
        float mt = fmaxf(s0, s1);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
        const float mo = ml[h * 4 + 0], mn = fmaxf(mo, mt);
        const float corr = mo == -INFINITY ? 0.0f : expf(mo - mn);
        const float e0 = lane < nk ? expf(s0 - mn) : 0.0f, e1 = lane + 32 < nk ? expf(s1 - mn) : 0.0f;
        if (lane < nk) sc[h * kTK + lane] = e0;
        if (lane + 32 < nk) sc[h * kTK + lane + 32] = e1;
        const float ls = mk::warp_sum(e0 + e1);
        __syncwarp();
        if (lane == 0) {
          ml[h * 4 + 0] = mn;
          ml[h * 4 + 1] = ml[h * 4 + 1] * corr + ls;
          ml[h * 4 + 2] = corr;
        }
      }
      cbar();
      {  // P·V
        const bool onA = hA < Gq, onB = hB < Gq;
        const float cA = onA ? ml[hA * 4 + 2] : 0.0f, cB = onB ? ml[hB * 4 + 2] : 0.0f;
#pragma unroll
        for (int q = 0; q < 4; q++) {
          accA[q] *= cA;
          accB[q] *= cB;
        }
        if (onA) {
#pragma unroll 4
          for (int kk = 0; kk < nk; kk++) {
            const uint2 u2 = *reinterpret_cast<const uint2*>(vt + kk * kD + d4);
            const float v4[4] = {__uint_as_float(u2.x << 16), __uint_as_float(u2.x & 0xffff0000u),
                                 __uint_as_float(u2.y << 16), __uint_as_float(u2.y & 0xffff0000u)};
            const float pa = sc[hA * kTK + kk], pb = onB ? sc[hB * kTK + kk] : 0.0f;
#pragma unroll
            for (int q = 0; q < 4; q++) {
              accA[q] = fmaf(pa, v4[q], accA[q]);
              accB[q] = fmaf(pb, v4[q], accB[q]);
            }
          }
        }
      }
      cbar();  // sc and ml's corr are free for the next tile
    }
    STAMP(3);
    // This unit's partial: unnormalised sums, the running max and sum.
    const size_t pu = (size_t)(g * p.U + part) * Gq;
    if (hA < Gq)
      for (int q = 0; q < 4; q++) p.part_o[(pu + hA) * kD + d4 + q] = accA[q];
    if (hB < Gq)
      for (int q = 0; q < 4; q++) p.part_o[(pu + hB) * kD + d4 + q] = accB[q];
    if (tid < Gq) {
      p.part_ml[(pu + tid) * 2 + 0] = ml[tid * 4 + 0];
      p.part_ml[(pu + tid) * 2 + 1] = ml[tid * 4 + 1];
    }
    csignal(sync + kSGrp + g);
    // The merge, split over kv head g's units: unit `part` merges outputs
    // [o0, o1) of the head's Gq·D, 8 threads an output (thread sub takes
    // units sub, sub + 8, …: every load of the thread in flight at once),
    // a running max and rescaled sums, combined over the 8 by shuffles.
    cwait(sync + kSGrp + g, p.U);
    const int NO = Gq * kD, sl = (NO + p.U - 1) / p.U, o0 = min(NO, part * sl), o1 = min(NO, o0 + sl);
    const size_t gb = (size_t)g * p.U * Gq;  // kv head g's first (unit, head) row
#pragma unroll 1
    for (int rep = 0; rep < 1 + p.twice; rep++) {
      if (rep) STAMP(15);
      for (int ob = o0; ob < o1; ob += kCT / 8) {
        const int o = ob + tid / 8, sub = tid % 8, h = min(o, NO - 1) / kD, d = min(o, NO - 1) % kD;
        float M = -INFINITY, den = 0.0f, num = 0.0f;
#pragma unroll 4
        for (int q = sub; q < p.U; q += 8) {
          const size_t r = gb + (size_t)q * Gq + h;
          const float m = __ldcg(p.part_ml + r * 2), l = __ldcg(p.part_ml + r * 2 + 1);
          const float v = __ldcg(p.part_o + r * kD + d);
          if (m == -INFINITY) continue;  // a unit with no keys
          const float Mn = fmaxf(M, m), ca = M == -INFINITY ? 0.0f : expf(M - Mn), cb = expf(m - Mn);
          den = fmaf(den, ca, l * cb);
          num = fmaf(num, ca, v * cb);
          M = Mn;
        }
#pragma unroll
        for (int s = 1; s < 8; s <<= 1) {
          const float Mo = __shfl_xor_sync(0xffffffffu, M, s), Do = __shfl_xor_sync(0xffffffffu, den, s),
                      No = __shfl_xor_sync(0xffffffffu, num, s);
          const float Mn = fmaxf(M, Mo);
          const float ca = M == -INFINITY ? 0.0f : expf(M - Mn), cb = Mo == -INFINITY ? 0.0f : expf(Mo - Mn);
          den = den * ca + Do * cb;
          num = num * ca + No * cb;
          M = Mn;
        }
        if (sub == 0 && o < o1) p.attn[(size_t)g * NO + o] = num / den;
      }
    }
    csignal(sync + kSA);
  }

  // O: x1 = x + attn·woᵀ over this CTA's rows.
  cwait(sync + kSA, KV * p.U);
  STAMP(4);
  const int HD = HQ * kD;
  load_vec4(vec, p.attn, HD);
  cbar();
  const int no = walk_o(p, c, G, consume(ring, nq, warp, lane, [&](const Chunk& ch, const bf16* w) {
    dot_chunk(w, ch.n, vec, HD, lane, [&](int r, float y) {
      const int i = ch.r + r;
      const float s = xr[i - r0] + y;
      xr[i - r0] = s;
      p.x1[i] = s;
    });
  }));
  STAMP(5);
  csignal(sync + kSO);

  // R: h1 = RMSNorm(x1)·post_norm, then this CTA's router rows.
  cwait(sync + kSO, G);
  STAMP(6);
  load_h(vec, p.x1, H);
  cbar();
  block_norm(vec, pnw, H, eps, reinterpret_cast<float*>(sm + p.o_red));
  const int nr = walk_r(p, c, G, consume(ring, nq + no, warp, lane, [&](const Chunk& ch, const bf16* w) {
    dot_chunk(w, ch.n, vec, H, lane, [&](int r, float y) { p.logits[ch.r + r] = y; });
  }));
  STAMP(7);
  csignal(sync + kSR);

  // T: the top k, the same in every CTA (moe.Route's rules: softmax in
  // float64 rounded once, ties to the lower index, output by descending
  // weight), by ranks: each thread counts the experts that beat its own
  // (NaN scores rank below every number, among themselves by index).
  cwait(sync + kSR, G);
  STAMP(8);
#pragma unroll 1
  for (int rep = 0; rep < 1 + p.twice; rep++) {
    if (rep) {
      cbar();
      STAMP(14);
    }
    float* sv = reinterpret_cast<float*>(sm + p.o_tmp);  // [E] scores
    float* red = reinterpret_cast<float*>(sm + p.o_red);  // [kCW] floats, then [kCW] doubles at red + 16
    constexpr int kER = kMaxE / kCT;
    float lv[kER];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kER; j++) {
      const int e = tid + j * kCT;
      lv[j] = e < E ? __ldcg(p.logits + e) : -INFINITY;
      mx = fmaxf(mx, lv[j]);
    }
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    cbar();
    mx = red[0];
#pragma unroll
    for (int i = 1; i < kCW; i++) mx = fmaxf(mx, red[i]);
    if (!a.softmax_topk) {
      double* rd = reinterpret_cast<double*>(red + 16);
      double ev[kER], sum = 0;
#pragma unroll
      for (int j = 0; j < kER; j++) {
        ev[j] = tid + j * kCT < E ? exp((double)lv[j] - (double)mx) : 0.0;
        sum += ev[j];
      }
      sum = mk::warp_sum_d(sum);
      if (lane == 0) rd[warp] = sum;
      cbar();
      sum = 0;
#pragma unroll
      for (int i = 0; i < kCW; i++) sum += rd[i];
#pragma unroll
      for (int j = 0; j < kER; j++) lv[j] = (float)(ev[j] / sum);
    }
    // Keys, larger first: the score's order-preserving bits (NaN lowest),
    // then the lower index; an expert's rank is the count of larger keys.
    unsigned long long* keys = reinterpret_cast<unsigned long long*>(sv + ((E + 1) & ~1));  // [E]
#pragma unroll
    for (int j = 0; j < kER; j++) {
      const int e = tid + j * kCT;
      if (e < E) {
        const float v = lv[j];
        unsigned u = __float_as_uint(v);
        u = v != v ? 0u : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
        sv[e] = v;
        keys[e] = ((unsigned long long)u << 32) | (unsigned)(0x7fffffff - e);
      }
    }
    cbar();
    float* rw = red + 32;                                // [K] the chosen scores
    int* ri = reinterpret_cast<int*>(red + 32 + kMaxK);  // [K] their ids
    // Two threads an expert (each over every other key, branch-free), the
    // counts summed by a shuffle.
#pragma unroll 1
    for (int e0 = 0; e0 < E; e0 += kCT / 2) {
      const int e = e0 + tid / 2;
      const unsigned long long me = e < E ? keys[e] : ~0ull;
      int n0 = 0, n1 = 0;
      int q = tid & 1;
#pragma unroll 4
      for (; q + 2 < E; q += 4) {
        n0 += keys[q] > me;
        n1 += keys[q + 2] > me;
      }
      if (q < E) n0 += keys[q] > me;
      int rank = n0 + n1;
      rank += __shfl_xor_sync(0xffffffffu, rank, 1);
      if ((tid & 1) == 0 && e < E && rank < K) {
        rw[rank] = sv[e];
        ri[rank] = e;
      }
    }
    cbar();
    if (warp == 0) {
      const float w0 = rw[0];
      const float bv = lane < K ? rw[lane] : 0.0f;
      const float wk = lane < K ? (a.softmax_topk ? (float)exp((double)bv - (double)w0) : bv) : 0.0f;
      float wsum = 0;  // in k order, as moe.Route sums
      for (int k = 0; k < K; k++) wsum += __shfl_sync(0xffffffffu, wk, k);
      const float f = __uint_as_float(a.scaling_bits);
      // Mixtral: softmax over the k logits; then NormTopK; then the scale.
      const float div = a.softmax_topk || a.norm_topk ? wsum : 1.0f;
      if (lane < K) {
        float w = wk / div;
        if (f != 0.0f && f != 1.0f) w *= f;
        rt->w[lane] = w;
        rt->ids[lane] = ri[lane];
        if (c == 0 && a.counts && rep == 0) atomicAdd(dp<unsigned long long>(a.counts) + ri[lane], 1ull);
      }
      __syncwarp();
      if (lane == 0) {
        __threadfence_block();
        rt->ready = 1;
      }
    }
  }
  cbar();
  STAMP(9);
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  // E1: act[k, j] = silu(gate_j·h1)·(up_j·h1) over this CTA's pairs.
  land = !p.twice;  // stamp 15: warp 0's first E1 chunk landed
  const int ne1 = walk_e1(p, rt->ids, c, G, consume(ring, nq + no + nr, warp, lane, [&](const Chunk& ch, const bf16* w) {
    if (land) STAMP(15);
    land = false;
    const bf16* up = w + (size_t)ch.n * H;
    for (int r = 0; r < ch.n; r += 2) {  // two (gate, up) pairs at a time
      const int n = min(2, ch.n - r);
      const bf16* const rows[4] = {w + (size_t)r * H, up + (size_t)r * H, w + (size_t)(r + 1) * H,
                                   up + (size_t)(r + 1) * H};
      float v[4];
      dot_rows4(rows, 2 * n, vec, H, lane, v);
      if (lane < n) {
        const float gv = lane == 0 ? v[0] : v[2], uv = lane == 0 ? v[1] : v[3];
        p.act[ch.r + r + lane] = gv / (1.0f + expf(-gv)) * uv;
      }
    }
  }));
  STAMP(10);
  csignal(sync + kSE1);

  // E2: out = x1 + Σ_k w_k·(down_k·act_k) over this CTA's rows.
  cwait(sync + kSE1, G);
  STAMP(11);
  load_vec4(vec, p.act, K * I);
  float* yk = reinterpret_cast<float*>(sm + p.o_yk);  // [K][RN]
  cbar();
  walk_e2(p, rt->ids, c, G, consume(ring, nq + no + nr + ne1, warp, lane, [&](const Chunk& ch, const bf16* w) {
    const float wk = rt->w[ch.k];
    dot_chunk(w, ch.n, vec + (size_t)ch.k * I, I, lane,
              [&](int r, float y) { yk[ch.k * p.RN + ch.r + r - r0] = wk * y; });
  }));
  cbar();
  for (int r = tid; r < r1 - r0; r += kCT) {
    float y = 0;
    for (int k = 0; k < K; k++) y += yk[k * p.RN + r];
    dp<float>(a.out)[r0 + r] = xr[r] + y;
  }
  STAMP(12);
  // The last CTA out zeroes the counters for the next launch.
  cbar();
  if (tid == 0 && atom_add_acq_rel(sync + kSExit, 1) == G - 1) {
    for (int i = 0; i < kSGrp + KV; i++) sync[i] = 0;
    __threadfence();
  }
}

// inflight is the most ring chunks a CTA keeps in flight: MK_LAYER_INFLIGHT
// (read once), default 10 (chosen with 8 KB slots; with 16 KB slots the
// ring has about 10 slots on the H200, so the ring's size bounds it).
int inflight() {
  static const int v = [] {
    const char* e = getenv("MK_LAYER_INFLIGHT");
    return e && atoi(e) > 0 ? atoi(e) : 10;
  }();
  return v;
}

// plan fills the launch's derived values; false when the shapes do not fit.
bool plan(const mk_layer& a, LayerK& k, size_t& smem, uint64_t& work) {
  const int G = mk::sm_count();
  const int H = a.hidden, HQ = a.heads, KV = a.kv_heads, E = a.experts, K = a.top_k, I = a.inter;
  if (H < 8 || H % 8 || I < 8 || I % 8 || a.head_dim != kD || KV < 1 || HQ % KV || HQ / KV > kMaxG ||
      E < K || E > kMaxE || K < 1 || K > kMaxK || a.block_size < 1 || a.rot_dim < 0 || a.rot_dim % 2 ||
      a.rot_dim > kD || kSGrp + KV > kSyncWords)
    return false;
  if (H > kHR * kCT || (int64_t)H * 2 > kSlot / 2 || (int64_t)HQ * kD * 2 > kSlot || (int64_t)I * 2 > kSlot)
    return false;
  k = LayerK{};
  k.a = a;
  k.U = std::max(1, G / KV);
  k.RN = (H + G - 1) / G;
  k.vecN = std::max({H, HQ * kD, K * I});
  const int Gq = HQ / KV;
  // Workspace (floats, each part 128-byte aligned).
  int64_t off = 0;
  auto wpart = [&](int64_t n) {
    const int64_t o = off;
    off += (n + 31) / 32 * 32;
    return o;
  };
  const int64_t oq = wpart((int64_t)(HQ + 2 * KV) * kD), opo = wpart((int64_t)KV * k.U * Gq * kD),
                opm = wpart((int64_t)KV * k.U * Gq * 2), oa = wpart((int64_t)HQ * kD), ox = wpart(H),
                ol = wpart(E), oact = wpart((int64_t)K * I);
  work = (uint64_t)off * 4;
  float* w = dp<float>(a.work);
  k.qkv = w + oq;
  k.part_o = w + opo;
  k.part_ml = w + opm;
  k.attn = w + oa;
  k.x1 = w + ox;
  k.logits = w + ol;
  k.act = w + oact;
  // Shared memory: the fixed parts, then as many ring slots as fit.
  uint32_t o = 0;
  auto spart = [&](uint32_t bytes) {
    const uint32_t r = o;
    o += (bytes + 127) / 128 * 128;
    return r;
  };
  const uint32_t fvec = spart((uint32_t)k.vecN * 4), fqs = spart((uint32_t)Gq * kD * 4),
                 ftmp = spart((uint32_t)std::max({kCW * kD, (Gq + 1) * kTK, 3 * E + 2}) * 4), fkv = spart(2 * kD * 4),
                 fml = spart((uint32_t)Gq * 16), fyk = spart((uint32_t)K * k.RN * 4), fkvt = spart((uint32_t)kTK * kD * 2 * 2),
                 frt = spart(sizeof(RouteSm)), fred = spart(256),
                 fcst = spart((2 * kD + kD / 2) * 4), fxr = spart((uint32_t)k.RN * 4);
  const size_t optin = mk::smem_optin();
  const int64_t left = (int64_t)optin - (int64_t)o - 1024;  // - the barriers and alignment
  int S = (int)std::min<int64_t>(kMaxSlots, left / kSlot);
  if (S < 4) return false;
  const uint32_t bars = (uint32_t)mkwg::mbar_bytes(2 * S);
  const uint32_t ringo = bars, fixed0 = ringo + (uint32_t)S * kSlot;
  k.S = S;
  k.N = std::min(S, inflight());
  k.o_ring = ringo;
  k.o_vec = fixed0 + fvec;
  k.o_qs = fixed0 + fqs;
  k.o_tmp = fixed0 + ftmp;
  k.o_kv = fixed0 + fkv;
  k.o_ml = fixed0 + fml;
  k.o_yk = fixed0 + fyk;
  k.o_kvt = fixed0 + fkvt;
  k.o_rt = fixed0 + frt;
  k.o_red = fixed0 + fred;
  k.o_cst = fixed0 + fcst;
  k.o_xr = fixed0 + fxr;
  smem = fixed0 + o;
  return smem <= optin;
}

}  // namespace

extern "C" {

int32_t mk_layer_workspace(const mk_layer* l, uint64_t* bytes) {
  const char* fn = "mk_layer_workspace";
  MK_THREAD(fn);
  MK_ARG(l && bytes, "%s: null argument", fn);
  *bytes = 0;
  LayerK k;
  size_t smem = 0;
  uint64_t work = 0;
  MK_ARG(plan(*l, k, smem, work),
         "%s: shapes the layer kernel does not take (hidden %d heads %d/%d head dim %d experts %d top %d inter %d)",
         fn, l->hidden, l->heads, l->kv_heads, l->head_dim, l->experts, l->top_k, l->inter);
  *bytes = work;
  return MK_OK;
}

int32_t mk_layer_decode(uint64_t stream, const mk_layer* l) {
  const char* fn = "mk_layer_decode";
  MK_THREAD(fn);
  MK_ARG(l, "%s: null argument", fn);
  LayerK k;
  size_t smem = 0;
  uint64_t work = 0;
  MK_ARG(plan(*l, k, smem, work),
         "%s: shapes the layer kernel does not take (hidden %d heads %d/%d head dim %d experts %d top %d inter %d)",
         fn, l->hidden, l->heads, l->kv_heads, l->head_dim, l->experts, l->top_k, l->inter);
  const mk_layer& a = *l;
  MK_ARG(a.x && a.out && a.in_norm && a.post_norm && a.wq && a.wk && a.wv && a.wo && a.pool_k && a.pool_v &&
             a.blocks && a.pos && a.table && a.slot && a.rope_pos && a.gate && a.gate_up && a.down && a.work &&
             a.sync && (a.rot_dim == 0 || a.inv_freq),
         "%s: a null operand", fn);
  const uint64_t al[] = {a.wq, a.wk, a.wv, a.wo, a.gate, a.gate_up, a.down, a.pool_k, a.pool_v, a.work};
  for (uint64_t v : al) MK_ARG((v & 15) == 0, "%s: weights, pools and work must be 16-byte aligned", fn);
  static size_t opted = 0;
  if (smem > opted) {
    MK_CUDA(cudaFuncSetAttribute(layer_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    opted = smem;
  }
  // MK_LAYER_STAMPS (read once): eager launches record each CTA's phase
  // times and print their medians and maxima to stderr (a measurement aid;
  // synchronises after every launch).
  static const bool stamps = getenv("MK_LAYER_STAMPS") != nullptr;
  static const bool twice = getenv("MK_LAYER_TWICE") != nullptr;
  k.twice = twice ? 1 : 0;
  static unsigned long long* st = nullptr;
  const int G = mk::sm_count();
  cudaStream_t s = mk::as_stream(stream);
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  MK_CUDA(cudaStreamIsCapturing(s, &cap));
  const bool stamp = stamps && cap == cudaStreamCaptureStatusNone;
  if (stamp) {
    if (!st) MK_CUDA(cudaMalloc(&st, (size_t)G * 16 * sizeof(unsigned long long)));
    MK_CUDA(cudaMemsetAsync(st, 0, (size_t)G * 16 * sizeof(unsigned long long), s));
    k.st = st;
  }
  (void)mk::launch(layer_kernel, dim3((unsigned)G), dim3(kThreads), smem, s, k);
  MK_LAUNCHED("layer_decode");
  if (stamp) {
    std::vector<unsigned long long> h((size_t)G * 16);
    MK_CUDA(cudaStreamSynchronize(s));
    MK_CUDA(cudaMemcpy(h.data(), st, h.size() * sizeof(h[0]), cudaMemcpyDeviceToHost));
    unsigned long long t0 = ~0ull;
    for (int c = 0; c < G; c++) t0 = std::min(t0, h[(size_t)c * 16 + 13]);
    static const int order2[] = {13, 0, 1, 2, 3, 15, 4, 5, 6, 7, 8, 14, 9, 10, 11, 12};
    static const int order1[] = {13, 0, 14, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 10, 11, 12};
    const int* order = twice ? order2 : order1;
    const char* names[16] = {"start", "Qdone", "Aready", "unit",   "Oready", "Odone",  "Rready", "Rdone",
                             "Tready", "routed", "E1done", "E2ready", "end", "entry", "routed1", "merged1"};
    if (!twice) names[14] = "Qland", names[15] = "E1land";
    std::string line = "layer stamps µs (median/max over CTAs from the first entry):";
    for (int oi = 0; oi < 16; oi++) {
      const int i = order[oi];
      std::vector<double> v;
      for (int c = 0; c < G; c++)
        if (h[(size_t)c * 16 + i]) v.push_back((double)(h[(size_t)c * 16 + i] - t0) / 1000.0);
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      char b[64];
      snprintf(b, sizeof b, " %s %.1f/%.1f", names[i], v[v.size() / 2], v.back());
      line += b;
    }
    fprintf(stderr, "%s\n", line.c_str());
  }
  return MK_OK;
}

}  // extern "C"
