// sample.cu — sampling on the device: one 1024-thread block per row of
// float32 logits [rows, vocab], with the semantics of the engine's host
// sampler (engine/sampler.go; contract in mk_sample.h).
//
// Per row (passes are reads of the row; the logits are never written):
//   0. penalties: the penalised values of the few listed tokens go to a
//      scratch row, a bitmap in shared memory marks them;
//   1. one pass: raw max and sum of exp (log-softmax for the log-probs), the
//      penalised max and its first index (greedy);
//   2. one pass (temperature > 0): z = (w - max) / T in float32 exactly as the
//      host does, q = exp(z) in float64 for z > -40, the total, and a
//      histogram over 2048 linear bins of z (counts and masses);
//   3. fast path: the bins give a threshold whose prefix (in descending z)
//      provably holds the kept set; if it has at most 4096 tokens they are
//      collected into shared memory, sorted (bitonic; key desc, id asc) and
//      top-k / min-p / top-p / the draw run on the sorted list with float64
//      scans;
//      slow path (large kept sets, e.g. top-p 0.95 over a flat
//      distribution): radix selection over the 32-bit order key of z
//      (11 + 11 + 10 bits, one pass each, plus one pass to break ties by id)
//      finds each cut (top-k, top-p, the draw) without sorting anything;
//   4. top log-probs: the same radix selection over the raw logits finds the
//      N-th most likely, one pass collects the N, one thread sorts them.
// Without top-k, top-p and min-p the host draws over the whole vocabulary in
// id order (drawAll); so does the device: block scans over tiles in id order.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common.cuh"

namespace {

constexpr int NT = 1024;   // threads per row
constexpr int NW = NT / 32;
constexpr int NB = 2048;   // histogram bins
constexpr int CAP = 4096;  // candidates sorted in shared memory (4 per thread)
constexpr float ZBIN = 51.2f;  // linear bins of z over (-40, 0]: NB / 40
constexpr int MAXV = 1 << 20;
constexpr unsigned FULL = 0xffffffffu;

// Dynamic shared memory: fixed part, then the penalty bitmap.
constexpr size_t SM_CNT = 0;                            // uint32 [NB]
constexpr size_t SM_FMASS = SM_CNT + NB * 4;            // float  [NB]
constexpr size_t SM_DMASS = SM_FMASS + NB * 4;          // double [NB]
constexpr size_t SM_CAND = SM_DMASS + NB * 8;           // uint64 [CAP]
constexpr size_t SM_BITS = SM_CAND + (size_t)CAP * 8;   // uint32 [(V+31)/32]

// fkey maps a float to a uint32 with the same order (larger key = larger float).
__device__ __forceinline__ uint32_t fkey(float f) {
  uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float kfloat(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Block-wide reductions; every thread gets the result. red holds NW values.
template <typename T, typename Op>
__device__ T block_all(T v, Op op, T* red) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(FULL, v, o));
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  T r = red[0];
  for (int i = 1; i < NW; i++) r = op(r, red[i]);
  return r;
}

struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Min {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a < b ? a : b; }
};
struct Or {
  __device__ int operator()(int a, int b) const { return a | b; }
};

// block_excl_scan returns the sum of v over the threads before this one and
// the block total in *total.
__device__ double block_excl_scan(double v, double* red, double* total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  double x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    double y = __shfl_up_sync(FULL, x, o);
    if (lane >= o) x += y;
  }
  double ex = __shfl_up_sync(FULL, x, 1);
  if (lane == 0) ex = 0;
  __syncthreads();
  if (lane == 31) red[w] = x;
  __syncthreads();
  double base = 0, tot = 0;
  for (int i = 0; i < NW; i++) {
    if (i < w) base += red[i];
    tot += red[i];
  }
  *total = tot;
  return base + ex;
}

// The row as the sampler sees it: raw logits, penalised overrides.
struct RowCtx {
  const float* x;
  const float* pv;        // penalised values at the marked positions
  const uint32_t* bits;   // marks (shared memory)
  bool pen;
  float maxw, inv;
};

__device__ __forceinline__ float wval(const RowCtx& r, int i) {
  float v = r.x[i];
  if (r.pen && ((r.bits[i >> 5] >> (i & 31)) & 1u)) v = r.pv[i];
  return v;
}

// row_walk calls f(i, x[i]) for i = tid, tid + NT, tid + 2·NT, ... < V in
// that order, with the next PF values of x already loaded: a row pass used to
// issue one load per iteration and wait for it (one 1024-thread block reads
// 608 KB of Qwen3's logits at ~12 GB/s that way: 52 µs a step at batch 1,
// ncu), now PF loads are in flight per thread. Each thread sees the same
// elements in the same order as a plain strided loop, so the sums are the same
// bit for bit.
constexpr int PF = 8;
template <typename F>
__device__ __forceinline__ void row_walk(const float* __restrict__ x, int V, int tid, F&& f) {
  for (int base = tid; base < V; base += PF * NT) {
    float v[PF];
#pragma unroll
    for (int u = 0; u < PF; u++) {
      const int i = base + u * NT;
      v[u] = i < V ? __ldg(x + i) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < PF; u++) {
      const int i = base + u * NT;
      if (i < V) f(i, v[u]);
    }
  }
}

// zf is float32((w - max) * inv) as the host computes it (no FMA), -0 as +0.
__device__ __forceinline__ float zf(float w, float maxw, float inv) {
  const float z = __fmul_rn(__fsub_rn(w, maxw), inv);
  return z == 0.f ? 0.f : z;
}
__device__ __forceinline__ float zval(const RowCtx& r, float w) { return zf(w, r.maxw, r.inv); }

// Keys for selection: ZKeys orders the tokens the draw can pick (z > -40)
// by z and weighs them by q = exp(z); RawKeys orders the non-NaN raw logits.
struct ZKeys {
  RowCtx r;
  static constexpr bool weighted = true;
  __device__ bool get(int i, uint32_t& k) const {
    float z = zval(r, wval(r, i));
    if (!(z > -40.f)) return false;
    k = fkey(z);
    return true;
  }
  __device__ double weight(uint32_t k) const { return exp((double)kfloat(k)); }
};
struct RawKeys {
  const float* x;
  static constexpr bool weighted = false;
  __device__ bool get(int i, uint32_t& k) const {
    float v = x[i];
    if (v != v) return false;
    if (v == 0.f) v = 0.f;
    k = fkey(v);
    return true;
  }
  __device__ double weight(uint32_t) const { return 1.0; }
};

// Shared scalars of one block.
struct Shared {
  double red_d[NW];
  float red_f[NW];
  int red_i[NW];
  long long red_l[NW];
  int wcnt[NW];
  // selection results
  int sel_found, sel_bin, sel_id;
  long long sel_cb;
  double sel_mb;
  int ncand;
  int flag;
  uint64_t top[32];
  int ntop;
};

// Sel is a position in the order (key desc, id asc): the element, the
// number of elements up to and including it, and their mass.
struct Sel {
  bool found;
  uint32_t key;
  int id;
  long long count;
  double mass;
};

__device__ __forceinline__ bool crosses(double x, double target, bool strict) {
  return strict ? x > target : x >= target;
}

// find_crossing (warp 0): bins hold counts cnt and masses dm over nb bins;
// scanning from the highest bin down with cb / mb already before them, find
// the first bin where the count (or mass) crosses target. Results in sh.
__device__ void find_crossing(const uint32_t* cnt, const double* dm, int nb, long long cb, double mb,
                              double target, bool by_mass, bool strict, Shared& sh) {
  const int lane = threadIdx.x & 31;
  const int per = nb / 32;
  const int top = nb - 1 - lane * per;  // this lane's bins: top, top-1, ..., top-per+1
  long long c = 0;
  double m = 0;
  for (int k = 0; k < per; k++) {
    c += cnt[top - k];
    m += dm[top - k];
  }
  // exclusive scan over lanes
  long long cx = c;
  double mx = m;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    long long yc = __shfl_up_sync(FULL, cx, o);
    double ym = __shfl_up_sync(FULL, mx, o);
    if (lane >= o) {
      cx += yc;
      mx += ym;
    }
  }
  long long cbefore = cb + cx - c;
  double mbefore = mb + mx - m;
  bool cr = by_mass ? crosses(mbefore + m, target, strict) : crosses((double)(cbefore + c), target, strict);
  unsigned bal = __ballot_sync(FULL, cr);
  if (bal == 0) {
    if (lane == 0) sh.sel_found = 0;
    return;
  }
  if (lane == __ffs(bal) - 1) {
    for (int k = 0; k < per; k++) {
      int b = top - k;
      long long c2 = cbefore + cnt[b];
      double m2 = mbefore + dm[b];
      if ((by_mass ? crosses(m2, target, strict) : crosses((double)c2, target, strict)) || k == per - 1) {
        sh.sel_found = 1;
        sh.sel_bin = b;
        sh.sel_cb = cbefore;
        sh.sel_mb = mbefore;
        break;
      }
      cbefore = c2;
      mbefore = m2;
    }
  }
}

// select_desc finds the first position in the order (key desc, id asc) of
// the elements kf accepts where the running count (by_mass false) or mass
// (true) crosses target (>= target, or > with strict). Radix selection:
// three histogram passes (11, 11, 10 bits of the key), then one pass to
// find the id among elements with equal keys. Every thread gets the result.
//
// The first level's histogram does not depend on the target: with l0 set,
// a call with l0->have takes it from l0's copy instead of a pass over the
// row, and a call without stores it there (several selections on one row's
// keys: the slow path's top-k, top-p, kept-set and draw cuts).
struct L0Cache {
  uint32_t* cnt;  // [NB]
  double* dm;     // [NB]
  bool have;
};

template <class K>
__device__ Sel select_desc(const K& kf, int V, double target, bool by_mass, bool strict, uint32_t* cnt,
                           double* dm, Shared& sh, L0Cache* l0 = nullptr) {
  const int tid = threadIdx.x;
  const int shifts[3] = {21, 10, 0};
  const int widths[3] = {11, 11, 10};
  uint32_t prefix = 0;
  long long cb = 0;
  double mb = 0;
  int bin = 0;
  Sel res{false, 0, -1, 0, 0};
  for (int l = 0; l < 3; l++) {
    const int sft = shifts[l], nb = 1 << widths[l];
    const int hs = sft + widths[l];
    const bool cached = l == 0 && l0 != nullptr && l0->have;
    for (int b = tid; b < NB; b += NT) {
      cnt[b] = cached ? l0->cnt[b] : 0;
      dm[b] = cached ? l0->dm[b] : 0;
    }
    __syncthreads();
    for (int i0 = cached ? V : 0; i0 < V; i0 += NT) {
      const int i = i0 + tid;
      uint32_t k = 0;
      bool ok = i < V && kf.get(i, k) && (l == 0 || (k >> hs) == (prefix >> hs));
      int b = ok ? (int)((k >> sft) & (uint32_t)(nb - 1)) : -1;
      if (!__any_sync(FULL, ok)) continue;  // warp-uniform: no lane in the prefix (most tiles past level 0)
      // aggregate equal bins across the warp for the counts
      const unsigned peers = __match_any_sync(FULL, b);
      const bool leader = ok && (threadIdx.x & 31) == __ffs(peers) - 1;
      if (K::weighted) {
        // The masses, by how the warp's lanes share bins: each lane's own
        // atomic where no bin holds more than two (a flat row past level
        // 0: shared-memory float64 atomics are compare-and-swap loops, so
        // contended ones retry), one butterfly sum a bin where they fall
        // in at most four, else every lane sums its peers' over 32
        // shuffles and their leader adds it (one contended atomic a bin).
        // Against that loop alone (twenty-first pass, flat Qwen3 rows with
        // top-p 0.9): 1.87 → 1.64 ms a step at batch 1, 4.26 → 4.02 at 32.
        const double q = ok ? kf.weight(k) : 0.0;
        const unsigned leaders = __ballot_sync(FULL, leader);
        const int most = __reduce_max_sync(FULL, ok ? (unsigned)__popc(peers) : 0u);
        const bool own = most <= 2, fly = __popc(leaders) <= 4;
        if (own) {
          if (ok) atomicAdd(&dm[b], q);
        } else if (fly) {
          for (unsigned left = leaders; left != 0; left &= left - 1) {  // warp-uniform
            const int ld = __ffs(left) - 1;
            const int bl = __shfl_sync(FULL, b, ld);
            double v = ok && b == bl ? q : 0.0;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
            if ((threadIdx.x & 31) == ld) atomicAdd(&dm[bl], v);
          }
        } else {
          double gs = 0;
          for (int src = 0; src < 32; src++) {
            const double y = __shfl_sync(FULL, q, src);
            if ((peers >> src) & 1u) gs += y;
          }
          if (leader) atomicAdd(&dm[b], gs);
        }
      }
      if (leader) atomicAdd(&cnt[b], (uint32_t)__popc(peers));
    }
    __syncthreads();
    if (l == 0 && l0 != nullptr && !l0->have) {
      for (int b = tid; b < NB; b += NT) {
        l0->cnt[b] = cnt[b];
        l0->dm[b] = dm[b];
      }
      l0->have = true;  // (every thread: l0 is per thread)
    }
    if (tid < 32) find_crossing(cnt, dm, nb, cb, mb, target, by_mass, strict, sh);
    __syncthreads();
    if (!sh.sel_found) return res;
    bin = sh.sel_bin;
    cb = sh.sel_cb;
    mb = sh.sel_mb;
    prefix |= (uint32_t)bin << sft;
    __syncthreads();
  }
  // All elements of the last bin have key == prefix and the same weight.
  const long long g = cnt[bin];
  const double w = kf.weight(prefix);
  long long j;
  if (by_mass) {
    double j0 = (target - mb) / w;
    j = strict ? (long long)floor(j0) + 1 : (long long)ceil(j0);
  } else {
    j = (long long)ceil(target - (double)cb);
    if (strict && (double)(cb + j) <= target) j++;
  }
  if (j < 1) j = 1;
  if (j > g) j = g;
  // The j-th smallest id with key == prefix: tiles in id order.
  __syncthreads();
  if (tid == 0) sh.sel_id = -1;
  __syncthreads();
  const int lane = tid & 31, wp = tid >> 5;
  long long base = 0;
  for (int t0 = 0; t0 < V; t0 += NT) {
    const int i = t0 + tid;
    uint32_t k;
    const bool f = i < V && kf.get(i, k) && k == prefix;
    const unsigned bal = __ballot_sync(FULL, f);
    if (lane == 0) sh.wcnt[wp] = __popc(bal);
    __syncthreads();
    int wb = 0, tot = 0;
    for (int q = 0; q < NW; q++) {
      if (q < wp) wb += sh.wcnt[q];
      tot += sh.wcnt[q];
    }
    if (f && base + wb + __popc(bal & ((1u << lane) - 1)) + 1 == j) sh.sel_id = i;
    base += tot;
    __syncthreads();
    if (base >= j) break;
  }
  res.found = true;
  res.key = prefix;
  res.id = sh.sel_id;
  res.count = cb + j;
  res.mass = mb + (double)j * w;
  return res;
}

// block_first returns the smallest e with cond, or big.
__device__ int block_first(bool cond, int e, int big, Shared& sh) {
  return block_all<int>(cond ? e : big, Min{}, sh.red_i);
}

// bitonic_desc sorts c [P] (shared memory; P a power of two) in descending
// order with the whole block (any block size).
__device__ void bitonic_desc(uint64_t* c, int P) {
  for (int k = 2; k <= P; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < P; i += blockDim.x) {
        const int ixj = i ^ j;
        if (ixj > i) {
          const uint64_t a = c[i], b = c[ixj];
          const bool desc = (i & k) == 0;
          if (desc ? a < b : a > b) {
            c[i] = b;
            c[ixj] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

// pick_sorted runs top-k, min-p, top-p and the draw (U) on cand, the first nc
// candidates of the order (key desc: fkey(z) << 32 | ~id; nc ≤ CAP), by the
// NT threads of the block (4 positions each). nk is the top-k cut
// (min(top_k, valid tokens), or the valid tokens without top-k); total the
// mass of every valid token (the norm without top-k); inside says whether
// the candidates provably hold the kept set before min-p and top-p cut
// it. Returns false when they may not (the caller then selects on the
// whole row), else true with the drawn token in *token.
//
// Which cuts prove the kept set inside the candidates depends on what the
// tokens outside them are. bound 0: the candidates are a prefix of the
// row's order (sample_rows' bins), so a min-p cut among them or a top-p
// crossing among them proves it. bound > 0 (topk_finish's cut rows: each
// chunk's best kk, so a chunk's (kk+1)-th token may outrank another
// chunk's candidates): every token outside has a key below bound, or none
// is outside when bound is kNoneOutside; min-p then proves it when bound's
// own mass is below min-p (every outside token is cut), top-p when its
// crossing candidate's key is at least bound (every token before the
// crossing is a candidate). The first version treated both like prefixes
// (twenty-first pass: a min-p 0.01 row at temperature 1.75 drew a token
// whose rank rested on a token outside the candidates).
constexpr uint64_t kNoneOutside = 1;  // below every real key (fkey(z) > 0 for z > −40: a key is ≥ 2^32)
__device__ bool pick_sorted(const uint64_t* cand, int nc, int nk, int topk, float topp, float minp, bool inside,
                            double total, double U, Shared& sh, int* token, uint64_t bound = 0) {
  if (bound == kNoneOutside) inside = true;
  const int tid = threadIdx.x;
  double q4[4];
  for (int e = 0; e < 4; e++) {
    const int p = 4 * tid + e;
    q4[e] = p < nc ? exp((double)kfloat((uint32_t)(cand[p] >> 32))) : 0.0;
  }
  int n = min(nk, nc);
  double norm = total;
  if (topk > 0) {
    double s = 0;
    for (int e = 0; e < 4; e++)
      if (4 * tid + e < n) s += q4[e];
    norm = block_all<double>(s, Sum{}, sh.red_d);
  }
  if (minp > 0.f) {
    int c = 0;
    for (int e = 0; e < 4; e++)
      if (4 * tid + e < n && q4[e] >= (double)minp) c++;
    const int cm = block_all<int>(c, Sum{}, sh.red_i);
    if (cm < n) {
      n = max(1, cm);
      if (bound == 0) inside = true;
    }
    if (bound > kNoneOutside && exp((double)kfloat((uint32_t)(bound >> 32))) < (double)minp) inside = true;
  }
  if (topp < 1.f) {
    double s = 0;
    for (int e = 0; e < 4; e++)
      if (4 * tid + e < n) s += q4[e] / norm;
    double tile;
    double run = block_excl_scan(s, sh.red_d, &tile);
    int first = 0x7fffffff;
    for (int e = 0; e < 4; e++) {
      const int p = 4 * tid + e;
      if (p < n) {
        run += q4[e] / norm;
        if (run >= (double)topp && first == 0x7fffffff) first = p;
      }
    }
    const int f = block_first(first != 0x7fffffff, first, 0x7fffffff, sh);
    if (f != 0x7fffffff) {
      n = f + 1;
      if (bound == 0 || cand[f] >= bound) inside = true;
    }
  }
  if (!inside) return false;
  double s = 0;
  for (int e = 0; e < 4; e++)
    if (4 * tid + e < n) s += q4[e];
  double mass;
  double run = block_excl_scan(s, sh.red_d, &mass);
  const double u = U * mass;
  int first = 0x7fffffff;
  for (int e = 0; e < 4; e++) {
    const int p = 4 * tid + e;
    if (p < n) {
      run += q4[e];
      if (run > u && first == 0x7fffffff) first = p;
    }
  }
  int f = block_first(first != 0x7fffffff, first, 0x7fffffff, sh);
  if (f == 0x7fffffff) f = n - 1;
  *token = (int)(~(uint32_t)(cand[f] & 0xffffffffu));
  return true;
}

__global__ void __launch_bounds__(NT, 1)
    sample_rows(const float* __restrict__ logits, int64_t V64, const int32_t* __restrict__ meta, int64_t meta_words,
                float* scratch, int32_t* __restrict__ out, const int32_t* __restrict__ only) {
  if (only != nullptr && only[blockIdx.x] == 0) return;  // (mk_sample_draw_f32: rows the split kernels answered)
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ Shared sh;
  uint32_t* cnt = reinterpret_cast<uint32_t*>(smem + SM_CNT);
  float* fmass = reinterpret_cast<float*>(smem + SM_FMASS);
  double* dm = reinterpret_cast<double*>(smem + SM_DMASS);
  uint64_t* cand = reinterpret_cast<uint64_t*>(smem + SM_CAND);
  uint32_t* bits = reinterpret_cast<uint32_t*>(smem + SM_BITS);

  const int V = (int)V64;
  const int row = blockIdx.x;
  const int tid = threadIdx.x;
  const float* x = logits + (int64_t)row * V;
  float* pv = scratch ? scratch + (int64_t)row * V : nullptr;
  const int32_t* m = meta + (int64_t)row * MK_SAMPLE_META_WORDS;
  int32_t* o = out + (int64_t)row * MK_SAMPLE_RESULT_WORDS;

  const float T = __int_as_float(m[0]);
  const int topk = m[1];
  const float topp = __int_as_float(m[2]);
  const float minp = __int_as_float(m[3]);
  const float rep = __int_as_float(m[4]);
  const float pres = __int_as_float(m[5]);
  const float freq = __int_as_float(m[6]);
  const int nseen = m[7], seen_off = m[8], nout = m[9], out_off = m[10];
  const int ntop = m[11];
  const double U = __hiloint2double(m[13], m[12]);

  // Defaults of the result (overwritten below).
  for (int k = tid; k < MK_SAMPLE_MAX_TOP; k += NT) {
    o[3 + k] = -1;
    o[3 + MK_SAMPLE_MAX_TOP + k] = __float_as_int(__int_as_float(0x7fc00000));
  }
  const bool bad_meta = nseen < 0 || nout < 0 || ntop < 0 || ntop > MK_SAMPLE_MAX_TOP ||
                        (nseen > 0 && (seen_off < 0 || (int64_t)seen_off + nseen > meta_words)) ||
                        (nout > 0 && (out_off < 0 || (int64_t)out_off + 2 * (int64_t)nout > meta_words));
  if (bad_meta) {
    if (tid == 0) {
      o[0] = -1;
      o[1] = 0;
      o[2] = 0;
    }
    return;
  }

  // ---- 0. penalties ----
  const bool use_rep = rep != 1.f && nseen > 0;
  const bool use_out = (pres != 0.f || freq != 0.f) && nout > 0;
  const bool pen = (use_rep || use_out) && pv != nullptr;
  if (pen) {
    const int nwords = (V + 31) / 32;
    for (int k = tid; k < nwords; k += NT) bits[k] = 0;
    __syncthreads();
    if (use_rep) {
      for (int k = tid; k < nseen; k += NT) {
        const int t = meta[seen_off + k];
        if (t < 0 || t >= V) continue;
        const float v = x[t];
        pv[t] = v > 0.f ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
        atomicOr(&bits[t >> 5], 1u << (t & 31));
      }
    }
    __syncthreads();
    if (use_out) {
      for (int k = tid; k < nout; k += NT) {
        const int t = meta[out_off + k];
        if (t < 0 || t >= V) continue;
        const int c = meta[out_off + nout + k];
        float v = x[t];
        if (use_rep && ((bits[t >> 5] >> (t & 31)) & 1u)) v = v > 0.f ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
        pv[t] = __fsub_rn(v, __fadd_rn(__fmul_rn(freq, (float)c), pres));
      }
      __syncthreads();
      for (int k = tid; k < nout; k += NT) {
        const int t = meta[out_off + k];
        if (t >= 0 && t < V) atomicOr(&bits[t >> 5], 1u << (t & 31));
      }
    }
    __syncthreads();
  }
  RowCtx rc{x, pv, bits, pen, 0.f, 1.f};

  // ---- 1. raw log-sum-exp, penalised argmax ----
  float rmax = -INFINITY, rsum = 0.f;
  int rnan = 0, nraw = 0;
  float wmax = -INFINITY;
  int widx = -1;
  row_walk(x, V, tid, [&](int i, float v) {
    if (v != v) {
      rnan = 1;
    } else {
      nraw++;
      if (v > rmax) {
        rsum = rsum * expf(rmax - v) + 1.f;
        rmax = v;
      } else if (v != -INFINITY) {
        rsum += expf(v - rmax);
      }
    }
    const float w = pen ? wval(rc, i) : v;
    if (w == w && (widx < 0 || w > wmax)) {
      wmax = w;
      widx = i;
    }
  });
  const float gmax_raw = block_all<float>(rmax, Max{}, sh.red_f);
  const double part = (rmax == -INFINITY || gmax_raw == -INFINITY) ? 0.0 : (double)rsum * exp((double)rmax - (double)gmax_raw);
  const double rs = block_all<double>(part, Sum{}, sh.red_d);
  const int anynan = block_all<int>(rnan, Or{}, sh.red_i);
  const int nraw_all = block_all<int>(nraw, Sum{}, sh.red_i);
  const bool lse_ok = !anynan && isfinite(gmax_raw);
  const double lse = lse_ok ? (double)gmax_raw + log(rs) : (double)NAN;
  const int anyw = block_all<int>(widx >= 0 ? 1 : 0, Or{}, sh.red_i);
  const float gmax_w = block_all<float>(widx >= 0 ? wmax : -INFINITY, Max{}, sh.red_f);
  const int greedy0 = block_all<int>((widx >= 0 && wmax == gmax_w) ? widx : 0x7fffffff, Min{}, sh.red_i);
  const int greedy = anyw ? greedy0 : 0;

  int token = greedy;
  bool bad = false;
  if (T > 0.f && anyw && gmax_w != -INFINITY) {
    rc.maxw = gmax_w;
    rc.inv = __fdiv_rn(1.f, T);
    const bool restricted = topk > 0 || topp < 1.f || minp > 0.f;
    // ---- 2. total, histogram ----
    if (restricted) {
      for (int b = tid; b < NB; b += NT) {
        cnt[b] = 0;
        fmass[b] = 0.f;
      }
      __syncthreads();
    }
    double tot = 0;
    int nval = 0, nmin = 0;
    row_walk(x, V, tid, [&](int i, float v) {
      const float z = zval(rc, pen ? wval(rc, i) : v);
      if (z > -40.f) {
        const double q = exp((double)z);
        tot += q;
        nval++;
        if (minp > 0.f && q >= (double)minp) nmin++;
        if (restricted) {
          const int b = min(NB - 1, (int)(-z * ZBIN));
          atomicAdd(&cnt[b], 1u);
          atomicAdd(&fmass[b], (float)q);
        }
      }
    });
    const double total = block_all<double>(tot, Sum{}, sh.red_d);
    const int nvalid = block_all<int>(nval, Sum{}, sh.red_i);
    const int nminp = block_all<int>(nmin, Sum{}, sh.red_i);
    if (nvalid == 0) {
      token = greedy;  // (the host would fail here: nothing to draw from)
    } else if (!restricted) {
      // drawAll: the first token in id order where the running sum exceeds U*total.
      const double u = U * total;
      double carry = 0;
      if (tid == 0) sh.sel_id = -1;
      __syncthreads();
      for (int t0 = 0; t0 < V; t0 += 4 * NT) {
        double q4[4];
        double s = 0;
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int i = t0 + 4 * tid + e;
          q4[e] = 0;
          if (i < V) {
            const float z = zval(rc, wval(rc, i));
            if (z > -40.f) q4[e] = exp((double)z);
          }
          s += q4[e];
        }
        double tile;
        const double before = carry + block_excl_scan(s, sh.red_d, &tile);
        if (s > 0 && !(before > u) && before + s > u) {
          double run = before;
          int pick = -1;
          for (int e = 0; e < 4; e++) {
            run += q4[e];
            if (q4[e] > 0) {
              pick = t0 + 4 * tid + e;  // the last positive one if rounding never crosses
              if (run > u) break;
            }
          }
          sh.sel_id = pick;
        }
        carry += tile;
        __syncthreads();
        if (sh.sel_id >= 0) break;
      }
      token = sh.sel_id >= 0 ? sh.sel_id : greedy;
    } else {
      // ---- 3. the cut bin ----
      if (tid < 32) {
        const int lane = tid;
        const int per = NB / 32;
        long long c = 0;
        double ms = 0;
        for (int k = 0; k < per; k++) {
          c += cnt[lane * per + k];
          ms += fmass[lane * per + k];
        }
        long long cx = c;
        double mx = ms;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          long long yc = __shfl_up_sync(FULL, cx, off);
          double ym = __shfl_up_sync(FULL, mx, off);
          if (lane >= off) {
            cx += yc;
            mx += ym;
          }
        }
        // smallest bin whose cumulative count reaches kc / mass reaches mt
        int bk = NB - 1, bp = NB - 1;
        const long long kc = topk;
        const double mt = (double)topp * total * (1 + 1e-4);
        unsigned balk = __ballot_sync(FULL, topk > 0 && cx >= kc);
        unsigned balp = __ballot_sync(FULL, topp < 1.f && mx >= mt);
        if (balk && lane == __ffs(balk) - 1) {
          long long r = cx - c;
          for (int k = 0; k < per; k++) {
            r += cnt[lane * per + k];
            if (r >= kc) {
              bk = lane * per + k;
              break;
            }
          }
        }
        if (balp && lane == __ffs(balp) - 1) {
          double r = mx - ms;
          for (int k = 0; k < per; k++) {
            r += fmass[lane * per + k];
            if (r >= mt) {
              bp = lane * per + k;
              break;
            }
          }
        }
        bk = __reduce_min_sync(FULL, (unsigned)bk);
        bp = __reduce_min_sync(FULL, (unsigned)bp);
        int bc;
        if (topk > 0) {
          bc = bk;
        } else {
          bc = NB - 1;
          if (topp < 1.f) bc = min(bc, bp);
          if (minp > 0.f) bc = min(bc, (int)((-log((double)minp) + 1e-4) * ZBIN) + 1);
          bc = min(bc, NB - 1);
        }
        // candidates: bins 0..bc
        long long nc = 0;
        for (int k = 0; k < per; k++)
          if (lane * per + k <= bc) nc += cnt[lane * per + k];
        nc = __reduce_add_sync(FULL, (unsigned)nc);
        if (lane == 0) {
          sh.sel_bin = bc;
          sh.ncand = (int)nc;
        }
      }
      __syncthreads();
      const int bc = sh.sel_bin;
      const int nc = sh.ncand;
      const int nk = topk > 0 ? min(topk, nvalid) : nvalid;
      bool fast = nc <= CAP;
      if (fast) {
        // collect
        __syncthreads();
        if (tid == 0) sh.ncand = 0;
        __syncthreads();
        for (int i0 = 0; i0 < V; i0 += NT) {
          const int i = i0 + tid;
          const float z = i < V ? zval(rc, wval(rc, i)) : -INFINITY;
          const bool take = z > -40.f && min(NB - 1, (int)(-z * ZBIN)) <= bc;
          const unsigned bal = __ballot_sync(FULL, take);
          if (take) {
            const int lane = tid & 31;
            const int leader = __ffs(bal) - 1;
            int pos = 0;
            if (lane == leader) pos = atomicAdd(&sh.ncand, __popc(bal));
            pos = __shfl_sync(bal, pos, leader) + __popc(bal & ((1u << lane) - 1));
            if (pos < CAP) cand[pos] = ((uint64_t)fkey(z) << 32) | (uint64_t)(~(uint32_t)i);
          }
        }
        __syncthreads();
        int P = 2;
        while (P < nc) P <<= 1;
        for (int k = nc + tid; k < P; k += NT) cand[k] = 0;
        __syncthreads();
        bitonic_desc(cand, P);
        fast = pick_sorted(cand, nc, nk, topk, topp, minp, topk > 0 || nc == nvalid, total, U, sh, &token);
        __syncthreads();
      }
      if (!fast) {
        // ---- slow path: radix selection, no sort ----
        // Its selections share the first level's histogram (l0, in the
        // candidates' room, unused here), and the kept set's last element
        // is taken from the top-k or top-p cut that set it where one did.
        // Each selection is 3 histogram passes over the row and one for
        // ties: top-p alone was 9 + 3 passes, now 5 + 2 (twenty-first
        // pass, Qwen3-8l with temperature 0.7 and top-p 0.9 on random
        // weights, whose flat rows all take this path: 2.70 → 1.86 ms a
        // step at batch 1, 5.14 → 4.21 at 32).
        __syncthreads();
        L0Cache l0{reinterpret_cast<uint32_t*>(cand), reinterpret_cast<double*>(cand + NB / 2), false};
        const ZKeys zk{rc};
        double norm = total;
        Sel last{false, 0, -1, 0, 0};  // the kept set's last element, if a cut found it
        if (topk > 0) {
          const Sel s = select_desc(zk, V, (double)nk, false, false, cnt, dm, sh, &l0);
          if (s.found) {
            norm = s.mass;
            if (s.count == nk) last = s;
          }
        }
        long long n = nk;
        if (minp > 0.f && nminp < n) {
          n = max(1, nminp);
          last.found = false;
        }
        if (topp < 1.f) {
          const Sel s = select_desc(zk, V, (double)topp * norm, true, false, cnt, dm, sh, &l0);
          if (s.found && s.count < n) {
            n = s.count;
            last = s;
          }
        }
        if (!(last.found && last.count == n)) last = select_desc(zk, V, (double)n, false, false, cnt, dm, sh, &l0);
        const double mass = last.mass;
        const Sel d = select_desc(zk, V, U * mass, true, true, cnt, dm, sh, &l0);
        if (d.found && d.count <= n) {
          token = d.id;
        } else {
          token = last.id;
        }
        if (token < 0) bad = true;
      }
    }
  }

  // ---- 4. log-probs ----
  const int N = min(ntop, nraw_all);
  if (N > 0) {
    const RawKeys rk{x};
    const Sel s = select_desc(rk, V, (double)N, false, false, cnt, dm, sh);
    if (tid == 0) sh.ntop = 0;
    __syncthreads();
    if (s.found && s.id >= 0) {
      for (int i = tid; i < V; i += NT) {
        uint32_t k;
        if (rk.get(i, k) && (k > s.key || (k == s.key && i <= s.id))) {
          const int p = atomicAdd(&sh.ntop, 1);
          if (p < 32) sh.top[p] = ((uint64_t)k << 32) | (uint64_t)(~(uint32_t)i);
        }
      }
    }
    __syncthreads();
    if (tid == 0) {
      const int c = min(sh.ntop, N);
      if (sh.ntop != N) bad = true;
      for (int a = 1; a < c; a++) {
        const uint64_t v = sh.top[a];
        int b = a - 1;
        while (b >= 0 && sh.top[b] < v) {
          sh.top[b + 1] = sh.top[b];
          b--;
        }
        sh.top[b + 1] = v;
      }
      for (int a = 0; a < c; a++) {
        const int id = (int)(~(uint32_t)(sh.top[a] & 0xffffffffu));
        o[3 + a] = id;
        o[3 + MK_SAMPLE_MAX_TOP + a] = __float_as_int((float)((double)x[id] - lse));
      }
      o[2] = c;
    }
  } else if (tid == 0) {
    o[2] = 0;
  }
  if (tid == 0) {
    if (bad || token < 0 || token >= V) {
      o[0] = -2;
      o[1] = 0;
    } else {
      o[0] = token;
      o[1] = __float_as_int((float)((double)x[token] - lse));
    }
  }
}

// ---- greedy rows without penalties or alternatives, split over CTAs ----
//
// Pass 1 of sample_rows is all such a row needs (the argmax, lowest id on
// ties, and the log-sum-exp for its log-probability), but one block per row
// streams the row through one SM: 41 µs for Qwen3's 151 936 logits at batch
// 1, where the bytes take ~1 µs of HBM time (eleventh pass). Here GS_NT
// threads of each of `splits` CTAs reduce GS_CHUNK logits of a row each
// (max, its first index, sum of exp, NaN flag, the same formulas as pass 1)
// and greedy_finish combines a row's partials (sums in float64).

constexpr int GS_NT = 256;
constexpr int GS_CHUNK = GS_NT * PF;  // logits a CTA reduces: one batch of loads a thread

struct GreedyPart {
  float max;    // of the non-NaN logits (-inf: none, or all -inf)
  int idx;      // first index of max (-1: no non-NaN logit)
  int nan;      // a NaN seen
  int pad;
  double sum;   // Σ exp(x - max) over the chunk (0 when max is -inf)
};

__global__ void __launch_bounds__(GS_NT) greedy_split(const float* __restrict__ logits, int V, int splits,
                                                      GreedyPart* __restrict__ parts) {
  __shared__ float red_f[GS_NT / 32];
  __shared__ int red_i[GS_NT / 32];
  __shared__ double red_d[GS_NT / 32];
  const int row = blockIdx.y, sp = blockIdx.x, tid = threadIdx.x;
  const float* x = logits + (int64_t)row * V;
  const int lo = sp * GS_CHUNK;
  float v[PF];
#pragma unroll
  for (int u = 0; u < PF; u++) {
    const int i = lo + u * GS_NT + tid;
    v[u] = i < V ? __ldg(x + i) : NAN;
  }
  float rmax = -INFINITY, rsum = 0.f;
  int rnan = 0, idx = -1;
#pragma unroll
  for (int u = 0; u < PF; u++) {
    const int i = lo + u * GS_NT + tid;
    const float y = v[u];
    if (i >= V) continue;
    if (y != y) {
      rnan = 1;
      continue;
    }
    if (idx < 0 || y > rmax) idx = i;  // (indices rise with u: the first of equal values stays)
    if (y > rmax) {
      rsum = rsum * expf(rmax - y) + 1.f;
      rmax = y;
    } else if (y != -INFINITY) {
      rsum += expf(y - rmax);
    }
  }
  // Block reductions (warp shuffles, then one warp over the warps).
  const int lane = tid & 31, w = tid >> 5;
  auto all_max = [&](float a) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(FULL, a, o));
    if (lane == 0) red_f[w] = a;
    __syncthreads();
    float r = red_f[0];
    for (int k = 1; k < GS_NT / 32; k++) r = fmaxf(r, red_f[k]);
    __syncthreads();
    return r;
  };
  const float bmax = all_max(rmax);
  double part = (rmax == -INFINITY || bmax == -INFINITY) ? 0.0 : (double)rsum * exp((double)rmax - (double)bmax);
  int cand = (idx >= 0 && rmax == bmax) ? idx : 0x7fffffff;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    part += __shfl_xor_sync(FULL, part, o);
    cand = min(cand, __shfl_xor_sync(FULL, cand, o));
    rnan |= __shfl_xor_sync(FULL, rnan, o);
  }
  if (lane == 0) {
    red_d[w] = part;
    red_i[w] = cand;
  }
  const int anynan = __syncthreads_or(rnan);
  if (tid == 0) {
    double sum = 0;
    int best = 0x7fffffff;
    for (int k = 0; k < GS_NT / 32; k++) {
      sum += red_d[k];
      best = min(best, red_i[k]);
    }
    GreedyPart g;
    g.max = bmax;
    g.idx = best == 0x7fffffff ? -1 : best;
    g.nan = anynan;
    g.pad = 0;
    g.sum = sum;
    parts[(int64_t)row * splits + sp] = g;
  }
}

// One warp a row: the row's token (the first index of its max; 0 when every
// logit is NaN) and its log-probability (NaN when a logit is NaN or the max
// is not finite), in sample_rows' result words (no alternatives).
// RowPick is a row's combined partials: the greedy token (first index of
// the max; 0 when every logit is NaN), the max, whether it has a non-NaN
// logit, and the log-sum-exp (NaN when a logit is NaN or the max is not
// finite).
struct RowPick {
  int greedy, anyw;
  float gmax;
  double lse;
};

// combine_parts reduces a row's splits partials with one warp (every lane
// gets the answer).
__device__ RowPick combine_parts(const GreedyPart* __restrict__ p, int splits, int lane) {
  float gmax = -INFINITY;
  int anyw = 0, nan = 0;
  for (int k = lane; k < splits; k += 32) {
    gmax = fmaxf(gmax, p[k].max);
    anyw |= p[k].idx >= 0;
    nan |= p[k].nan;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    gmax = fmaxf(gmax, __shfl_xor_sync(FULL, gmax, o));
    anyw |= __shfl_xor_sync(FULL, anyw, o);
    nan |= __shfl_xor_sync(FULL, nan, o);
  }
  double rs = 0;
  int best = 0x7fffffff;
  for (int k = lane; k < splits; k += 32) {
    const GreedyPart q = p[k];
    if (q.max != -INFINITY && gmax != -INFINITY) rs += q.sum * exp((double)q.max - (double)gmax);
    if (q.idx >= 0 && q.max == gmax) best = min(best, q.idx);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    rs += __shfl_xor_sync(FULL, rs, o);
    best = min(best, __shfl_xor_sync(FULL, best, o));
  }
  RowPick r;
  r.greedy = anyw ? best : 0;
  r.anyw = anyw;
  r.gmax = gmax;
  r.lse = (!nan && isfinite(gmax)) ? (double)gmax + log(rs) : (double)NAN;
  return r;
}

__global__ void greedy_finish(const float* __restrict__ logits, int V, int splits,
                              const GreedyPart* __restrict__ parts, int32_t* __restrict__ out) {
  const int row = blockIdx.x, lane = threadIdx.x;
  const RowPick r = combine_parts(parts + (int64_t)row * splits, splits, lane);
  if (lane == 0) {
    int32_t* o = out + (int64_t)row * MK_SAMPLE_RESULT_WORDS;
    o[0] = r.greedy;
    o[1] = __float_as_int((float)((double)logits[(int64_t)row * V + r.greedy] - r.lse));
    o[2] = 0;
  }
}

// ---- rows that draw over the whole vocabulary, split over CTAs ----
//
// A row with temperature > 0 and no top-k, top-p, min-p, penalties or
// alternatives draws the first token, in id order, where the running sum of
// q = exp(z), z = (w − max)/T, exceeds U · (the total) (drawAll). After
// greedy_split's partials (the max), draw_split sums q over each chunk and
// draw_finish picks the chunk where the running sum of the chunk sums
// crosses U · total (in chunk order, float64), then walks that chunk in id
// order with one block. Greedy rows in the same call are answered as by
// greedy_finish. Sums are ordered differently from the host's sequential
// one, so a draw within rounding of a boundary may pick the neighbour, as
// sample_rows' block scans may.
//
// A row with top-k (1 ≤ k ≤ kk, the call's candidates per chunk; top-p and
// min-p allowed) needs only its k most likely tokens: draw_split sorts each
// chunk's keys (fkey(z) << 32 | ~id, 0 for z ≤ −40 or NaN) in shared memory
// and keeps the chunk's first kk, and topk_finish sorts a row's splits · kk
// candidates and runs sample_rows' kept-set rules and draw on the first k
// (pick_sorted): the order and formulas of sample_rows' fast path, which
// one block a row ran over the whole vocabulary (passes over Qwen3's
// 151 936 logits through one SM).

__device__ __forceinline__ float row_max(const GreedyPart* p, int splits, float* red) {
  float m = -INFINITY;
  for (int k = threadIdx.x; k < splits; k += blockDim.x) m = fmaxf(m, p[k].max);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(FULL, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  float r = red[0];
  for (int k = 1; k < (int)(blockDim.x >> 5); k++) r = fmaxf(r, red[k]);
  __syncthreads();
  return r;
}

// zq is q = exp(z) for z = float32((w − max)·inv) > −40 (as the host), else 0.
__device__ __forceinline__ double zq(float w, float maxw, float inv) {
  const float z = zf(w, maxw, inv);
  return z > -40.f ? exp((double)z) : 0.0;  // (false for NaN)
}

// cut_row says whether a row header asks for top-p or min-p without top-k
// (the split kernels' "cut" rows: their kept set is found among the
// candidates when it is small, else sample_rows answers the row).
__device__ __forceinline__ bool cut_row(const int32_t* m) {
  return m[1] <= 0 && (__int_as_float(m[2]) < 1.f || __int_as_float(m[3]) > 0.f);
}

// chunk_top writes the kk first keys (fkey(z) << 32 | ~id, z > −40; 0 past
// them) of logits [lo, lo + GS_CHUNK) in the order (z desc, id asc) to c,
// with the block's GS_NT threads: a histogram of −z over sample_rows' NB
// linear bins finds the bin where the count from the top reaches kk; only
// the elements up to that bin (as few as kk, all 2048 when their z are
// within one bin) are sorted in ck (shared memory, GS_CHUNK keys). A full
// sort of every chunk took ~10 µs of a CTA and 100 µs of the GPU at 32
// rows of Qwen3's vocabulary.
__device__ void chunk_top(const float* __restrict__ x, int V, int lo, float maxw, float inv, int kk, uint64_t* ck,
                          uint64_t* __restrict__ c) {
  __shared__ uint32_t hist[NB];
  __shared__ int wsum[GS_NT / 32], wmin[GS_NT / 32], s_cnt;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  constexpr int BPT = NB / GS_NT;  // bins a thread scans
  for (int b = tid; b < NB; b += GS_NT) hist[b] = 0;
  if (tid == 0) s_cnt = 0;
  float z[PF];
  __syncthreads();
#pragma unroll
  for (int u = 0; u < PF; u++) {
    const int i = lo + u * GS_NT + tid;
    z[u] = i < V ? zf(__ldg(x + i), maxw, inv) : -INFINITY;
    if (z[u] > -40.f) atomicAdd(&hist[min(NB - 1, (int)(-z[u] * ZBIN))], 1u);
  }
  __syncthreads();
  // The first bin (from the top) where the running count reaches kk: an
  // exclusive scan of the threads' BPT-bin sums, then each thread's bins.
  int mine = 0;
#pragma unroll
  for (int k = 0; k < BPT; k++) mine += (int)hist[tid * BPT + k];
  int inc = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(FULL, inc, o);
    if (lane >= o) inc += y;
  }
  if (lane == 31) wsum[w] = inc;
  __syncthreads();
  int run = inc - mine;
  for (int k = 0; k < w; k++) run += wsum[k];
  int cut = NB - 1;
#pragma unroll
  for (int k = 0; k < BPT; k++) {
    run += (int)hist[tid * BPT + k];
    if (run >= kk) {
      cut = tid * BPT + k;
      break;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) cut = min(cut, __shfl_xor_sync(FULL, cut, o));
  if (lane == 0) wmin[w] = cut;
  __syncthreads();
  for (int k = 0; k < GS_NT / 32; k++) cut = min(cut, wmin[k]);
  // The elements up to the cut, in any order, then sorted.
#pragma unroll
  for (int u = 0; u < PF; u++) {
    if (z[u] > -40.f && min(NB - 1, (int)(-z[u] * ZBIN)) <= cut) {
      const int i = lo + u * GS_NT + tid;
      ck[atomicAdd(&s_cnt, 1)] = ((uint64_t)fkey(z[u]) << 32) | (uint64_t)(~(uint32_t)i);
    }
  }
  __syncthreads();
  const int n = s_cnt;
  int P = 2;
  while (P < n) P <<= 1;
  for (int j = n + tid; j < P; j += GS_NT) ck[j] = 0ull;
  __syncthreads();
  bitonic_desc(ck, P);
  for (int j = tid; j < kk; j += GS_NT) c[j] = j < P ? ck[j] : 0ull;
}

__global__ void __launch_bounds__(GS_NT) draw_split(const float* __restrict__ logits, int V, int splits,
                                                    const int32_t* __restrict__ meta,
                                                    const GreedyPart* __restrict__ parts, double* __restrict__ sums,
                                                    uint64_t* __restrict__ cands, int kk) {
  __shared__ float red_f[GS_NT / 32];
  __shared__ double red_d[GS_NT / 32];
  __shared__ uint64_t ck[GS_CHUNK];  // top-k rows: the chunk's keys
  const int row = blockIdx.y, sp = blockIdx.x, tid = threadIdx.x;
  const float T = __int_as_float(meta[(int64_t)row * MK_SAMPLE_META_WORDS]);
  const int topk = meta[(int64_t)row * MK_SAMPLE_META_WORDS + 1];
  const float maxw = row_max(parts + (int64_t)row * splits, splits, red_f);
  if (!(T > 0.f) || maxw == -INFINITY || maxw != maxw) {  // greedy, or nothing to draw from
    if (tid == 0) sums[(int64_t)row * splits + sp] = 0.0;
    return;
  }
  const float inv = __fdiv_rn(1.f, T);
  const float* x = logits + (int64_t)row * V;
  const bool cut = kk > 0 && cut_row(meta + (int64_t)row * MK_SAMPLE_META_WORDS);
  if ((topk > 0 && kk > 0) || cut) {  // the chunk's kk most likely tokens, sorted
    chunk_top(x, V, sp * GS_CHUNK, maxw, inv, kk, ck, cands + ((int64_t)row * splits + sp) * kk);
    if (!cut) return;  // a cut row also needs the chunk's mass (below)
  }
  double q = 0;
#pragma unroll
  for (int u = 0; u < PF; u++) {
    const int i = sp * GS_CHUNK + u * GS_NT + tid;
    if (i < V) q += zq(__ldg(x + i), maxw, inv);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(FULL, q, o);
  if ((tid & 31) == 0) red_d[tid >> 5] = q;
  __syncthreads();
  if (tid == 0) {
    double t = 0;
    for (int k = 0; k < GS_NT / 32; k++) t += red_d[k];
    sums[(int64_t)row * splits + sp] = t;
  }
}

// One block a row: greedy_finish's token and log-probability for greedy
// rows (and rows with nothing to draw from), else the drawn token.
__global__ void __launch_bounds__(GS_NT) draw_finish(const float* __restrict__ logits, int V, int splits,
                                                     const int32_t* __restrict__ meta,
                                                     const GreedyPart* __restrict__ parts,
                                                     const double* __restrict__ sums, int kk,
                                                     int32_t* __restrict__ out, int32_t* __restrict__ need) {
  __shared__ int s_chunk, s_pick, s_greedy;
  __shared__ double s_before, s_u, s_lse;
  __shared__ float red_f[GS_NT / 32];
  __shared__ double red_d[GS_NT / 32];
  const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const GreedyPart* p = parts + (int64_t)row * splits;
  const double* cs = sums + (int64_t)row * splits;
  const int32_t* m = meta + (int64_t)row * MK_SAMPLE_META_WORDS;
  const float* x = logits + (int64_t)row * V;
  const float T = __int_as_float(m[0]);
  const double U = __hiloint2double(m[13], m[12]);
  if (need != nullptr && tid == 0) need[row] = 0;  // (topk_finish may set it)
  if (kk > 0 && T > 0.f && (m[1] > 0 || cut_row(m))) return;  // topk_finish answers it
  RowPick rp{};
  if (w == 0) rp = combine_parts(p, splits, lane);  // the greedy answer and the log-sum-exp
  if (tid == 0) {
    const int anyw = rp.anyw;
    const float gmax = rp.gmax;
    s_greedy = rp.greedy;
    s_lse = rp.lse;
    // The chunk where the running sum of the chunk sums crosses U · total
    // (-1: greedy, or nothing to draw from); if rounding never crosses, the
    // last chunk with mass.
    int chunk = -1;
    double before = 0, u = 0;
    if (T > 0.f && anyw && gmax != -INFINITY) {
      double total = 0;
      for (int k = 0; k < splits; k++) total += cs[k];
      u = U * total;
      double run = 0, last_before = 0;
      for (int k = 0; k < splits && total > 0; k++) {
        if (cs[k] > 0) {
          chunk = k;
          last_before = run;
          if (run + cs[k] > u) break;
        }
        run += cs[k];
      }
      before = last_before;
    }
    s_chunk = chunk;
    s_before = before;
    s_u = u;
    s_pick = 0x7fffffff;
  }
  __syncthreads();
  const int chunk = s_chunk;
  if (chunk >= 0) {
    // Walk the chunk in id order: thread t holds ids chunk·GS_CHUNK + 8t .. 8t+7.
    const float maxw = row_max(p, splits, red_f);
    const float inv = __fdiv_rn(1.f, T);
    const int i0 = chunk * GS_CHUNK + PF * tid;
    double q[PF], sq = 0;
#pragma unroll
    for (int e = 0; e < PF; e++) {
      q[e] = i0 + e < V ? zq(x[i0 + e], maxw, inv) : 0.0;
      sq += q[e];
    }
    double xs = sq;  // inclusive scan within the warp, then over the warps
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(FULL, xs, o);
      if (lane >= o) xs += y;
    }
    if (lane == 31) red_d[w] = xs;
    __syncthreads();
    double base = 0;
    for (int k = 0; k < w; k++) base += red_d[k];
    const double before = s_before + base + xs - sq, u = s_u;
    if (sq > 0 && !(before > u) && before + sq > u) {
      double run = before;
      int pick = -1;
      for (int e = 0; e < PF; e++) {
        run += q[e];
        if (q[e] > 0) {
          pick = i0 + e;
          if (run > u) break;
        }
      }
      if (pick >= 0) atomicMin(&s_pick, pick);  // (one thread crosses; the first in id order if rounding made more)
    }
    __syncthreads();
    if (tid == 0 && s_pick == 0x7fffffff) {  // rounding never crossed: the chunk's last token with mass
      for (int i = min(V, (chunk + 1) * GS_CHUNK) - 1; i >= chunk * GS_CHUNK; i--)
        if (zq(x[i], maxw, inv) > 0) {
          s_pick = i;
          break;
        }
    }
    __syncthreads();
  }
  if (tid == 0) {
    int32_t* o = out + (int64_t)row * MK_SAMPLE_RESULT_WORDS;
    const int token = s_pick != 0x7fffffff ? s_pick : s_greedy;
    o[0] = token;
    o[1] = __float_as_int((float)((double)x[token] - s_lse));
    o[2] = 0;
  }
}

// One block of NT threads a top-k row of the call (others return): the
// row's splits · kk candidates (draw_split) sorted, then pick_sorted on
// them with the row's top-k, top-p and min-p; the greedy token where
// nothing can be drawn (as draw_finish); -2 (bad) for a top-k above kk.
__global__ void __launch_bounds__(NT, 1) topk_finish(const float* __restrict__ logits, int V, int splits,
                                                     const int32_t* __restrict__ meta,
                                                     const GreedyPart* __restrict__ parts,
                                                     const uint64_t* __restrict__ cands, int kk,
                                                     const double* __restrict__ sums, int32_t* __restrict__ out,
                                                     int32_t* __restrict__ need) {
  __shared__ Shared sh;
  __shared__ uint64_t c[CAP];
  __shared__ int s_greedy, s_go;
  __shared__ double s_lse, s_total;
  __shared__ unsigned long long s_bound;
  const int row = blockIdx.x, tid = threadIdx.x;
  const int32_t* m = meta + (int64_t)row * MK_SAMPLE_META_WORDS;
  const float T = __int_as_float(m[0]);
  const int topk = m[1];
  const bool cut = cut_row(m) && need != nullptr;
  if (!(T > 0.f) || (topk <= 0 && !cut)) return;  // draw_finish answers it
  const float topp = __int_as_float(m[2]), minp = __int_as_float(m[3]);
  const double U = __hiloint2double(m[13], m[12]);
  const float* x = logits + (int64_t)row * V;
  if (tid < 32) {
    const RowPick rp = combine_parts(parts + (int64_t)row * splits, splits, tid);
    if (tid == 0) {
      s_greedy = rp.greedy;
      s_lse = rp.lse;
      s_go = rp.anyw && rp.gmax != -INFINITY && rp.gmax == rp.gmax;
      double t = 0;  // a cut row's total mass, in chunk order (draw_finish's sum)
      if (cut)
        for (int k = 0; k < splits; k++) t += sums[(int64_t)row * splits + k];
      s_total = t;
    }
  }
  __syncthreads();
  int token = s_greedy;
  bool inside = true;
  const bool bad = topk > kk;
  const int n = splits * kk;  // ≤ CAP (mk_sample_draw_f32)
  if (s_go && !bad) {
    int P = 2;
    while (P < n) P <<= 1;
    const uint64_t* src = cands + (int64_t)row * n;
    if (cut) {
      // pick_sorted's bound: the largest of the full chunks' last (kk-th)
      // candidates; a chunk's other tokens rank below its kk candidates.
      if (tid == 0) s_bound = kNoneOutside;
      __syncthreads();
      for (int k = tid; k < splits; k += NT) {
        const unsigned long long last = src[(int64_t)k * kk + kk - 1];
        if (last != 0ull) atomicMax(&s_bound, last);
      }
    }
    for (int j = tid; j < P; j += NT) c[j] = j < n ? src[j] : 0ull;
    __syncthreads();
    bitonic_desc(c, P);
    int have = 0;  // candidates with mass (keys > 0: first in the order)
    for (int j = tid; j < P; j += NT) have += c[j] != 0ull;
    const int nc = block_all<int>(have, Sum{}, sh.red_i);
    if (nc > 0) {
      if (cut)  // the kept set is inside the candidates only when min-p or top-p cuts them
        inside = pick_sorted(c, nc, 0x7fffffff, 0, topp, minp, false, s_total, U, sh, &token, s_bound);
      else
        pick_sorted(c, nc, topk, topk, topp, minp, true, 0.0, U, sh, &token);
    }
  }
  if (!inside) {  // sample_rows answers the row (mk_sample_draw_f32 launches it)
    if (tid == 0) need[row] = 1;
    return;
  }
  if (tid == 0) {
    int32_t* o = out + (int64_t)row * MK_SAMPLE_RESULT_WORDS;
    if (bad) {
      o[0] = -2;
      o[1] = 0;
    } else {
      o[0] = token;
      o[1] = __float_as_int((float)((double)x[token] - s_lse));
    }
    o[2] = 0;
  }
}

}  // namespace

extern "C" MK_API int32_t mk_sample_greedy_f32(uint64_t stream, uint64_t out, uint64_t logits, uint64_t work,
                                               int64_t rows, int64_t vocab) {
  MK_THREAD("mk_sample_greedy_f32");
  MK_ARG(out != 0 && logits != 0 && work != 0, "mk_sample_greedy_f32: null pointer");
  MK_ARG(rows >= 1 && rows <= 65535, "mk_sample_greedy_f32: rows = %lld, want [1, 65535]", (long long)rows);
  MK_ARG(vocab >= 1 && vocab <= MAXV, "mk_sample_greedy_f32: vocab = %lld, want [1, %d]", (long long)vocab, MAXV);
  const int splits = (int)((vocab + GS_CHUNK - 1) / GS_CHUNK);
  cudaStream_t s = mk::as_stream(stream);
  greedy_split<<<dim3((unsigned)splits, (unsigned)rows), GS_NT, 0, s>>>(mk::dev<const float>(logits), (int)vocab,
                                                                      splits, mk::dev<GreedyPart>(work));
  greedy_finish<<<(unsigned)rows, 32, 0, s>>>(mk::dev<const float>(logits), (int)vocab, splits,
                                              mk::dev<const GreedyPart>(work), mk::dev<int32_t>(out));
  MK_LAUNCHED("sample_greedy");
  return MK_OK;
}

// draw_kk is the candidates a chunk keeps for a call whose largest top-k
// is kmax (0: none).
static int draw_kk(int64_t kmax) { return (int)std::min<int64_t>(kmax, GS_CHUNK); }

extern "C" MK_API int32_t mk_sample_draw_kmax(int64_t vocab) {
  const int64_t splits = (std::max<int64_t>(vocab, 1) + GS_CHUNK - 1) / GS_CHUNK;
  return (int32_t)std::min<int64_t>(CAP / splits, GS_CHUNK);
}

// rows_smem readies sample_rows for vocab logits a row: its dynamic shared
// memory (the fixed part and the penalty bitmap), opted in once per size.
static int rows_smem(int64_t vocab, size_t* smem) {
  *smem = SM_BITS + (size_t)((vocab + 31) / 32) * 4;
  static size_t opted = 0;
  if (*smem > opted) {
    MK_CUDA(cudaFuncSetAttribute(sample_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)*smem));
    opted = *smem;
  }
  return MK_OK;
}

extern "C" MK_API int32_t mk_sample_draw_f32(uint64_t stream, uint64_t out, uint64_t logits, uint64_t meta,
                                             int64_t meta_words, uint64_t work, int64_t rows, int64_t vocab,
                                             int64_t kmax, int32_t cuts) {
  MK_THREAD("mk_sample_draw_f32");
  MK_ARG(out != 0 && logits != 0 && meta != 0 && work != 0, "mk_sample_draw_f32: null pointer");
  MK_ARG(rows >= 1 && rows <= 65535, "mk_sample_draw_f32: rows = %lld, want [1, 65535]", (long long)rows);
  MK_ARG(vocab >= 1 && vocab <= MAXV, "mk_sample_draw_f32: vocab = %lld, want [1, %d]", (long long)vocab, MAXV);
  MK_ARG(meta_words >= rows * MK_SAMPLE_META_WORDS, "mk_sample_draw_f32: %lld metadata words for %lld rows",
         (long long)meta_words, (long long)rows);
  MK_ARG(kmax >= 0 && kmax <= mk_sample_draw_kmax(vocab), "mk_sample_draw_f32: top-k up to %lld, at most %d for vocab %lld",
         (long long)kmax, mk_sample_draw_kmax(vocab), (long long)vocab);
  const int splits = (int)((vocab + GS_CHUNK - 1) / GS_CHUNK), kk = draw_kk(kmax);
  GreedyPart* parts = mk::dev<GreedyPart>(work);
  double* sums = reinterpret_cast<double*>(parts + rows * splits);
  uint64_t* cands = reinterpret_cast<uint64_t*>(sums + rows * splits);
  int32_t* need = cuts ? reinterpret_cast<int32_t*>(cands + rows * splits * kk) : nullptr;
  MK_ARG(!cuts || kk > 0, "mk_sample_draw_f32: rows with top-p or min-p without top-k need kmax > 0");
  size_t smem = 0;
  if (cuts) {
    const int rc = rows_smem(vocab, &smem);
    if (rc != MK_OK) return rc;
  }
  cudaStream_t s = mk::as_stream(stream);
  const int32_t* m = mk::dev<const int32_t>(meta);
  const float* x = mk::dev<const float>(logits);
  int32_t* o = mk::dev<int32_t>(out);
  greedy_split<<<dim3((unsigned)splits, (unsigned)rows), GS_NT, 0, s>>>(x, (int)vocab, splits, parts);
  draw_split<<<dim3((unsigned)splits, (unsigned)rows), GS_NT, 0, s>>>(x, (int)vocab, splits, m, parts, sums, cands, kk);
  draw_finish<<<(unsigned)rows, GS_NT, 0, s>>>(x, (int)vocab, splits, m, parts, sums, kk, o, need);
  if (kk > 0) topk_finish<<<(unsigned)rows, NT, 0, s>>>(x, (int)vocab, splits, m, parts, cands, kk, sums, o, need);
  if (cuts)  // cut rows whose kept set was not inside their candidates
    sample_rows<<<(unsigned)rows, NT, smem, s>>>(x, vocab, m, meta_words, nullptr, o, need);
  MK_LAUNCHED("sample_draw");
  return MK_OK;
}

extern "C" MK_API int64_t mk_sample_draw_work(int64_t rows, int64_t vocab, int64_t kmax) {
  const int64_t splits = (vocab + GS_CHUNK - 1) / GS_CHUNK;
  return rows * splits * (int64_t)(sizeof(GreedyPart) + sizeof(double) + (size_t)draw_kk(kmax) * sizeof(uint64_t)) +
         rows * (int64_t)sizeof(int32_t);  // need: the cut rows sample_rows answers
}

extern "C" MK_API int64_t mk_sample_greedy_work(int64_t rows, int64_t vocab) {
  return rows * ((vocab + GS_CHUNK - 1) / GS_CHUNK) * (int64_t)sizeof(GreedyPart);
}

extern "C" MK_API int32_t mk_sample_f32(uint64_t stream, uint64_t out, uint64_t logits, uint64_t meta,
                                        int64_t meta_words, uint64_t scratch, int64_t rows, int64_t vocab) {
  MK_THREAD("mk_sample_f32");
  MK_ARG(out != 0 && logits != 0 && meta != 0, "mk_sample_f32: null pointer (out %llu, logits %llu, meta %llu)",
         (unsigned long long)out, (unsigned long long)logits, (unsigned long long)meta);
  MK_ARG(rows >= 1 && rows <= 0x7fffffff, "mk_sample_f32: rows = %lld, want [1, 2^31)", (long long)rows);
  MK_ARG(vocab >= 1 && vocab <= MAXV, "mk_sample_f32: vocab = %lld, want [1, %d]", (long long)vocab, MAXV);
  MK_ARG(meta_words >= rows * MK_SAMPLE_META_WORDS && meta_words <= 0x7fffffff,
         "mk_sample_f32: meta holds %lld words, %lld rows need at least %lld (and < 2^31)", (long long)meta_words,
         (long long)rows, (long long)rows * MK_SAMPLE_META_WORDS);
  size_t smem = 0;
  const int rc = rows_smem(vocab, &smem);
  if (rc != MK_OK) return rc;
  sample_rows<<<(unsigned)rows, NT, smem, mk::as_stream(stream)>>>(
      mk::dev<const float>(logits), vocab, mk::dev<const int32_t>(meta), meta_words, mk::dev<float>(scratch),
      mk::dev<int32_t>(out), nullptr);
  MK_LAUNCHED("sample_rows");
  return MK_OK;
}

namespace {

constexpr int PROC_CHUNK = 8192;  // tokens a CTA of logits_process covers
constexpr int PROC_NT = 256;

// logits_process: blockIdx.y a listed row, blockIdx.x a chunk of its
// tokens. The bias goes first (each CTA adds the entries in its chunk),
// then the mask; the barrier keeps a thread's bias add from racing another
// thread's -inf on the same token.
__global__ void __launch_bounds__(PROC_NT) logits_process(float* __restrict__ logits, int64_t vocab,
                                                          const int32_t* __restrict__ proc) {
  const int32_t* h = proc + 4 * blockIdx.y;
  const int row = h[0], moff = h[1], boff = h[2], bn = h[3];
  float* x = logits + (int64_t)row * vocab;
  const int64_t lo = (int64_t)blockIdx.x * PROC_CHUNK, hi = min(lo + PROC_CHUNK, vocab);
  for (int b = threadIdx.x; b < bn; b += PROC_NT) {
    const int t = proc[boff + b];
    if (t >= lo && t < hi) x[t] += __int_as_float(proc[boff + bn + b]);
  }
  __syncthreads();
  if (moff < 0) return;
  const uint32_t* m = reinterpret_cast<const uint32_t*>(proc + moff);
  for (int64_t t = lo + threadIdx.x; t < hi; t += PROC_NT)
    if (!((m[t >> 5] >> (t & 31)) & 1u)) x[t] = -INFINITY;
}

}  // namespace

extern "C" MK_API int32_t mk_logits_process_f32(uint64_t stream, uint64_t logits, uint64_t proc, int64_t proc_words,
                                                int64_t nproc, int64_t rows, int64_t vocab) {
  MK_THREAD("mk_logits_process_f32");
  MK_ARG(logits != 0 && proc != 0, "mk_logits_process_f32: null pointer");
  MK_ARG(vocab >= 1 && vocab <= MAXV, "mk_logits_process_f32: vocab = %lld, want [1, %d]", (long long)vocab, MAXV);
  MK_ARG(nproc >= 1 && nproc <= rows && nproc <= 65535, "mk_logits_process_f32: %lld rows listed of %lld (at most 65535)",
         (long long)nproc, (long long)rows);
  MK_ARG(proc_words >= 4 * nproc && proc_words <= 0x7fffffff, "mk_logits_process_f32: %lld words for %lld rows",
         (long long)proc_words, (long long)nproc);
  const unsigned chunks = (unsigned)((vocab + PROC_CHUNK - 1) / PROC_CHUNK);
  logits_process<<<dim3(chunks, (unsigned)nproc), PROC_NT, 0, mk::as_stream(stream)>>>(mk::dev<float>(logits), vocab,
                                                                                      mk::dev<const int32_t>(proc));
  MK_LAUNCHED("logits_process");
  return MK_OK;
}
