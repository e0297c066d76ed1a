// moe_wgmma.cu — the prefill-regime grouped expert GEMM on sm_90a: wgmma
// (warpgroup MMA, bf16 → f32) reading both operands from shared memory
// through 128-byte-swizzle descriptors. Same contract as moe.cu's mma.sync
// kernel (GemmArgs, 128-row tiles of one expert, grouped rasterisation, the
// activation fused into GEMM1's epilogue); CTA tile 128×256, BK 64, 4 cp.async
// stages; 2 warpgroups, each 64 rows × 256 columns as one m64n256k16 wgmma
// per 16-wide k step (GEMM1: the gate half in accumulators 0–63, the up
// half in 64–127; wgmma_k64_n256). The
// warp-specialised kernel also runs 64×256 tiles (TBM 64, moe.cu's cfg 5:
// 25–48 rows an expert), each consumer warpgroup 64 rows × 128 columns.
//
// The cp.async layout of moe.cu (128-byte rows, 16-byte chunk c of row r at
// c ^ (r & 7)) is exactly the hardware's 128B swizzle within 1024-byte-aligned
// 8-row atoms, so the descriptors use swizzle mode 1, SBO 1024 bytes, and a
// k step of 16 advances the start address by 32 bytes.
//
// Two kernels share that contract (MK_MOE_WGMMA picks; docs in README):
//   moe_wgmma_kernel     every thread loads (cp.async) and computes; a block
//                        barrier per 64-wide k step (MK_MOE_WGMMA=1);
//   moe_wgmma_ws_kernel  warp-specialised, the default: a producer warpgroup
//                        fills a 4-stage ring (the weight tile by TMA, two
//                        128-row boxes issued by one thread; the gathered
//                        activation rows by cp.async) and signals each stage
//                        through an mbarrier; two consumer warpgroups wait on
//                        it, run the wgmmas and hand the stage back through a
//                        second mbarrier, so no block barrier sits in the k
//                        loop. Registers move from the producer to the
//                        consumers (setmaxnreg 40 / 232). Measured on the H200
//                        (docs/PERF.md, twelfth pass): 1.07-1.17x the
//                        single-role kernel at 4096-16384 tokens. Loading the
//                        weights by cp.async from the producer instead was
//                        1.3-1.6x slower than the single-role kernel: 128
//                        threads at 40 registers could not issue 24 copies a
//                        stage fast enough (ncu: the consumers spent 41 % of
//                        their samples waiting for full stages).

#include <algorithm>

#include <cstdint>
#include <cstdlib>

#include "common.cuh"
#include "moe_gemm.cuh"
#include "wgmma.cuh"

namespace {

using mkmoe::bf16;
using mkmoe::GemmArgs;
using namespace mkwg;

constexpr int BM = 128, BN = 256, BK = 64, ST = 4, THREADS = 256;
static_assert(BK == 64 && BN == 256, "a k step is wgmma_k64_n256 (one m64n256k16 per 16 of k)");
constexpr size_t kStageA = BM * BK * 2, kStageB = BN * BK * 2;
constexpr size_t kSmem = ST * (kStageA + kStageB) + 1024;  // + alignment slack

__device__ __forceinline__ int swz(int row, int ch) { return row * BK + ((ch ^ (row & 7)) << 3); }

using mkmoe::cp_async16;

// tile_of maps work item id to its row tile and column tile (group_tile).
__device__ __forceinline__ void tile_of(const GemmArgs& p, int id, int& tile, int& ntile) {
  mkmoe::group_tile(id, p.group_m, p.mt, p.nt, tile, ntile);
}

// store_y_bf16 writes GEMM2's 64 × 256 block of warpgroup wg as bf16 rows
// (p.ybf), 8 bytes a lane: for each pair of 8-column groups i, i + 1 the
// lanes 2j and 2j + 1 of a row swap one bf16 pair (shfl.xor 1), so that
// the even lane writes columns 8i + 2q .. + 3 (q = lane % 4) and the odd
// one 8(i + 1) + 2(q - 1) .. + 3: the row's four lanes store 32 contiguous
// bytes, a whole sector (4-byte stores left half-sectors: GEMM2 791 → 839
// µs on Qwen3 at 16384 tokens under ncu, forty-sixth pass). N % 8 == 0, so
// an 8-column group is wholly inside N or outside. Every lane runs the
// shuffles; padding rows (asg < 0) only skip the stores.
__device__ __forceinline__ void store_y_bf16(const GemmArgs& p, const float (&acc0)[64], const float (&acc1)[64],
                                             int e, int64_t m0, int ntile, int wg, int warp, int lane,
                                             const int32_t (&asg)[2]) {
  const int64_t N = p.N;
  const int q = lane % 4;
  const bool odd = q & 1;
  const float* db = p.bias ? p.bias + (int64_t)e * N : nullptr;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int64_t slot = m0 + wg * 64 + warp * 16 + lane / 4 + 8 * h;
    bf16* yrow = reinterpret_cast<bf16*>(p.out) + slot * N;
#pragma unroll
    for (int half = 0; half < 2; half++) {
      const float(&acc)[64] = half ? acc1 : acc0;
#pragma unroll
      for (int i = 0; i < 16; i += 2) {
        const int64_t n0 = (int64_t)ntile * BN + half * 128 + 8 * i + 2 * q, n1 = n0 + 8;
        float2 v0 = make_float2(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
        float2 v1 = make_float2(acc[4 * (i + 1) + 2 * h], acc[4 * (i + 1) + 2 * h + 1]);
        if (db && n0 < N) v0.x += db[n0], v0.y += db[n0 + 1];
        if (db && n1 < N) v1.x += db[n1], v1.y += db[n1 + 1];
        const __nv_bfloat162 b0 = __floats2bfloat162_rn(v0.x, v0.y), b1 = __floats2bfloat162_rn(v1.x, v1.y);
        const uint32_t p0 = *reinterpret_cast<const uint32_t*>(&b0), p1 = *reinterpret_cast<const uint32_t*>(&b1);
        const uint32_t r = __shfl_xor_sync(0xffffffffu, odd ? p0 : p1, 1);
        const int64_t n = odd ? n1 - 2 : n0;  // the lane's first of four columns
        if (asg[h] >= 0 && n < N) *reinterpret_cast<uint2*>(yrow + n) = odd ? make_uint2(r, p1) : make_uint2(p0, r);
      }
    }
  }
}

// store_tile writes a 128×256 tile's accumulators: warpgroup wg holds rows
// 64·wg + [0, 64) of the tile, acc0 its columns [0, 128) and acc1 [128, 256)
// (GEMM1: gate and up of the same 128 columns, activated and stored as bf16;
// GEMM2: f32, or bf16 rows by store_y_bf16). d[4i + q] is row 16·warp +
// lane/4 + 8·(q/2), column 8i + 2·(lane%4) + q%2 of a warpgroup's m64n128
// block. Rows whose assignment is padding (asg[h] = sorted[row] < 0:
// tile_rows, read before the k loop so that the epilogue does not wait for
// it) are skipped.
template <bool GATEUP>
__device__ __forceinline__ void store_tile(const GemmArgs& p, const float (&acc0)[64], const float (&acc1)[64], int e,
                                           int64_t m0, int ntile, int wg, int warp, int lane,
                                           const int32_t (&asg)[2]) {
  const int64_t N = p.N;
  if (!GATEUP && p.ybf) {
    store_y_bf16(p, acc0, acc1, e, m0, ntile, wg, warp, lane, asg);
    return;
  }
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int64_t slot = m0 + wg * 64 + warp * 16 + lane / 4 + 8 * h;
    if (asg[h] < 0) continue;
    if (GATEUP) {
      mkmoe::store_act_row(reinterpret_cast<bf16*>(p.out) + slot * N, acc0, acc1, h, lane, (int64_t)ntile * (BN / 2),
                           N, p.bias ? p.bias + (int64_t)e * 2 * N : nullptr, p.act, p.alpha, p.limit);
    } else {
      const float* db = p.bias ? p.bias + (int64_t)e * N : nullptr;
#pragma unroll
      for (int half = 0; half < 2; half++) {
#pragma unroll
        for (int i = 0; i < 16; i++) {
          const int64_t n = (int64_t)ntile * BN + half * 128 + 8 * i + 2 * (lane % 4);
          if (n >= N) continue;
          float2 v = half ? make_float2(acc1[4 * i + 2 * h], acc1[4 * i + 2 * h + 1])
                          : make_float2(acc0[4 * i + 2 * h], acc0[4 * i + 2 * h + 1]);
          if (db) {
            v.x += db[n];
            v.y += db[n + 1];
          }
          mkmoe::store_y2(p.out, slot * N + n, v, p.ybf);
        }
      }
    }
  }
}

// store_tile64 writes consumer warpgroup cw's 64 × 128 block of a 64-row
// tile (moe_wgmma_ws_kernel, TBM 64): GEMM1 the activation of the output
// columns ntile·128 + 64·cw + [0, 64) (gate in acc's columns 0–63, up in
// 64–127); GEMM2 the columns ntile·256 + 128·cw + [0, 128).
template <bool GATEUP>
__device__ __forceinline__ void store_tile64(const GemmArgs& p, const float (&acc)[64], int e, int64_t m0, int ntile,
                                             int cw, int warp, int lane, const int32_t (&asg)[2]) {
  const int64_t N = p.N;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int64_t slot = m0 + warp * 16 + lane / 4 + 8 * h;
    if (asg[h] < 0) continue;
    if (GATEUP) {
      mkmoe::store_act_half(reinterpret_cast<bf16*>(p.out) + slot * N, acc, h, lane,
                            (int64_t)ntile * (BN / 2) + 64 * cw, N, p.bias ? p.bias + (int64_t)e * 2 * N : nullptr,
                            p.act, p.alpha, p.limit);
    } else {
      const float* db = p.bias ? p.bias + (int64_t)e * N : nullptr;
#pragma unroll
      for (int i = 0; i < 16; i++) {
        const int64_t n = (int64_t)ntile * BN + 128 * cw + 8 * i + 2 * (lane % 4);
        if (n >= N) continue;
        float2 v = make_float2(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
        if (db) {
          v.x += db[n];
          v.y += db[n + 1];
        }
        mkmoe::store_y2(p.out, slot * N + n, v, p.ybf);
      }
    }
  }
}

// tile_rows reads the assignments of the two rows whose outputs this
// thread stores (store_tile, store_tile64): rows r0 + lane / 4 and 8 more
// of the tile from m0, r0 the warp's first row. Issued before the k loop,
// they land while it runs.
__device__ __forceinline__ void tile_rows(int32_t (&asg)[2], const GemmArgs& p, int64_t m0, int r0, int lane) {
  asg[0] = p.sorted[m0 + r0 + lane / 4];
  asg[1] = p.sorted[m0 + r0 + lane / 4 + 8];
}

// padding_half says whether the second half of the 128-row tile tile
// skips its work (mkmoe::skip_half): rows 64–127 all padding (the padding
// ends an expert's rows, so its first row says) and, where kHalfSkipShared
// is unset (MK_MOE_HALF_SKIP_SHARED=0), the expert's only tile. The
// producer (one A box) and the second consumer warpgroup (no wgmmas)
// decide by it alike.
__device__ __forceinline__ bool padding_half(const GemmArgs& p, int tile) {
  const int64_t m0 = (int64_t)tile * BM;
  if (p.sorted[m0 + 64] >= 0) return false;
  return mkmoe::skip_half(p.half_skip, true, tile > 0 && p.tile_expert[tile - 1] == p.tile_expert[tile]);
}

template <bool GATEUP>
__global__ void __launch_bounds__(THREADS) moe_wgmma_kernel(const GemmArgs p) {
  int tile, ntile;
  tile_of(p, blockIdx.x, tile, ntile);
  if (tile >= *p.num_tiles) return;
  extern __shared__ unsigned char wg_sm_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(wg_sm_raw) + 1023) & ~uintptr_t(1023));
  bf16* sA = reinterpret_cast<bf16*>(base);
  bf16* sB = reinterpret_cast<bf16*>(base + ST * kStageA);

  const int tid = threadIdx.x, wg = tid / 128, wl = tid % 128, warp = wl / 32, lane = tid % 32;
  const int e = p.tile_expert[tile];
  const int64_t m0 = (int64_t)tile * BM;
  const int64_t Kd = p.Kd, N = p.N;

  constexpr int A_PER = BM * 8 / THREADS, B_PER = BN * 8 / THREADS;
  const bf16* a_src[A_PER];
  int a_dst[A_PER], a_ch[A_PER];
#pragma unroll
  for (int i = 0; i < A_PER; i++) {
    const int c = tid + i * THREADS, r = c / 8;
    a_ch[i] = c % 8;
    a_dst[i] = swz(r, a_ch[i]);
    const int32_t asg = p.sorted[m0 + r];
    a_src[i] = asg < 0 ? nullptr : (GATEUP ? p.A + (int64_t)(asg / p.topk) * Kd : p.A + (m0 + r) * Kd);
  }
  const bf16* b_src[B_PER];
  int b_dst[B_PER], b_ch[B_PER];
#pragma unroll
  for (int i = 0; i < B_PER; i++) {
    const int c = tid + i * THREADS, r = c / 8;
    b_ch[i] = c % 8;
    b_dst[i] = swz(r, b_ch[i]);
    b_src[i] = mkmoe::tile_b_row<GATEUP, BN>(p.W, (int64_t)e * (GATEUP ? 2 * N : N), r, ntile, N, Kd);
  }
  const int KT = (int)((Kd + BK - 1) / BK);
  auto load = [&](int stage, int kt) {
    const int64_t k0 = (int64_t)kt * BK;
    bf16* a = sA + stage * (BM * BK);
    bf16* b = sB + stage * (BN * BK);
#pragma unroll
    for (int i = 0; i < A_PER; i++) {
      const int64_t k = k0 + a_ch[i] * 8;
      const bool v = a_src[i] != nullptr && k < Kd;
      cp_async16(a + a_dst[i], v ? a_src[i] + k : p.A, v);
    }
#pragma unroll
    for (int i = 0; i < B_PER; i++) {
      const int64_t k = k0 + b_ch[i] * 8;
      const bool v = b_src[i] != nullptr && k < Kd;
      cp_async16(b + b_dst[i], v ? b_src[i] + k : p.W, v);
    }
  };

  int32_t asg[2];
  tile_rows(asg, p, m0, wg * 64 + warp * 16, lane);
  float acc0[64], acc1[64];
#pragma unroll
  for (int i = 0; i < 64; i++) acc0[i] = acc1[i] = 0.0f;

#pragma unroll
  for (int s = 0; s < ST - 1; s++) {
    if (s < KT) load(s, s);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  const uint32_t sA0 = (uint32_t)__cvta_generic_to_shared(sA), sB0 = (uint32_t)__cvta_generic_to_shared(sB);
  // Stage kt: wait for its tile, issue its wgmmas, then (while they run)
  // wait for stage kt-1's wgmmas, barrier, and prefetch tile kt+ST-1 into
  // the stage they read. One wgmma group stays in flight across the barrier.
  for (int kt = 0; kt < KT; kt++) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 2));
    fence_proxy_async();
    __syncthreads();
    const int st = kt % ST;
    wgmma_k64_n256(acc0, acc1, sA0 + st * (uint32_t)kStageA + wg * 64 * 128, sB0 + st * (uint32_t)kStageB);
    wgmma_wait1();
    __syncthreads();  // every warpgroup's stage kt-1 wgmmas are done
    const int nk = kt + ST - 1;
    if (nk < KT) load(nk % ST, nk);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  wgmma_wait0();
  asm volatile("cp.async.wait_group 0;\n" ::);

  store_tile<GATEUP>(p, acc0, acc1, e, m0, ntile, wg, warp, lane, asg);
}

// ─────────────── warp-specialised variant (producer + 2 consumer warpgroups) ───────────────

constexpr int WS_THREADS = 384;  // warpgroup 0 loads, 1 and 2 compute
static_assert(BN / 2 == BM, "one TMA box shape (BK columns × 128 rows) serves the weight halves and the A tile");
// ws_smem is the warp-specialised kernel's shared memory for row tiles of
// TBM rows: the ring, alignment slack, the ring's barriers, the work-item
// slots and their barriers (DYN), the A rows' indices.
// STC: GEMM1's two 16 KB output staging buffers (one a consumer
// warpgroup) sit between the ring and the barriers.
constexpr size_t kStcStage = 64 * 128 * 2;  // a consumer warpgroup's 64 rows × 128 bf16 columns
constexpr size_t ws_smem(int TBM, bool stc = false) {
  return ST * ((size_t)TBM * BK * 2 + kStageB) + (stc ? 2 * kStcStage : 0) + 1024 + 2 * ST * sizeof(uint64_t) +
         4 * sizeof(uint64_t) + 2 * sizeof(int32_t) + (size_t)TBM * sizeof(int64_t);
}
constexpr size_t kWsSmem = ws_smem(BM);
static_assert(ws_smem(BM, true) <= 232448, "the ring and GEMM1's staging fit in an sm_90 CTA's shared memory");

// full[s] completes when the producer's 128 threads' copies into stage s
// and the stage's two weight boxes (TMA, 2·16 KB of transaction bytes) have
// landed; empty[s] when both consumer warpgroups' wgmmas reading it
// are done. Stage s of k tile kt is filled for the (kt / ST)-th time, so
// its full phase has parity (kt / ST) & 1.
// PairRelease gives a stage back to both CTAs of a shared pair (PAIR).
struct PairRelease {
  uint32_t peer;
  __device__ __forceinline__ void operator()(uint64_t* b) const {
    mbar_arrive(b);
    mbar_arrive_peer(b, peer);
  }
};

// producer_sync is a barrier among the producer warpgroup's 128 threads only.
__device__ __forceinline__ void producer_sync() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }

// consumer_sync is a barrier among consumer warpgroup cw's 128 threads.
__device__ __forceinline__ void consumer_sync(int cw) { asm volatile("bar.sync %0, 128;\n" ::"r"(2 + cw) : "memory"); }

// stage_store_act is store_tile's GEMM1 form through shared memory (STC,
// MK_MOE_TMA_C=1): consumer warpgroup cw writes the activation of its 64
// rows × the tile's 128 output columns, rounded to bf16, into stg (two
// 64 × 64 boxes in the 128-byte swizzle: 16-byte chunk c of row r at
// c ^ (r & 7), so a warp's 32 four-byte writes hit 32 banks), and its
// thread 0 stores both boxes by TMA (cmap: the output [mt·128, N], boxes
// of 64 × 64; columns past N are clipped, padding rows written as they
// are and never read). The warpgroup goes on to its next item's k loop
// while the copy runs; the buffer is written again only after thread 0
// has seen the copy read it (bulk_wait_read). Every row is written,
// padding too, so no row flags are needed — but for a warpgroup whose 64
// rows are all padding (half_skip), which computes and stores nothing.
__device__ __forceinline__ void stage_store_act(const GemmArgs& p, const TmaMap& cmap, unsigned char* stg,
                                                const float (&acc0)[64], const float (&acc1)[64], int e, int64_t m0,
                                                int ntile, int cw, int warp, int lane, int wl) {
  const int64_t N = p.N, j0 = (int64_t)ntile * (BN / 2);
  const float* gb = p.bias ? p.bias + (int64_t)e * 2 * N : nullptr;
  if (wl == 0) bulk_wait_read();  // the previous item's copy has read stg
  consumer_sync(cw);
  const uint32_t s0 = sm_addr(stg);
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int r = warp * 16 + lane / 4 + 8 * h;  // row of the warpgroup's 64
#pragma unroll
    for (int i = 0; i < 16; i++) {
      const int64_t j = j0 + 8 * i + 2 * (lane % 4);
      float2 a2 = make_float2(0.0f, 0.0f);  // past N: clipped by the store
      if (j < N)
        a2 = mkmoe::act_pair_f(acc0[4 * i + 2 * h], acc0[4 * i + 2 * h + 1], acc1[4 * i + 2 * h], acc1[4 * i + 2 * h + 1],
                               gb, j, N, p.act, p.alpha, p.limit);
      const __nv_bfloat162 v = __floats2bfloat162_rn(a2.x, a2.y);
      const uint32_t addr = s0 + (uint32_t)((i / 8) * 8192 + r * 128 + (((i % 8) ^ (r & 7)) << 4) + 4 * (lane % 4));
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(*reinterpret_cast<const uint32_t*>(&v)) : "memory");
    }
  }
  fence_proxy_async();  // the generic-proxy writes before the TMA (async proxy) reads them
  consumer_sync(cw);
  if (wl == 0) {
    const int y = (int)(m0 + 64 * cw);
    tma_store_2d(&cmap, stg, (int)j0, y);
    tma_store_2d(&cmap, stg + 8192, (int)j0 + 64, y);
    bulk_commit();
  }
}

// The CTA takes work items blockIdx.x, blockIdx.x + gridDim.x, ... of the
// p.mt × p.nt grid (one each when the grid covers them all; a persistent
// grid of one CTA per SM, so that a tile's epilogue runs while the
// producer already loads the next tile's first stages: persist_grid says
// where; it pays on short k loops, Qwen3's, not on Mixtral's or
// DeepSeek-V3's).
// Both roles walk the same items and skip row tiles past *num_tiles, and
// count k steps across items (g): stage g % ST, phase (g / ST) & 1.
// TMA_A: the A tile comes by TMA too (amap) and one producer thread does
// all the loading. GEMM2 (default; MK_MOE_TMA_A=0 turns it off): the
// activation rows are contiguous. GEMM1 (MK_MOE_G1_TMA=1, off by default
// until measured): permute_rows_kernel first copies the gathered rows into
// p.ascratch in tile order, and amap maps that.
//
// PAIR (MK_MOE_PAIR=1): CTAs run in clusters of two, one item each: the
// cluster's row tiles 2·pt and 2·pt + 1 (pairs of row tiles rasterised by
// group_tile over ceil(mt / 2) × nt) for the same column tile. When both
// tiles are real and of the same expert ("shared"), each CTA's TMA issuer
// loads one of the two 128-row weight boxes of every stage and multicasts
// it into both CTAs, so the cluster reads its weight tile from L2 once,
// not twice (the grouped GEMMs on Qwen3's shape keep L2 81-90 % busy:
// docs/PERF.md, seventeenth pass). A stage is then free only when both
// CTAs' consumers are done with it: each consumer warpgroup arrives on its
// own CTA's empty barrier and on the peer's (count 4). Cluster barriers
// after the barriers' set-up and before exit keep every remote arrival and
// copy inside both CTAs' lifetimes. Otherwise (different experts, or the
// second tile past the real ones) the two CTAs run as unpaired ones.
//
// DYN (a persistent grid, p.tile_ctr set: mkmoe::dyn_sched): a CTA's
// first item is blockIdx.x, each later one gridDim.x + atomicAdd(p.tile_ctr,
// 1), taken by producer thread 0, so the items run in the rasterised order
// whatever each SM's pace. Thread 0 publishes each id in one of two slots
// (nid) and arrives on its idf barrier; every consumer thread (and, without
// TMA_A, every producer thread, after a producer barrier) reads it from
// there, the consumers arriving on ide, which thread 0 waits for before it
// writes that slot again. An id past the grid's items ends every role.
//
// TBM 64 (the 64-row tiles, mkmoe::wgmma_gemm's bm): the A tile is 64 rows
// and each consumer warpgroup takes all of them against its 128 of the
// stage's 256 B rows (wgmma_k64_n128). GEMM2: consumer c the output
// columns 128·c + [0, 128) of the tile. GEMM1: the stage holds gate rows
// [0, 64), the matching up rows, gate [64, 128), up [64, 128) of the
// tile's 128 output columns (four 64-row TMA boxes; wmap's boxes are 64
// rows), so consumer c's block is gate and up of the columns 64·c + [0,
// 64) (store_act_half). With TMA_A, amap's boxes are TBM rows.
template <bool GATEUP, bool TMA_A, bool PAIR = false, int TBM = BM, bool DYN = false, bool STC = false>
__global__ void __launch_bounds__(WS_THREADS, 1)
    moe_wgmma_ws_kernel(const GemmArgs p, const __grid_constant__ TmaMap wmap, const __grid_constant__ TmaMap amap,
                        const __grid_constant__ TmaMap cmap) {
  static_assert(TBM == BM || (TBM == 64 && !PAIR), "64-row tiles run unpaired");
  static_assert(!(DYN && PAIR), "paired CTAs run one item each");
  static_assert(!STC || (GATEUP && TBM == BM && !PAIR), "the staged store is GEMM1's, 128-row tiles, unpaired");
  constexpr uint32_t SA = (uint32_t)TBM * BK * 2;  // A bytes a stage
  const int items = PAIR ? 1 : p.mt * p.nt, ntiles = *p.num_tiles;
  int pair_tile = 0, pair_ntile = 0, pair_c = 0;
  bool shared = false;  // PAIR: the weight boxes are multicast (both CTAs see the same value)
  if (PAIR) {
    pair_c = (int)cluster_ctarank();
    int pt;
    mkmoe::group_tile((int)blockIdx.x / 2, p.group_m, (p.mt + 1) / 2, p.nt, pt, pair_ntile);
    pair_tile = 2 * pt + pair_c;
    shared = 2 * pt + 1 < ntiles && p.tile_expert[2 * pt] == p.tile_expert[2 * pt + 1];
    if (pair_tile >= ntiles) return;  // never shared: the peer runs alone
  } else {
    if ((int)blockIdx.x >= items) return;
    if ((int)gridDim.x >= items) {  // one item per CTA: a row tile past the real ones exits before any set-up
      int tile, ntile;
      tile_of(p, blockIdx.x, tile, ntile);
      if (tile >= ntiles) return;
    }
  }
  // The work items this CTA walks: PAIR one (its pair's tile), else
  // blockIdx.x, blockIdx.x + gridDim.x, ...
  const int id0 = PAIR ? 0 : (int)blockIdx.x, id_step = PAIR ? 1 : (int)gridDim.x;
  const auto item = [&](int id, int& tile, int& ntile) {
    if (PAIR) {
      tile = pair_tile;
      ntile = pair_ntile;
    } else {
      tile_of(p, id, tile, ntile);
    }
  };
  extern __shared__ unsigned char wg_sm_raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(wg_sm_raw) + 1023) & ~uintptr_t(1023));
  bf16* sA = reinterpret_cast<bf16*>(base);                       // [ST][TBM][BK] swizzled
  bf16* sB = reinterpret_cast<bf16*>(base + ST * SA);             // [ST][BN][BK] swizzled
  unsigned char* stc = base + ST * (SA + kStageB);  // STC: [2 warpgroups][2 boxes][64][64] bf16 swizzled
  uint64_t* full = reinterpret_cast<uint64_t*>(stc + (STC ? 2 * kStcStage : 0));
  uint64_t* empty = full + ST;
  uint64_t* idf = empty + ST;  // DYN: [2] slot q % 2 holds item q's id
  uint64_t* ide = idf + 2;     // DYN: [2] every consumer thread has read it
  int32_t* nid = reinterpret_cast<int32_t*>(ide + 2);  // DYN: [2] the slots
  int32_t* arow = nid + 2;  // [TBM]: the row of p.A each A row reads, -1 padding

  const int tid = threadIdx.x, wg = tid / 128, wl = tid % 128;
  if (tid == 0) {
    for (int st = 0; st < ST; st++) {
      mbar_init(&full[st], TMA_A ? 1 : 129);  // the producer's 128 cp.async arrivals (unless TMA_A) + the TMA issuer's expect_tx
      mbar_init(&empty[st], shared ? 4 : 2);  // shared: the peer's two consumer warpgroups too
    }
    if (DYN) {
      for (int q = 0; q < 2; q++) {
        mbar_init(&idf[q], 1);
        mbar_init(&ide[q], WS_THREADS - 128);
      }
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (shared) cluster_sync();  // the peer's barriers are set up before any copy or arrival reaches them
  const int64_t Kd = p.Kd, N = p.N;
  const int KT = (int)((Kd + BK - 1) / BK);

  if (wg == 0) {  // producer: thread wl copies chunk wl % 8 of A rows wl / 8 + 16 i; thread 0 issues B's TMA
    // 40 registers: a thread holds its 8 rows' indices (arow, read once an
    // item) across the k loop, so a stage is 8 address computations and
    // copies with no load in between. (Reading each row's offset from
    // shared memory before each copy made every stage a chain of 8
    // dependent loads: ncu, sixteenth pass, the consumers waited for full
    // stages in 36 % of all warp samples on Mixtral's GEMM1.)
    setmaxnreg_dec<40>();
    const int ch = wl % 8, r0 = wl / 8;
    if (wl == 0) {
      tma_prefetch(&wmap);
      if (TMA_A) tma_prefetch(&amap);
      if (STC) tma_prefetch(&cmap);
    }
    int g = 0;
    for (int q = 0;; q++) {
      if (TMA_A && wl != 0) break;  // one thread loads
      int id = id0 + q * id_step;
      if (DYN) {
        if (wl == 0) {
          if (q > 0) id = (int)gridDim.x + atomicAdd(p.tile_ctr, 1);
          if (q >= 2) mbar_wait(&ide[q & 1], ((q >> 1) - 1) & 1);
          nid[q & 1] = id;
          mbar_arrive(&idf[q & 1]);
        }
        if (!TMA_A) {
          producer_sync();  // thread 0 wrote the slot (it writes it again only after the next producer barrier)
          id = nid[q & 1];
        }
      }
      if (id >= items) break;
      int tile, ntile;
      item(id, tile, ntile);
      if (tile >= ntiles) continue;
      const int e = p.tile_expert[tile];
      const int64_t m0 = (int64_t)tile * TBM;
      // TMA_A, 128-row tiles: rows 64–127 all padding (the consumers skip
      // them too): one 64-row box of A a stage instead of two.
      const bool half = TMA_A && TBM == BM && (p.half_skip & mkmoe::kHalfSkipBox) && padding_half(p, tile);
      if (!TMA_A) {
        producer_sync();  // every producer thread has read the previous item's rows from arow
        if (wl < TBM) {
          const int32_t asg = p.sorted[m0 + wl];
          arow[wl] = asg < 0 ? -1 : GATEUP ? asg / p.topk : (int32_t)(m0 + wl);
        }
        producer_sync();
      }
      int32_t ri[TBM / 16];  // this thread's A rows r0 + 16 i
#pragma unroll
      for (int i = 0; i < TBM / 16; i++) ri[i] = TMA_A ? -1 : arow[r0 + 16 * i];
      // B's two 128-row boxes: GEMM1 the expert's gate rows and its up rows
      // (N further) for output columns ntile·128 + [0, 128); GEMM2 rows
      // ntile·256 + [0, 256). Rows past the expert's N belong to the next
      // expert (or, past the tensor, are zeros): their columns are computed
      // and never stored.
      const int32_t b0 =
          (int32_t)(GATEUP ? (int64_t)e * 2 * N + (int64_t)ntile * (BN / 2) : (int64_t)e * N + (int64_t)ntile * BN);
      const int32_t b1 = (int32_t)(GATEUP ? b0 + N : b0 + BN / 2);
      for (int kt = 0; kt < KT; kt++, g++) {
        const int st = g % ST;
        if (g >= ST) mbar_wait(&empty[st], ((g / ST) - 1) & 1);
        bf16* b = sB + st * (BN * BK);
        bf16* a = sA + st * (TBM * BK);
        if (wl == 0) {
          mbar_expect_tx(&full[st], (uint32_t)(TMA_A ? (half ? SA / 2 : SA) + kStageB : kStageB));
          if (TMA_A) {  // 64-row boxes (launch64's map: one box, the whole 64-row tile)
            tma_load_2d(a, &amap, kt * BK, (int32_t)m0, &full[st]);
            if (TBM == BM && !half) tma_load_2d(a + 64 * BK, &amap, kt * BK, (int32_t)m0 + 64, &full[st]);
          }
          if (PAIR && shared) {  // box pair_c into both CTAs; the peer sends the other
            tma_load_2d_mc(b + pair_c * (BN / 2) * BK, &wmap, kt * BK, pair_c ? b1 : b0, &full[st], 0x3);
          } else if (GATEUP && TBM == 64) {  // gate, up, gate + 64, up + 64: 64-row boxes
            tma_load_2d(b, &wmap, kt * BK, b0, &full[st]);
            tma_load_2d(b + 64 * BK, &wmap, kt * BK, b1, &full[st]);
            tma_load_2d(b + 128 * BK, &wmap, kt * BK, b0 + 64, &full[st]);
            tma_load_2d(b + 192 * BK, &wmap, kt * BK, b1 + 64, &full[st]);
          } else {
            tma_load_2d(b, &wmap, kt * BK, b0, &full[st]);
            tma_load_2d(b + (BN / 2) * BK, &wmap, kt * BK, b1, &full[st]);
          }
        }
        if (TMA_A) continue;
        const int64_t k = (int64_t)kt * BK + ch * 8;
        const bool kv = k < Kd;
#pragma unroll
        for (int i = 0; i < TBM / 16; i++) {
          const bool v = ri[i] >= 0 && kv;
          cp_async16(a + swz(r0 + 16 * i, ch), v ? p.A + (int64_t)ri[i] * Kd + k : p.A, v);
        }
        cp_async_arrive(&full[st]);
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    if (shared) cluster_sync();
    return;
  }

  setmaxnreg_inc<232>();
  const int cw = wg - 1, warp = wl / 32, lane = tid % 32;
  const uint32_t sA0 = sm_addr(sA), sB0 = sm_addr(sB);
  int g = 0;
  for (int q = 0;; q++) {
    int id = id0 + q * id_step;
    if (DYN) {
      mbar_wait(&idf[q & 1], (q >> 1) & 1);
      id = nid[q & 1];
      mbar_arrive(&ide[q & 1]);
    }
    if (id >= items) break;
    int tile, ntile;
    item(id, tile, ntile);
    if (tile >= ntiles) continue;
    // The expert and the stored rows' assignments, read before the k loop.
    const int e = p.tile_expert[tile];
    int32_t asg[2] = {0, 0};  // STC writes every row: no flags
    if constexpr (!STC) tile_rows(asg, p, (int64_t)tile * TBM, (TBM == 64 ? 0 : cw * 64) + warp * 16, lane);
    // Rows 64–127 all padding (the padding ends an expert's rows): the
    // second consumer warpgroup has nothing to compute.
    const int skip_bar = TBM == BM && p.half_skip && cw == 1 && padding_half(p, tile) ? 2 + cw : -1;
    float acc0[64], acc1[64];
    if constexpr (TBM == 64) {
      ws_consume<ST, MbarWait, MbarRelease, true>(acc0, acc1, sA0, sB0, SA, (uint32_t)kStageB, 0, full, empty, wl,
                                                  KT, g, MbarWait(), MbarRelease(), cw * 128 * 128);
      store_tile64<GATEUP>(p, acc0, e, (int64_t)tile * TBM, ntile, cw, warp, lane, asg);
      continue;
    }
    if (PAIR && shared)
      ws_consume<ST>(acc0, acc1, sA0, sB0, (uint32_t)kStageA, (uint32_t)kStageB, cw * 64 * 128, full, empty, wl, KT,
                     g, MbarWait(), PairRelease{(uint32_t)(pair_c ^ 1)}, 0, skip_bar);
    else
      ws_consume<ST>(acc0, acc1, sA0, sB0, (uint32_t)kStageA, (uint32_t)kStageB, cw * 64 * 128, full, empty, wl, KT,
                     g, MbarWait(), MbarRelease(), 0, skip_bar);
    if (skip_bar >= 0) continue;  // padding rows: nothing to store
    if constexpr (STC)
      stage_store_act(p, cmap, stc + cw * kStcStage, acc0, acc1, e, (int64_t)tile * BM, ntile, cw, warp, lane, wl);
    else
      store_tile<GATEUP>(p, acc0, acc1, e, (int64_t)tile * BM, ntile, cw, warp, lane, asg);
  }
  // STC: the last copy has read the staging buffer before the CTA's shared
  // memory goes (its global writes complete with the grid, as a store's do).
  if (STC && wl == 0) bulk_wait_read();
  if (shared) cluster_sync();  // the peer's arrivals on this CTA's barriers are done
}

// permute_rows_kernel copies GEMM1's A rows into tile order: ap[m] =
// x[sorted[m] / topk] for every real row m of the first *num_tiles tiles
// (padding rows are left as they are: their outputs are never stored).
// One warp a row, 16-byte copies (Kd % 8 == 0).
__global__ void __launch_bounds__(256) permute_rows_kernel(bf16* ap, const bf16* x, const int32_t* sorted,
                                                           const int32_t* num_tiles, int topk, int64_t Kd,
                                                           int64_t rows, int bm) {
  const int64_t m = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
  if (m >= rows || m >= (int64_t)*num_tiles * bm) return;
  const int32_t a = sorted[m];
  if (a < 0) return;
  const uint4* src = reinterpret_cast<const uint4*>(x + (int64_t)(a / topk) * Kd);
  uint4* dst = reinterpret_cast<uint4*>(ap + m * Kd);
  for (int64_t c = threadIdx.x % 32; c < Kd / 8; c += 32) dst[c] = __ldg(src + c);
}

// kernel_ready finds out once (ok: 0 unknown, 1 runnable, -1 not built for
// this device) whether kern runs here, allowing it smem bytes of dynamic
// shared memory; MK_OK or an mk status when the attribute cannot be set.
template <class K>
int kernel_ready(K kern, size_t smem, int& ok) {
  if (ok == 0) {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, kern) != cudaSuccess || fa.binaryVersion < 90) {
      cudaGetLastError();
      ok = -1;
    } else {
      MK_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
      ok = 1;
    }
  }
  return MK_OK;
}

// launch_kern launches kern (threads per CTA, smem bytes) over tiles ×
// ntiles CTAs with args; -1 when it is not built for this device.
template <class... Args>
int launch_kern(void (*kern)(Args...), int threads, size_t smem, const char* name, int64_t tiles, int64_t ntiles,
                cudaStream_t s, int& ok, const Args&... args) {
  const int rc = kernel_ready(kern, smem, ok);
  if (rc != MK_OK) return rc;
  if (ok < 0) return -1;
  kern<<<(unsigned)(tiles * ntiles), threads, smem, s>>>(args...);
  MK_LAUNCHED(name);
  return MK_OK;
}

// launch_pair launches kern on grid CTAs in clusters of two (PAIR).
template <class... Args>
int launch_pair(void (*kern)(Args...), const char* name, int64_t grid, cudaStream_t s, int& ok, const Args&... args) {
  const int rc = kernel_ready(kern, kWsSmem, ok);
  if (rc != MK_OK) return rc;
  if (ok < 0) return -1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)grid);
  cfg.blockDim = dim3(WS_THREADS);
  cfg.dynamicSmemBytes = kWsSmem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  MK_CUDA(cudaLaunchKernelEx(&cfg, kern, args...));
  MK_LAUNCHED(name);
  return MK_OK;
}

// pair: the warp-specialised kernel in clusters of two CTAs sharing their
// weight tiles (PAIR in moe_wgmma_ws_kernel), MK_MOE_PAIR=1. Off: correct
// but measured 9-24 % slower on an H200 (seventeenth pass: the GEMMs are
// limited by the fabric between the L2 halves, not by L2 bytes).
bool pair() {
  static const bool w = mk::env_is("MK_MOE_PAIR", '1');
  return w;
}

// warp_specialised: moe_wgmma_ws_kernel unless MK_MOE_WGMMA=1 (the
// single-role kernel; measurements).
bool warp_specialised() {
  static const bool w = [] {
    const char* v = getenv("MK_MOE_WGMMA");
    return !(v && v[0] == '1' && v[1] == 0);
  }();
  return w;
}

// weight_map fills m with the TMA map of a [rows, kd] bf16 matrix (the
// weights; with TMA_A, GEMM2's activation rows): boxes of BK columns × 128
// rows, 128-byte swizzle (moe_wgmma's shared-memory layout), zeros past the
// tensor. False when the driver cannot make it.
bool weight_map(TmaMap& m, const bf16* w, int64_t rows, int64_t kd) {
  static_assert(BK == 64, "the TMA box is 64 columns wide");
  return tma_map_bf16(m, w, rows, kd, BN / 2);
}

// a_map fills m with the TMA map of the 128-row tiles' A rows ([rows, kd]
// bf16) in 64-row boxes: a stage is two boxes, one where the tile's rows
// 64–127 are all padding (half_skip), so those rows are not read.
bool a_map(TmaMap& m, const bf16* a, int64_t rows, int64_t kd) { return tma_map_bf16(m, a, rows, kd, 64); }

// persistent: the warp-specialised kernel on one CTA per SM (each walks
// work items, the producer loading the next item's first stages during the
// epilogue) instead of one CTA per item, for a reduction of kd columns.
// It pays where the k loop is short: measured on an H200 (session 17,
// Qwen3-30B-A3B at 4096 tokens, ncu) GEMM2 (kd 768, 12 k steps) 272 → 256
// µs, GEMM1 (kd 2048) 484 → 477, the layer 3.6 % faster; Mixtral and
// DeepSeek-V3 (kd 2048-14336) 3-7 % slower. So it is on up to kd 1024;
// MK_MOE_PERSIST=1 / 0 forces it on / off.
bool persistent(int64_t kd) {
  static const int force = mk::env_force("MK_MOE_PERSIST");
  return force >= 0 ? force == 1 : kd <= 1024;
}

// persist_grid: whether the 128-row GEMM (gu: GEMM1) of a layer runs
// persistent. GEMM2 by persistent(kd) (kd = I); GEMM1 by persistent(kd)
// (kd = H) too, and also for layers of intermediate size N up to
// mkmoe::kPersistMaxI when its items come by counter (a.tile_ctr), where
// its tiles are stored by TMA (tma_c): forty-fifth pass, Qwen3-30B-A3B's
// grouped layer 2.2–2.6 % faster at 1024 and 16384 tokens. MK_MOE_PERSIST
// forces both.
bool persist_grid(bool gu, const GemmArgs& a) {
  static const int force = mk::env_force("MK_MOE_PERSIST");
  if (force >= 0) return force == 1;
  return persistent(a.Kd) || (gu && a.N <= mkmoe::kPersistMaxI && a.tile_ctr != nullptr);
}

using mk::sm_count;

// tma_a: GEMM2's activation rows by TMA (default since session 13: 7 % faster
// than cp.async on Mixtral at 16384 tokens, 3 % on DeepSeek-V3 and Qwen3);
// MK_MOE_TMA_A=0 loads them with cp.async.
bool tma_a() {
  static const bool w = !mk::env_is("MK_MOE_TMA_A", '0');
  return w;
}

// g1_tma: GEMM1's rows copied into tile order and loaded by TMA, for an
// intermediate size of inter (mkmoe::gather_by_copy; MK_MOE_G1_TMA=1/0).
bool g1_tma(int64_t inter) {
  static const int force = mk::env_force("MK_MOE_G1_TMA");
  return mkmoe::gather_by_copy(force, inter);
}

// launch64 runs the warp-specialised kernel on 64-row tiles (TBM 64): -1
// where it cannot (no TMA map; the caller then runs the mma.sync tiles).
template <bool GU>
int launch64(const GemmArgs& a, int64_t tiles, int64_t ntiles, cudaStream_t s) {
  constexpr int TBM = 64;
  static int ok = 0, ok_a = 0, ok_g1a = 0;
  TmaMap wm, am;
  // GEMM1's weight boxes are 64 rows (gate and up halves), GEMM2's 128.
  if (a.experts <= 0 || !tma_map_bf16(wm, a.W, a.experts * (GU ? 2 : 1) * a.N, a.Kd, GU ? 64 : BN / 2)) return -1;
  int64_t grid = tiles * ntiles;
  if (persistent(a.Kd)) {
    static const int sms = sm_count();
    if (sms > 0) grid = std::min<int64_t>(grid, sms);
  }
  constexpr size_t smem = ws_smem(TBM);
  if (!GU && tma_a() && tma_map_bf16(am, a.A, (int64_t)a.mt * TBM, a.Kd, TBM))
    return launch_kern(moe_wgmma_ws_kernel<false, true, false, TBM>, WS_THREADS, smem,
                       "moe_wgmma_ws64 (down, A by TMA)", grid, 1, s, ok_a, a, wm, am, wm);
  if (GU && g1_tma(a.N) && a.ascratch != nullptr && a.Kd % 8 == 0 &&
      tma_map_bf16(am, a.ascratch, (int64_t)a.mt * TBM, a.Kd, TBM)) {
    const int64_t rows = (int64_t)a.mt * TBM;
    permute_rows_kernel<<<(unsigned)((rows + 7) / 8), 256, 0, s>>>(a.ascratch, a.A, a.sorted, a.num_tiles, a.topk,
                                                                      a.Kd, rows, TBM);
    MK_LAUNCHED("moe_wgmma permute_rows");
    return launch_kern(moe_wgmma_ws_kernel<true, true, false, TBM>, WS_THREADS, smem,
                       "moe_wgmma_ws64 (gate/up, A by TMA)", grid, 1, s, ok_g1a, a, wm, am, wm);
  }
  return launch_kern(moe_wgmma_ws_kernel<GU, false, false, TBM>, WS_THREADS, smem,
                     GU ? "moe_wgmma_ws64 (gate/up)" : "moe_wgmma_ws64 (down)", grid, 1, s, ok, a, wm, wm, wm);
}

// tma_c: GEMM1's activated tiles staged in shared memory and stored by TMA
// (STC in moe_wgmma_ws_kernel): by default on the persistent grids with
// items by counter (dyn), where a warpgroup goes on to its next item while
// the copy runs; with one CTA an item it was not clearly better in two
// rounds (forty-fifth pass: Qwen3 ×1.006–1.014, Mixtral ×0.975–0.991,
// DeepSeek-V3 ×0.977–0.998; unconfirmed). MK_MOE_TMA_C=1 / 0 forces.
bool tma_c(bool dyn) {
  static const int force = mk::env_force("MK_MOE_TMA_C");
  return force >= 0 ? force == 1 : dyn;
}

// launch_ws launches the warp-specialised kernel <G, A> (128-row tiles,
// unpaired) on grid CTAs, taking its items from a.tile_ctr when dyn and,
// GEMM1 with tma_c(dyn) and a map of its output, storing its tiles by TMA;
// ok[dyn + 2·stc] is that kernel's kernel_ready state.
template <bool G, bool A>
int launch_ws(bool dyn, const char* name, int64_t grid, cudaStream_t s, int (&ok)[4], const GemmArgs& a,
              const TmaMap& wm, const TmaMap& am) {
  if constexpr (G) {
    TmaMap cm;  // the output [mt·128, N] bf16 in 64 × 64 boxes
    if (tma_c(dyn) && tma_map_bf16(cm, a.out, (int64_t)a.mt * BM, a.N, 64)) {
      constexpr size_t smem = ws_smem(BM, true);
      if (dyn)
        return launch_kern(moe_wgmma_ws_kernel<G, A, false, BM, true, true>, WS_THREADS, smem, name, grid, 1, s,
                           ok[3], a, wm, am, cm);
      return launch_kern(moe_wgmma_ws_kernel<G, A, false, BM, false, true>, WS_THREADS, smem, name, grid, 1, s, ok[2],
                         a, wm, am, cm);
    }
  }
  if (dyn)
    return launch_kern(moe_wgmma_ws_kernel<G, A, false, BM, true>, WS_THREADS, kWsSmem, name, grid, 1, s, ok[1], a,
                       wm, am, wm);
  return launch_kern(moe_wgmma_ws_kernel<G, A>, WS_THREADS, kWsSmem, name, grid, 1, s, ok[0], a, wm, am, wm);
}

template <bool GU>
int launch(const GemmArgs& a0, int64_t tiles, int64_t ntiles, cudaStream_t s) {
  static int ok = 0, ok_p = 0, ok_p_a = 0, ok_p_g1a = 0;
  GemmArgs a = a0;
  a.half_skip = mkmoe::half_skip_mode(GU ? a.N : a.Kd, false);  // GEMM1: N = I; GEMM2: Kd = I; every padding half
  static int ok_ws[4] = {}, ok_ws_a[4] = {}, ok_ws_g1a[4] = {};  // [dyn + 2·stc]
  TmaMap wm, am;
  if (warp_specialised() && a.experts > 0 && weight_map(wm, a.W, a.experts * (GU ? 2 : 1) * a.N, a.Kd)) {
    if (pair()) {  // clusters of two CTAs, one item each: pairs of row tiles × column tiles
      const int64_t grid = 2 * ((tiles + 1) / 2) * ntiles;
      if (!GU && tma_a() && a_map(am, a.A, (int64_t)a.mt * BM, a.Kd))
        return launch_pair(moe_wgmma_ws_kernel<false, true, true>, "moe_wgmma_ws pair (down, A by TMA)", grid, s,
                           ok_p_a, a, wm, am, wm);
      if (GU && g1_tma(a.N) && a.ascratch != nullptr && a.Kd % 8 == 0 &&
          a_map(am, a.ascratch, (int64_t)a.mt * BM, a.Kd)) {
        const int64_t rows = (int64_t)a.mt * BM;
        permute_rows_kernel<<<(unsigned)((rows + 7) / 8), 256, 0, s>>>(a.ascratch, a.A, a.sorted, a.num_tiles,
                                                                          a.topk, a.Kd, rows, BM);
        MK_LAUNCHED("moe_wgmma permute_rows");
        return launch_pair(moe_wgmma_ws_kernel<true, true, true>, "moe_wgmma_ws pair (gate/up, A by TMA)", grid, s,
                           ok_p_g1a, a, wm, am, wm);
      }
      return launch_pair(moe_wgmma_ws_kernel<GU, false, true>,
                         GU ? "moe_wgmma_ws pair (gate/up)" : "moe_wgmma_ws pair (down)", grid, s, ok_p, a, wm, wm, wm);
    }
    int64_t grid = tiles * ntiles;  // one CTA per work item, or one per SM walking them
    bool dyn = false;  // the persistent CTAs take their items from a.tile_ctr
    if (persist_grid(GU, a)) {
      static const int sms = sm_count();
      if (sms > 0) grid = std::min<int64_t>(grid, sms);
      dyn = a.tile_ctr != nullptr && grid < tiles * ntiles;
    }
    if (!GU && tma_a() && a_map(am, a.A, (int64_t)a.mt * BM, a.Kd))
      return launch_ws<false, true>(dyn, "moe_wgmma_ws (down, A by TMA)", grid, s, ok_ws_a, a, wm, am);
    if (GU && g1_tma(a.N) && a.ascratch != nullptr && a.Kd % 8 == 0 &&
        a_map(am, a.ascratch, (int64_t)a.mt * BM, a.Kd)) {
      const int64_t rows = (int64_t)a.mt * BM;
      permute_rows_kernel<<<(unsigned)((rows + 7) / 8), 256, 0, s>>>(a.ascratch, a.A, a.sorted, a.num_tiles, a.topk,
                                                                        a.Kd, rows, BM);
      MK_LAUNCHED("moe_wgmma permute_rows");
      return launch_ws<true, true>(dyn, "moe_wgmma_ws (gate/up, A by TMA)", grid, s, ok_ws_g1a, a, wm, am);
    }
    return launch_ws<GU, false>(dyn, GU ? "moe_wgmma_ws (gate/up)" : "moe_wgmma_ws (down)", grid, s, ok_ws, a, wm,
                                wm);
  }
  return launch_kern(moe_wgmma_kernel<GU>, THREADS, kSmem, GU ? "moe_wgmma (gate/up)" : "moe_wgmma (down)", tiles,
                     ntiles, s, ok, a);
}

}  // namespace

namespace mkmoe {

int wgmma_gemm(const GemmArgs& a, bool gateup, int64_t tiles, int64_t ntiles, cudaStream_t s, int bm) {
#ifndef MK_MOE_NO_WGMMA
  if (bm == 64) return gateup ? launch64<true>(a, tiles, ntiles, s) : launch64<false>(a, tiles, ntiles, s);
  return gateup ? launch<true>(a, tiles, ntiles, s) : launch<false>(a, tiles, ntiles, s);
#else
  return -1;
#endif
}

}  // namespace mkmoe
