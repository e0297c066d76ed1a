// flash.cu — FlashAttention-2 style prefill attention on bf16 tensor cores
// (mk_flash_attn_bf16, see mk_flash.h).
//
// One thread block (4 warps) owns BM = 64*MT query rows of one sequence:
// rph consecutive query positions of hpb query heads that share a kv head
// (hpb = 4, 2 or 1 by the GQA ratio, rph = BM/hpb), so each K/V tile it
// loads serves hpb heads. It walks the key/value tiles (BN = 64 keys) that
// the causal/window mask leaves, loading them with cp.async into a 2-stage
// shared-memory ring (tile it+1 lands while tile it is computed; one barrier
// per tile; XOR-swizzled 16-byte chunks, so that ldmatrix reads are free of
// bank conflicts), and per tile
//   S = Q·Kᵀ   mma.sync m16n8k16 bf16 → f32, Q and K through ldmatrix;
//   online softmax in registers: exp2 of S·(scale·log2 e) − running max,
//              the max raised lazily so most tiles skip rescaling O;
//   O += P·V   P re-packed from the S accumulators as the A operand, V
//              through ldmatrix.trans.
// Each warp owns 16*MT rows; with MT = 2 every K/V fragment read from shared
// memory feeds two MMAs. Only tiles that cross the diagonal, the window's
// start or the end of the keys apply a mask; tiles wholly outside are never
// loaded. Blocks are issued heaviest (last) query tile first. 128-row
// tiles (MT = 2) when they fill two blocks per multiprocessor, else 64.
//
// Head dims are padded to 32, 64, 128, 192 or 256 in shared memory with
// zeros (zero Q/K columns add nothing to S, zero V columns are not stored).
#include <cmath>

#include "attn_tile.cuh"
#include "flash_wg.cuh"
#include "wgmma.cuh"

namespace {

struct Params {
  void* out;
  const bf16* q;
  const bf16* k;
  const bf16* v;
  const int* q_start;
  const int* past;
  const int* table;
  const int* blocks;
  const float* sinks;
  int64_t q_stride, k_stride, v_stride, o_stride;  // elements per row
  int block_size, heads, group, hd, vhd, window, causal, out_f32, vec, ovec;
  int hpb, rph_log2;  // query heads per block (one GQA group's), log2 of rows per head
  int bs_log2;        // log2(block_size) when it is a power of two, else -1 (flash_wg's lookups)
  int rescale_all;    // flash_wg: rescale O every tile (MK_FLASH_RESCALE_ALL=1), not only where a maximum moved
  int tma;            // flash_wg at 128: whole key tiles by TMA (its km / vm maps), else cp.async
  float scale_log2;
};

template <int D, int DV, int MT>
__global__ void __launch_bounds__(kThreads, 2) flash_fwd(const Params p) {
  using C = Cfg<D, DV, MT>;
  constexpr int BM = C::BM, NO = DV / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw);
  bf16* sk = sq + C::QE;              // kStages K tiles
  bf16* sv = sk + kStages * C::KE;    // kStages V tiles

  // The block's BM rows are hpb query heads of one kv head × rph positions:
  // row r is head h0 + r/rph at query row i0 + r%rph, so one K/V tile
  // feeds hpb heads (less L2 traffic under GQA).
  const int rph = 1 << p.rph_log2;
  const int h0 = blockIdx.x * p.hpb, b = blockIdx.y;
  const int tile = gridDim.z - 1 - blockIdx.z;  // heaviest (last) tiles first
  const int qs = p.q_start[b];
  const int L = p.q_start[b + 1] - qs;
  const int i0 = tile * rph;
  if (i0 >= L) return;
  const int P = p.past[b];
  const int nk = P + L;
  const int kvh = h0 / p.group;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int iend = min(i0 + rph, L);  // query rows i0..iend-1 are real

  const int kmax = p.causal ? P + iend - 1 : nk - 1;
  const int kmin = (p.causal && p.window > 0) ? max(0, P + i0 - p.window + 1) : 0;
  const int n_lo = kmin / kBN, n_hi = kmax / kBN;
  const int ntiles = n_hi - n_lo + 1;
  const bool vec = p.vec != 0;
  const int tb = p.table[b];

  // Q rows: BM rows over kThreads threads.
  {
    constexpr int TPR = kThreads / BM;
    const int row = tid / TPR, sub = tid % TPR;
    const int qi = i0 + (row & (rph - 1)), qh = h0 + (row >> p.rph_log2);
    const bf16* src = qi < L ? p.q + (int64_t)(qs + qi) * p.q_stride + (int64_t)qh * p.hd : nullptr;
    load_row<C::WQ>(sq, row, src, p.hd, sub, TPR, vec, p.q);
    cp_async_commit();
  }

  // K/V rows: 2 threads per key row, one block-table lookup each.
  constexpr int KTPR = kThreads / kBN;
  const int lrow = tid / KTPR, lsub = tid % KTPR;
  auto load_kv = [&](int n, int stage) {
    const int j = n * kBN + lrow;
    const bf16* ks = nullptr;
    const bf16* vs = nullptr;
    if (j < nk) {
      int64_t r;
      if (p.block_size > 0)
        r = (int64_t)p.blocks[tb + j / p.block_size] * p.block_size + j % p.block_size;
      else
        r = (int64_t)tb + j;
      ks = p.k + r * p.k_stride + (int64_t)kvh * p.hd;
      vs = p.v + r * p.v_stride + (int64_t)kvh * p.vhd;
    }
    load_row<C::WQ>(sk + stage * C::KE, lrow, ks, p.hd, lsub, KTPR, vec, p.k);
    load_row<C::WV>(sv + stage * C::VE, lrow, vs, p.vhd, lsub, KTPR, vec, p.v);
  };
  load_kv(n_lo, 0);
  cp_async_commit();

  float o[MT][NO][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int nt = 0; nt < NO; ++nt) o[mi][nt][0] = o[mi][nt][1] = o[mi][nt][2] = o[mi][nt][3] = 0.f;
    m[mi][0] = m[mi][1] = -INFINITY;
    l[mi][0] = l[mi][1] = 0.f;
  }
  const float sl2 = p.scale_log2;
  const int g = lane / 4, t4 = lane % 4;
  const int wrow = warp * 16 * MT;  // the warp's first row in the tile
  const TileAddr<D, DV, MT> ad(sq, sk, sv, wrow, lane);
  const TileRows tr{P + i0, P + iend, nk, rph};

  for (int it = 0; it < ntiles; ++it) {
    // Tile it has landed and every warp is done with tile it-1, whose stage
    // now takes tile it+1 (in flight while tile it is computed).
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < ntiles) load_kv(n_lo + it + 1, (it + 1) % kStages);
    cp_async_commit();
    const uint32_t koff = 2 * (it % kStages) * C::KE, voff = 2 * (it % kStages) * C::VE;
    attend_tile<D, DV, MT>(o, m, l, ad, koff, voff, (n_lo + it) * kBN, tr, p.causal, p.window, wrow, sl2);
  }
  cp_async_wait<0>();

  // Normalise (sinks join the denominator) and store.
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float ll = l[mi][hh];
      ll += __shfl_xor_sync(0xffffffffu, ll, 1);
      ll += __shfl_xor_sync(0xffffffffu, ll, 2);
      const int row = wrow + mi * 16 + g + hh * 8;
      const int h = h0 + (row >> p.rph_log2), i = i0 + (row & (rph - 1));
      float f = 1.f;
      if (p.sinks != nullptr) {
        const float sink2 = p.sinks[h] * kLog2e;
        const float mm = fmaxf(m[mi][hh], sink2);
        f = ex2(m[mi][hh] - mm);
        ll = ll * f + ex2(sink2 - mm);
      }
      const float inv = ll > 0.f ? f / ll : 0.f;
      if (i >= L) continue;
      const int64_t base = (int64_t)(qs + i) * p.o_stride + (int64_t)h * p.vhd;
#pragma unroll
      for (int nt = 0; nt < NO; ++nt) {
        const int col = nt * 8 + 2 * t4;
        if (col >= p.vhd) continue;
        const float v0 = o[mi][nt][2 * hh] * inv, v1 = o[mi][nt][2 * hh + 1] * inv;
        if (p.out_f32) {
          float* dst = static_cast<float*>(p.out) + base + col;
          if (p.ovec)
            *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
          else {
            dst[0] = v0;
            if (col + 1 < p.vhd) dst[1] = v1;
          }
        } else {
          bf16* dst = static_cast<bf16*>(p.out) + base + col;
          if (p.ovec)
            *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
          else {
            dst[0] = __float2bfloat16_rn(v0);
            if (col + 1 < p.vhd) dst[1] = __float2bfloat16_rn(v1);
          }
        }
      }
    }
  }
}

template <int D, int DV, int MT>
int launch(const Params& p, int batch, int max_q_len, cudaStream_t st) {
  using C = Cfg<D, DV, MT>;
  static bool attr_set = false;  // the library runs on its one owning thread
  if (!attr_set) {
    MK_CUDA(cudaFuncSetAttribute(flash_fwd<D, DV, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::smem));
    attr_set = true;
  }
  const int rph = C::BM / p.hpb;
  const int tiles = (max_q_len + rph - 1) / rph;
  MK_ARG(tiles <= 65535, "mk_flash_attn_bf16: max_q_len=%d needs %d query tiles of %d rows, more than 65535",
         max_q_len, tiles, rph);
  Params q = p;
  q.rph_log2 = __builtin_ctz(rph);
  dim3 grid(p.heads / p.hpb, batch, tiles);
  flash_fwd<D, DV, MT><<<grid, kThreads, C::smem, st>>>(q);
  MK_LAUNCHED("flash_fwd");
  return MK_OK;
}

// ---------------------------------------------------------------- wgmma path
//
// flash_wg (sm_90a; the default, MK_FLASH_WG=0 turns it off): the forward pass for
// head dims 128/128 without a window or sinks, FlashAttention-3 style. A
// CTA of three warpgroups owns 128 query rows of one head: warpgroup 0
// copies Q once and then, tile after tile, 128 keys of K and V (cp.async
// through the block table, zeros past the keys) into a 3-stage ring of
// 128B-swizzled shared memory; warpgroups 1 and 2 own 64 rows each and per
// tile run S = Q·Kᵀ as wgmma from shared memory (K-major, 8 k steps of 16),
// the online softmax in registers, and O += P·V as wgmma with P from
// registers (the S accumulators re-packed to bf16 in place: the m64 D
// fragment of 16 columns is the A fragment of one k step) and V from
// shared memory read N-major (imm-trans-b: V's rows are keys, so no
// transpose is copied). Per-stage full barriers for K and V (the S wgmmas
// start while V lands) and an empty barrier the consumers release after
// the P·V wgmmas (a 3-stage ring: 224 KB of shared memory with Q). Each
// consumer issues S(t) and P·V(t − 1) together and runs tile t's softmax
// while P·V(t − 1) is in flight (O is rescaled once it is done). At head
// dim 128 the producer moves whole key tiles by TMA (tma_tile: 32 boxes of
// 16 rows × 64 columns from one thread, the rows through the block table),
// the last partial tile and head dim 192 by cp.async. H200, causal, 32 / 8
// heads: 252 / 480 / 544–558 TFLOP/s at 1k / 4k / 16k contiguous, 462 /
// 533–570 at 4k / 16k paged in blocks of 16, against the mma.sync
// kernel's 157 / 294 / 332 (docs/PERF.md, twenty-eighth pass;
// FlashAttention-3's ping-pong of the two consumers, MK_FLASH_PINGPONG=1,
// measured level to 4 % slower before TMA: see launch). The cp.async
// copies and the consumers' loop are flash_wg.cuh's (ring.cu's ring_wg
// runs the same ones).
namespace fwg {

// pool_row_pow2 is key j's row in the pool through the block table from tb
// for power-of-two blocks (sh = log2, mask = size − 1: shifts, not
// divisions; the engine's 16), pool_row_any for any layout (paged blocks of
// any size, or tb + j for contiguous keys), pool_row picks between them.
__device__ __forceinline__ int32_t pool_row_pow2(const Params& p, int tb, int j, int sh, int mask) {
  return (p.blocks[tb + (j >> sh)] << sh) + (j & mask);
}
__device__ __forceinline__ int32_t pool_row_any(const Params& p, int tb, int j) {
  return p.block_size > 0 ? p.blocks[tb + j / p.block_size] * p.block_size + j % p.block_size : tb + j;
}
__device__ __forceinline__ int32_t pool_row(const Params& p, int tb, int j) {
  return p.block_size > 0 && p.bs_log2 >= 0 ? pool_row_pow2(p, tb, j, p.bs_log2, p.block_size - 1)
                                            : pool_row_any(p, tb, j);
}

// tma_table_tile (every producer thread): key tile t into stage st by TMA
// through the block table from tb. Lanes 0-7 look up the 8 groups' pool
// rows before the stage wait (their loads in flight under it), thread 0
// issues the boxes after it (tma_tile), the other 127 threads arrive (the
// full barriers count 128 arrivals a phase either way). The wait comes
// before any branch on the lane: inside one (thread 0 apart from its
// warp), the warp ran the other lanes' wait first and only then thread 0's
// lookups, their latency exposed (paged keys 5 % slower than the cp.async
// producer, twenty-eighth pass).
template <int DQK>
__device__ __forceinline__ void tma_table_tile(const Params& p, const SmemT<DQK>& s, int st, int t, int tb, int wl,
                                               const mkwg::TmaMap* km, const mkwg::TmaMap* vm, int kcol, int vcol) {
  int32_t g = 0;
  if (wl < 8) g = pool_row(p, tb, t * kBN + 16 * wl);
  wait_empty(s, t);
  if (wl < 32) {
    int32_t grp[8];
#pragma unroll
    for (int i = 0; i < 8; i++) grp[i] = __shfl_sync(0xffffffffu, g, i);
    if (wl == 0) {
      tma_tile(s, st, km, vm, kcol, vcol, [&](int i) { return grp[i]; });
      return;
    }
  }
  mkwg::mbar_arrive(s.full_k(st));
  mkwg::mbar_arrive(s.full_v(st));
}

template <bool PP, int DQK>
__global__ void __launch_bounds__(kThreadsWG, 1)
    flash_wg(const __grid_constant__ Params p, const __grid_constant__ mkwg::TmaMap km,
             const __grid_constant__ mkwg::TmaMap vm) {
  extern __shared__ unsigned char fwg_raw[];
  const SmemT<DQK> s = carve<DQK>(fwg_raw);
  const int h = blockIdx.x, b = blockIdx.y;
  const int tile = gridDim.z - 1 - blockIdx.z;  // heaviest (last) tiles first
  const int qs = p.q_start[b];
  const int L = p.q_start[b + 1] - qs;
  const int i0 = tile * kBM;
  if (i0 >= L) return;
  const int P = p.past[b];
  const int nk = P + L;
  const int kvh = h / p.group;
  const int iend = min(i0 + kBM, L);
  const int kmax = p.causal ? P + iend - 1 : nk - 1;
  const int ntiles = kmax / kBN + 1;
  const int tb = p.table[b];

  const int tid = threadIdx.x, wg = tid / 128, wl = tid % 128;
  if (tid == 0) init_barriers(s, 0);
  __syncthreads();

  if constexpr (DQK != 128) {
  if (wg == 0) {  // producer, head dims 192 / 128: 8 rows a thread (copy_rows8)
    mkwg::setmaxnreg_dec<56>();
    constexpr int ST = Geo<DQK>::kST, QB = Geo<DQK>::kQB;
    const int r0 = wl / 8;
    copy_rows8<QB>(s.q(), wl, [&](int i) -> const bf16* {
      const int qi = i0 + r0 + 16 * i;
      return qi < iend ? p.q + (int64_t)(qs + qi) * p.q_stride + (int64_t)h * DQK : nullptr;
    }, p.q, s.q_full());
    const bf16* kp = p.k + (int64_t)kvh * DQK;
    const bf16* vp = p.v + (int64_t)kvh * kD;  // values: 128
    for (int t = 0; t < ntiles; t++) {
      const int st = t % ST;
      if (p.tma && (t + 1) * kBN - 1 <= kmax) {  // a whole tile by TMA, as at head dim 128 below
        tma_table_tile(p, s, st, t, tb, wl, &km, &vm, kvh * DQK, kvh * kD);
        continue;
      }
      int32_t row[8];  // the pool rows of keys t·kBN + r0 + 16 i (-1 past kmax)
#pragma unroll
      for (int i = 0; i < 8; i++) {
        const int j = t * kBN + r0 + 16 * i;
        row[i] = j > kmax ? -1 : pool_row(p, tb, j);
      }
      wait_empty(s, t);
      copy_rows8<QB>(s.k() + st * Geo<DQK>::kTileQK, wl, [&](int i) -> const bf16* {
        return row[i] >= 0 ? kp + (int64_t)row[i] * p.k_stride : nullptr;
      }, p.k, s.full_k(st));
      copy_rows8<2>(s.v() + st * Geo<DQK>::kTileV, wl, [&](int i) -> const bf16* {
        return row[i] >= 0 ? vp + (int64_t)row[i] * p.v_stride : nullptr;
      }, p.v, s.full_v(st));
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }
  } else {
  if (wg == 0) {  // producer
    mkwg::setmaxnreg_dec<56>();
    load_q(s, wl, [&](int r) -> const bf16* {
      const int qi = i0 + r;
      return qi < iend ? p.q + (int64_t)(qs + qi) * p.q_stride + (int64_t)h * kD : nullptr;
    }, p.q);
    const bf16* kp = p.k + (int64_t)kvh * kD;
    const bf16* vp = p.v + (int64_t)kvh * kD;
    const int r0 = wl / 16;
    for (int t = 0; t < ntiles; t++) {
      const int st = t % kST;
      if (p.tma && (t + 1) * kBN - 1 <= kmax) {
        tma_table_tile(p, s, st, t, tb, wl, &km, &vm, kvh * kD, kvh * kD);
        continue;
      }
      // This thread's keys' pool rows (-1 past kmax), looked up before the
      // wait for the stage, so that the block table's loads are in flight
      // while the consumers still hold it.
      int32_t row[16];
      if (p.block_size > 0 && p.bs_log2 >= 0) {  // the engine's blocks (16): shifts, not divisions
        const int sh = p.bs_log2, mask = p.block_size - 1;
#pragma unroll
        for (int i = 0; i < 16; i++) {
          const int j = t * kBN + r0 + 8 * i;
          row[i] = j > kmax ? -1 : pool_row_pow2(p, tb, j, sh, mask);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 16; i++) {
          const int j = t * kBN + r0 + 8 * i;
          row[i] = j > kmax ? -1 : pool_row_any(p, tb, j);
        }
      }
      wait_empty(s, t);
      copy_k(s, st, wl, kp, p.k_stride, row);
      copy_v(s, st, wl, vp, p.v_stride, row);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }
  }

  mkwg::setmaxnreg_inc<224>();
  const int cw = wg - 1, lane = tid % 32;
  const int ra = cw * 64 + (wl / 32) * 16 + lane / 4;  // this thread's rows: ra and ra + 8
  Acc a;
  consume<PP>(s, 0, ntiles, 0, [&](int g, int, int& kb, int& kend) {
    kb = g * kBN;
    kend = nk;
  }, P + i0 + ra, p.causal, 0, p.scale_log2, cw, wl, a, !p.rescale_all);

  // O / l, rows ra and ra + 8 (stored where they are real).
  const float ia = 1.f / a.la, ib = 1.f / a.lb;
  const int cl = 2 * (lane % 4);
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int qi = i0 + ra + 8 * hh;
    if (qi >= iend) continue;
    const float inv = hh ? ib : ia;
    const int64_t obase = (int64_t)(qs + qi) * p.o_stride + (int64_t)h * kD;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const int col = 8 * j + cl;
      const float x0 = a.o[4 * j + 2 * hh] * inv, x1 = a.o[4 * j + 2 * hh + 1] * inv;
      if (p.out_f32)
        *reinterpret_cast<float2*>(static_cast<float*>(p.out) + obase + col) = make_float2(x0, x1);
      else
        *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(p.out) + obase + col) = __floats2bfloat162_rn(x0, x1);
    }
  }
}

// on reports MK_FLASH_WG (read once): 0 the mma.sync kernel everywhere,
// else (the default) flash_wg where it applies.
bool on() {
  static const bool m = !mk::env_is("MK_FLASH_WG", '0');
  return m;
}

// mla_on reports MK_FLASH_WG192 (read once): head dims 192/128
// (DeepSeek-V3's decompressed MLA prefill) run on flash_wg too — two
// stages, 8 rows a producer thread — unless it is 0: 350–360 TFLOP/s at
// 4k / 8k, 128 heads, against the mma.sync kernel's 217–223 (H200,
// twenty-eighth pass).
bool mla_on() {
  static const bool m = !mk::env_is("MK_FLASH_WG192", '0');
  return m;
}

// fits reports whether flash_wg takes a call: 16-byte rows (p.vec,
// p.ovec) and head dims 128/128 (or 192/128 with mla_on) without a window
// or sinks.
bool fits(const Params& p, int head_dim, int v_head_dim) {
  return p.vec && p.ovec && (head_dim == 128 || (head_dim == 192 && mla_on())) && v_head_dim == 128 &&
         p.window == 0 && p.sinks == nullptr;
}

// go launches flash_wg<PP, DQK>, its shared-memory attribute set once.
template <bool PP, int DQK>
int go(const Params& p, const mkwg::TmaMap& km, const mkwg::TmaMap& vm, int batch, int tiles, cudaStream_t st) {
  auto kern = flash_wg<PP, DQK>;
  constexpr size_t smem = Geo<DQK>::kSmem;
  static bool attr_set = false;  // the library runs on its one owning thread
  if (!attr_set) {
    MK_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    attr_set = true;
  }
  kern<<<dim3(p.heads, batch, tiles), kThreadsWG, smem, st>>>(p, km, vm);
  MK_LAUNCHED("flash_wg");
  return MK_OK;
}

int launch(const Params& p, int batch, int max_q_len, cudaStream_t st) {
  const int tiles = (max_q_len + kBM - 1) / kBM;
  MK_ARG(tiles <= 65535, "mk_flash_attn_bf16: max_q_len=%d needs %d query tiles of %d rows, more than 65535",
         max_q_len, tiles, kBM);
  // MK_FLASH_PINGPONG=1: the consumers take turns issuing their wgmmas
  // (flash_wg.cuh's PP, FlashAttention-3's ping-pong): +1 % at 1k / 4k,
  // −2–4 % at 16k on the H200 (twenty-eighth pass), so off by default.
  static const bool pp = mk::env_is("MK_FLASH_PINGPONG", '1');
  mkwg::TmaMap km{}, vm{};
  // The maps of the last keys and values are kept (the engine's pool is
  // the same buffer every layer and step): two driver calls saved a launch.
  auto maps = [&](const Params& x) {
    struct Last {
      const void *k, *v;
      int64_t ks, vs;
      bool ok;
      mkwg::TmaMap km, vm;
    };
    static Last last{nullptr, nullptr, 0, 0, false, {}, {}};  // the library runs on its one owning thread
    if (x.block_size != 0 && x.block_size % 16 != 0) return false;
    if (last.k != x.k || last.v != x.v || last.ks != x.k_stride || last.vs != x.v_stride) {
      last.ok = tile_map(last.km, x.k, x.k_stride) && tile_map(last.vm, x.v, x.v_stride);
      last.k = x.k;
      last.v = x.v;
      last.ks = x.k_stride;
      last.vs = x.v_stride;
    }
    km = last.km;
    vm = last.vm;
    return last.ok;
  };
  Params q = p;
  if (p.hd == 192) {
    // MK_FLASH_TMA192=1: the MLA tiles by TMA too (three K boxes a group).
    // Measured level (H200, twenty-ninth pass, 128 heads, two rounds: 356–
    // 358 against 359–360 TFLOP/s at 4k, 370–371 against 367–371 at 8k;
    // DeepSeek-V3-4l 8k prefill with q/k in bf16 115.9 / 117.8 against
    // 115.2 / 115.6 ms): the 192 kernel is not bound by its producer's
    // copies, so it stays opt-in.
    static const bool tma192 = mk::env_is("MK_FLASH_TMA192", '1');
    q.tma = tma192 && maps(p);
    return pp ? go<true, 192>(q, km, vm, batch, tiles, st) : go<false, 192>(q, km, vm, batch, tiles, st);
  }
  // Whole key tiles by TMA (tma_tile; MK_FLASH_TMA=0: cp.async, for A/Bs)
  // where the keys' rows come in groups of 16 (contiguous, or blocks of a
  // multiple of 16 rows) and the driver makes the maps — over the pool's
  // rows as far as a row index reaches (the block table names which; none
  // past it is read). +5 / +13 / +10–15 % at 1k / 4k / 16k contiguous,
  // +15 / +16–24 % paged (blocks of 16) at 4k / 16k, Qwen3-8l 8k prefill
  // −4.5 % (twenty-eighth pass).
  static const bool tma_env = !mk::env_is("MK_FLASH_TMA", '0');
  q.tma = tma_env && maps(p);
  return pp ? go<true, 128>(q, km, vm, batch, tiles, st) : go<false, 128>(q, km, vm, batch, tiles, st);
}

}  // namespace fwg

int pad_dim(int d) {
  if (d <= 32) return 32;
  if (d <= 64) return 64;
  if (d <= 128) return 128;
  if (d <= 192) return 192;
  return 256;
}

using mk::sm_count;

}  // namespace

extern "C" MK_API int32_t mk_flash_attn_bf16(uint64_t stream, uint64_t out, int32_t out_dtype, uint64_t q,
                                             uint64_t pool_k, uint64_t pool_v, uint64_t q_start, uint64_t past,
                                             uint64_t table, uint64_t blocks, int32_t block_size, int32_t batch,
                                             int32_t max_q_len, int32_t heads, int32_t kv_heads, int32_t head_dim,
                                             int32_t v_head_dim, uint32_t scale_bits, int32_t window,
                                             uint64_t sinks, int32_t causal) {
  MK_THREAD("mk_flash_attn_bf16");
  const float scale = mk::float_from_bits(scale_bits);
  MK_ARG(out && q && pool_k && pool_v && q_start && past && table,
         "mk_flash_attn_bf16: out, q, pool_k, pool_v, q_start, past and table must be non-null");
  MK_ARG(out_dtype == MK_DTYPE_BF16 || out_dtype == MK_DTYPE_F32, "mk_flash_attn_bf16: out_dtype %d is not bf16 or f32",
         out_dtype);
  MK_ARG(batch >= 1 && batch <= 65535, "mk_flash_attn_bf16: batch=%d must be in [1, 65535]", batch);
  MK_ARG(max_q_len >= 1, "mk_flash_attn_bf16: max_q_len=%d must be >= 1", max_q_len);
  MK_ARG(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0,
         "mk_flash_attn_bf16: heads=%d must be a positive multiple of kv_heads=%d", heads, kv_heads);
  MK_ARG(heads <= 65535, "mk_flash_attn_bf16: heads=%d > 65535", heads);
  MK_ARG(head_dim >= 1 && head_dim <= 256 && v_head_dim >= 1 && v_head_dim <= 256,
         "mk_flash_attn_bf16: head_dim=%d and v_head_dim=%d must be in [1, 256]", head_dim, v_head_dim);
  MK_ARG(block_size >= 0, "mk_flash_attn_bf16: block_size=%d must be >= 0 (0: contiguous)", block_size);
  MK_ARG(block_size == 0 || blocks != 0, "mk_flash_attn_bf16: paged (block_size=%d) needs a blocks table", block_size);
  MK_ARG(std::isfinite(scale) && scale > 0, "mk_flash_attn_bf16: scale %g must be finite and > 0", (double)scale);
  MK_ARG(window >= 0, "mk_flash_attn_bf16: window=%d must be >= 0", window);
  MK_ARG(causal == 0 || causal == 1, "mk_flash_attn_bf16: causal=%d must be 0 or 1", causal);
  MK_ARG(causal == 1 || window == 0, "mk_flash_attn_bf16: a window (%d) needs causal=1", window);

  Params p{};
  p.out = reinterpret_cast<void*>(out);
  p.q = mk::dev<const bf16>(q);
  p.k = mk::dev<const bf16>(pool_k);
  p.v = mk::dev<const bf16>(pool_v);
  p.q_start = mk::dev<const int>(q_start);
  p.past = mk::dev<const int>(past);
  p.table = mk::dev<const int>(table);
  p.blocks = mk::dev<const int>(blocks);
  p.sinks = mk::dev<const float>(sinks);
  p.q_stride = (int64_t)heads * head_dim;
  p.k_stride = (int64_t)kv_heads * head_dim;
  p.v_stride = (int64_t)kv_heads * v_head_dim;
  p.o_stride = (int64_t)heads * v_head_dim;
  p.block_size = block_size;
  p.bs_log2 = block_size > 0 && (block_size & (block_size - 1)) == 0 ? __builtin_ctz((unsigned)block_size) : -1;
  p.heads = heads;
  p.group = heads / kv_heads;
  p.hpb = p.group % 4 == 0 ? 4 : p.group % 2 == 0 ? 2 : 1;
  p.hd = head_dim;
  p.vhd = v_head_dim;
  p.window = window;
  p.causal = causal;
  p.out_f32 = out_dtype == MK_DTYPE_F32;
  p.vec = head_dim % 8 == 0 && v_head_dim % 8 == 0 && q % 16 == 0 && pool_k % 16 == 0 && pool_v % 16 == 0;
  p.ovec = v_head_dim % 2 == 0 && out % (p.out_f32 ? 8 : 4) == 0;
  p.scale_log2 = scale * 1.4426950408889634f;
  static const bool rescale_all = mk::env_is("MK_FLASH_RESCALE_ALL", '1');
  p.rescale_all = rescale_all;

  cudaStream_t st = mk::as_stream(stream);
  if (fwg::on() && fwg::fits(p, head_dim, v_head_dim)) return fwg::launch(p, batch, max_q_len, st);
  int d = pad_dim(head_dim), dv = pad_dim(v_head_dim);
  if (d == 192 && dv <= 128) dv = 128;
  else if (d != dv) d = dv = d > dv ? d : dv;
  // 128-row tiles unless that leaves fewer than two blocks per multiprocessor.
  const int64_t blocks128 = (int64_t)(heads / p.hpb) * batch * ((max_q_len + 128 / p.hpb - 1) / (128 / p.hpb));
  const bool big = blocks128 >= 2 * sm_count();
  switch (d * 1000 + dv) {
    case 32032: return big ? launch<32, 32, 2>(p, batch, max_q_len, st) : launch<32, 32, 1>(p, batch, max_q_len, st);
    case 64064: return big ? launch<64, 64, 2>(p, batch, max_q_len, st) : launch<64, 64, 1>(p, batch, max_q_len, st);
    case 128128:
      return big ? launch<128, 128, 2>(p, batch, max_q_len, st) : launch<128, 128, 1>(p, batch, max_q_len, st);
    case 192128: return launch<192, 128, 1>(p, batch, max_q_len, st);
    case 192192: return launch<192, 192, 1>(p, batch, max_q_len, st);
    case 256256: return launch<256, 256, 1>(p, batch, max_q_len, st);
  }
  return mk::fail(MK_ERR_ARG, "mk_flash_attn_bf16: no kernel for head dims %d/%d", head_dim, v_head_dim);
}
