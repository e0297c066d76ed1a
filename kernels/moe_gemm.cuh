// moe_gemm.cuh — internal to libmkernel: the arguments of the grouped expert
// GEMMs shared by moe.cu (mma.sync) and moe_wgmma.cu (sm_90a wgmma).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdlib>

#include "common.cuh"
#include "mk_moe.h"
#include "mma.cuh"

namespace mkmoe {

using bf16 = __nv_bfloat16;

struct GemmArgs {
  const bf16* A;               // GEMM1: x [T, Kd]; GEMM2: act [rows, Kd]
  const bf16* W;               // GEMM1: GateUp [E*2N, Kd]; GEMM2: Down [E*N, Kd]
  const float* bias;           // GEMM1: [E, 2N]; GEMM2: [E, N]; or null
  const int32_t* sorted;       // [rows]: assignment of each row, -1 for padding
  const int32_t* tile_expert;  // [tiles]
  const int32_t* num_tiles;    // [1]
  void* out;                   // GEMM1: act bf16 [rows, N]; GEMM2: y f32 [rows, N], or bf16 when ybf
  int64_t Kd;                  // reduction length (H or I), multiple of 8
  int64_t N;                   // GEMM1: I (gate columns); GEMM2: H
  int64_t experts;             // E: W holds E·2N (GEMM1) or E·N (GEMM2) rows (0: unknown, no TMA)
  int topk;
  int act;
  float alpha, limit;
  int mt, nt;   // row tiles (upper bound) and column tiles of the grid
  int group_m;  // rasterisation: blocks of group_m row tiles × all column tiles run together
  int early_b;  // GEMM2 of moe.cu: issue the first weight stages before the PDL wait (MK_MOE_EARLY_B=0: after)
  int l2pf;     // moe.cu's mma.sync tiles: 0, or 128 / 256, the L2 prefetch size of their weight copies (MK_MOE_L2PF)
  // > 0 (GEMM2 of moe.cu only): a dense GEMM of dense_rows rows (mk_gemm_skinny_bf16): one expert (0),
  // row r of A is row r, rows from dense_rows on are padding; sorted, tile_expert and num_tiles unused.
  int dense_rows;
  // Dense mode, ksplit > 1: the CTAs of split s (blockIdx.x / (mt·nt)) sum the k tiles [s·ktc, (s+1)·ktc)
  // and write their partial sums, bias left out, to part [ksplit, dense_rows, N] f32 instead of out.
  // Grouped mode (dense_rows 0), GEMM2 of moe.cu's mma.sync tiles, ksplit > 1: split s writes its partial
  // sums to part [ksplit, mt·BM, N] f32 and bumps split_cnt[work item]; the last split of an item sums
  // the ksplit partials in s order (+ bias) into out, so y is the same whatever order the splits finish
  // in. GEMM1 (GATEUP) zeroes split_cnt [split_cnt_n] after its PDL wait, before GEMM2 can start.
  int ksplit, ktc;
  float* part;
  int* split_cnt;
  int split_cnt_n;
  // GEMM1 of moe.cu's mma.sync tiles, ksplit > 1 (MK_MOE_G1_SPLIT, an
  // experiment): split s writes its gate and up partial sums to part
  // [ksplit, mt·BM, 2N] f32 and bumps g1_cnt[work item] (zeroed by the align
  // kernel); the last split sums them in s order, adds the biases and
  // writes the activation.
  int* g1_cnt;
  // GEMM1 of the wgmma kernel (MK_MOE_G1_TMA=1): room for [mt·128, Kd] bf16
  // rows, where A's gathered rows are copied in tile order so that the
  // GEMM loads them by TMA; null: the producer gathers them by cp.async.
  bf16* ascratch;
  // Persistent wgmma grids (moe_wgmma.cu, dyn_sched): two counters in
  // the workspace, GEMM1's and GEMM2's, zeroed by a memset before GEMM1;
  // a CTA's first work item is blockIdx.x, each later one gridDim.x plus
  // the count it takes from its GEMM's counter. Null: the CTAs walk fixed
  // strides of gridDim.x.
  int* tile_ctr;
  // GEMM2 (grouped, not dense): y is bf16 [rows, N], the f32 sums rounded
  // (moe.cu's y_bf16: the 128-row prefill tiles), so that GEMM2 writes and
  // the combine reads half the bytes. Split partial sums stay f32.
  int ybf;
  // The wgmma kernels' 128-row tiles: a consumer warpgroup whose 64 rows
  // are all padding (an expert's last tile holds at most 64 rows) skips its
  // wgmmas (mkwg::ws_consume's skip_bar); with kHalfSkipBox the producer
  // loads only rows 0–63 of A there. Bits kHalfSkip*, set by
  // half_skip_mode; skip_half decides a tile.
  int half_skip;
};

// store_y2 writes a GEMM2 output pair: elements idx, idx + 1 of y, f32 or
// (ybf) bf16 (idx is even: a bf16 pair is 4-byte aligned).
__device__ __forceinline__ void store_y2(void* y, int64_t idx, float2 v, bool ybf) {
  if (ybf)
    *reinterpret_cast<__nv_bfloat162*>(reinterpret_cast<__nv_bfloat16*>(y) + idx) = __floats2bfloat162_rn(v.x, v.y);
  else
    *reinterpret_cast<float2*>(reinterpret_cast<float*>(y) + idx) = v;
}

using mk::mma16816;

// The mma.sync expert GEMMs (moe.cu's grouped kernel, moe_fused.cu's
// persistent one) stage 64-column bf16 tiles: 128-byte rows of eight
// 16-byte chunks, chunk ch of row row XOR-swizzled by the row (swz64, in
// elements), so that ldmatrix reads them without bank conflicts.
constexpr int kTileK = 64;
__device__ __forceinline__ int swz64(int row, int ch) { return row * kTileK + ((ch ^ (row & 7)) << 3); }

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* smem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// mma_stage accumulates one staged 64-column step into a warp's tile:
// acc[mf][nf] += A rows wm·WM + 16·mf (+ lane) of a · the B rows brow(nf)
// of b, k in order (four m16n8k16 steps). a and b are swz64 tiles in
// shared memory; brow(nf) is the first of the 8 B rows of n fragment nf.
template <int MF, int NF, int WM, class BRow>
__device__ __forceinline__ void mma_stage(float (&acc)[MF][NF][4], const bf16* a, const bf16* b, int wm, int lane,
                                          const BRow& brow) {
  static_assert(NF % 2 == 0, "n fragments come in pairs");
#pragma unroll
  for (int kk = 0; kk < kTileK / 16; kk++) {
    uint32_t af[MF][4];
#pragma unroll
    for (int mf = 0; mf < MF; mf++) {
      const int r = wm * WM + mf * 16 + (lane % 16);
      ldsm_x4(af[mf], a + swz64(r, kk * 2 + lane / 16));
    }
    uint32_t bfr[NF][2];
#pragma unroll
    for (int pr = 0; pr < NF / 2; pr++) {
      const int mat = lane / 8;
      const int r = brow(2 * pr + mat / 2) + (lane % 8);
      uint32_t q[4];
      ldsm_x4(q, b + swz64(r, kk * 2 + (mat & 1)));
      bfr[2 * pr][0] = q[0];
      bfr[2 * pr][1] = q[1];
      bfr[2 * pr + 1][0] = q[2];
      bfr[2 * pr + 1][1] = q[3];
    }
#pragma unroll
    for (int mf = 0; mf < MF; mf++)
#pragma unroll
      for (int nf = 0; nf < NF; nf++) mma16816(acc[mf][nf], af[mf], bfr[nf][0], bfr[nf][1]);
  }
}

// cp.async commit groups of the rings below.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// tile_brow is the first B row (in the CTA's BN-row tile) of n fragment nf
// of warp column wn: GEMM1's (GATEUP) tile holds BN/2 gate rows then the
// BN/2 matching up rows, and a warp's first NF/2 fragments are its gate
// columns, the rest the same columns' up rows; GEMM2's rows are in order.
template <bool GATEUP, int NF, int WN, int BN>
__device__ __forceinline__ int tile_brow(int nf, int wn) {
  if (GATEUP) return nf < NF / 2 ? wn * (WN / 2) + nf * 8 : BN / 2 + wn * (WN / 2) + (nf - NF / 2) * 8;
  return wn * WN + nf * 8;
}

// tile_b_row is row r (< BN) of the weight tile of column tile ntile, in
// W [rows, Kd] whose expert starts at row row0: for GEMM1 (GATEUP) its
// BN/2 gate rows then the matching up rows (the expert's gate rows [0, N),
// up rows [N, 2N)), for GEMM2 its rows [0, N); null past N (its copies
// zero-fill).
template <bool GATEUP, int BN>
__device__ __forceinline__ const bf16* tile_b_row(const bf16* W, int64_t row0, int r, int ntile, int64_t N,
                                                  int64_t Kd) {
  int64_t wrow;
  bool ok;
  if (GATEUP) {
    const int64_t j = (int64_t)ntile * (BN / 2) + (r % (BN / 2));
    ok = j < N;
    wrow = row0 + (r < BN / 2 ? 0 : N) + j;
  } else {
    const int64_t n = (int64_t)ntile * BN + r;
    ok = n < N;
    wrow = row0 + n;
  }
  return ok ? W + wrow * Kd : nullptr;
}

// zero_acc clears an mma.sync tile's accumulators.
template <int MF, int NF>
__device__ __forceinline__ void zero_acc(float (&acc)[MF][NF][4]) {
#pragma unroll
  for (int i = 0; i < MF; i++)
#pragma unroll
    for (int j = 0; j < NF; j++)
#pragma unroll
      for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;
}

// ring_prologue issues the first STAGES − 1 k tiles of mma_ring's ring
// (load(stage, k tile) for those below KT), one commit group each.
template <int STAGES, class Load>
__device__ __forceinline__ void ring_prologue(int KT, const Load& load) {
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < KT) load(s, s);
    cp_async_commit();
  }
}

// ring_prologue_b_first issues the same prologue with the weights first:
// the first STAGES − 1 B stages (loadB) as one commit group, then wait()
// (a PDL wait, or a task's input wait: false gives up, after every copy
// issued has landed, and the function returns false), then the A stages
// (loadA) one group each — mma_ring's wait for stage s's A group also
// waits for the older weight group. Weights are constants, so a CTA
// streams them while what it waits for still runs (moe.cu's GEMM2 before
// griddepcontrol.wait, the fused kernel's 16-row tasks before their
// input waits).
template <int STAGES, class LoadA, class LoadB, class Wait>
__device__ __forceinline__ bool ring_prologue_b_first(int KT, const LoadA& loadA, const LoadB& loadB,
                                                      const Wait& wait) {
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++)
    if (s < KT) loadB(s, s);
  cp_async_commit();
  if (!wait()) {
    cp_async_wait<0>();  // no copy into shared memory outlives the caller's use of it
    return false;
  }
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < KT) loadA(s, s);
    cp_async_commit();
  }
  return true;
}

// mma_ring is the k loop of an mma.sync tile over a cp.async ring of
// STAGES stages, sA [STAGES][BM·kTileK] and sB [STAGES][BN·kTileK], whose
// first STAGES − 1 k tiles the caller has issued (one commit group each):
// per k tile kt < KT it waits for kt's stage, issues k tile kt + STAGES − 1
// (load(stage, k tile)) and multiplies kt's stage into acc (mma_stage,
// brow as there); then it waits for every copy.
template <int STAGES, int BM, int BN, int WM, int MF, int NF, class Load, class BRow>
__device__ __forceinline__ void mma_ring(float (&acc)[MF][NF][4], const bf16* sA, const bf16* sB, int KT, int wm,
                                         int lane, const Load& load, const BRow& brow) {
  for (int kt = 0; kt < KT; kt++) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int nk = kt + STAGES - 1;
    if (nk < KT) load(nk % STAGES, nk);
    cp_async_commit();
    mma_stage<MF, NF, WM>(acc, sA + (kt % STAGES) * BM * kTileK, sB + (kt % STAGES) * BN * kTileK, wm, lane, brow);
  }
  cp_async_wait<0>();
}

// The paired ring (dec_pair): mma_ring's k loop with
// its copies issued two k tiles at a time — one commit group a pair, each
// weight row's 256 bytes of the two tiles by 16 consecutive lanes (PairB)
// — for an even STAGES. The multiplications run in the same k order, so
// the sums are bit-equal to mma_ring's. Why: a weight stream read in
// 64-row blocks through a cp.async ring ran 3–5 % faster in 256-byte row
// segments than in 128-byte ones at the same bytes in flight (H200,
// scripts/stream_probe.cu, docs/PERF.md "GPU, fifty-sixth pass").
// load2(stage, k tile, two) issues k tile kt into stage and, when two,
// kt + 1 into stage + 1 (stage is even).

// ring2_prologue issues the first STAGES − 2 k tiles in pairs.
template <int STAGES, class Load2>
__device__ __forceinline__ void ring2_prologue(int KT, const Load2& load2) {
  static_assert(STAGES % 2 == 0 && STAGES >= 4, "pairs of stages");
#pragma unroll
  for (int s = 0; s < STAGES - 2; s += 2) {
    if (s < KT) load2(s, s, s + 1 < KT);
    cp_async_commit();
  }
}

// ring2_prologue_b_first is ring_prologue_b_first over pairs: the first
// STAGES − 2 weight tiles (loadB2) as one group, wait(), then the A tiles
// (loadA2) one group a pair.
template <int STAGES, class LoadA2, class LoadB2, class Wait>
__device__ __forceinline__ bool ring2_prologue_b_first(int KT, const LoadA2& loadA2, const LoadB2& loadB2,
                                                       const Wait& wait) {
  static_assert(STAGES % 2 == 0 && STAGES >= 4, "pairs of stages");
#pragma unroll
  for (int s = 0; s < STAGES - 2; s += 2)
    if (s < KT) loadB2(s, s, s + 1 < KT);
  cp_async_commit();
  if (!wait()) {
    cp_async_wait<0>();
    return false;
  }
#pragma unroll
  for (int s = 0; s < STAGES - 2; s += 2) {
    if (s < KT) loadA2(s, s, s + 1 < KT);
    cp_async_commit();
  }
  return true;
}

// mma_ring2 is mma_ring over pairs: per pair of k tiles (kt, kt + 1) it
// waits for their group, issues the pair kt + STAGES − 2 into the stages
// the previous pair freed, and multiplies kt then kt + 1 (if < KT).
template <int STAGES, int BM, int BN, int WM, int MF, int NF, class Load2, class BRow>
__device__ __forceinline__ void mma_ring2(float (&acc)[MF][NF][4], const bf16* sA, const bf16* sB, int KT, int wm,
                                          int lane, const Load2& load2, const BRow& brow) {
  static_assert(STAGES % 2 == 0 && STAGES >= 4, "pairs of stages");
  for (int kt = 0; kt < KT; kt += 2) {
    cp_async_wait<(STAGES - 2) / 2 - 1>();
    __syncthreads();
    const int nk = kt + STAGES - 2;
    if (nk < KT) load2(nk % STAGES, nk, nk + 1 < KT);
    cp_async_commit();
    mma_stage<MF, NF, WM>(acc, sA + (kt % STAGES) * BM * kTileK, sB + (kt % STAGES) * BN * kTileK, wm, lane, brow);
    if (kt + 1 < KT)
      mma_stage<MF, NF, WM>(acc, sA + ((kt + 1) % STAGES) * BM * kTileK, sB + ((kt + 1) % STAGES) * BN * kTileK, wm,
                            lane, brow);
  }
  cp_async_wait<0>();
}

// ring_run is a 16×64-or-larger mma.sync tile's whole k loop: with early,
// ring_prologue_b_first through wait(), else wait() then ring_prologue;
// then mma_ring. PAIR: the paired forms instead (ring2_prologue_b_first /
// ring2_prologue, mma_ring2), the weights by loadB2(stage, k tile, two).
// False, with every copy landed, when wait() gave up.
template <int STAGES, int BM, int BN, int WM, bool PAIR, int MF, int NF, class LoadA, class LoadB, class LoadB2,
          class Wait, class BRow>
__device__ __forceinline__ bool ring_run(float (&acc)[MF][NF][4], const bf16* sA, const bf16* sB, int KT, int wm,
                                         int lane, const LoadA& loadA, const LoadB& loadB, const LoadB2& loadB2,
                                         bool early, const Wait& wait, const BRow& brow) {
  if constexpr (PAIR) {
    auto loadA2 = [&](int stage, int kt, bool two) {
      loadA(stage, kt);
      if (two) loadA(stage + 1, kt + 1);
    };
    auto load2 = [&](int stage, int kt, bool two) {
      loadA2(stage, kt, two);
      loadB2(stage, kt, two);
    };
    if (early) {
      if (!ring2_prologue_b_first<STAGES>(KT, loadA2, loadB2, wait)) return false;
    } else {
      if (!wait()) return false;
      ring2_prologue<STAGES>(KT, load2);
    }
    mma_ring2<STAGES, BM, BN, WM>(acc, sA, sB, KT, wm, lane, load2, brow);
  } else {
    auto load = [&](int stage, int kt) {
      loadA(stage, kt);
      loadB(stage, kt);
    };
    if (early) {
      if (!ring_prologue_b_first<STAGES>(KT, loadA, loadB, wait)) return false;
    } else {
      if (!wait()) return false;
      ring_prologue<STAGES>(KT, load);
    }
    mma_ring<STAGES, BM, BN, WM>(acc, sA, sB, KT, wm, lane, load, brow);
  }
  return true;
}

// activation is the expert's gated activation of gate g and up u (biases
// added): silu(g)·u, or gpt-oss's clamped form (MK_MOE_SWIGLU_CLAMPED).
// The sigmoid's division is the fast one (__fdividef: g times an
// approximate reciprocal, within 2 ulp; g / inf is 0, so silu of a large
// negative g is 0 as it should be), as __expf is: both far below the bf16
// rounding of the result. With IEEE division the wgmma GEMM1's epilogue
// cost 1–2 % of the grouped layer at 4096–16384 tokens (H200, forty-fourth
// pass); every path (GEMV, mma.sync, wgmma, fused, FP4) uses this one, so a
// token's activation does not depend on the path its batch takes.
__device__ __forceinline__ float activation(float g, float u, int act, float alpha, float limit) {
  if (act == MK_MOE_SWIGLU) return __fdividef(g, 1.0f + __expf(-g)) * u;
  if (g > limit) g = limit;
  if (u > limit) u = limit;
  else if (u < -limit) u = -limit;
  return (u + 1.0f) * __fdividef(g, 1.0f + __expf(-alpha * g));
}

// act_pair_f is the activation of output columns j and j + 1 from their
// gate (g0, g1) and up (u0, u1) sums, plus gb's gate and up biases when gb
// (the expert's [2N] bias row) is set: every GEMM1 epilogue's element pair
// (store_act_frags, store_act_cols, moe_wgmma.cu's staged store); act_pair
// rounds it to bf16.
__device__ __forceinline__ float2 act_pair_f(float g0, float g1, float u0, float u1, const float* gb, int64_t j,
                                             int64_t N, int act, float alpha, float limit) {
  const float g[2] = {g0, g1}, u[2] = {u0, u1};
  float r2[2];
#pragma unroll
  for (int q = 0; q < 2; q++) {
    float gv = g[q], uv = u[q];
    if (gb) {
      gv += gb[j + q];
      uv += gb[N + j + q];
    }
    r2[q] = activation(gv, uv, act, alpha, limit);
  }
  return make_float2(r2[0], r2[1]);
}
__device__ __forceinline__ __nv_bfloat162 act_pair(float g0, float g1, float u0, float u1, const float* gb, int64_t j,
                                                   int64_t N, int act, float alpha, float limit) {
  const float2 r = act_pair_f(g0, g1, u0, u1, gb, j, N, act, alpha, limit);
  return __floats2bfloat162_rn(r.x, r.y);
}


// padded_scan writes off[e] = the sum over experts e' < e of cnt[e']
// rounded up to BM, and off[E] = the total (one block; every thread calls
// it; off is in shared memory and complete when it returns). Thread i owns
// experts [i·c, i·c + c): a warp scan, then one over the warps' totals (a
// loop on one thread took ~4 µs of the align's 10 at E = 128).
__device__ __forceinline__ void padded_scan(const int* cnt, int* off, int E, int BM) {
  __shared__ int wsum[32];
  const int c = (E + (int)blockDim.x - 1) / (int)blockDim.x;
  const int e0 = (int)threadIdx.x * c, e1 = min(E, e0 + c);
  int mine = 0;
  for (int e = e0; e < e1; e++) mine += (cnt[e] + BM - 1) / BM * BM;
  const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
  int inc = mine;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  if (lane == 31) wsum[wp] = inc;
  __syncthreads();
  if (wp == 0) {
    const int nw = (int)blockDim.x >> 5;
    int x = lane < nw ? wsum[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (lane < nw) wsum[lane] = x;  // inclusive over warps
  }
  __syncthreads();
  int o = inc - mine + (wp > 0 ? wsum[wp - 1] : 0);
  for (int e = e0; e < e1; e++) {
    off[e] = o;
    o += (cnt[e] + BM - 1) / BM * BM;
  }
  if (threadIdx.x == blockDim.x - 1) off[E] = o;  // o is the total here (later threads own no experts)
  __syncthreads();
}

// group_tile maps work item id of an mt × nt grid of (row tile, column
// tile) to its tile, rasterised in groups of group_m row tiles × every
// column tile, row tiles fastest inside a group: the CTAs that run together
// share their A rows (across column tiles) and weight tiles (across row
// tiles) in L2. Every expert GEMM grid (moe.cu, moe_wgmma.cu) and the fused
// kernel's GEMM task queue (moe_fused.cu) walk their tiles this way.
__device__ __forceinline__ void group_tile(int id, int group_m, int mt, int nt, int& tile, int& ntile) {
  const int span = group_m * nt;
  const int first_m = (id / span) * group_m;
  const int gsize = min(mt - first_m, group_m);
  tile = first_m + (id % span) % gsize;
  ntile = (id % span) / gsize;
}

// store_y_frags writes row half h of one m fragment of a warp's mma.sync
// GEMM2 tile (acc: its NF n fragments) to the row out (f32, or bf16 when
// ybf: store_y2): out[n] = acc + db[n] (db may be null) for the warp's
// columns n = ntile·BN + wn·WN + 8·nf + 2·(lane%4) (+1) below N.
template <int NF, int WN, int BN>
__device__ __forceinline__ void store_y_frags(void* out, const float (&acc)[NF][4], int h, int ntile, int wn,
                                              int lane, int64_t N, const float* db, bool ybf) {
#pragma unroll
  for (int nf = 0; nf < NF; nf++) {
    const int64_t n = (int64_t)ntile * BN + wn * WN + nf * 8 + (lane % 4) * 2;
    if (n >= N) continue;
    float2 v = make_float2(acc[nf][2 * h], acc[nf][2 * h + 1]);
    if (db) {
      v.x += db[n];
      v.y += db[n + 1];
    }
    store_y2(out, n, v, ybf);
  }
}

// store_act_frags writes row half h of one m fragment of a warp's mma.sync
// GEMM1 tile (acc: its NF n fragments, the first NF/2 gate, the rest the
// same columns' up; tile_brow's layout) as the activation: out[j] =
// act(gate + gb[j], up + gb[N + j]) rounded to bf16 for the warp's columns
// j = ntile·BN/2 + wn·WN/2 + 8·nf + 2·(lane%4) (+1) below N; gb may be null.
template <int NF, int WN, int BN>
__device__ __forceinline__ void store_act_frags(bf16* out, const float (&acc)[NF][4], int h, int ntile, int wn,
                                                int lane, int64_t N, const float* gb, int act, float alpha,
                                                float limit) {
#pragma unroll
  for (int nf = 0; nf < NF / 2; nf++) {
    const int64_t j = (int64_t)ntile * (BN / 2) + wn * (WN / 2) + nf * 8 + (lane % 4) * 2;
    if (j >= N) continue;
    *reinterpret_cast<__nv_bfloat162*>(out + j) = act_pair(acc[nf][2 * h], acc[nf][2 * h + 1], acc[nf + NF / 2][2 * h],
                                                            acc[nf + NF / 2][2 * h + 1], gb, j, N, act, alpha, limit);
  }
}

// store_act_cols writes ni 8-column blocks of one row as act(gate + gb[j],
// up + gb[N + j]) rounded to bf16 into out[j], j = j0 + 8i + 2·(lane%4)
// (+1) below N, where g(k) and u(k) give accumulator k of the gate and up
// blocks (the wgmma layout: this lane holds columns 8i + 2·(lane%4) and +1
// of block i in d[4i + 2h + q] for row half h); gb is the expert's gate/up
// bias row or null.
template <int NI, class G, class U>
__device__ __forceinline__ void store_act_cols(bf16* out, G g, U u, int h, int lane, int64_t j0, int64_t N,
                                               const float* gb, int act, float alpha, float limit) {
#pragma unroll
  for (int i = 0; i < NI; i++) {
    const int64_t j = j0 + 8 * i + 2 * (lane % 4);
    if (j >= N) continue;
    *reinterpret_cast<__nv_bfloat162*>(out + j) =
        act_pair(g(4 * i + 2 * h), g(4 * i + 2 * h + 1), u(4 * i + 2 * h), u(4 * i + 2 * h + 1), gb, j, N, act, alpha,
                 limit);
  }
}

// store_act_row writes row half h of a warpgroup's m64n128 gate and up
// blocks (acc0, acc1): 128 columns from j0. The grouped wgmma GEMM1
// (moe_wgmma.cu) and the fused kernel's wgmma GEMM1 (moe_fused.cu) share
// it.
__device__ __forceinline__ void store_act_row(bf16* out, const float (&acc0)[64], const float (&acc1)[64], int h,
                                              int lane, int64_t j0, int64_t N, const float* gb, int act, float alpha,
                                              float limit) {
  store_act_cols<16>(out, [&](int k) { return acc0[k]; }, [&](int k) { return acc1[k]; }, h, lane, j0, N, gb, act,
                     alpha, limit);
}

// store_act_half is store_act_row for a warpgroup's m64n128 block whose
// columns 0–63 are gate and 64–127 the matching up columns (the 64-row
// wgmma GEMM1's layout): 64 columns from j0.
__device__ __forceinline__ void store_act_half(bf16* out, const float (&acc)[64], int h, int lane, int64_t j0,
                                               int64_t N, const float* gb, int act, float alpha, float limit) {
  store_act_cols<8>(out, [&](int k) { return acc[k]; }, [&](int k) { return acc[32 + k]; }, h, lane, j0, N, gb, act,
                    alpha, limit);
}

// cp_async16_pf copies 16 bytes from global to shared memory through L2
// (cp.async.cg; zero-fills them, reading nothing, when !valid) with an L2
// prefetch size: pf 256 asks L2 for the aligned 256 bytes around gmem (a
// weight row's next k tile too), 128 for its line, anything else for no
// size. pf is the same for every thread.
__device__ __forceinline__ void cp_async16_pf(void* smem, const void* gmem, bool valid, int pf) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  const int n = valid ? 16 : 0;
  if (pf == 256)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
  else if (pf == 128)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}

// cp_async16 is cp_async16_pf without a prefetch size.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  cp_async16_pf(smem, gmem, valid, 0);
}

// PairB is a thread's share of the weight copies of a pair of k tiles for
// the paired ring (mma_ring2): a BN-row stage of each, 16-byte chunk c of
// the pair row c / 16, tile (c / 8) % 2, column chunk c % 8, so 16
// consecutive lanes copy one row's 256 contiguous bytes. A thread's rows
// are tid / 16 + i·THREADS / 16, all with the same swizzle (THREADS is a
// multiple of 128), so it keeps one shared-memory offset and, per row,
// the row's element offset from base (the expert's weights: < 2^31).
template <int BN, int THREADS>
struct PairB {
  static_assert(THREADS % 128 == 0 && 2 * BN * 8 % THREADS == 0, "whole rows of 16 lanes, one swizzle");
  static constexpr int PER = 2 * BN * 8 / THREADS, RSTEP = THREADS / 16;
  const bf16* base;
  int32_t off[PER];  // row tid / 16 + i·RSTEP from base (-1: none, zero-filled)
  int dst0, col0;    // shared-memory offset of chunk 0 (its tile's stage from the pair's), its column
  // init takes the expert's weights b and the rows' pointers row(r) into
  // them (null: none) for r < BN.
  template <class Row>
  __device__ __forceinline__ void init(int tid, const bf16* b, const Row& row) {
    base = b;
    const int r0 = tid / 16, h = (tid / 8) % 2, ch = tid % 8;
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const bf16* w = row(r0 + i * RSTEP);
      off[i] = w != nullptr ? (int32_t)(w - b) : -1;
    }
    dst0 = h * BN * kTileK + swz64(r0, ch);
    col0 = h * kTileK + ch * 8;
  }
  // load copies k tiles from column k0 into stage sB (and, when two, the
  // next into the stage after it); columns from klim on are zero-filled.
  __device__ __forceinline__ void load(bf16* sB, int64_t k0, bool two, int64_t klim, int pf) const {
    if (!two && col0 >= kTileK) return;
    const int64_t k = k0 + col0;
#pragma unroll
    for (int i = 0; i < PER; i++) {
      const bool v = off[i] >= 0 && k < klim;
      cp_async16_pf(sB + dst0 + i * RSTEP * kTileK, v ? base + off[i] + k : base, v, pf);
    }
  }
};

// l2pf_env is the L2 prefetch size the environment variable name asks for
// (128 or 256; anything else: none), dflt when it is unset.
inline int l2pf_env(const char* name, int dflt) {
  const char* v = getenv(name);
  if (v == nullptr) return dflt;
  const int n = atoi(v);
  return n == 128 || n == 256 ? n : 0;
}

// group_m is the rasterisation group (row tiles) of group_tile;
// MK_MOE_GROUP_M overrides the default 8 (1: row tiles fastest, no
// grouping) for measurements.
inline int group_m() {
  static const int g = [] {
    const char* v = getenv("MK_MOE_GROUP_M");
    const int n = v ? atoi(v) : 0;
    return n > 0 ? n : 8;
  }();
  return g;
}

// gather_by_copy says whether GEMM1's rows are first copied into tile order
// and loaded by TMA (grouped: MK_MOE_G1_TMA; fused: MK_MOE_FUSED_COPY_LOCAL),
// instead of gathered row by row by the producer warps. The copy costs
// 2·H bytes a row read and written, GEMM1 2·H·2·I flops a row, so it pays
// for itself only when I is large: measured on an H200 (session 17,
// docs/PERF.md) it is 3-9 % faster on Mixtral's I = 14336, 2-11 % slower on
// Qwen3's I = 768 and DeepSeek-V3's I = 2048 at most token counts. The
// variable set to 1 or 0 (force: mk::env_force, read once by the caller)
// forces it on or off; unset (-1), it is on from kCopyMinI.
constexpr int64_t kCopyMinI = 4096;
inline bool gather_by_copy(int force, int64_t inter) {
  return force >= 0 ? force == 1 : inter >= kCopyMinI;
}

// dec_pair: the 16×64 decode tiles at an even ring depth (moe.cu's
// grouped GEMMs and the fused kernel's 16-row tasks) issue their copies two
// k tiles at a time (their PAIR instantiations, mma_ring2): each weight
// row's 256 bytes by 16 lanes in one go, which a probe read 3–5 % faster
// than 128-byte segments (docs/PERF.md, "GPU, fifty-sixth pass"). Written
// after that pass's device time: off until measured; MK_MOE_DEC_PAIR=1
// turns it on (read once). Its own instantiations, so the plain ring's
// registers are untouched; moe.cu's fit_stages still counts the plain
// kernels' CTAs an SM. The sums are bit-equal.
inline bool dec_pair() {
  static const bool on = mk::env_is("MK_MOE_DEC_PAIR", '1');
  return on;
}

// The bits of GemmArgs::half_skip / Params::half_skip (half_skip_mode).
constexpr int kHalfSkipOn = 1;      // the second warpgroup's wgmmas skipped on a padding half
constexpr int kHalfSkipBox = 2;     // and A rows 64–127 not loaded where they come by TMA
constexpr int kHalfSkipShared = 4;  // also in tiles whose expert has other row tiles

// half_skip_mode is GemmArgs::half_skip / Params::half_skip for a layer of
// intermediate size inter: whether a 128-row wgmma tile's second consumer
// warpgroup skips its wgmmas when its 64 rows are all padding
// (mkwg::ws_consume's skip_bar) — 0 off; kHalfSkipOn the wgmmas skipped;
// with kHalfSkipBox (the default where on) also the tile's A rows 64–127
// not loaded where they come by TMA (one 64-row box a stage instead of
// two; MK_MOE_HALF_BOX=0 keeps both). Measured on an H200 (fifty-fifth
// pass, docs/PERF.md, three rounds against off): DeepSeek-V3 ×0.965–0.988
// and Qwen3-30B-A3B ×0.967–0.993 at 1024–16384 tokens, grouped and fused;
// on Mixtral (I = 14336) ×1.011–1.023 at 1024 / 16384 — hence on only
// below kHalfSkipMinI. MK_MOE_HALF_SKIP=1 / 0 forces it on / off.
//
// lone: only in a tile that is its expert's only one (the expert has ≤ 64
// rows), not in the short last tile of an expert of several row tiles
// (kHalfSkipShared unset). The caller passes its default;
// MK_MOE_HALF_SKIP_SHARED=1 / 0 forces every padding half / lone tiles
// only. Such a tile streams the same weight tiles as its expert's full
// tiles, which run beside it (group_tile) and read them from L2; a guess,
// not measured: a tile that skips runs ahead of them, over GEMM1's long
// reduction far enough that the weights have left L2 when the full tiles
// reach them. Measured (fifty-sixth pass, three rounds, even routing,
// lone against every half): the fused DeepSeek-V3 layer (H = 7168)
// ×0.965 at 4096 tokens (128 rows an expert: a full tile and a short
// one), ×1.000 at 1024 / 2048, ×1.010 at 16384; but Qwen3-30B-A3B ×1.017–
// 1.033 at 2048–16384 (fused and grouped) and grouped DeepSeek-V3 ×1.022
// at 4096. So the fused kernel passes lone from hidden kHalfSkipLoneH,
// the grouped kernels never.
constexpr int64_t kHalfSkipMinI = 4096;
constexpr int64_t kHalfSkipLoneH = 4096;
inline int half_skip_mode(int64_t inter, bool lone) {
  static const int force = mk::env_force("MK_MOE_HALF_SKIP");
  static const bool box = !mk::env_is("MK_MOE_HALF_BOX", '0');
  static const int shared = mk::env_force("MK_MOE_HALF_SKIP_SHARED");
  const bool on = force >= 0 ? force == 1 : inter < kHalfSkipMinI;
  if (!on) return 0;
  const bool all = shared >= 0 ? shared == 1 : !lone;
  return kHalfSkipOn | (box ? kHalfSkipBox : 0) | (all ? kHalfSkipShared : 0);
}

// skip_half says whether a 128-row tile whose rows 64–127 are all padding
// (pad_half) skips that half under mode: kHalfSkipOn, and the tile is its
// expert's only one (prev_same: the tile before it belongs to the same
// expert or slot) unless kHalfSkipShared.
__host__ __device__ __forceinline__ bool skip_half(int mode, bool pad_half, bool prev_same) {
  return (mode & kHalfSkipOn) && pad_half && (!prev_same || (mode & kHalfSkipShared));
}

// kPersistMaxI: layers of intermediate size up to this run both 128-row
// wgmma GEMMs on persistent grids with their items by counter (dyn_sched,
// moe_wgmma.cu's persist_grid) and GEMM1's tiles stored by TMA (STC).
// Measured on an H200 (forty-fifth pass, docs/PERF.md): Qwen3-30B-A3B's
// grouped layer ×0.974–0.984 at 1024 and 16384 tokens, level at 2048–4096;
// Mixtral and DeepSeek-V3 level or noisy, so they keep one CTA an item.
constexpr int64_t kPersistMaxI = 1024;

// dyn_sched: the persistent wgmma grids of a layer of intermediate size
// inter take their work items from a counter (GemmArgs.tile_ctr) in the
// order of the grouped rasterisation, as the hardware hands out the CTAs
// of a grid of one CTA an item, instead of each CTA walking a fixed
// stride: by default up to kPersistMaxI; MK_MOE_DYN=1 / 0 forces (read once).
inline bool dyn_sched(int64_t inter) {
  static const int force = mk::env_force("MK_MOE_DYN");
  return force >= 0 ? force == 1 : inter <= kPersistMaxI;
}

// wgmma_gemm launches the sm_90a wgmma grouped GEMM (bm×256 CTA tiles) when
// moe_wgmma.cu is linked in (a weak symbol otherwise null); it returns
// MK_OK, or an mk status when the launch fails, or -1 when the kernel is
// not available for this device (then the mma.sync kernel runs).
// bm is the row tile: 128 (two consumer warpgroups of 64 rows × 256
// columns) or 64 (two of 64 rows × 128 columns: the 128×256 tile's weight
// stream for experts of few rows, with half the padded rows' MMA work).
int wgmma_gemm(const GemmArgs& a, bool gateup, int64_t tiles, int64_t ntiles, cudaStream_t s, int bm)
    __attribute__((weak));

}  // namespace mkmoe
