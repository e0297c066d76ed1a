// moe_fused.cu — one MoE layer's routed experts over R emulated
// expert-parallel ranks in ONE persistent cooperative launch (mk_moe_fused),
// the same work from separate launches as a baseline (mk_moe_fused_separate),
// and the watchdog's error record (mk_moe_fused_check); see mk_moe_fused.h.
//
// Plan (a pre-pass launch, one CTA per rank). For every source rank r and
// assignment a = t*K + k, the placement table gives the (rank d, local slot)
// serving it. CTA d counts the rows d receives per slot from every source
// (and how many of them come from d itself: local rows), pads each slot's
// rows to the row tile BM (offsets by a block scan), orders each slot's
// local rows before its remote ones, and writes: num_tiles, per tile its
// slot and its number of REMOTE rows (tile_want), per receive row its
// source (a*8 + r, or -1 for padding), and per assignment its destination
// row (dest_row[r][a] = row*8 + d, or -1 when dropped); it adds the rows to
// the expert-load counters (int64 atomics per (rank, slot)) and zeroes the
// flags and (CTA 0) the queue counters of the persistent launch. The plan
// is a separate launch so that the persistent kernel needs no grid-wide
// barrier; the persistent kernel reads num_tiles to size its task queue.
//
// Local rows are never copied: GEMM1 gathers a row whose source is its own
// rank straight from x (as moe.cu's GEMM1 gathers from x), so a tile waits
// only for its remote rows (tile_want of them; none: no wait), and with one
// rank there is no dispatch task at all. GEMM2 writes every row once (bf16
// on the wgmma tiles, else f32) straight into the source rank's return
// rows, where combine reads it.
//
// Persistent kernel. CTAs [0, dispatch_ctas) start with the dispatch queue;
// when it is empty they, and from the start all other CTAs, take tasks from
// the main queue: every rank's GEMM1 tasks (row tile × column block), then
// every rank's GEMM2 tasks, then the combine tasks (a source rank's block
// of tokens). Roles:
//   dispatch  (source rank r, block of dt ≈ 32/K tokens; only when R > 1):
//             one warp per remote (t, k) copies x_r[t] to row dest_row of
//             rank d's receive buffer (16-byte L2 stores, eight in flight per
//             lane), bar.sync, then one thread per row +1 on arrive_d[tile]
//             (release);
//   GEMM1     (d, tile, block n): waits for arrive_d[tile] == tile_want,
//             gate/up GEMM (A rows: local from x_d, remote from the receive
//             buffer) with SwiGLU in the epilogue → act_d rows (bf16), then
//             +1 on g1done_d[tile] (release);
//   GEMM2     (d, tile, block n): waits for g1done_d[tile] == GEMM1 blocks,
//             down GEMM → rows (bf16, or f32) written to the source rank's
//             return buffer ret_r[a] (a = t*K + k), then +1 per row on
//             tokdone_r[t];
//   combine   (r, block of CT tokens, block of comb_cols columns — whole
//             rows but for the 16-row tiles): waits for tokdone_r[t] ==
//             (GEMM2 blocks) × (routed k of t), out_r[t] = Σ_k
//             w[t,k]·ret_r[t*K+k] in k order (+ shared_r[t]): deterministic.
//             At ≤ 4 tokens a rank on the 16-row tiles (Params.fold) there
//             are no combine tasks: the GEMM2 task that returns a token's
//             last row of a column block sums that block (fold_combine).
// Protocol (as ring.cu): writers store, synchronise (bar.sync, or each lane
// fences then bar.warp.sync), one thread does fence.acq_rel.gpu and
// red.release.gpu.add; readers spin on one thread with ld.acquire.gpu, then
// bar.sync, and read the data through L2 only (cp.async.cg, ld.global.cg).
// Local rows need no protocol: x is written before the launch.
// Deadlock freedom: every task waits only on tasks earlier in the queue
// order (dispatch < GEMM1 < GEMM2 < combine); a CTA finishes a task before
// taking the next, tasks are taken in increasing order, every CTA is
// co-resident (cooperative launch) and dispatch CTAs never wait: every task
// waited for is held by a running CTA that will finish it. A GEMM1 tile's
// counter is raised only by dispatch tasks (one per remote row, exactly
// tile_want of them), never by local rows, so the count it waits for is
// reached exactly once every dispatch task has run.
//
// Watchdog: every spin is bounded by timeout_ns on %globaltimer; on timeout
// the CTA writes the error record (rank, role, tile, seen, want) once
// (atomicCAS on word 0) and exits; other CTAs' waits see the record and
// exit too. mk_moe_fused_check reads and clears it.
//
// Rank-local mode (mk_moe_fused_rank, Params.me >= 0): the same kernels
// serve ONE rank per launch, its peers being other launches (other
// processes, through CUDA IPC mappings of their workspaces). The plan (one
// CTA) first pushes this rank's ids into every rank's workspace (rids, by
// epoch parity) and raises rflag[me] = epoch there, waits for every
// source's rflag, plans this rank's tiles exactly as above (reading the
// sources' ids from its own rids), stores each source's dest_row entries
// into that source's workspace, and raises pflag[me] = epoch in every
// workspace. The persistent launch takes only this rank's dispatch, GEMM
// and combine tasks; a CTA waits for every pflag before its first dispatch
// or combine task (dest_row complete). Flags and counters a peer writes are
// in the memory of the rank that waits; the protocol runs at system scope
// (fence.sc.sys, red/st.release.sys, ld.acquire.sys). Epochs instead of
// resets: the per-tile and per-token counters are zeroed by their owner
// before it raises the flag the writers wait for (arrive before pflag,
// tokdone before rflag), so no peer writes into a rank before that rank is
// ready for the epoch. Buffer reuse across calls: a rank writes into a
// peer's recv, dest_row or counters only after that peer's plan of the same
// epoch ran (which follows the peer's previous call on its stream); ret
// rows are written only for rows the source dispatched in this epoch;
// rids is double-buffered by epoch parity because a source may push epoch
// e+1's ids before a slow destination finished reading epoch e's (it
// cannot push e+2's: its plan of e+1 waits for that destination's rflag).
// Deadlock freedom across ranks: dispatch waits only for plans, plans only
// for the other plans' first step; compute and combine as above.
//
// GEMM tiles (a compute policy of the one task loop; see "compute tiles"):
// the mma.sync m16n8k16 tile of moe.cu (cp.async multi-stage pipeline,
// XOR-swizzled shared memory, ldmatrix), as a device function on 128-thread
// CTAs: 16×64 tiles (6 stages; 8 at 1–2 tokens with h ≥ 4096) for
// decode-sized batches, whose few tasks may split a reduction over k
// (ksplit; the block's last split sums the partials in split order),
// 64×128 (4 stages)
// above ~24 rows per active expert where sm_90a is missing; on sm_90a above
// 24 rows a slot (MK_MOE_FUSED_WG_ROWS) the wgmma tiles of moe_wgmma.cu,
// 128×256 with TMA and a producer warpgroup, in their own kernel
// (fused_wg_kernel, 384-thread CTAs, one a multiprocessor).
// The caller may force a tile (the tile argument; the tuner stores it).
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common.cuh"
#include "moe_gemm.cuh"

#include "sysflag.cuh"
#include "wgmma.cuh"

namespace {

using namespace mk;  // the flag helpers of sysflag.cuh

using bf16 = __nv_bfloat16;

constexpr int kMaxRanks = MK_MOE_FUSED_MAX_RANKS;
constexpr int kThreads = 128;
constexpr int kBK = mkmoe::kTileK;
constexpr int kDR = 32;  // (token, k) rows per dispatch task: Params.dt = max(1, kDR / K) tokens
constexpr int kCT = 2;   // tokens per combine task
constexpr int kFoldBM = 16;  // the row tile of Params.fold (the decode tiles)
// Control workspace: [0, 32) error record, word 8 the trace's capacity in
// records (set by the caller, 0: no trace), [64, 256) queue counters and
// the trace's record count (zeroed per launch by the plan), then the trace
// records (kTraceWords u64 each) of fused_wg_kernel (see trace_rec).
constexpr int kQDisp = 16, kQMain = 17, kTraceCount = 18, kTraceCap = 8, kFaultOnce = 19;
constexpr uint64_t kCtlBytes = 256;
// The many-block plan (plan_count_kernel, plan_place_kernel): at most
// kPlanMaxG CTAs per destination, from kPlanMultiMin assignments in all.
constexpr int kPlanMaxG = 32;
constexpr int64_t kPlanMultiMin = 4096;
constexpr int kTraceWords = MK_MOE_FUSED_TRACE_WORDS;

struct RankP {
  const bf16* x;
  const int32_t* ids;
  const float* w;
  float* out;
  const float* shared;
  const bf16* gu;
  const bf16* dn;
  unsigned long long* counts;
  // destination side
  int32_t* num_tiles;  // [1]
  int32_t* tile_slot;  // [tiles_cap]
  int32_t* tile_want;  // [tiles_cap]
  int32_t* arrive;     // [tiles_cap]
  int32_t* g1done;     // [tiles_cap]
  int32_t* row_src;    // [rows_cap]
  int32_t* row_slot;   // [rows_cap] (separate path)
  float* row_w;        // [rows_cap] (separate path)
  bf16* recv;          // [rows_cap, H]
  bf16* act;           // [rows_cap, I]
  // split reductions (the 16-row tiles, Params.ks1 / ks2 > 1): each split's
  // f32 partial of a (tile, block), GEMM1's [tiles_cap·n1t][ks1] then
  // GEMM2's [tiles_cap·n2t][ks2] (kPartFloats each, only where that GEMM
  // splits), and the splits done per (tile, block): GEMM1's
  // [tiles_cap·n1t] then GEMM2's [tiles_cap·n2t] (zeroed by the plan)
  float* part;
  int32_t* kdone;
  // source side
  int32_t* dest_row;  // [T*K]
  int32_t* tokdone;   // [T]; Params.fold: [T][n2t], from −(routed k of t) (the plan) up to 0
  int32_t* phist;     // [2][kPlanMaxG][S] the many-block plan's counts per CTA: all rows, then the local ones
  void* ret;          // [T*K, H] bf16 (Params.ret_bf16) or f32
  // rank-local mode (cross-process flags hold epochs, written by the peers)
  int32_t* rflag;  // [kMaxRanks] per source: the epoch whose routing it pushed into rids
  int32_t* pflag;  // [kMaxRanks] per destination: the epoch whose plan wrote this rank's dest_row
  int32_t* rids;   // [2][ids_total] every source's ids, by epoch parity (source q at ids_off[q])
  // separate path
  float* y;     // [rows_cap, H]
  void* moews;  // mk_moe_experts workspace
  uint64_t moews_bytes;
  int64_t T, rows_cap;
  int32_t S, tiles_cap;
};

struct Params {
  RankP rk[kMaxRanks];
  const int32_t* place;  // [R*E]
  int32_t* ctl;
  int R, K, E, BM;
  int64_t H, I;
  int act;
  float alpha, limit;
  int n1t, n2t;  // column blocks of GEMM1 (over I) and GEMM2 (over H)
  // ks1, ks2: the splits of GEMM1's and GEMM2's reduction (k) per (tile,
  // block) task (ksplit; 1: none; the 16-row tiles only). Each split is a
  // task of its own; the last of a block's splits to finish sums every
  // split's partial in split order (deterministic) and runs the epilogue.
  int ks1, ks2;
  int disp_pre[kMaxRanks + 1];  // prefix sums of dispatch tasks per source rank
  int comb_pre[kMaxRanks + 1];  // prefix sums of combine tasks per source rank
  // comb_nc: combine tasks per block of kCT tokens, each comb_cols of the
  // H columns (a multiple of 8; the last one shorter): comb_cols.
  int comb_nc, comb_cols;
  int dt;  // tokens per dispatch task
  int group_m;  // GEMM tasks: row tiles per rasterisation group (task_tile)
  int ndisp_ctas;
  int fault_rank;
  int fault_stage;  // tests (fault_rank == R): the first stage a producer fills never gets its weights
  int separate;  // plan: also fill row_slot/row_w for every row (separate path)
  int plan_g;    // plan: CTAs per destination of the many-block plan (plan_multi), 0: the one-CTA plan_kernel
  // fold (the 16-row tiles, at most kCombNarrowT tokens a rank, emulated
  // ranks, the one-CTA plan; MK_MOE_FUSED_FOLD=0: off): no combine tasks;
  // the GEMM2 task that returns the last routed row of a token's column
  // block sums that block of the token's output (fold_combine).
  int fold;
  // copy_local (wgmma tiles, MK_MOE_FUSED_COPY_LOCAL=1): local rows are
  // dispatched into the receive buffer too, so that every GEMM1 tile's rows
  // are contiguous there and load by TMA instead of the row gather.
  int copy_local;
  // ret_bf16 (wgmma tiles, unless MK_MOE_FUSED_RET_BF16=0): GEMM2 returns its
  // rows rounded to bf16 (half the bytes written, sent to the source and
  // read by the combine), the default; 0: f32 rows (ret_elem_bytes).
  int ret_bf16;
  // l2pf (mma.sync tiles): the L2 prefetch size of the weight copies, 0 /
  // 128 / 256 (MK_MOE_FUSED_L2PF; moe.cu's grouped tiles take 256 by
  // default, measured there). 0 here: 256 measured ×1.000–1.013 (slower)
  // on fused layers at R = 8, 1024 / 4096 tokens (twenty-fifth pass), and
  // on the 16-row tiles at 1–32 tokens level or slower (none against 256:
  // DeepSeek-V3 ×0.98–1.00, Mixtral ×0.99–1.00, Qwen3 ×1.00–1.01; forty-
  // ninth pass, three rounds).
  int l2pf;
  // early_b (mma.sync tiles): a GEMM task issues its first weight stages
  // before its input wait (gemm_task); MK_MOE_FUSED_EARLY_B=0 waits first.
  int early_b;
  // half_skip (wgmma tiles): a consumer warpgroup whose 64 rows are all
  // padding issues no wgmma (mkwg::ws_consume's skip_bar) where the tile is
  // its slot's only one or, below hidden kHalfSkipLoneH, in every tile
  // (mkmoe::skip_half, mkmoe::half_skip_mode; MK_MOE_HALF_SKIP and
  // MK_MOE_HALF_SKIP_SHARED force).
  // Its A rows still come whole: loading GEMM2's in 64-row boxes, one where
  // the second half is padding (the grouped kernel's mode 2), put spills
  // into GEMM1's gather loop of this kernel's 56-register producer (ptxas
  // proxy, fifty-fifth pass), so it is not done here.
  int half_skip;
  long long timeout_ns;
  // Rank-local mode: me >= 0 is the one rank this launch serves (its peers
  // are other launches, other processes or GPUs); -1: every rank (emulated).
  int me;
  int epoch;                        // rank-local: this layer call's number (>= 1, +1 per call)
  int64_t ids_off[kMaxRanks + 1];   // prefix sums of T_q*K (rids offsets)
  // Trace (diagnostics): records after the control words, at most
  // trace_max of them (the control workspace's room); the kernel takes
  // min(trace_max, ctl[kTraceCap]).
  unsigned long long* trace;
  int trace_max;
};
static_assert(sizeof(Params) <= 4096, "Params is a kernel parameter (4 KB)");
static_assert(sizeof(mk_moe_fused_router) == 88, "mk_moe_fused_router: the Go side's layout (kernels/moe_fused.go)");

// ---- PTX wrappers ----

// ret_row is the returned row src >> 3 (of N values) at rank src & 7, as T
// (bf16 with p.ret_bf16, else float); st2 stores two floats at out past L1.
template <typename T>
__device__ __forceinline__ T* ret_row(const Params& p, int32_t src, int64_t N) {
  return static_cast<T*>(p.rk[src & 7].ret) + (int64_t)(src >> 3) * N;
}
__device__ __forceinline__ void st2(float* out, float x, float y) {
  __stcg(reinterpret_cast<float2*>(out), make_float2(x, y));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// ret_bf16_row stores one row of a warpgroup's m64n256 GEMM2 block as bf16
// (p.ret_bf16): the row h of this lane's group of four (src < 0: padding,
// nothing stored), columns n0 + [0, 256) from acc0 ([0, 128)) and acc1.
// Lane q of the four holds columns 8i + 2q, +1 of each 8-column block i;
// four shuffles a pair of blocks give lane q columns 8i + 4q .. + 3, so
// that each instruction writes the row's 32-byte sectors whole (8 bytes a
// lane) — the plain layout writes 16-byte halves, 4 bytes a lane. Every
// lane of the warp calls it (the shuffles).
__device__ __forceinline__ void ret_bf16_row(const Params& p, int32_t src, int64_t N, int64_t n0,
                                             const float (&acc0)[64], const float (&acc1)[64], int h, int lane) {
  bf16* out = src >= 0 ? ret_row<bf16>(p, src, N) : nullptr;
  const int q = lane % 4, s0 = (lane & ~3) | ((2 * q) & 3), s1 = (lane & ~3) | ((2 * q + 1) & 3);
#pragma unroll
  for (int half = 0; half < 2; half++) {
    const float(&acc)[64] = half ? acc1 : acc0;
#pragma unroll
    for (int i = 0; i < 16; i += 2) {
      const uint32_t a = pack_bf16x2(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
      const uint32_t b = pack_bf16x2(acc[4 * i + 4 + 2 * h], acc[4 * i + 4 + 2 * h + 1]);
      const uint32_t a0 = __shfl_sync(0xffffffffu, a, s0), a1 = __shfl_sync(0xffffffffu, a, s1);
      const uint32_t b0 = __shfl_sync(0xffffffffu, b, s0), b1 = __shfl_sync(0xffffffffu, b, s1);
      const int64_t n = n0 + half * 128 + 8 * i + 4 * q;
      if (out != nullptr && n < N) __stcg(reinterpret_cast<uint2*>(out + n), q < 2 ? make_uint2(a0, a1) : make_uint2(b0, b1));
    }
  }
}


using mkmoe::cp_async16;
using mkmoe::cp_async_commit;
using mkmoe::cp_async_wait;
using mkmoe::mma16816;
// signal_add: the fence and release-add of a counter another CTA waits on,
// at system scope in rank-local mode (the counter may be a peer's).
__device__ __forceinline__ void signal_add(const Params& p, int* f, int v) {
  if (p.me >= 0) {
    __threadfence_system();
    red_release_add_sys(f, v);
  } else {
    __threadfence();
    red_release_add(f, v);
  }
}

// wait_geq spins (one thread) until *flag >= want, the error record is set,
// or timeout_ns passes (then it writes the record). True when the flag came.
// record_error writes the error record once (the first writer wins).
__device__ void record_error(const Params& p, int rank, int role, int tile, int seen, int want) {
  int* err = p.ctl;
  if (atomicCAS(err, 0, 1) == 0) {
    err[MK_MOE_FUSED_ERR_RANK] = rank;
    err[MK_MOE_FUSED_ERR_ROLE] = role;
    err[MK_MOE_FUSED_ERR_TILE] = tile;
    err[MK_MOE_FUSED_ERR_SEEN] = seen;
    err[MK_MOE_FUSED_ERR_WANT] = want;
    __threadfence();
  }
}

__device__ bool wait_geq(const Params& p, const int* flag, int want, int rank, int role, int tile) {
  // sysflag.cuh's poll_geq (GEMM2's g1done and the combine's tokdone wait on
  // the layer's critical path: the record and clock every 16th poll).
  return poll_geq<64>(flag, want, p.me >= 0, p.ctl, p.timeout_ns,
                      [&](int v) { record_error(p, rank, role, tile, v, want); });
}

// ring_wait waits for the phase with this parity of an mbarrier of the
// wgmma CTA's own rings (stages, tasks) under the same watchdog: bounded by
// limit_ns, and, where abortable, given up as soon as the CTA's abort word
// is set. A timeout writes the error record (role 7: the CTA's own ring,
// with the task's rank and row tile) and sets the abort word. Only the
// producer's waits for free stages are abortable: the consumers' waits
// must end alike in all threads of a warpgroup (their wgmmas are
// warpgroup-wide), and a timeout does so on a real hang, where the abort
// word, set at any moment, would not.
__device__ bool ring_wait(const Params& p, uint64_t* b, unsigned parity, volatile int* abort, bool abortable,
                          int rank, int tile, long long limit_ns) {
  if (mkwg::mbar_try(b, parity)) return true;
  unsigned long long t0 = 0;
  for (unsigned it = 0;; ++it) {
    if (mkwg::mbar_try(b, parity)) return true;
    if ((it & 31) == 31) {
      if (abortable && *abort) return false;
      const unsigned long long now = globaltimer();
      if (t0 == 0) {
        t0 = now;
      } else if ((long long)(now - t0) > limit_ns) {
        record_error(p, rank, 7, tile, 0, 0);
        *abort = 1;
        return false;
      }
    }
  }
}

// ---- plan ----

// ---- plan pieces shared by plan_kernel and the many-block plan

// plan_drop marks source b's assignment a dropped (dest_row -1) when the
// table places its expert nowhere valid (E = p.E, R = p.R).
// plan_unplaced reports whether placement pl (rank << 16 | slot, or -1)
// names no valid slot of the R ranks.
__device__ __forceinline__ bool plan_unplaced(const Params& p, int pl, int R) {
  return pl < 0 || (pl >> 16) >= R || (pl & 0xffff) >= p.rk[pl >> 16].S;
}
__device__ __forceinline__ void plan_drop(const Params& p, const RankP& me, int b, int64_t a, int E, int R) {
  const int e = me.ids[a];
  const int pl = (e >= 0 && e < E) ? p.place[b * E + e] : -1;
  if (plan_unplaced(p, pl, R)) me.dest_row[a] = -1;
}

// plan_count4 counts, for destination b of S slots, the placements pl of
// four of source r's assignments: rows per slot, and local ones (r == b).
__device__ __forceinline__ void plan_count4(const int (&pl)[4], int r, int b, int S, int* cnt, int* cnt_loc) {
#pragma unroll
  for (int u = 0; u < 4; ++u)
    if (pl[u] >= 0 && (pl[u] >> 16) == b && (pl[u] & 0xffff) < S) {
      atomicAdd(&cnt[pl[u] & 0xffff], 1);
      if (r == b) atomicAdd(&cnt_loc[pl[u] & 0xffff], 1);
    }
}

// plan_overflow handles destination b's plan when its rows (padded) are
// more than its workspace holds (MoEFusedArgs.MaxRows): an error of the
// layer (record role 6), not a write past the buffers: nothing of this
// rank is planned, the separate path's rows are all padding (threads t0,
// t0 + step, ... of the rank's), and the persistent launch sees the record
// and does nothing (rank-local: the peers' waits for this plan time out).
// writer: the one thread that writes the record. True: the caller returns.
__device__ __forceinline__ bool plan_overflow(const Params& p, const RankP& me, int b, int rows, bool writer,
                                              int64_t t0, int64_t step) {
  if (rows <= me.rows_cap) return false;
  if (writer) {
    *me.num_tiles = 0;
    int* err = p.ctl;
    if (atomicCAS(err, 0, 1) == 0) {
      err[MK_MOE_FUSED_ERR_RANK] = b;
      err[MK_MOE_FUSED_ERR_ROLE] = 6;
      err[MK_MOE_FUSED_ERR_TILE] = -1;
      err[MK_MOE_FUSED_ERR_SEEN] = rows;
      err[MK_MOE_FUSED_ERR_WANT] = (int)me.rows_cap;
      __threadfence();
    }
  }
  if (p.separate)
    for (int64_t q = t0; q < me.rows_cap; q += step) me.row_slot[q] = -1;
  return true;
}

// plan_fill writes destination me's tile count (writer), its tiles'
// counters, slots and wanted rows, its slots' expert-load counts and
// padding rows, and (separate path) every row's slot and weight, from the
// rows per slot (cnt, local cnt_loc) and padded offsets off [S + 1] of
// tiles of BM rows: threads t0, t0 + step, ... of the rank's (Ix: their
// index type).
template <typename Ix>
__device__ __forceinline__ void plan_fill(const Params& p, const RankP& me, const int* cnt, const int* cnt_loc,
                                          const int* off, int S, int BM, bool writer, Ix t0, Ix step) {
  const int ntiles = off[S] / BM;
  if (writer) *me.num_tiles = ntiles;
  for (Ix tl = t0; tl < ntiles; tl += step) {
    me.arrive[tl] = 0;
    me.g1done[tl] = 0;
  }
  // The split reductions' counters of this launch's (tile, block)s.
  if (p.ks1 > 1)
    for (Ix j = t0; j < (Ix)ntiles * p.n1t; j += step) me.kdone[j] = 0;
  if (p.ks2 > 1)
    for (Ix j = t0; j < (Ix)ntiles * p.n2t; j += step) me.kdone[(int64_t)me.tiles_cap * p.n1t + j] = 0;
  for (Ix s = t0; s < S; s += step) {
    if (me.counts && !p.separate) atomicAdd(&me.counts[s], (unsigned long long)cnt[s]);
    // The slot's rows that arrive by dispatch, [rem0, rem1): the remote
    // ones, or every one with copy_local.
    const int rem0 = off[s] + (p.copy_local ? 0 : cnt_loc[s]), rem1 = off[s] + cnt[s];
    for (int tl = off[s] / BM; tl < off[s + 1] / BM; ++tl) {
      me.tile_slot[tl] = (int32_t)s;
      me.tile_want[tl] = max(0, min(tl * BM + BM, rem1) - max(tl * BM, rem0));
    }
    for (int q = off[s] + cnt[s]; q < off[s + 1]; ++q) {
      me.row_src[q] = -1;
      if (p.separate) me.row_slot[q] = -1;
    }
  }
  if (p.separate) {
    for (int64_t q = off[S] + (int64_t)t0; q < me.rows_cap; q += step) me.row_slot[q] = -1;
    for (int64_t q = t0; q < me.rows_cap; q += step) me.row_w[q] = 1.0f;
  }
}

// plan_put records source r's assignment a in destination b's row q of
// slot s (both directions: the row's source, the assignment's row).
__device__ __forceinline__ void plan_put(const Params& p, const RankP& me, int r, int b, int64_t a, int s, int q) {
  me.row_src[q] = (int32_t)(a * 8 + r);
  if (p.separate) me.row_slot[q] = s;
  p.rk[r].dest_row[a] = q * 8 + b;  // rank-local: a store into source r's (peer) workspace
}

// One CTA per rank b: b's source side (dropped assignments, token flags)
// and b's destination side (slot counts, padded offsets, tiles, rows). A
// slot's rows from b itself (local) come first, then the rows from other
// ranks (remote); tile_want counts only a tile's remote rows, the ones a
// dispatch task delivers. CTA 0 also zeroes the queue counters.
//
// Rank-local mode (p.me >= 0, one CTA, b = me): the source side also pushes
// b's ids into every rank's rids[epoch & 1] (its own included) and sets
// rflag[b] = epoch there (release, system scope); the destination side waits
// for rflag[q] >= epoch of every source q (watchdog role 4), reads the ids
// from its own rids, writes dest_row into each source's (peer) workspace, and
// at the end sets pflag[b] = epoch in every rank's workspace. Everything b's
// peers write into b for this epoch is zeroed or written by b before the
// flag they wait for is raised, so nothing is reset between layers by a peer.
// One block an SM at most (a CTA per rank is all it launches): the
// registers of the one-pass placements (pl1) fit (ptxas proxy: 48, no
// spills; with 2 blocks an SM allowed it chose 32 and spilled).
__global__ void __launch_bounds__(1024, 1) plan_kernel(const __grid_constant__ Params p) {
  extern __shared__ int plan_sm[];
  mk::pdl_begin();  // mk::launch: wait for the kernel before, then let the next one's CTAs launch
  __shared__ int ok_sh;
  const bool local = p.me >= 0;
  const int b = local ? p.me : (int)blockIdx.x, R = p.R, K = p.K, E = p.E, BM = p.BM;
  const RankP& me = p.rk[b];
  const int S = me.S;
  int* cnt = plan_sm;       // [S] rows per slot
  int* cnt_loc = cnt + S;   // [S] of them local
  int* off = cnt_loc + S;   // [S+1] padded row offsets
  int* cur_loc = off + S + 1;  // [S] next local row
  int* cur_rem = cur_loc + S;  // [S] next remote row
  if (blockIdx.x == 0 && threadIdx.x < (int)(kCtlBytes / 4) - 16) p.ctl[16 + threadIdx.x] = 0;
  // places4: the placements (p.place: rank << 16 | slot, or -1) of source
  // r's assignments a0 + u·blockDim.x (u < 4) of n, loaded together so that
  // their loads are in flight at once; -1 past n or for an id out of range.
  auto places4 = [&](const int32_t* ids, int r, int64_t n, int64_t a0, int (&pl)[4]) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t a = a0 + (int64_t)u * blockDim.x;
      pl[u] = a < n ? __ldcg(ids + a) : -1;  // rank-local: pushed by the peers
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) pl[u] = (pl[u] >= 0 && pl[u] < E) ? p.place[r * E + pl[u]] : -1;
  };
  // One rank and at most four assignments a thread (decode sizes): each
  // thread loads its placements once (pl1), for the dropped marks, the
  // counts and the rows alike, where the general path loads them in each
  // of the three passes — two dependent round trips to L2 a pass, on the
  // fused launch's critical path (its CTAs wait for the plan). Measured
  // ×0.99 on Qwen3's one-token fused layer (fifty-third pass; ×0.96 was
  // expected).
  const int64_t n1 = me.T * K;
  const bool once = !local && R == 1 && n1 <= 4 * (int64_t)blockDim.x;
  int pl1[4];
  if (once) places4(me.ids, 0, n1, threadIdx.x, pl1);
  // Source side.
  if (p.fold) {
    // A warp a token: its routed k (placed assignments), the start of its
    // column blocks' counters (−routed: the GEMM2 task that brings one to 0
    // combines that block), and a token with none its whole output row
    // (the shared output, or 0: no GEMM2 task will).
    const int lane = threadIdx.x % 32;
    for (int64_t t = threadIdx.x / 32; t < me.T; t += blockDim.x / 32) {
      int routed = 0;
      for (int k0 = 0; k0 < K; k0 += 32) {
        int pl = -1;
        if (k0 + lane < K) {
          const int e = __ldcg(me.ids + t * K + k0 + lane);
          pl = (e >= 0 && e < E) ? p.place[b * E + e] : -1;
        }
        routed += __popc(__ballot_sync(0xffffffffu, k0 + lane < K && !plan_unplaced(p, pl, R)));
      }
      for (int nb = lane; nb < p.n2t; nb += 32) me.tokdone[t * p.n2t + nb] = -routed;
      if (routed == 0)
        for (int64_t c = 4 * lane; c < p.H; c += 128)
          *reinterpret_cast<float4*>(me.out + t * p.H + c) =
              me.shared ? *reinterpret_cast<const float4*>(me.shared + t * p.H + c) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  } else {
    for (int64_t t = threadIdx.x; t < me.T; t += blockDim.x) me.tokdone[t] = 0;
  }
  if (once) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t a = threadIdx.x + (int64_t)u * blockDim.x;
      if (a < n1 && plan_unplaced(p, pl1[u], R)) me.dest_row[a] = -1;
    }
  } else {
    for (int64_t a = threadIdx.x; a < n1; a += blockDim.x) plan_drop(p, me, b, a, E, R);
  }
  const int64_t par = (int64_t)(p.epoch & 1) * p.ids_off[R];
  if (local) {
    for (int d = 0; d < R; ++d) {
      int32_t* dst = p.rk[d].rids + par + p.ids_off[b];
      for (int64_t a = threadIdx.x; a < n1; a += blockDim.x) dst[a] = me.ids[a];
    }
    __syncthreads();
    if (threadIdx.x < R) {
      __threadfence_system();
      st_release_sys(p.rk[threadIdx.x].rflag + b, p.epoch);
    }
    if (threadIdx.x == 0) {
      bool ok = true;
      for (int q = 0; ok && q < R; ++q) ok = wait_geq(p, me.rflag + q, p.epoch, q, 4, -1);
      ok_sh = ok;
    }
    __syncthreads();
    if (!ok_sh) return;
  }
  // ids of source r as this CTA reads them.
  auto src_ids = [&](int r) -> const int32_t* { return local ? me.rids + par + p.ids_off[r] : p.rk[r].ids; };
  // place_rows gives this destination's rows to four of source r's
  // assignments (a0 + u·blockDim.x, placements pl): local rows first in
  // their slot, then remote ones.
  auto place_rows = [&](int r, int64_t a0, const int (&pl)[4]) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (pl[u] < 0 || (pl[u] >> 16) != b || (pl[u] & 0xffff) >= S) continue;
      const int64_t a = a0 + (int64_t)u * blockDim.x;
      const int s = pl[u] & 0xffff;
      const int q = r == b ? off[s] + atomicAdd(&cur_loc[s], 1) : off[s] + cnt_loc[s] + atomicAdd(&cur_rem[s], 1);
      plan_put(p, me, r, b, a, s, q);
    }
  };
  // walk4 calls f(r, a0, pl) for every four assignments of every source
  // this destination reads (a0 + u·blockDim.x, placements pl): pl1 where
  // they were loaded once.
  auto walk4 = [&](auto&& f) {
    if (once) {
      f(0, (int64_t)threadIdx.x, pl1);
      return;
    }
    for (int r = 0; r < R; ++r) {
      const int32_t* ids = src_ids(r);
      const int64_t n = p.rk[r].T * K;
      for (int64_t a0 = threadIdx.x; a0 < n; a0 += 4 * blockDim.x) {
        int pl[4];
        places4(ids, r, n, a0, pl);
        f(r, a0, pl);
      }
    }
  };
  if (S > 0) {
    // Destination side: counts.
    for (int s = threadIdx.x; s < S; s += blockDim.x) cnt[s] = cnt_loc[s] = cur_loc[s] = cur_rem[s] = 0;
    __syncthreads();
    // Four assignments per thread and pass: their loads are in flight together.
    walk4([&](int r, int64_t, const int(&pl)[4]) { plan_count4(pl, r, b, S, cnt, cnt_loc); });
    __syncthreads();
    mkmoe::padded_scan(cnt, off, S, BM);  // ends with a barrier
    if (plan_overflow(p, me, b, off[S], threadIdx.x == 0, threadIdx.x, blockDim.x)) return;
    plan_fill<int>(p, me, cnt, cnt_loc, off, S, BM, threadIdx.x == 0, threadIdx.x, blockDim.x);
    // Rows.
    walk4(place_rows);
  }
  if (local) {
    __syncthreads();
    if (threadIdx.x < R) {
      __threadfence_system();
      st_release_sys(p.rk[threadIdx.x].pflag + b, p.epoch);
    }
  }
}

// ---- the plan over many blocks (emulated ranks, p.plan_g > 0)
//
// plan_kernel is one CTA per destination rank: at R = 1 one CTA walks all
// T·K assignments twice, 235 µs of Qwen3's 16384-token fused layer (ncu,
// forty-sixth pass; 62 µs at R = 8 with 1024 tokens a rank). Here G CTAs
// per destination b (grid G × R) each own the part plan_range of the
// concatenation of every source's assignments (ids_off order), in two
// launches: plan_count_kernel counts the part's rows of each of b's slots
// (all, and local ones) into b's phist[.][g]; plan_place_kernel sums every
// CTA's counts, scans the padded offsets (every CTA alike), writes its
// share of the per-slot, per-tile and per-row fields, and places its
// part's rows after the rows of the CTAs before it: a slot's local rows
// first, then its remote ones, as plan_kernel orders them (within a CTA in
// the shared atomics' order). The source side (tokdone, dropped
// assignments) is spread over source b's G CTAs of the first launch.

// plan_range is the part [a0, a1) of the ids_off[R] concatenated
// assignments that CTA g of G owns.
__device__ __forceinline__ void plan_range(const Params& p, int g, int G, int64_t& a0, int64_t& a1) {
  const int64_t n = p.ids_off[p.R], c = (n + G - 1) / G;
  a0 = min(n, (int64_t)g * c);
  a1 = min(n, a0 + c);
}

// plan_places4 loads the placements (rank << 16 | slot, or -1) of
// concatenated assignments j0 + u·blockDim.x (u < 4) below hi, all of
// source r (its assignments start at ids_off[r]), loads in flight together.
__device__ __forceinline__ void plan_places4(const Params& p, int r, int64_t j0, int64_t hi, int (&pl)[4]) {
  const int32_t* ids = p.rk[r].ids;
  const int64_t base = p.ids_off[r];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int64_t j = j0 + (int64_t)u * blockDim.x;
    pl[u] = j < hi ? ids[j - base] : -1;
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) pl[u] = (pl[u] >= 0 && pl[u] < p.E) ? p.place[r * p.E + pl[u]] : -1;
}

// plan_walk calls f(r, j0, pl) over CTA g of G's part (plan_range) of the
// concatenated assignments, four a thread at a time: their source r, the
// first one's concatenated number j0 (the others j0 + u·blockDim.x) and
// their placements pl (plan_places4).
template <class F>
__device__ __forceinline__ void plan_walk(const Params& p, int g, int G, F&& f) {
  int64_t a0, a1;
  plan_range(p, g, G, a0, a1);
  for (int r = 0; r < p.R; ++r) {
    const int64_t lo = max(a0, p.ids_off[r]), hi = min(a1, p.ids_off[r + 1]);
    for (int64_t j0 = lo + threadIdx.x; j0 < hi; j0 += 4 * (int64_t)blockDim.x) {
      int pl[4];
      plan_places4(p, r, j0, hi, pl);
      f(r, j0, pl);
    }
  }
}

// shared: 2·S ints.
__global__ void __launch_bounds__(1024) plan_count_kernel(const __grid_constant__ Params p) {
  extern __shared__ int pc_sm[];
  mk::pdl_begin();  // mk::launch: wait for the kernel before, then let the next one's CTAs launch
  const int g = (int)blockIdx.x, G = (int)gridDim.x, b = (int)blockIdx.y, R = p.R, K = p.K, E = p.E;
  const RankP& me = p.rk[b];
  const int S = me.S;
  if (g == 0 && b == 0 && threadIdx.x < (int)(kCtlBytes / 4) - 16) p.ctl[16 + threadIdx.x] = 0;
  {  // source side, part g of rank b's tokens and assignments
    const int64_t ct = (me.T + G - 1) / G, t1 = min(me.T, (int64_t)(g + 1) * ct);
    for (int64_t t = (int64_t)g * ct + threadIdx.x; t < t1; t += blockDim.x) me.tokdone[t] = 0;
    const int64_t n = me.T * K, ca = (n + G - 1) / G, e1 = min(n, (int64_t)(g + 1) * ca);
    for (int64_t a = (int64_t)g * ca + threadIdx.x; a < e1; a += blockDim.x) plan_drop(p, me, b, a, E, R);
  }
  if (S == 0) return;
  int* cnt = pc_sm;        // [S]
  int* cnt_loc = cnt + S;  // [S]
  for (int s = threadIdx.x; s < S; s += blockDim.x) cnt[s] = cnt_loc[s] = 0;
  __syncthreads();
  plan_walk(p, g, G, [&](int r, int64_t, const int(&pl)[4]) { plan_count4(pl, r, b, S, cnt, cnt_loc); });
  __syncthreads();
  for (int s = threadIdx.x; s < S; s += blockDim.x) {
    me.phist[(int64_t)g * S + s] = cnt[s];
    me.phist[(int64_t)(kPlanMaxG + g) * S + s] = cnt_loc[s];
  }
}

// shared: 5·S + 1 ints.
__global__ void __launch_bounds__(1024) plan_place_kernel(const __grid_constant__ Params p) {
  extern __shared__ int pp_sm[];
  mk::pdl_begin();  // mk::launch: wait for the kernel before, then let the next one's CTAs launch
  const int g = (int)blockIdx.x, G = (int)gridDim.x, b = (int)blockIdx.y, BM = p.BM;
  const RankP& me = p.rk[b];
  const int S = me.S;
  if (S == 0) return;
  int* cnt = pp_sm;            // [S] rows per slot, every CTA's
  int* cnt_loc = cnt + S;      // [S] of them local
  int* off = cnt_loc + S;      // [S+1] padded row offsets
  int* cur_loc = off + S + 1;  // [S] this CTA's next local row
  int* cur_rem = cur_loc + S;  // [S] this CTA's next remote row
  for (int s = threadIdx.x; s < S; s += blockDim.x) cnt[s] = cnt_loc[s] = cur_loc[s] = cur_rem[s] = 0;
  __syncthreads();
  const int64_t hn = (int64_t)G * S;
  for (int64_t j = threadIdx.x; j < hn; j += blockDim.x) {
    const int v = me.phist[j], vl = me.phist[(int64_t)kPlanMaxG * S + j];
    if (v == 0) continue;
    const int s = (int)(j % S);
    atomicAdd(&cnt[s], v);
    if (vl) atomicAdd(&cnt_loc[s], vl);
    if (j / S < g) {  // the CTAs before this one
      if (vl) atomicAdd(&cur_loc[s], vl);
      if (v - vl) atomicAdd(&cur_rem[s], v - vl);
    }
  }
  __syncthreads();
  mkmoe::padded_scan(cnt, off, S, BM);  // ends with a barrier
  const int64_t gt = (int64_t)g * blockDim.x + threadIdx.x, gstep = (int64_t)G * blockDim.x;  // this rank's threads
  if (plan_overflow(p, me, b, off[S], g == 0 && threadIdx.x == 0, gt, gstep)) return;
  plan_fill<int64_t>(p, me, cnt, cnt_loc, off, S, BM, g == 0 && threadIdx.x == 0, gt, gstep);
  for (int s = threadIdx.x; s < S; s += blockDim.x) {
    cur_loc[s] += off[s];
    cur_rem[s] += off[s] + cnt_loc[s];
  }
  __syncthreads();
  plan_walk(p, g, G, [&](int r, int64_t j0, const int(&pl)[4]) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      if (pl[u] < 0 || (pl[u] >> 16) != b || (pl[u] & 0xffff) >= S) continue;
      const int64_t a = j0 + (int64_t)u * blockDim.x - p.ids_off[r];
      const int s = pl[u] & 0xffff;
      plan_put(p, me, r, b, a, s, atomicAdd(r == b ? &cur_loc[s] : &cur_rem[s], 1));
    }
  });
}

// ---- roles ----

// dispatch_task copies source rank r's tokens [t0, t1) to their rows on
// other ranks (sep: to every row, local ones too, and signals nothing: the
// separate path's experts read all rows from the receive buffers). One warp
// per (t, k) copies (16-byte L2 stores, all copies of the task in flight
// together); after bar.sync one thread per row does fence.acq_rel.gpu and
// +1 on the row's arrive_d[tile] (release).
// role_sync is the barrier among a role's NT threads: the whole CTA
// (BAR 0), or named barrier BAR of the first NT threads.
template <int NT, int BAR>
__device__ __forceinline__ void role_sync() {
  if (BAR == 0) __syncthreads();
  else asm volatile("bar.sync %0, %1;\n" ::"n"(BAR), "n"(NT) : "memory");
}

// plans_done is the rank-local wait for every destination's plan to have
// written this rank's dest_row (pflag[d] >= epoch: watchdog role 5), done
// once per CTA before its first dispatch or combine task: thread 0 waits,
// the role's NT threads get the answer through *ok_sh.
template <int NT, int BAR>
__device__ __forceinline__ bool plans_done(const Params& p, int* ok_sh) {
  if (threadIdx.x == 0) {
    bool ok = true;
    for (int d = 0; ok && d < p.R; ++d) ok = wait_geq(p, p.rk[p.me].pflag + d, p.epoch, d, 5, -1);
    *ok_sh = ok;
  }
  role_sync<NT, BAR>();
  const bool ok = *ok_sh;
  role_sync<NT, BAR>();
  return ok;
}

template <int NT = kThreads, int BAR = 0>
__device__ void dispatch_task(const Params& p, int r, int64_t t0, int64_t t1, bool sep) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, K = p.K;
  const RankP& src = p.rk[r];
  const int64_t H8 = p.H / 8;
  for (int64_t a = t0 * K + warp; a < t1 * K; a += NT / 32) {
    const int dr = __ldcg(src.dest_row + a);  // rank-local: written by the peers' plans (L2, not L1)
    if (dr < 0 || (!sep && !p.copy_local && (dr & 7) == r)) continue;
    const int d = dr & 7;
    const int64_t row = dr >> 3;
    const uint4* s = reinterpret_cast<const uint4*>(src.x + (a / K) * p.H);
    uint4* dst = reinterpret_cast<uint4*>(p.rk[d].recv + row * p.H);
    // Eight 16-byte loads per lane in flight before their stores (the
    // compiler may not move a load above a store that might alias it).
    for (int64_t c0 = lane; c0 < H8; c0 += 32 * 8) {
      uint4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u)
        if (c0 + u * 32 < H8) v[u] = __ldcg(s + c0 + u * 32);
#pragma unroll
      for (int u = 0; u < 8; ++u)
        if (c0 + u * 32 < H8) __stcg(dst + c0 + u * 32, v[u]);
    }
  }
  if (sep) return;
  role_sync<NT, BAR>();
  for (int64_t a = t0 * K + threadIdx.x; a < t1 * K; a += NT) {
    const int dr = __ldcg(src.dest_row + a);
    if (dr < 0 || (!p.copy_local && (dr & 7) == r)) continue;
    signal_add(p, p.rk[dr & 7].arrive + (dr >> 3) / p.BM, 1);
  }
}

__device__ __forceinline__ int swz(int row, int ch) { return mkmoe::swz64(row, ch); }

// What gemm_task did: its input wait gave up (nothing computed or stored),
// it finished its block (the caller signals), or it left a split's
// partial for the block's last split.
constexpr int kTaskFailed = 0, kTaskDone = 1, kTaskPartial = 2;
// kPartFloats: one (tile, block) split's partial, the 128 threads' 16×64
// accumulator fragments (ksplit_sum).
constexpr int kPartFloats = 16 * 64;

// ksplit_sum: split ks of nks of (tile, ntile)'s reduction is done (acc,
// [MF][NF][4] a thread). Every split stores its partial (float4s in
// thread order, coalesced), then one thread fences and counts it on
// kdone; the split that counts last (after a fence) sums every split's
// partial into acc in split order — its own from registers — and returns
// true: the block's sum does not depend on which split came last, so the
// launch is deterministic. The others return false. 128 threads call it.
template <int MF, int NF>
__device__ bool ksplit_sum(const Params& p, const RankP& rk, bool gateup, int tile, int ntile, int ks, int nks,
                           float (&acc)[MF][NF][4]) {
  constexpr int V = MF * NF;  // float4s a thread
  static_assert(V * 4 * kThreads == kPartFloats, "a partial is the 16x64 tile");
  __shared__ int last_sh;
  const int tid = threadIdx.x;
  int64_t blk = (int64_t)tile * (gateup ? p.n1t : p.n2t) + ntile;  // this (tile, block)'s counter
  int64_t part_at = blk * p.ks1;                                   // its first partial
  if (!gateup) {
    part_at = (p.ks1 > 1 ? (int64_t)rk.tiles_cap * p.n1t * p.ks1 : 0) + blk * p.ks2;
    blk += (int64_t)rk.tiles_cap * p.n1t;
  }
  float4* part = reinterpret_cast<float4*>(rk.part + part_at * kPartFloats);  // [nks][V][kThreads]
#pragma unroll
  for (int mf = 0; mf < MF; mf++)
#pragma unroll
    for (int nf = 0; nf < NF; nf++) {
      const float* a = acc[mf][nf];
      __stcg(part + ((int64_t)ks * V + mf * NF + nf) * kThreads + tid, make_float4(a[0], a[1], a[2], a[3]));
    }
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    const int before = atomicAdd(rk.kdone + blk, 1);
    __threadfence();
    last_sh = before == nks - 1;
  }
  __syncthreads();
  if (!last_sh) return false;
#pragma unroll
  for (int mf = 0; mf < MF; mf++)
#pragma unroll
    for (int nf = 0; nf < NF; nf++) {
      float4 t = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int q = 0; q < nks; q++) {
        const float* a = acc[mf][nf];
        const float4 v = q == ks ? make_float4(a[0], a[1], a[2], a[3])
                                 : __ldcg(part + ((int64_t)q * V + mf * NF + nf) * kThreads + tid);
        if (q == 0) {
          t = v;
        } else {
          t.x += v.x;
          t.y += v.y;
          t.z += v.z;
          t.w += v.w;
        }
      }
      acc[mf][nf][0] = t.x;
      acc[mf][nf][1] = t.y;
      acc[mf][nf][2] = t.z;
      acc[mf][nf][3] = t.w;
    }
  return true;
}

// gemm_task runs one (row tile, column block) of GEMM1 (GATEUP: A = receive
// rows, B = the slot's gate and matching up rows, SwiGLU → act) or GEMM2
// (A = act rows, B = the slot's down rows, rows → the source's ret).
// ready() is the task's input wait (every thread calls it; false: the
// watchdog gave up, nothing is computed or stored and gemm_task returns
// kTaskFailed). Split ks of the block's reduction (nks = p.ks1 or p.ks2
// splits) is the task's k tiles [ks·KT/nks, (ks+1)·KT/nks); when the
// block is split, ksplit_sum decides whether this task finishes the
// block (kTaskDone: epilogue and stores ran, the caller signals) or only
// left its partial (kTaskPartial: nothing to signal). With p.early_b the
// prologue's weight stages are issued before it
// (mkmoe::ring_prologue_b_first), as moe.cu's GEMM2 does before
// griddepcontrol.wait: weights are
// constants, so a CTA that took a GEMM2 task (or, with R > 1, a GEMM1 task
// whose rows are still arriving) streams its first weights while the
// GEMM1 blocks it waits for still run.
template <int BM, int BN, int WM, int WN, int STAGES, bool GATEUP, bool PAIR, class Ready>
__device__ int gemm_task(const Params& p, int d, int tile, int ntile, int ks, unsigned char* smem,
                         const Ready& ready) {
  constexpr int WARPS_N = BN / WN, THREADS = (BM / WM) * WARPS_N * 32;
  static_assert(THREADS == kThreads, "tile shape uses the kernel's 128 threads");
  constexpr int MF = WM / 16, NF = WN / 8;
  static_assert(NF % 2 == 0, "n fragments come in pairs");
  constexpr int A_CH = BM * 8, B_CH = BN * 8;
  constexpr int A_PER = (A_CH + THREADS - 1) / THREADS, B_PER = B_CH / THREADS;
  static_assert(B_CH % THREADS == 0, "B chunks split evenly");
  const RankP& rk = p.rk[d];
  bf16* sA = reinterpret_cast<bf16*>(smem);
  bf16* sB = sA + STAGES * BM * kBK;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int slot = rk.tile_slot[tile];
  const int64_t m0 = (int64_t)tile * BM;
  const int64_t Kd = GATEUP ? p.H : p.I, N = GATEUP ? p.I : p.H;
  const bf16* A = GATEUP ? rk.recv : rk.act;
  const bf16* W = GATEUP ? rk.gu + (int64_t)slot * 2 * p.I * p.H : rk.dn + (int64_t)slot * p.H * p.I;

  const bf16* a_src[A_PER];
  int a_dst[A_PER], a_ch[A_PER];
#pragma unroll
  for (int i = 0; i < A_PER; i++) {
    const int c = tid + i * THREADS;
    const int r = c / 8;
    a_ch[i] = c % 8;
    a_dst[i] = c < A_CH ? swz(r, a_ch[i]) : -1;
    a_src[i] = nullptr;
    const int32_t src = c < A_CH ? rk.row_src[m0 + r] : -1;
    // GEMM1 reads a local row (its source is this rank) from x itself.
    if (src >= 0)
      a_src[i] = GATEUP && (src & 7) == d ? rk.x + (int64_t)(src >> 3) / p.K * Kd : A + (m0 + r) * Kd;
  }
  const bf16* b_src[B_PER];
  int b_dst[B_PER], b_ch[B_PER];
#pragma unroll
  for (int i = 0; i < B_PER; i++) {
    const int c = tid + i * THREADS;
    const int r = c / 8;
    b_ch[i] = c % 8;
    b_dst[i] = swz(r, b_ch[i]);
    b_src[i] = mkmoe::tile_b_row<GATEUP, BN>(W, 0, r, ntile, N, Kd);
  }
  const int nks = GATEUP ? p.ks1 : p.ks2;
  const int KTall = (int)((Kd + kBK - 1) / kBK);
  const int kt0 = (int)((int64_t)ks * KTall / nks), KT = (int)((int64_t)(ks + 1) * KTall / nks) - kt0;
  // The split's first k folded into the row pointers once, not added in
  // every copy's address; Kr: the k left from there.
  const int64_t Kr = Kd - (int64_t)kt0 * kBK;
#pragma unroll
  for (int i = 0; i < A_PER; i++)
    if (a_src[i] != nullptr) a_src[i] += (int64_t)kt0 * kBK;
#pragma unroll
  for (int i = 0; i < B_PER; i++)
    if (b_src[i] != nullptr) b_src[i] += (int64_t)kt0 * kBK;
  auto loadA = [&](int stage, int kt) {
    const int64_t k0 = (int64_t)kt * kBK;
    bf16* a = sA + stage * BM * kBK;
#pragma unroll
    for (int i = 0; i < A_PER; i++) {
      if (a_dst[i] < 0) continue;
      const int64_t k = k0 + a_ch[i] * 8;
      const bool v = a_src[i] != nullptr && k < Kr;
      cp_async16(a + a_dst[i], v ? a_src[i] + k : A, v);
    }
  };
  auto loadB = [&](int stage, int kt) {
    const int64_t k0 = (int64_t)kt * kBK;
    bf16* b = sB + stage * BN * kBK;
#pragma unroll
    for (int i = 0; i < B_PER; i++) {
      const int64_t k = k0 + b_ch[i] * 8;
      const bool v = b_src[i] != nullptr && k < Kr;
      mkmoe::cp_async16_pf(b + b_dst[i], v ? b_src[i] + k : W, v, p.l2pf);
    }
  };
  float acc[MF][NF][4];
  mkmoe::zero_acc(acc);
  auto brow = [&](int nf) -> int { return mkmoe::tile_brow<GATEUP, NF, WN, BN>(nf, wn); };
  // The paired ring (PAIR: mkmoe::dec_pair).
  static_assert(!PAIR || (BM == 16 && BN == 64 && STAGES % 2 == 0 && STAGES >= 4), "the paired decode tiles");
  mkmoe::PairB<BN, THREADS> pb;  // set and used by the paired ring only
  if constexpr (PAIR) pb.init(tid, W, [&](int r) { return mkmoe::tile_b_row<GATEUP, BN>(W, 0, r, ntile, N, Kd); });
  auto loadB2 = [&](int stage, int kt, bool two) {
    pb.load(sB + stage * BN * kBK, (int64_t)(kt0 + kt) * kBK, two, Kd, p.l2pf);
  };
  if (!mkmoe::ring_run<STAGES, BM, BN, WM, PAIR>(acc, sA, sB, KT, wm, lane, loadA, loadB, loadB2, p.early_b, ready,
                                                  brow))
    return kTaskFailed;
  if constexpr (BM * BN == kPartFloats) {  // the 16-row tiles (the host splits no other)
    if (nks > 1 && !ksplit_sum(p, rk, GATEUP, tile, ntile, ks, nks, acc)) return kTaskPartial;
  }

#pragma unroll
  for (int mf = 0; mf < MF; mf++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int64_t row = m0 + wm * WM + mf * 16 + lane / 4 + 8 * h;
      const int32_t src = rk.row_src[row];
      if (src < 0) continue;
      if (GATEUP) {
        mkmoe::store_act_frags<NF, WN, BN>(rk.act + row * N, acc[mf], h, ntile, wn, lane, N, nullptr, p.act, p.alpha,
                                           p.limit);
      } else {
        float* out = ret_row<float>(p, src, N);  // f32 rows: ret_bf16 is for the wgmma tiles only
#pragma unroll
        for (int nf = 0; nf < NF; nf++) {
          const int64_t n = (int64_t)ntile * BN + wn * WN + nf * 8 + (lane % 4) * 2;
          if (n >= N) continue;
          st2(out + n, acc[mf][nf][2 * h], acc[mf][nf][2 * h + 1]);
        }
      }
    }
  }
  return kTaskDone;
}

// CombTask is a combine task's part of the work: source rank r's tokens
// [t0, t1) (at most kCT) and output columns [c0, c1) (comb_task).
struct CombTask {
  int r;
  int64_t t0, t1, c0, c1;
};

// combine_y: the separate path's combine (combine_kernel): source rank r's
// tokens [t0, t1) (at most kCT): out = Σ_k w·y (k order) + shared, y the
// expert output rows (f32) at the destination ranks, found through
// dest_row. The task's row addresses and weights are staged in shared
// memory first (one round trip), then each thread takes two (token,
// 4-column) units at a time and loads the rows of eight k of both
// together: 16 loads in flight a thread. NT threads with barrier BAR (0:
// __syncthreads) call it together.
template <int NT, int BAR>
__device__ void combine_y(const Params& p, int r, int64_t t0, int64_t t1) {
  constexpr int KS = 32;  // k staged per token (larger K: chunks of KS)
  constexpr int KU = 8;   // k rows loaded together per unit
  __shared__ const float* c_src[kCT * KS];  // [token][k]: the expert output row, null when dropped
  __shared__ float c_w[kCT * KS];
  const RankP& rk = p.rk[r];
  const int K = p.K;
  const int nt = (int)(t1 - t0);
  const int64_t H4 = p.H / 4, units = nt * H4;
  for (int kb = 0; kb < K; kb += KS) {  // one pass for K <= KS
    const int kn = min(KS, K - kb);
    role_sync<NT, BAR>();  // the previous chunk's (or task's) readers of c_src are done
    for (int i = threadIdx.x; i < nt * kn; i += NT) {
      const int64_t a = (t0 + i / kn) * K + kb + i % kn;
      const int dr = __ldcg(rk.dest_row + a);  // written by the plan launch(es)
      c_src[(i / kn) * KS + i % kn] = dr < 0 ? nullptr : p.rk[dr & 7].y + (int64_t)(dr >> 3) * p.H;
      c_w[(i / kn) * KS + i % kn] = dr < 0 ? 0.0f : __ldg(rk.w + a);
    }
    role_sync<NT, BAR>();
    for (int64_t u0 = threadIdx.x; u0 < units; u0 += 2 * NT) {
      int64_t c[2];
      int t[2];
      bool on[2];
#pragma unroll
      for (int g = 0; g < 2; g++) {
        const int64_t u = u0 + g * NT;
        on[g] = u < units;
        t[g] = on[g] ? (int)(u / H4) : 0;
        c[g] = on[g] ? u % H4 : 0;
      }
      float4 s[2];
#pragma unroll
      for (int g = 0; g < 2; g++) {
        s[g] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (on[g] && kb > 0) s[g] = reinterpret_cast<const float4*>(rk.out + (t0 + t[g]) * p.H)[c[g]];
      }
      for (int k0 = 0; k0 < kn; k0 += KU) {
        float4 v[2][KU];
#pragma unroll
        for (int g = 0; g < 2; g++) {
#pragma unroll
          for (int uk = 0; uk < KU; uk++) {
            const float* src = on[g] && k0 + uk < kn ? c_src[t[g] * KS + k0 + uk] : nullptr;
            v[g][uk] = src ? __ldcg(reinterpret_cast<const float4*>(src) + c[g]) : make_float4(0.f, 0.f, 0.f, 0.f);
          }
        }
#pragma unroll
        for (int g = 0; g < 2; g++) {
#pragma unroll
          for (int uk = 0; uk < KU; uk++) {
            if (!on[g] || k0 + uk >= kn || c_src[t[g] * KS + k0 + uk] == nullptr) continue;
            const float w = c_w[t[g] * KS + k0 + uk];
            s[g].x = fmaf(w, v[g][uk].x, s[g].x);
            s[g].y = fmaf(w, v[g][uk].y, s[g].y);
            s[g].z = fmaf(w, v[g][uk].z, s[g].z);
            s[g].w = fmaf(w, v[g][uk].w, s[g].w);
          }
        }
      }
#pragma unroll
      for (int g = 0; g < 2; g++) {
        if (!on[g]) continue;
        const int64_t tt = t0 + t[g];
        if (rk.shared && kb + kn == K) {
          const float4 v = reinterpret_cast<const float4*>(rk.shared + tt * p.H)[c[g]];
          s[g].x += v.x;
          s[g].y += v.y;
          s[g].z += v.z;
          s[g].w += v.w;
        }
        reinterpret_cast<float4*>(rk.out + tt * p.H)[c[g]] = s[g];
      }
    }
  }
}

// RetCols<BF, VC>: VC columns of a returned row as one load (Raw: bf16 8
// columns in 16 bytes or 4 in 8, f32 4 in 16) and their exact widening.
template <bool BF, int VC>
struct RetCols;
template <>
struct RetCols<true, 8> {
  using Raw = uint4;
  __device__ static void widen(const Raw& u, float (&f)[8]) {
    const float4 a = mk::bf16x4_to_f32(make_uint2(u.x, u.y)), b = mk::bf16x4_to_f32(make_uint2(u.z, u.w));
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  }
};
template <>
struct RetCols<true, 4> {
  using Raw = uint2;
  __device__ static void widen(const Raw& u, float (&f)[4]) {
    const float4 a = mk::bf16x4_to_f32(u);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
  }
};
template <>
struct RetCols<false, 4> {
  using Raw = float4;
  __device__ static void widen(const Raw& u, float (&f)[4]) { f[0] = u.x, f[1] = u.y, f[2] = u.z, f[3] = u.w; }
};

// combine_ret: the fused launches' combine of task ct, source rank r's
// tokens [t0, t1) (at most kCT), columns [c0, c1): out = Σ_k w·ret (k
// order, fmaf from 0, dropped k skipped) + shared, ret's rows widened to
// f32 (bf16 with p.ret_bf16). A returned row's address does not depend on the plan (row t·K + k of
// ret), so each thread loads the KU rows of each of its two (token,
// VC-column) units together with their dest_row entries (< 0: dropped, no
// term) and weights: one round trip a chunk of KU k, no shared memory and
// no barrier. A dropped k's row is loaded and not used (it lies inside
// ret's [T·K, H]). The form that staged dest_row through shared memory
// first took 9.1 µs a 2-token task in f32 and 13.7 in bf16 (Qwen3 at 16384
// tokens, the task trace of the forty-seventh pass). Same sums in the same
// order as that form: the same bits.
template <int NT, bool BF, int VC>
__device__ void combine_ret(const Params& p, const CombTask& ct) {
  using C = RetCols<BF, VC>;
  using Raw = typename C::Raw;
  constexpr int KU = 8;
  const RankP& rk = p.rk[ct.r];
  const int K = p.K;
  const int64_t t0 = ct.t0, t1 = ct.t1;
  // Units of VC columns: the row's HU, of which the task's CU from cu0.
  const int64_t HU = p.H / VC, cu0 = ct.c0 / VC, CU = (ct.c1 - ct.c0) / VC, units = (t1 - t0) * CU;
  const Raw* ret = static_cast<const Raw*>(rk.ret);  // row a: ret + a·HU
  for (int64_t u0 = threadIdx.x; u0 < units; u0 += 2 * NT) {
    int64_t tt[2], c[2];
    bool on[2];
#pragma unroll
    for (int g = 0; g < 2; g++) {
      const int64_t u = u0 + g * NT;
      on[g] = u < units;
      tt[g] = t0 + (on[g] ? u / CU : 0);
      c[g] = cu0 + (on[g] ? u % CU : 0);
    }
    float s[2][VC];
#pragma unroll
    for (int g = 0; g < 2; g++)
#pragma unroll
      for (int i = 0; i < VC; i++) s[g][i] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += KU) {
      Raw v[2][KU];
      float wk[2][KU];
      int dr[2][KU];
#pragma unroll
      for (int g = 0; g < 2; g++) {
#pragma unroll
        for (int uk = 0; uk < KU; uk++) {
          const bool ok = on[g] && k0 + uk < K;
          const int64_t a = tt[g] * K + k0 + uk;
          dr[g][uk] = ok ? __ldcg(rk.dest_row + a) : -1;  // written by the plan launch(es)
          wk[g][uk] = ok ? __ldg(rk.w + a) : 0.0f;
          v[g][uk] = ok ? __ldcg(ret + a * HU + c[g]) : Raw{};
        }
      }
#pragma unroll
      for (int g = 0; g < 2; g++) {
#pragma unroll
        for (int uk = 0; uk < KU; uk++) {
          if (dr[g][uk] < 0) continue;
          float f[VC];
          C::widen(v[g][uk], f);
#pragma unroll
          for (int i = 0; i < VC; i++) s[g][i] = fmaf(wk[g][uk], f[i], s[g][i]);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < 2; g++) {
      if (!on[g]) continue;
      float4* o = reinterpret_cast<float4*>(rk.out + tt[g] * p.H + c[g] * VC);
      const float4* sh = rk.shared ? reinterpret_cast<const float4*>(rk.shared + tt[g] * p.H + c[g] * VC) : nullptr;
#pragma unroll
      for (int q = 0; q < VC / 4; q++) {
        float4 v = make_float4(s[g][4 * q], s[g][4 * q + 1], s[g][4 * q + 2], s[g][4 * q + 3]);
        if (sh) {
          const float4 e = sh[q];
          v.x += e.x;
          v.y += e.y;
          v.z += e.z;
          v.w += e.w;
        }
        o[q] = v;
      }
    }
  }
}

// combine_rows: combine task ct (its tokens and columns): from_y the
// separate path's (combine_y; whole rows: comb_nc is 1 there), else the
// fused launches' (combine_ret; bf16 rows 8 columns a load where H % 8 == 0).
template <int NT = kThreads, int BAR = 0>
__device__ void combine_rows(const Params& p, const CombTask& ct, bool from_y) {
  if (from_y)
    combine_y<NT, BAR>(p, ct.r, ct.t0, ct.t1);
  else if (!p.ret_bf16)
    combine_ret<NT, false, 4>(p, ct);
  else if (p.H % 8 == 0)
    combine_ret<NT, true, 8>(p, ct);
  else
    combine_ret<NT, true, 4>(p, ct);
}

// task_tile maps GEMM task rel of a rank (ntiles row tiles × n column
// blocks) to its row tile and column block by group_tile, so that the CTAs
// running at once share each weight block through L2; tile-major order
// re-read Mixtral's GEMM1 weights from HBM once per row tile.
__device__ __forceinline__ void task_tile(const Params& p, int rel, int ntiles, int n, int& tile, int& nb) {
  mkmoe::group_tile(rel, p.group_m, ntiles, n, tile, nb);
}

// gemm_prefix writes the prefix sums over ranks of the GEMM1 and GEMM2
// tasks (row tiles × column blocks × splits) this launch runs: every rank's
// planned tiles, rank-local only its own (the peers' num_tiles are theirs).
__device__ void gemm_prefix(const Params& p, int* g1pre, int* g2pre) {
  g1pre[0] = g2pre[0] = 0;
  for (int d = 0; d < p.R; ++d) {
    const int nt = p.rk[d].S > 0 && (p.me < 0 || d == p.me) ? *p.rk[d].num_tiles : 0;
    g1pre[d + 1] = g1pre[d] + nt * p.n1t * p.ks1;
    g2pre[d + 1] = g2pre[d] + nt * p.n2t * p.ks2;
  }
}

// find_rank maps a task index to its rank through prefix sums pre[0..R].
__device__ __forceinline__ int find_rank(const int* pre, int R, int idx) {
  int r = 0;
  while (r + 1 < R && idx >= pre[r + 1]) ++r;
  return r;
}

// comb_task is combine task c's part of the work (CombTask).
__device__ __forceinline__ CombTask comb_task(const Params& p, int c) {
  CombTask k;
  k.r = find_rank(p.comb_pre, p.R, c);
  const int rel = c - p.comb_pre[k.r];
  k.t0 = (int64_t)(rel / p.comb_nc) * kCT;
  k.t1 = min(p.rk[k.r].T, k.t0 + kCT);
  k.c0 = (int64_t)(rel % p.comb_nc) * p.comb_cols;
  k.c1 = min(p.H, k.c0 + p.comb_cols);
  return k;
}

// fold_combine is GEMM2's end on the 16-row tiles with Params.fold (after
// the task's rows are stored and the CTA's barrier): each routed row of
// row tile `tile` of rank d adds 1 to its token's counter of column block
// nb (fence, then an acq_rel add: release of this block's rows, acquire of
// the others'); the row that brings it to 0 returned the token's last row
// of the block, and a warp then sums the block's columns [BN·nb, BN·nb +
// BN) of that token (BN = 64: two a lane): out = Σ_k w·ret in k order
// (fmaf from 0, dropped k skipped) + shared, combine_ret's operations in
// its order, so the same bits. Inlined: as a call (__noinline__) the
// 6-stage kernel's spills went from 38 / 56 to 238 / 796 bytes (ptxas
// proxy); inlined they stay 38 / 56.
template <int NT, int BM, int BN>
__device__ __forceinline__ void fold_combine(const Params& p, int d, int tile, int nb, int* win_sh) {
  if (threadIdx.x < BM) {
    const int32_t src = p.rk[d].row_src[(int64_t)tile * BM + threadIdx.x];
    int win = -1;
    if (src >= 0) {
      const int64_t t = (src >> 3) / p.K;
      __threadfence();
      if (atom_acq_rel_add(p.rk[src & 7].tokdone + t * p.n2t + nb, 1) == -1) win = src;
    }
    win_sh[threadIdx.x] = win;
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, K = p.K;
  for (int w = threadIdx.x / 32; w < BM; w += NT / 32) {
    const int32_t src = win_sh[w];
    if (src < 0) continue;
    const RankP& rk = p.rk[src & 7];
    static_assert(BN == 64, "two columns a lane");
    const int64_t t = (src >> 3) / K, c = (int64_t)nb * BN + 2 * lane;
    if (c >= p.H) continue;
    const float* ret = static_cast<const float*>(rk.ret);  // f32 rows on these tiles (ret_elem_bytes)
    float s0 = 0.0f, s1 = 0.0f;
    constexpr int KU = 8;
    for (int k0 = 0; k0 < K; k0 += KU) {
      float2 v[KU];
      float wk[KU];
      int dr[KU];
#pragma unroll
      for (int u = 0; u < KU; u++) {
        const bool ok = k0 + u < K;
        const int64_t a = t * K + k0 + u;
        dr[u] = ok ? __ldcg(rk.dest_row + a) : -1;
        wk[u] = ok ? __ldg(rk.w + a) : 0.0f;
        v[u] = ok ? __ldcg(reinterpret_cast<const float2*>(ret + a * p.H + c)) : make_float2(0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < KU; u++) {
        if (dr[u] < 0) continue;
        s0 = fmaf(wk[u], v[u].x, s0);
        s1 = fmaf(wk[u], v[u].y, s1);
      }
    }
    if (rk.shared) {
      const float2 e = *reinterpret_cast<const float2*>(rk.shared + t * p.H + c);
      s0 += e.x;
      s1 += e.y;
    }
    st2(rk.out + t * p.H + c, s0, s1);
  }
}

// combine_ready waits (one thread) until every routed row of combine task
// c's tokens has come back from GEMM2 (its tokdone counts); false when a
// wait gave up (the error record names it). (A form that loads every
// token's counts and dest_row entries at once and fences once measured
// level, ×0.99–1.01, on all three shapes at R = 1 and R = 8: forty-eighth
// pass; the combine task's ~4 µs is not this wait's round trips.)
__device__ bool combine_ready(const Params& p, int c) {
  const CombTask ct = comb_task(p, c);
  const int r = ct.r;
  const RankP& rk = p.rk[r];
  const int K = p.K;
  bool ok = true;
  for (int64_t t = ct.t0; ok && t < ct.t1; ++t) {
    int routed = 0;
    for (int k = 0; k < K; ++k) routed += __ldcg(rk.dest_row + t * K + k) >= 0;
    ok = wait_geq(p, rk.tokdone + t, routed * p.n2t, r, 3, (int)t);
  }
  return ok;
}

// ---- trace (diagnostics; mk_moe_fused.h, MK_MOE_FUSED_TRACE_*) ----

// trace_room: the records this launch may write (0: no trace).
__device__ __forceinline__ int trace_room(const Params& p) {
  if (p.trace == nullptr) return 0;
  const int cap = ld_relaxed(p.ctl + kTraceCap);
  return cap < p.trace_max ? cap : p.trace_max;
}

// trace_now is %globaltimer when the launch traces (room > 0), else 0.
__device__ __forceinline__ unsigned long long trace_now(int room) { return room > 0 ? globaltimer() : 0; }

// trace_pos is a GEMM task's position in its record: tile << 32 | block,
// and for a split reduction (nks > 1) split << 16 | nks << 24 besides.
__device__ __forceinline__ unsigned long long trace_pos(int tile, int nb, int ks, int nks) {
  const unsigned lo = (unsigned)nb | (nks > 1 ? (unsigned)ks << 16 | (unsigned)nks << 24 : 0u);
  return (unsigned long long)(unsigned)tile << 32 | lo;
}

// trace_rec writes one record (one thread): kind, task index, the CTA, the
// four times and the task's position (a = trace_pos, or a token).
__device__ __forceinline__ void trace_rec(const Params& p, int room, int kind, int idx, unsigned long long t_take,
                                          unsigned long long t_ready, unsigned long long t_start, unsigned long long a) {
  if (room <= 0) return;
  const int n = atomicAdd(p.ctl + kTraceCount, 1);
  if (n >= room) return;
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
  unsigned long long* r = p.trace + (size_t)n * kTraceWords;
  r[0] = (unsigned long long)(unsigned)idx | (unsigned long long)kind << 32 | (unsigned long long)(sm & 0xff) << 40 |
         (unsigned long long)(blockIdx.x & 0xffff) << 48;
  r[1] = t_take;
  r[2] = t_ready;
  r[3] = t_start;
  r[4] = globaltimer();
  r[5] = a;
}

// ---- compute tiles ----
//
// Two persistent kernels share the plan, the queues, the roles' code and the
// protocol: fused_kernel<C> over mma.sync tiles C (every thread takes every
// role), and fused_wg_kernel over the wgmma tiles (a producer warpgroup and
// two consumer warpgroups with their own register budgets; the consumers
// take the dispatch and combine roles).

// FusedMaps: the TMA maps of the wgmma tiles, per rank (zeros where a rank
// has no slots, or is a peer of a rank-local launch).
struct FusedMaps {
  mkwg::TmaMap gu[kMaxRanks];   // [S_r·2I, H] gate/up weights: boxes of 64 columns × 128 rows
  mkwg::TmaMap dn[kMaxRanks];   // [S_r·H, I] down weights
  mkwg::TmaMap act[kMaxRanks];  // [rows_cap_r, I] activations (GEMM2's A)
  mkwg::TmaMap recv[kMaxRanks];  // [rows_cap_r, H] received rows (GEMM1's A with copy_local)
};

// MmaTiles: mma.sync m16n8k16 tiles of 128-thread CTAs (gemm_task above).
template <int BM_, int BN_, int WM, int WN, int ST, bool PAIR = false>
struct MmaTiles {
  static constexpr int kThreads = ::kThreads, BM = BM_, BN = BN_;
  static constexpr size_t kSmem = (size_t)ST * (BM + BN) * kBK * 2;
  // kMinCTAs: the CTAs an SM that its shared memory allows (228 KB an SM;
  // a CTA's dynamic ring, 1 KB the driver reserves, ~256 B static), passed
  // to __launch_bounds__ so that registers never lower that occupancy: 3
  // for the 6-stage 16-row tiles (168 registers a thread), 2 for the
  // 8-stage ones.
  static constexpr int kMinCTAs = std::max(1, (int)((228u << 10) / (kSmem + 1024 + 256)));
  template <bool GATEUP, class Ready>
  __device__ static int gemm(const Params& p, int d, int tile, int nb, int ks, unsigned char* smem,
                             const Ready& ready) {
    return gemm_task<BM, BN, WM, WN, ST, GATEUP, PAIR>(p, d, tile, nb, ks, smem, ready);
  }
};

// WgTiles (sm_90a): 128×256 tiles, BK 64, a 4-stage ring, warp-specialised
// as moe_wgmma.cu's kernel, in their own persistent kernel (fused_wg_kernel):
// two consumer warpgroups (threads [0, 256), 64 rows each, two m64n128k16
// wgmmas per 16-wide k step: GEMM1 the gate half and the up half, 224
// registers) and one producer warpgroup (threads [256, 384), 56 registers)
// that fills the ring: the weight tile by TMA (two 128-row boxes), the A
// tile by TMA in GEMM2 (the activation rows are contiguous) and by cp.async
// in GEMM1 (row gather: local rows from x, remote ones from the receive
// buffer; 8 rows × one 16-byte chunk a thread a stage). full[s] completes
// on 129 arrivals (the 128 producer threads' — cp.async-tracked in GEMM1,
// plain in GEMM2 — and the TMA issuer's expect_tx) plus the TMA bytes;
// empty[s] when both consumer warpgroups' wgmmas reading it are done.
// The wgmma kernel's register split. setmaxnreg moves registers within
// the CTA's own pool, the 168 a thread it launched with (384 threads, one
// CTA a multiprocessor): 128·P + 256·C ≤ 384·168. 40 / 232 left the
// producer's GEMM1 stage loop spilling its rows (ptxas: 72-byte spills,
// local loads between the copies) once the producer also held the task
// ring, the trace times and the combine wait; 56 / 224 keeps the loop in
// registers and the consumers spill no more than at 232 (ptxas 12.4 on
// this file, scripts/ptxas_check.sh). 48 / 232 asks for more than the
// pool and never starts (sixteenth pass: the fused launches failed).
constexpr int kWgProducerRegs = 56, kWgConsumerRegs = 224;
static_assert(kWgProducerRegs % 8 == 0 && kWgConsumerRegs % 8 == 0 &&
                  128 * kWgProducerRegs + 256 * kWgConsumerRegs <= 384 * 168,
              "the register split must fit the CTA's pool");

struct WgTiles {
  static constexpr int BM = 128, BN = 256, BK = 64, ST = 4;
  static constexpr int kConsumers = 256, kThreads = kConsumers + 128;
  static constexpr uint32_t kStageA = BM * BK * 2, kStageB = BN * BK * 2;
  static constexpr size_t kSmem = 1024 + ST * (kStageA + kStageB) + 2 * ST * sizeof(uint64_t) + BM * sizeof(int32_t);
  static_assert(BK == mkmoe::kTileK, "the swizzled row is 64 bf16 (swz64)");

  __device__ static unsigned char* base(unsigned char* smem) {
    return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem) + 1023) & ~uintptr_t(1023));
  }
  __device__ static bf16* sA(unsigned char* smem) { return reinterpret_cast<bf16*>(base(smem)); }  // [ST][BM][BK]
  __device__ static bf16* sB(unsigned char* smem) {  // [ST][BN][BK]
    return reinterpret_cast<bf16*>(base(smem) + ST * kStageA);
  }
  __device__ static uint64_t* full(unsigned char* smem) {
    return reinterpret_cast<uint64_t*>(base(smem) + ST * (kStageA + kStageB));
  }
  __device__ static uint64_t* empty(unsigned char* smem) { return full(smem) + ST; }
  // arow: [BM] GEMM1's A row sources: t >= 0 row t of x (a local row),
  // -2 - m receive row m (a remote one), -1 padding.
  __device__ static int32_t* arow(unsigned char* smem) { return reinterpret_cast<int32_t*>(empty(smem) + ST); }
  __device__ static void setup(unsigned char* smem) {
    if (threadIdx.x == 0) {
      for (int st = 0; st < ST; st++) {
        mkwg::mbar_init(&full(smem)[st], 129);
        mkwg::mbar_init(&empty(smem)[st], 2);
      }
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
  }
  __device__ static void producer_sync() { asm volatile("bar.sync 2, 128;\n" ::: "memory"); }

  // produce fills the ring for one (row tile, column block) task: the
  // producer warpgroup's threads, g counting the CTA's k steps.
  // produce returns false when a wait for a free stage gave up (the abort).
  template <bool GATEUP>
  __device__ static bool produce(const Params& p, const FusedMaps& m, int d, int tile, int nb, unsigned char* smem,
                                 int& g, volatile int* abort) {
    using namespace mkwg;
    const RankP& rk = p.rk[d];
    const int wl = threadIdx.x - kConsumers;
    const int64_t Kd = GATEUP ? p.H : p.I, N = GATEUP ? p.I : p.H;
    const int KT = (int)((Kd + BK - 1) / BK);
    const int64_t m0 = (int64_t)tile * BM;
    const int slot = rk.tile_slot[tile];
    int32_t* ar = arow(smem);
    int32_t ri[BM / 16];  // this thread's A rows r0 + 16 i (arow's code), read once a task: a stage is
                          // then 8 address computations and copies with no load between them
    const bool gather = GATEUP && !p.copy_local;  // GEMM1's rows by cp.async (else by TMA, like GEMM2's)
    if (gather) {
      producer_sync();  // every producer thread read the previous task's rows from arow
      const int32_t src = rk.row_src[m0 + wl];
      ar[wl] = src < 0 ? -1 : (src & 7) == d ? (src >> 3) / p.K  // a local row: x itself
                                             : -2 - (int32_t)(m0 + wl);
      producer_sync();
#pragma unroll
      for (int i = 0; i < BM / 16; i++) ri[i] = ar[wl / 8 + 16 * i];
    } else if (wl == 0) {
      // The activation rows were stored by GEMM1 epilogues (generic proxy)
      // and released through g1done (GEMM1 with copy_local: the received
      // rows, by dispatch through arrive), which this thread acquired when
      // it took the task; order them before its TMA reads (async proxy).
      fence_proxy_async_global();
    }
    // B's two 128-row boxes: GEMM1 the slot's gate rows and its up rows (I
    // further) of output columns nb·128 + [0, 128); GEMM2 rows nb·256 +
    // [0, 256) of the slot's down matrix. Rows past the slot's N are the
    // next slot's (or zeros past the tensor): computed, never stored.
    const int32_t b0 = (int32_t)(GATEUP ? (int64_t)slot * 2 * N + (int64_t)nb * (BN / 2)
                                        : (int64_t)slot * N + (int64_t)nb * BN);
    const int32_t b1 = (int32_t)(GATEUP ? b0 + N : b0 + BN / 2);
    const TmaMap* wm = GATEUP ? &m.gu[d] : &m.dn[d];
    bf16* const a0 = sA(smem);
    bf16* const bb0 = sB(smem);
    uint64_t* const fb = full(smem);
    uint64_t* const eb = empty(smem);
    const int ch = wl % 8, r0 = wl / 8;
    for (int kt = 0; kt < KT; kt++, g++) {
      const int st = g % ST;
      if (g >= ST && !ring_wait(p, &eb[st], ((g / ST) - 1) & 1, abort, true, d, tile, p.timeout_ns)) {
        if (gather) asm volatile("cp.async.wait_all;\n" ::: "memory");
        return false;
      }
      bf16* a = a0 + st * (BM * BK);
      bf16* b = bb0 + st * (BN * BK);
      if (wl == 0) {
        mbar_expect_tx(&fb[st], gather ? kStageB : kStageA + kStageB);
        if (!gather) tma_load_2d(a, GATEUP ? &m.recv[d] : &m.act[d], kt * BK, (int32_t)m0, &fb[st]);
        // Fault injection: the launch's first filled stage never gets its weights.
        if (!(p.fault_stage && g == 0 && atomicCAS(p.ctl + kFaultOnce, 0, 1) == 0)) {
          tma_load_2d(b, wm, kt * BK, b0, &fb[st]);
          tma_load_2d(b + (BN / 2) * BK, wm, kt * BK, b1, &fb[st]);
        }
      }
      if (gather) {
        const int64_t k = (int64_t)kt * BK + ch * 8;
        const bool kv = k < Kd;
#pragma unroll
        for (int i = 0; i < BM / 16; i++) {
          const int r = r0 + 16 * i;
          const bool v = ri[i] != -1 && kv;
          const bf16* src = ri[i] >= 0 ? rk.x + (int64_t)ri[i] * p.H : rk.recv + (int64_t)(-2 - ri[i]) * p.H;
          cp_async16(a + mkmoe::swz64(r, ch), v ? src + k : rk.recv, v);
        }
        cp_async_arrive(&fb[st]);
      } else {
        mbar_arrive(&fb[st]);
      }
    }
    if (gather) asm volatile("cp.async.wait_all;\n" ::: "memory");
    return true;
  }

  // consume runs the wgmmas of one task and stores its outputs: the two
  // consumer warpgroups (warpgroup cw: rows 64·cw + [0, 64) of the tile).
  // False, nothing stored, when a wait for a full stage gave up.
  template <bool GATEUP>
  __device__ static bool consume(const Params& p, int d, int tile, int nb, unsigned char* smem, int& g,
                                 volatile int* abort) {
    using namespace mkwg;
    const RankP& rk = p.rk[d];
    const int64_t Kd = GATEUP ? p.H : p.I, N = GATEUP ? p.I : p.H;
    const int KT = (int)((Kd + BK - 1) / BK);
    const int64_t m0 = (int64_t)tile * BM;
    const int tid = threadIdx.x, lane = tid % 32, cw = tid / 128, wl = tid % 128, warp = wl / 32;
    float acc0[64], acc1[64];
    const auto stage_full = [&](uint64_t* b, unsigned parity) {
      return ring_wait(p, b, parity, abort, false, d, tile, p.timeout_ns);
    };
    // Rows 64–127 all padding (the padding ends a slot's rows): the second
    // warpgroup only keeps the ring's pace (named barrier 3: its own).
    const int skip_bar = cw == 1 && mkmoe::skip_half(p.half_skip, rk.row_src[m0 + 64] < 0,
                                                      tile > 0 && rk.tile_slot[tile - 1] == rk.tile_slot[tile])
                             ? 3
                             : -1;
    if (!ws_consume<ST>(acc0, acc1, sm_addr(sA(smem)), sm_addr(sB(smem)), kStageA, kStageB, cw * 64 * 128,
                        full(smem), empty(smem), wl, KT, g, stage_full, MbarRelease(), 0, skip_bar))
      return false;
    if (skip_bar >= 0) return true;  // nothing to store
    // d[4i + q] of a warpgroup's m64n128 block: row 16·warp + lane/4 + 8·(q/2),
    // column 8i + 2·(lane%4) + q%2.
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int64_t row = m0 + cw * 64 + warp * 16 + lane / 4 + 8 * h;
      const int32_t src = rk.row_src[row];
      if (!GATEUP && p.ret_bf16) {  // every lane: the stores' shuffles
        ret_bf16_row(p, src, N, nb * BN, acc0, acc1, h, lane);
        continue;
      }
      if (src < 0) continue;
      if (GATEUP) {
        mkmoe::store_act_row(rk.act + row * N, acc0, acc1, h, lane, (int64_t)nb * (BN / 2), N, nullptr, p.act, p.alpha,
                             p.limit);
      } else {
        float* out = ret_row<float>(p, src, N);
#pragma unroll
        for (int half = 0; half < 2; half++) {
#pragma unroll
          for (int i = 0; i < 16; i++) {
            const int64_t n = (int64_t)nb * BN + half * 128 + 8 * i + 2 * (lane % 4);
            if (n >= N) continue;
            const float2 v = half ? make_float2(acc1[4 * i + 2 * h], acc1[4 * i + 2 * h + 1])
                                  : make_float2(acc0[4 * i + 2 * h], acc0[4 * i + 2 * h + 1]);
            st2(out + n, v.x, v.y);
          }
        }
      }
    }
    return true;
  }
};

template <class C>
__global__ void __launch_bounds__(C::kThreads, C::kMinCTAs) fused_kernel(const __grid_constant__ Params p) {
  constexpr int NT = C::kThreads;
  static_assert(C::BM <= NT, "one thread per row signals GEMM2's tokens");
  extern __shared__ __align__(128) unsigned char fused_sm[];
  __shared__ int task_sh, ok_sh;
  // The trace's times (thread 0's; in shared memory, not registers).
  __shared__ unsigned long long t_entry, t_setup, t_take, t_ready;
  __shared__ int g1pre[kMaxRanks + 1], g2pre[kMaxRanks + 1];
  __shared__ int fold_sh[kFoldBM];  // fold_combine's winning rows (the 16-row tiles)
  const int R = p.R, K = p.K;
  const bool local = p.me >= 0;
  // Launched programmatically after the plan (launch_fused): every CTA
  // waits here for the plan's writes; it never lets a later kernel launch
  // early (its CTAs hold every multiprocessor until the layer is done).
  mk::pdl_wait();
  const int room = trace_room(p);
  if (threadIdx.x == 0) t_entry = trace_now(room);
  if (threadIdx.x == 0) {
    // Rank-local: only this rank's tiles (the peers' num_tiles are theirs).
    // Nothing at all when the error record is set: a plan's wait timed out
    // (rank-local: stale plan) or a rank got more rows than it holds.
    ok_sh = ld_relaxed(p.ctl) == 0;
    gemm_prefix(p, g1pre, g2pre);
  }
  __syncthreads();
  if (!ok_sh) return;
  if (threadIdx.x == 0) t_setup = trace_now(room);
  int ntasks = 0;  // trace: this CTA's tasks
  bool planned = !local;  // rank-local: plans_done, once
  auto wait_planned = [&]() -> bool { return planned || (planned = plans_done<NT, 0>(p, &ok_sh)); };
  const int n_disp = p.disp_pre[R];
  const int n_g1 = g1pre[R], n_g2 = g2pre[R];
  const int n_main = n_g1 + n_g2 + p.comb_pre[R];
  // Dispatch role.
  if ((int)blockIdx.x < p.ndisp_ctas) {
    for (;;) {
      const int idx = block_take(p.ctl + kQDisp, &task_sh);
      if (threadIdx.x == 0) t_take = trace_now(room);
      if (idx >= n_disp) break;
      if (!wait_planned()) return;
      const int r = find_rank(p.disp_pre, R, idx);
      if (r == p.fault_rank) continue;  // fault injection: this rank never sends
      const int64_t t0 = (int64_t)(idx - p.disp_pre[r]) * p.dt;
      dispatch_task<NT>(p, r, t0, min(p.rk[r].T, t0 + p.dt), false);
      if (threadIdx.x == 0) trace_rec(p, room, 4, idx, t_take, t_take, t_take, (unsigned long long)t0);
      ntasks++;
    }
  }
  // Compute and combine.
  for (;;) {
    int idx = block_take(p.ctl + kQMain, &task_sh);
    if (threadIdx.x == 0) t_take = trace_now(room);
    if (idx >= n_main) break;
    const int task = idx;
    ntasks++;
    if (idx < n_g1) {
      const int d = find_rank(g1pre, R, idx);
      const int rel = idx - g1pre[d];
      int tile, nb;
      // A block's splits are neighbours in the queue: taken together.
      task_tile(p, rel / p.ks1, (g1pre[d + 1] - g1pre[d]) / (p.n1t * p.ks1), p.n1t, tile, nb);
      const int got = C::template gemm<true>(p, d, tile, nb, rel % p.ks1, fused_sm, [&]() {
        if (threadIdx.x == 0) {
          const int want = p.rk[d].tile_want[tile];  // remote rows; local ones are read from x
          ok_sh = want == 0 || wait_geq(p, p.rk[d].arrive + tile, want, d, 1, tile);
          t_ready = trace_now(room);
        }
        __syncthreads();
        return ok_sh != 0;
      });
      if (got == kTaskFailed) return;
      if (got == kTaskDone) {
        __syncthreads();
        if (threadIdx.x == 0) {
          __threadfence();
          red_release_add(p.rk[d].g1done + tile, 1);
        }
      }
      if (threadIdx.x == 0)
        trace_rec(p, room, 1, task, t_take, t_ready, t_ready, trace_pos(tile, nb, rel % p.ks1, p.ks1));
    } else if ((idx -= n_g1) < n_g2) {
      const int d = find_rank(g2pre, R, idx);
      const int rel = idx - g2pre[d];
      int tile, nb;
      task_tile(p, rel / p.ks2, (g2pre[d + 1] - g2pre[d]) / (p.n2t * p.ks2), p.n2t, tile, nb);
      const int got = C::template gemm<false>(p, d, tile, nb, rel % p.ks2, fused_sm, [&]() {
        if (threadIdx.x == 0) {
          ok_sh = wait_geq(p, p.rk[d].g1done + tile, p.n1t, d, 2, tile);
          t_ready = trace_now(room);
        }
        __syncthreads();
        return ok_sh != 0;
      });
      if (got == kTaskFailed) return;
      if (got == kTaskDone) {
        __syncthreads();
        bool folded = false;
        if constexpr (C::BM == kFoldBM) {
          if (p.fold) {
            fold_combine<NT, C::BM, C::BN>(p, d, tile, nb, fold_sh);
            folded = true;
          }
        }
        if (!folded && threadIdx.x < C::BM) {
          const int32_t src = p.rk[d].row_src[(int64_t)tile * C::BM + threadIdx.x];
          if (src >= 0) signal_add(p, p.rk[src & 7].tokdone + (src >> 3) / K, 1);
        }
      }
      if (threadIdx.x == 0)
        trace_rec(p, room, 2, task, t_take, t_ready, t_ready, trace_pos(tile, nb, rel % p.ks2, p.ks2));
    } else {
      idx -= n_g2;
      const CombTask ct = comb_task(p, idx);
      if (!wait_planned()) return;
      if (threadIdx.x == 0) ok_sh = combine_ready(p, idx);
      __syncthreads();
      if (!ok_sh) return;
      if (threadIdx.x == 0) t_ready = trace_now(room);
      combine_rows<NT>(p, ct, false);
      if (threadIdx.x == 0) trace_rec(p, room, 3, task, t_take, t_ready, t_ready, (unsigned long long)ct.t0);
    }
  }
  if (threadIdx.x == 0) trace_rec(p, room, 0, blockIdx.x, t_entry, t_setup, t_setup, (unsigned long long)ntasks);
}

// fused_wg_kernel: the persistent launch with the wgmma tiles (WgTiles),
// one 384-thread CTA a multiprocessor. The same queues, tasks, waits and
// signals as fused_kernel, but the two roles run their own loops:
//   producer warpgroup (56 registers): its thread 0 takes the main queue's
//     tasks, waits for a GEMM task's inputs (the tile's remote rows for
//     GEMM1, its GEMM1 blocks for GEMM2; bounded), passes each task to the
//     consumers through a two-slot task ring (mbarriers), and the warpgroup
//     loads the GEMM task's stages; it then takes the next task at once, so
//     the next task's inputs are waited for and its first stages load while
//     the consumers still compute and store the current one;
//   consumer warpgroups (224 registers): the dispatch tasks first (among
//     themselves, named barrier 1), then every task from the ring: a GEMM
//     task's wgmmas, epilogue and signals, a combine task's wait and sums.
// Nobody leaves early: a wait that gives up (the watchdog) sets the abort
// word and marks its task failed; the producer then passes the end of the
// queue, the consumers skip failed and later work, and both roles drain to
// that end, so no mbarrier or barrier waits for threads that returned and
// no TMA copy is in flight when the CTA exits.
__global__ void __launch_bounds__(WgTiles::kThreads, 1)
    fused_wg_kernel(const __grid_constant__ Params p, const __grid_constant__ FusedMaps maps) {
  constexpr int NC = WgTiles::kConsumers;
  extern __shared__ __align__(128) unsigned char fused_sm[];
  __shared__ int task_sh, ok_sh, ptask_sh;
  __shared__ volatile int abort_sh;
  __shared__ int tq_idx[2], tq_ok[2];                       // the task ring
  __shared__ unsigned long long tq_t[2][2];                 // trace: when the producer took the task, when its inputs were there
  __shared__ __align__(8) uint64_t tq_full[2], tq_empty[2];  // its mbarriers: 1 producer arrival, NC consumer ones
  __shared__ int g1pre[kMaxRanks + 1], g2pre[kMaxRanks + 1];
  const int R = p.R, K = p.K;
  const bool local = p.me >= 0;
  mk::pdl_wait();  // the plan's writes (as fused_kernel)
  const int room = trace_room(p);
  const unsigned long long t_entry = trace_now(room);
  WgTiles::setup(fused_sm);
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; s++) {
      mkwg::mbar_init(&tq_full[s], 1);
      mkwg::mbar_init(&tq_empty[s], NC);
    }
    abort_sh = ld_relaxed(p.ctl) != 0;  // a plan's wait timed out (stale plan) or a rank is over capacity
    gemm_prefix(p, g1pre, g2pre);
  }
  __syncthreads();
  if (abort_sh) return;
  const int n_g1 = g1pre[R], n_g2 = g2pre[R];
  const int n_main = n_g1 + n_g2 + p.comb_pre[R];
  // task_at maps a main-queue index of a GEMM task to its rank, row tile
  // and column block; false for a combine task or the end.
  // (The host never splits these tiles' reductions: ks1 = ks2 = 1.)
  auto task_at = [&](int idx, bool& gateup, int& d, int& tile, int& nb) -> bool {
    gateup = idx < n_g1;
    if (!gateup && (idx -= n_g1) >= n_g2) return false;
    const int* pre = gateup ? g1pre : g2pre;
    const int n = gateup ? p.n1t : p.n2t;
    d = find_rank(pre, R, idx);
    task_tile(p, idx - pre[d], (pre[d + 1] - pre[d]) / n, n, tile, nb);
    return true;
  };
  int g = 0;  // k steps of this CTA's GEMM tasks so far: the stage ring's position, the same in both roles
  int j = 0;  // tasks through the task ring so far

  if (threadIdx.x >= NC) {  // producer warpgroup
    mkwg::setmaxnreg_dec<kWgProducerRegs>();
    const int wl = threadIdx.x - NC;
    for (;; j++) {
      if (wl == 0) {
        int idx = abort_sh ? INT_MAX : atomicAdd(p.ctl + kQMain, 1);
        const unsigned long long t_take = trace_now(room);
        if (idx > n_main) idx = n_main;
        bool gu;
        int d, tile, nb, ok = 1;
        if (task_at(idx, gu, d, tile, nb)) {
          if (gu) {
            const int want = p.rk[d].tile_want[tile];  // remote rows; local ones are read from x
            ok = want == 0 || wait_geq(p, p.rk[d].arrive + tile, want, d, 1, tile);
          } else {
            ok = wait_geq(p, p.rk[d].g1done + tile, p.n1t, d, 2, tile);
          }
          if (!ok) abort_sh = 1;
        } else if (idx < n_main && !local) {
          // A combine task: wait here for its tokens' rows, while the
          // consumers still work (rank-local: they wait, after the plans).
          ok = combine_ready(p, idx - n_g1 - n_g2);
          if (!ok) abort_sh = 1;
        }
        const unsigned long long t_ready = trace_now(room);
        const int s = j & 1;
        if (j >= 2 && !ring_wait(p, &tq_empty[s], ((j >> 1) - 1) & 1, &abort_sh, false, -1, -1, 2 * p.timeout_ns)) {
          ptask_sh = n_main;  // the consumers stopped taking tasks (their waits end the same way)
        } else {
          ok = ok && !abort_sh;  // after an abort the consumers skip what is left
          tq_idx[s] = idx;
          tq_ok[s] = ok;
          tq_t[s][0] = t_take;
          tq_t[s][1] = t_ready;
          mkwg::mbar_arrive(&tq_full[s]);  // release: the slot's words before the consumers' acquire
          ptask_sh = ok ? idx : idx >= n_main ? n_main : -1;  // a failed wait: nothing to load; the next take ends
        }
      }
      WgTiles::producer_sync();
      const int idx = ptask_sh;
      WgTiles::producer_sync();  // ptask_sh is free for the next task
      bool gu;
      int d, tile, nb;
      if (idx >= n_main) break;
      if (idx < 0 || !task_at(idx, gu, d, tile, nb)) continue;  // failed, or a combine task (the consumers' alone)
      if (gu) WgTiles::produce<true>(p, maps, d, tile, nb, fused_sm, g, &abort_sh);
      else WgTiles::produce<false>(p, maps, d, tile, nb, fused_sm, g, &abort_sh);
    }
    // After an abort, stages may still be filling: see the last fill of each
    // land (bounded) before the CTA exits, so no TMA copy outlives it.
    if (abort_sh && wl == 0)
      for (int i = g > WgTiles::ST ? g - WgTiles::ST : 0; i < g; i++)
        ring_wait(p, &WgTiles::full(fused_sm)[i % WgTiles::ST], (i / WgTiles::ST) & 1, &abort_sh, false, -1, -1,
                  p.timeout_ns);
    return;
  }

  mkwg::setmaxnreg_inc<kWgConsumerRegs>();
  const unsigned long long t_setup = trace_now(room);
  int ntasks = 0;  // trace: this CTA's tasks
  bool planned = !local;  // rank-local: plans_done (consumers only), once; a timeout aborts the CTA
  auto wait_planned = [&]() -> bool {
    if (planned) return true;
    planned = plans_done<NC, 1>(p, &ok_sh);
    if (!planned && threadIdx.x == 0) abort_sh = 1;
    return planned;
  };
  // Dispatch role (consumers only; dispatch never waits but for the plan).
  if ((int)blockIdx.x < p.ndisp_ctas) {
    const int n_disp = p.disp_pre[R];
    for (;;) {
      if (threadIdx.x == 0) task_sh = atomicAdd(p.ctl + kQDisp, 1);
      const unsigned long long t_take = trace_now(room);
      role_sync<NC, 1>();
      const int idx = task_sh;
      role_sync<NC, 1>();
      if (idx >= n_disp || !wait_planned()) break;
      const int r = find_rank(p.disp_pre, R, idx);
      if (r == p.fault_rank) continue;  // fault injection: this rank never sends
      const int64_t t0 = (int64_t)(idx - p.disp_pre[r]) * p.dt;
      dispatch_task<NC, 1>(p, r, t0, min(p.rk[r].T, t0 + p.dt), false);
      if (threadIdx.x == 0) trace_rec(p, room, 4, idx, t_take, t_take, t_take, (unsigned long long)t0);
      ntasks++;
    }
  }
  // Every task from the ring, to the end of the queue.
  for (;; j++) {
    const int s = j & 1;
    if (!ring_wait(p, &tq_full[s], (j >> 1) & 1, &abort_sh, false, -1, -1, 2 * p.timeout_ns)) break;
    const int idx = tq_idx[s], ok = tq_ok[s];
    const unsigned long long t_take = tq_t[s][0], t_ready = tq_t[s][1], t_start = trace_now(room);
    mkwg::mbar_arrive(&tq_empty[s]);
    if (idx >= n_main) break;
    ntasks++;
    if (!ok) continue;  // its wait gave up (the error record names it); the producer ends the queue next
    bool gu;
    int d, tile, nb;
    if (task_at(idx, gu, d, tile, nb)) {
      const bool done = gu ? WgTiles::consume<true>(p, d, tile, nb, fused_sm, g, &abort_sh)
                           : WgTiles::consume<false>(p, d, tile, nb, fused_sm, g, &abort_sh);
      role_sync<NC, 1>();  // every consumer's stores of the task are done
      if (!done) continue;  // a stage never filled (the error record says so): nothing to signal
      if (gu) {
        if (threadIdx.x == 0) {
          __threadfence();
          red_release_add(p.rk[d].g1done + tile, 1);
        }
      } else if (threadIdx.x < WgTiles::BM) {
        const int32_t src = p.rk[d].row_src[(int64_t)tile * WgTiles::BM + threadIdx.x];
        if (src >= 0) signal_add(p, p.rk[src & 7].tokdone + (src >> 3) / K, 1);
      }
      if (threadIdx.x == 0) trace_rec(p, room, gu ? 1 : 2, idx, t_take, t_ready, t_start, trace_pos(tile, nb, 0, 1));
      continue;
    }
    // Combine.
    const int c = idx - n_g1 - n_g2;
    const CombTask ct = comb_task(p, c);
    if (local) {  // the producer waited for the inputs unless rank-local (the plans come first)
      if (!wait_planned()) continue;
      if (threadIdx.x == 0) {
        const bool ok2 = !abort_sh && combine_ready(p, c);
        ok_sh = ok2;
        if (!ok2) abort_sh = 1;
      }
      role_sync<NC, 1>();
      if (!ok_sh) continue;
    }
    combine_rows<NC, 1>(p, ct, false);
    if (threadIdx.x == 0) trace_rec(p, room, 3, idx, t_take, t_ready, t_start, (unsigned long long)ct.t0);
  }
  if (threadIdx.x == 0) trace_rec(p, room, 0, blockIdx.x, t_entry, t_setup, t_setup, (unsigned long long)ntasks);
}

// The separate path's dispatch and combine launches.
__global__ void __launch_bounds__(kThreads) dispatch_kernel(const __grid_constant__ Params p) {
  if (ld_relaxed(p.ctl) != 0) return;  // the plan found a rank over capacity
  const int idx = blockIdx.x;
  const int r = find_rank(p.disp_pre, p.R, idx);
  const int64_t t0 = (int64_t)(idx - p.disp_pre[r]) * p.dt;
  dispatch_task(p, r, t0, min(p.rk[r].T, t0 + p.dt), true);
}
__global__ void __launch_bounds__(kThreads) combine_kernel(const __grid_constant__ Params p) {
  if (ld_relaxed(p.ctl) != 0) return;
  combine_rows(p, comb_task(p, blockIdx.x), true);
}

// ---- host side ----

struct TileCfg {
  int bm, bn;
};
// 0, 1: mma.sync (MmaTiles); 2: wgmma (WgTiles, sm_90a).
constexpr TileCfg kTiles[3] = {{16, 64}, {64, 128}, {WgTiles::BM, WgTiles::BN}};
// The persistent kernel of tile policy C, and what it takes besides Params.
template <class C>
struct KernelOf {
  static constexpr void (*fn)(Params) = fused_kernel<C>;
};
template <>
struct KernelOf<WgTiles> {
  static constexpr void (*fn)(Params, FusedMaps) = fused_wg_kernel;
};
using MmaSmall = MmaTiles<16, 64, 16, 16, 6>;
using MmaSmall8 = MmaTiles<16, 64, 16, 16, 8>;
// The same with the paired ring (MK_MOE_DEC_PAIR=1, off by default:
// written after the fifty-sixth pass's device time, not yet run).
using MmaSmallP = MmaTiles<16, 64, 16, 16, 6, true>;
using MmaSmall8P = MmaTiles<16, 64, 16, 16, 8, true>;
using MmaLarge = MmaTiles<64, 128, 32, 64, 4>;

// small_stages is the cp.async ring depth of the 16-row decode tiles for
// a launch whose largest rank has tmax tokens: 6 (three CTAs an SM), or 8
// (two) at one or two tokens where GEMM1's reduction is long (hidden ≥
// 4096). One depth serves both GEMMs of the persistent launch. Measured
// (H200, forty-eighth pass, fused layers by graph replay, 8 against 6
// stages): one token DeepSeek-V3 ×0.91 (0.231 against 0.252 ms), Mixtral
// ×0.89 (0.257 against 0.289); but 4–256 tokens DeepSeek-V3 ×1.03–1.12,
// Mixtral at 4–64 ×1.08–1.21: fewer, deeper CTAs stream one token's
// weights faster and lose where a CTA's tile has several rows to feed.
// MK_MOE_FUSED_DEC_ST=6 or 8 forces one.
int small_stages(int64_t h, int64_t tmax) {
  static const int forced = [] {
    const char* v = getenv("MK_MOE_FUSED_DEC_ST");
    const int n = v ? atoi(v) : 0;
    return n == 6 || n == 8 ? n : 0;
  }();
  if (forced) return forced;
  return h >= 4096 && tmax <= 2 ? 8 : 6;
}

// wg_ok: the wgmma tiles can run here (the kernel is built for this
// device's architecture and the driver encodes TMA maps).
bool wg_ok() {
  static const bool ok = [] {
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, fused_wg_kernel) != cudaSuccess || fa.binaryVersion < 90) {
      cudaGetLastError();
      return false;
    }
    return mkwg::encode_tiled() != nullptr;
  }();
  return ok;
}

// wg_rows: the average rows per active slot from which the automatic
// choice takes the wgmma tiles (MK_MOE_FUSED_WG_ROWS, default 25: every
// count above the 16-row tiles' range). H200, R = 1 (docs/PERF.md,
// fifteenth pass): 128-row wgmma tiles beat the 64-row mma.sync tiles
// from 32 rows a slot on (DeepSeek-V3 at 1024 tokens: 4.82 against 5.72 ms,
// though three quarters of each tile is padding; the layer reads weights).
int wg_rows() {
  static const int v = [] {
    const char* e = getenv("MK_MOE_FUSED_WG_ROWS");
    return e && atoi(e) > 0 ? atoi(e) : 25;
  }();
  return v;
}

// copy_local: dispatch local rows too and load GEMM1's rows by TMA
// (Params.copy_local; wgmma tiles only) for an intermediate size of inter:
// mkmoe::gather_by_copy, forced by MK_MOE_FUSED_COPY_LOCAL=1/0.
bool copy_local(int64_t inter) {
  static const int force = mk::env_force("MK_MOE_FUSED_COPY_LOCAL");
  return mkmoe::gather_by_copy(force, inter);
}

// pick_tile is the kTiles index for the tile argument: 16, 64 or 128 that
// row tile (128 needs wg_ok), 0 by rows per active slot. -1: not valid here.
int pick_tile(int ranks, const int64_t* tokens, const int32_t* slots, int k, int tile) {
  switch (tile) {
    case 16: return 0;
    case 64: return 1;
    case 128: return wg_ok() ? 2 : -1;
    case 0: break;
    default: return -1;
  }
  int64_t n = 0, tmax = 0, s = 0;
  for (int r = 0; r < ranks; ++r) {
    n += tokens[r] * k;
    tmax = tokens[r] > tmax ? tokens[r] : tmax;
    s += slots[r];
  }
  const int64_t active = n < s ? n : s;
  const double avg = (double)n / (double)(active > 0 ? active : 1);
  if (tmax <= 16 || avg <= 24) return 0;
  return avg >= wg_rows() && wg_ok() ? 2 : 1;
}

size_t up256(size_t x) { return (x + 255) / 256 * 256; }

// ret_elem_bytes: a returned row's element, bf16 (2) on the wgmma tiles
// unless MK_MOE_FUSED_RET_BF16=0 (f32, 4; the mma.sync tiles always keep
// f32 in the larger workspace). Read once: the workspace sizes and the
// launches of a process agree (every process of an IPC group must be
// started with the same setting). bf16 halves GEMM2's writes, the bytes
// sent back to the source rank and the combine's reads (Qwen3-30B-A3B at
// 4096 tokens: 268 → 134 MB), as DeepEP's and vLLM's bf16 combine inputs
// and our grouped path's GEMM2 rows, and rounds each expert output once
// before the weighted sum (relative error ≤ 2^-9 an element; layers ~2e-3
// against the CPU reference). It measured 1-9 % slower than f32 until the
// forty-seventh pass, whose task trace put the cost in the combine (13.7
// µs a task against 9.1): with combine_ret's one round trip a chunk bf16
// is the faster (Qwen3 at 16384 tokens 2.46–2.64 ms against 2.76–2.82 in
// f32, PERF.md "GPU, forty-seventh pass").
// bm is the launch's row tile (128: the wgmma tiles).
size_t ret_elem_bytes(int bm) {
  static const bool bf = !mk::env_is("MK_MOE_FUSED_RET_BF16", '0');
  return bf && bm == kTiles[2].bm ? 2 : 4;
}

// plan_blocks is the many-block plan's CTAs per destination for n
// assignments over R emulated ranks: one per 4096 assignments, at most
// kPlanMaxG and a wave of the GPU in all; 0 (the one-CTA plan_kernel) below
// kPlanMultiMin or where that leaves one. MK_MOE_PLAN_MULTI=0 / 1 forces
// the one-CTA plan / the many-block one (read once).
int plan_blocks(int64_t n, int R) {
  static const int force = mk::env_force("MK_MOE_PLAN_MULTI");
  if (force == 0 || (force < 0 && n < kPlanMultiMin)) return 0;
  const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(kPlanMaxG, mk::sm_count() / R));
  const int64_t g = std::min<int64_t>(cap, (n + kPlanMultiMin - 1) / kPlanMultiMin);
  return force == 1 ? (int)std::max<int64_t>(g, 2) : g >= 2 ? (int)g : 0;
}

// fused_cores is how many CTAs of tile policy C's persistent kernel are
// co-resident on this device (its shared memory attribute set once here);
// 0 with the CUDA error pending where the query failed.
template <class C>
int fused_cores() {
  auto fn = KernelOf<C>::fn;
  static bool attr = false;
  if (!attr) {
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::kSmem) != cudaSuccess) return 0;
    attr = true;
  }
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, C::kThreads, C::kSmem) != cudaSuccess) return 0;
  return occ * mk::sm_count();
}

// KSplit: the splits of GEMM1's and GEMM2's reductions (Params.ks1, ks2).
struct KSplit {
  int g1 = 1, g2 = 1;
};
constexpr int kMaxSplit = 8;

// ksplit picks the splits of a launch of bm-row tiles: none but for the
// 16-row tiles, where a reduction is split in two (then four, eight)
// while its GEMM's tasks (about one row tile a routed row at these sizes
// — min(rows, slots) tiles — times its column blocks), doubled, still fit
// the co-resident CTAs and each split keeps ≥ 4 k steps of 64. At one
// token that splits Mixtral's GEMM2 in two (128 tasks of 224 k steps for
// 264 CTAs: one token ×0.84, H200, PERF.md "GPU, forty-ninth pass") and
// Qwen3-30B-A3B's GEMM1 (192 tasks of 32 k steps for 396 CTAs); a split
// of Qwen3's GEMM2 too (512 tasks of 6 k steps) measured slower than
// none, its tasks two waves of short latency-bound tasks that no longer
// load their weights while GEMM1 runs; DeepSeek-V3's GEMMs have their 512
// and 896 tasks. A function of the shapes and the device only: the
// workspace sizes and the launches agree (build checks the workspace
// again). MK_MOE_FUSED_KSPLIT="a/b" (or a,b, axb) forces GEMM1's and
// GEMM2's (1..8 each, capped at their k steps; 0: the rule).
KSplit ksplit(int ranks, const int64_t* tokens, const int32_t* slots, int k, int64_t h, int64_t i, int bm) {
  KSplit ks;
  if (bm != 16) return ks;
  static const std::pair<int, int> forced = [] {
    const char* v = getenv("MK_MOE_FUSED_KSPLIT");
    int a = 0, b = 0;
    if (v == nullptr || sscanf(v, "%d%*[,/x]%d", &a, &b) != 2) return std::pair<int, int>(0, 0);
    return std::pair<int, int>(std::clamp(a, 0, kMaxSplit), std::clamp(b, 0, kMaxSplit));
  }();
  int64_t n = 0, sl = 0, tmax = 0;
  for (int r = 0; r < ranks; ++r) {
    n += tokens[r] * k;
    sl += slots[r];
    tmax = std::max(tmax, tokens[r]);
  }
  // The 16-row tiles' co-resident CTAs (2 or 3 an SM on the H200).
  int64_t cores = small_stages(h, tmax) == 8 ? fused_cores<MmaSmall8>() : fused_cores<MmaSmall>();
  if (cores <= 0) {
    cudaGetLastError();  // the launch reports it
    return ks;
  }
  const int64_t tiles = std::min(n, sl);
  auto pick = [&](int force, int64_t blocks, int64_t kt) {
    if (force > 0) return (int)std::min<int64_t>(force, std::max<int64_t>(kt, 1));
    int sp = 1;
    while (sp < kMaxSplit && tiles * blocks * sp * 2 <= cores && kt >= 8 * sp) sp *= 2;
    return sp;
  };
  const int64_t bn = kTiles[0].bn;
  ks.g1 = pick(forced.first, (i + bn / 2 - 1) / (bn / 2), (h + kBK - 1) / kBK);
  ks.g2 = pick(forced.second, (h + bn - 1) / bn, (i + kBK - 1) / kBK);
  return ks;
}

// comb_cols is the output columns of one combine task (Params.comb_cols)
// for hidden size h and row tile bm: whole rows but for the fused 16-row
// tiles (decode sizes), whose tasks take 1024 columns — one round trip of
// combine_ret's loads, 128 threads × 2 units × 4 f32 columns — so that a
// token's combine runs on ceil(h / 1024) CTAs at once instead of looping
// on one: after GEMM2 (whose weights have streamed through L2 since) each
// round trip reads the returned rows at ~2.5 µs (task trace at one token,
// this pass: DeepSeek-V3's one combine task 17.9 µs for 7 round trips,
// Qwen3's 6.6 µs for 2). Where the largest rank has at most
// kCombNarrowT tokens a task takes 128 columns (a token's combine on h /
// 128 CTAs, one unit of four columns a thread): H200, fifty-third pass,
// call 3, two rounds, 128 against 1024 columns: Qwen3-30B-A3B ×0.994 /
// 0.967 / 0.983 at 1 / 2 / 4 tokens, DeepSeek-V3 ×0.997 / 0.991 / 0.995,
// Mixtral ×0.996 / 0.994 / 0.996 (256 columns ×0.97–1.00). More tokens
// keep 1024 (not measured narrower; tasks would multiply by 8).
// MK_MOE_FUSED_COMB_COLS=N (a multiple of 8; 0: whole rows) forces it.
constexpr int64_t kCombNarrowT = 4;
int64_t comb_cols(int64_t h, int bm, bool sep, int64_t tmax) {
  static const int64_t forced = [] {
    const char* v = getenv("MK_MOE_FUSED_COMB_COLS");
    return v ? (int64_t)atoll(v) : (int64_t)-1;
  }();
  if (sep || bm != kTiles[0].bm) return h;
  const int64_t c = forced >= 0 ? forced : tmax <= kCombNarrowT ? 128 : 1024;
  return c <= 0 || c % 8 != 0 || c >= h ? h : c;
}

// RankLayout: byte offsets of one rank's workspace regions.
struct RankLayout {
  int64_t rows_cap, tiles_cap;
  size_t num_tiles, tile_slot, tile_want, arrive, g1done, row_src, row_slot, row_w, recv, act, dest_row, tokdone,
      ret, flags, rids, phist, part, kdone, y, moews, moews_bytes, total;
};

int rank_layout(int ranks, const int64_t* tokens, const int32_t* slots, int r, int k, int e, int64_t h, int64_t i,
                int bm, bool sep, int64_t max_rows, RankLayout* L) {
  int64_t n = 0;
  for (int q = 0; q < ranks; ++q) n += tokens[q] * k;
  if (max_rows > 0 && max_rows < n) n = max_rows;  // the rows a rank may receive (else all: the worst case)
  const int64_t S = slots[r];
  const int64_t active = n < S ? n : S;
  L->rows_cap = S > 0 ? (n + active * (bm - 1) + bm - 1) / bm * bm : 0;
  L->tiles_cap = L->rows_cap / bm;
  size_t o = 0;
  auto take = [&](size_t bytes) {
    const size_t at = o;
    o = up256(o + bytes);
    return at;
  };
  L->num_tiles = take(4);
  L->tile_slot = take((size_t)L->tiles_cap * 4);
  L->tile_want = take((size_t)L->tiles_cap * 4);
  L->arrive = take((size_t)L->tiles_cap * 4);
  L->g1done = take((size_t)L->tiles_cap * 4);
  L->row_src = take((size_t)L->rows_cap * 4);
  L->row_slot = take((size_t)L->rows_cap * 4);
  L->row_w = take((size_t)L->rows_cap * 4);
  L->recv = take((size_t)L->rows_cap * h * 2);
  L->act = take((size_t)L->rows_cap * i * 2);
  // GEMM2's column blocks on the 16-row tiles (the split counters below, and
  // Params.fold's token counters: [T][n2t] there, whether folding or not,
  // so that the layout is the same for every call on these workspaces).
  const int64_t bn = bm == kTiles[0].bm ? kTiles[0].bn : 0;
  const int64_t n1t = bn ? (i + bn / 2 - 1) / (bn / 2) : 0, n2t = bn ? (h + bn - 1) / bn : 0;
  L->dest_row = take((size_t)tokens[r] * k * 4);
  L->tokdone = take((size_t)tokens[r] * (n2t > 0 ? n2t : 1) * 4);
  L->ret = take((size_t)tokens[r] * k * h * ret_elem_bytes(bm));
  // Rank-local mode: rflag then pflag ([kMaxRanks] each; they must hold
  // values < 1 before epoch 1: zeroed or 0xff-filled), and the routing copies.
  L->flags = take(2 * kMaxRanks * 4);
  L->rids = take((size_t)2 * n * 4);
  L->phist = take((size_t)2 * kPlanMaxG * S * 4);  // the many-block plan's counts (plan_count_kernel)
  // The split reductions' partials and counters (RankP.part, kdone).
  const KSplit ks = ksplit(ranks, tokens, slots, k, h, i, bm);
  const int64_t parts = (ks.g1 > 1 ? n1t * ks.g1 : 0) + (ks.g2 > 1 ? n2t * ks.g2 : 0);
  L->part = take((size_t)L->tiles_cap * parts * kPartFloats * 4);
  L->kdone = take(parts > 0 ? (size_t)L->tiles_cap * (n1t + n2t) * 4 : 0);
  L->y = L->moews = L->moews_bytes = 0;
  if (sep && L->rows_cap > 0) {
    L->y = take((size_t)L->rows_cap * h * 4);
    uint64_t b = 0;
    int32_t tm = 0;
    const int rc = mk_moe_workspace(L->rows_cap, 1, (int32_t)S, h, i, &b, &tm);
    if (rc != MK_OK) return rc;
    L->moews_bytes = b;
    L->moews = take(b);
  }
  L->total = o;
  return MK_OK;
}

int check_shapes(const char* fn, int ranks, const int64_t* tokens, const int32_t* slots, int k, int e, int64_t h,
                 int64_t i, int tile, int64_t max_rows) {
  MK_ARG(ranks >= 1 && ranks <= kMaxRanks, "%s: ranks=%d must be in [1, %d]", fn, ranks, kMaxRanks);
  MK_ARG(tokens != nullptr && slots != nullptr, "%s: null tokens or slots", fn);
  MK_ARG(k >= 1 && e >= 1 && k <= e && e <= 65535, "%s: K=%d E=%d (want 1 <= K <= E <= 65535)", fn, k, e);
  MK_ARG(h > 0 && i > 0 && h % 8 == 0 && i % 8 == 0, "%s: H=%lld and I=%lld must be positive multiples of 8", fn,
         (long long)h, (long long)i);
  int64_t n = 0;
  for (int r = 0; r < ranks; ++r) {
    MK_ARG(tokens[r] >= 0 && tokens[r] <= (1 << 24), "%s: rank %d has %lld tokens (0..2^24)", fn, r,
           (long long)tokens[r]);
    MK_ARG(slots[r] >= 0 && slots[r] <= MK_MOE_FUSED_MAX_SLOTS, "%s: rank %d has %d slots (0..%d)", fn, r, slots[r],
           MK_MOE_FUSED_MAX_SLOTS);
    n += tokens[r] * k;
  }
  MK_ARG(n < (1 << 27), "%s: %lld (token, k) assignments in all, at most 2^27", fn, (long long)n);
  MK_ARG(tile == 0 || tile == 16 || tile == 64 || tile == 128, "%s: tile=%d must be 0 (pick), 16, 64 or 128", fn,
         tile);
  MK_ARG(max_rows >= 0, "%s: max_rows=%lld must be >= 0", fn, (long long)max_rows);
  MK_ARG(pick_tile(ranks, tokens, slots, k, tile) >= 0, "%s: tile=%d: the wgmma tiles need an sm_90a device", fn,
         tile);
  return MK_OK;
}

// build fills Params and checks the per-rank pointers.
int build(const char* fn, Params* p, int ranks, const uint64_t* ptrs, const int64_t* tokens, const int32_t* slots,
          int k, int e, int64_t h, int64_t i, uint64_t place, int act_kind, uint32_t alpha_bits, uint32_t limit_bits,
          uint64_t ctl, uint64_t ctl_bytes, const uint64_t* rank_bytes, bool sep, int tile, int64_t max_rows,
          int me = -1, int epoch = 0) {
  int rc = check_shapes(fn, ranks, tokens, slots, k, e, h, i, tile, max_rows);
  if (rc != MK_OK) return rc;
  MK_ARG(ptrs && rank_bytes, "%s: null ptrs or rank_bytes", fn);
  MK_ARG(place != 0 && ctl != 0, "%s: null place or ctl", fn);
  MK_ARG(ctl_bytes >= kCtlBytes, "%s: control workspace of %llu bytes, %llu needed", fn,
         (unsigned long long)ctl_bytes, (unsigned long long)kCtlBytes);
  MK_ARG(act_kind == MK_MOE_SWIGLU || act_kind == MK_MOE_SWIGLU_CLAMPED, "%s: act_kind %d", fn, act_kind);
  std::memset(p, 0, sizeof *p);
  if (ctl_bytes >= kCtlBytes + kTraceWords * 8) {
    p->trace = reinterpret_cast<unsigned long long*>(ctl + kCtlBytes);
    const uint64_t room = (ctl_bytes - kCtlBytes) / (kTraceWords * 8);
    p->trace_max = room < (1u << 30) ? (int)room : 1 << 30;
  }
  const int cfg = pick_tile(ranks, tokens, slots, k, tile);
  const TileCfg& tc = kTiles[cfg];
  p->R = ranks;
  p->K = k;
  p->E = e;
  p->BM = tc.bm;
  p->H = h;
  p->I = i;
  p->act = act_kind;
  p->alpha = mk::float_from_bits(alpha_bits);
  p->limit = mk::float_from_bits(limit_bits);
  p->n1t = (int)((i + tc.bn / 2 - 1) / (tc.bn / 2));
  p->n2t = (int)((h + tc.bn - 1) / tc.bn);
  const KSplit ks = ksplit(ranks, tokens, slots, k, h, i, tc.bm);
  p->ks1 = ks.g1;
  p->ks2 = ks.g2;
  p->place = mk::dev<const int32_t>(place);
  p->ctl = mk::dev<int32_t>(ctl);
  p->fault_rank = -1;
  p->dt = k < kDR ? kDR / k : 1;
  int64_t tmax = 0;
  for (int r = 0; r < ranks; ++r) tmax = std::max(tmax, tokens[r]);
  p->comb_cols = (int)comb_cols(h, tc.bm, sep, tmax);
  p->comb_nc = (int)((h + p->comb_cols - 1) / p->comb_cols);
  p->group_m = mkmoe::group_m();
  p->separate = sep;
  p->copy_local = !sep && cfg == 2 && copy_local(i);
  p->ret_bf16 = ret_elem_bytes(tc.bm) == 2;
  static const int l2pf = mkmoe::l2pf_env("MK_MOE_FUSED_L2PF", 0);
  p->l2pf = l2pf;
  static const bool early = !mk::env_is("MK_MOE_FUSED_EARLY_B", '0');
  p->early_b = early;
  // The wgmmas only (A rows in one 128-row box); lone tiles only from hidden kHalfSkipLoneH.
  p->half_skip = mkmoe::half_skip_mode(i, h >= mkmoe::kHalfSkipLoneH) & ~mkmoe::kHalfSkipBox;
  p->me = me;
  p->epoch = epoch;
  for (int r = 0; r < ranks; ++r) p->ids_off[r + 1] = p->ids_off[r] + tokens[r] * k;
  p->plan_g = me < 0 ? plan_blocks(p->ids_off[ranks], ranks) : 0;
  // The combine folded into GEMM2 (fold_combine) at decode sizes: one wait
  // and one task hand-over fewer on the layer's critical path.
  static const bool fold_env = !mk::env_is("MK_MOE_FUSED_FOLD", '0');
  p->fold = fold_env && !sep && me < 0 && p->plan_g == 0 && tc.bm == kFoldBM && tmax <= kCombNarrowT;
  int64_t dsum = 0, csum = 0, tiles_all = 0;
  for (int r = 0; r < ranks; ++r) {
    const uint64_t* pr = ptrs + (int64_t)r * MK_MOE_FUSED_NPTR;
    RankLayout L;
    rc = rank_layout(ranks, tokens, slots, r, k, e, h, i, tc.bm, sep, max_rows, &L);
    if (rc != MK_OK) return rc;
    MK_ARG(rank_bytes[r] >= L.total, "%s: rank %d workspace of %llu bytes, %llu needed%s", fn, r,
           (unsigned long long)rank_bytes[r], (unsigned long long)L.total,
           sep ? " (sized with with_separate?)" : "");
    RankP& q = p->rk[r];
    q.T = tokens[r];
    q.S = slots[r];
    q.rows_cap = L.rows_cap;
    q.tiles_cap = (int32_t)L.tiles_cap;
    MK_ARG(pr[MK_MOE_FUSED_WS] != 0, "%s: rank %d: null workspace", fn, r);
    const bool mine = me < 0 || r == me;  // rank-local: a peer's entry needs only its (mapped) workspace
    if (q.T > 0 && mine) {
      MK_ARG(pr[MK_MOE_FUSED_X] && pr[MK_MOE_FUSED_IDS] && pr[MK_MOE_FUSED_WEIGHTS] && pr[MK_MOE_FUSED_OUT],
             "%s: rank %d: null x, ids, weights or out", fn, r);
      MK_ARG((pr[MK_MOE_FUSED_X] | pr[MK_MOE_FUSED_OUT] | pr[MK_MOE_FUSED_SHARED]) % 16 == 0,
             "%s: rank %d: x, out and shared must be 16-byte aligned", fn, r);
    }
    if (q.S > 0 && mine)
      MK_ARG(pr[MK_MOE_FUSED_GATE_UP] && pr[MK_MOE_FUSED_DOWN] && (pr[MK_MOE_FUSED_GATE_UP] | pr[MK_MOE_FUSED_DOWN]) % 16 == 0,
             "%s: rank %d: null or unaligned expert weights", fn, r);
    MK_ARG(pr[MK_MOE_FUSED_WS] % 256 == 0, "%s: rank %d: workspace not 256-byte aligned", fn, r);
    q.x = mk::dev<const bf16>(pr[MK_MOE_FUSED_X]);
    q.ids = mk::dev<const int32_t>(pr[MK_MOE_FUSED_IDS]);
    q.w = mk::dev<const float>(pr[MK_MOE_FUSED_WEIGHTS]);
    q.out = mk::dev<float>(pr[MK_MOE_FUSED_OUT]);
    q.shared = mk::dev<const float>(pr[MK_MOE_FUSED_SHARED]);
    q.gu = mk::dev<const bf16>(pr[MK_MOE_FUSED_GATE_UP]);
    q.dn = mk::dev<const bf16>(pr[MK_MOE_FUSED_DOWN]);
    q.counts = mk::dev<unsigned long long>(pr[MK_MOE_FUSED_COUNTS]);
    char* w = mk::dev<char>(pr[MK_MOE_FUSED_WS]);
    q.num_tiles = reinterpret_cast<int32_t*>(w + L.num_tiles);
    q.tile_slot = reinterpret_cast<int32_t*>(w + L.tile_slot);
    q.tile_want = reinterpret_cast<int32_t*>(w + L.tile_want);
    q.arrive = reinterpret_cast<int32_t*>(w + L.arrive);
    q.g1done = reinterpret_cast<int32_t*>(w + L.g1done);
    q.row_src = reinterpret_cast<int32_t*>(w + L.row_src);
    q.row_slot = reinterpret_cast<int32_t*>(w + L.row_slot);
    q.row_w = reinterpret_cast<float*>(w + L.row_w);
    q.recv = reinterpret_cast<bf16*>(w + L.recv);
    q.act = reinterpret_cast<bf16*>(w + L.act);
    q.dest_row = reinterpret_cast<int32_t*>(w + L.dest_row);
    q.tokdone = reinterpret_cast<int32_t*>(w + L.tokdone);
    q.ret = w + L.ret;
    q.rflag = reinterpret_cast<int32_t*>(w + L.flags);
    q.pflag = q.rflag + kMaxRanks;
    q.rids = reinterpret_cast<int32_t*>(w + L.rids);
    q.phist = reinterpret_cast<int32_t*>(w + L.phist);
    q.part = reinterpret_cast<float*>(w + L.part);
    q.kdone = reinterpret_cast<int32_t*>(w + L.kdone);
    q.y = sep ? reinterpret_cast<float*>(w + L.y) : nullptr;
    q.moews = sep ? reinterpret_cast<void*>(w + L.moews) : nullptr;
    q.moews_bytes = L.moews_bytes;
    // One rank has no remote rows: the fused path has nothing to dispatch.
    if ((sep || ranks > 1 || p->copy_local) && mine) dsum += (q.T + p->dt - 1) / p->dt;
    if (mine && !p->fold) csum += (q.T + kCT - 1) / kCT * p->comb_nc;
    tiles_all += L.tiles_cap;
    p->disp_pre[r + 1] = (int)dsum;
    p->comb_pre[r + 1] = (int)csum;
  }
  MK_ARG(tiles_all * ((int64_t)p->n1t * p->ks1 + (int64_t)p->n2t * p->ks2) + csum < (1ll << 30), "%s: too many tasks",
         fn);
  return MK_OK;
}

int plan(const Params& p, cudaStream_t st) {
  int smax = 0;
  for (int r = 0; r < p.R; ++r) smax = p.rk[r].S > smax ? p.rk[r].S : smax;
  const size_t sm = (size_t)(5 * smax + 1) * 4;
  if (p.plan_g > 0) {  // emulated ranks, many assignments: two launches of G × R CTAs
    static size_t cattr = 48 << 10, pattr = 48 << 10;
    const size_t csm = (size_t)2 * smax * 4;
    if (csm > cattr) {
      MK_CUDA(cudaFuncSetAttribute(plan_count_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)csm));
      cattr = csm;
    }
    if (sm > pattr) {
      MK_CUDA(cudaFuncSetAttribute(plan_place_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
      pattr = sm;
    }
    const dim3 grid((unsigned)p.plan_g, (unsigned)p.R);
    MK_CUDA(mk::launch(plan_count_kernel, grid, dim3(1024), csm, st, p));
    MK_CUDA(mk::launch(plan_place_kernel, grid, dim3(1024), sm, st, p));
    return MK_OK;
  }
  static size_t attr = 48 << 10;
  if (sm > attr) {
    MK_CUDA(cudaFuncSetAttribute(plan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
    attr = sm;
  }
  MK_CUDA(mk::launch(plan_kernel, dim3(p.me >= 0 ? 1 : p.R), dim3(1024), sm, st, p));
  return MK_OK;
}

// route routes a fused call's tokens when it has a router (rt non-null):
// mk_moe_route on st for every rank the call serves (all, or me in
// rank-local mode) with tokens, before the plan. (Routing inside the
// one-CTA plan instead, at 1024 and at 256 threads, measured ×1.01–1.05
// slower at 1–8 tokens: fifty-fourth pass, branch routeplan.)
int route(Params* p, const uint64_t* ptrs, const mk_moe_fused_router* rt, cudaStream_t st) {
  if (rt == nullptr) return MK_OK;
  for (int r = 0; r < p->R; ++r) {
    const RankP& q = p->rk[r];
    if (q.T == 0 || (p->me >= 0 && r != p->me)) continue;
    const uint64_t* pr = ptrs + (int64_t)r * MK_MOE_FUSED_NPTR;
    const int rc = mk_moe_route(reinterpret_cast<uint64_t>(st), pr[MK_MOE_FUSED_IDS], pr[MK_MOE_FUSED_WEIGHTS],
                                rt->logits[r], rt->score_bias, q.T, p->E, p->K, rt->flags, rt->num_groups,
                                rt->topk_groups, rt->scaling_bits);
    if (rc != MK_OK) return rc;
  }
  return MK_OK;
}

// maps_for fills the wgmma tiles' TMA maps of every rank this launch
// computes for (rank-local: me only).
int maps_for(const Params& p, FusedMaps* m) {
  std::memset(m, 0, sizeof *m);
  for (int d = 0; d < p.R; ++d) {
    const RankP& q = p.rk[d];
    if (q.S == 0 || q.rows_cap == 0 || (p.me >= 0 && d != p.me)) continue;
    if (!mkwg::tma_map_bf16(m->gu[d], q.gu, (int64_t)q.S * 2 * p.I, p.H, 128) ||
        !mkwg::tma_map_bf16(m->dn[d], q.dn, (int64_t)q.S * p.H, p.I, 128) ||
        !mkwg::tma_map_bf16(m->act[d], q.act, q.rows_cap, p.I, 128) ||
        (p.copy_local && !mkwg::tma_map_bf16(m->recv[d], q.recv, q.rows_cap, p.H, 128)))
      return mk::fail(MK_ERR_CUDA, "mk_moe_fused: rank %d: the driver cannot encode the TMA maps of the wgmma tiles", d);
  }
  return MK_OK;
}

// fused_pdl: MK_MOE_FUSED_PDL=0 launches the persistent kernel only once
// the plan has ended (for comparisons).
bool fused_pdl() {
  static const bool on = !mk::env_is("MK_MOE_FUSED_PDL", '0');
  return on;
}

// launch_fused launches tile policy C's persistent kernel cooperatively;
// extra... are its arguments after Params (the wgmma tiles' TMA maps).
template <class C, class... Extra>
int launch_fused(const Params& p, int ctas, int dispatch_ctas, cudaStream_t st, Extra... extra) {
  auto fn = KernelOf<C>::fn;
  const size_t sm = C::kSmem;
  const int cores = fused_cores<C>();
  if (cores <= 0) {
    MK_CUDA(cudaGetLastError());
    return mk::fail(MK_ERR_CUDA, "mk_moe_fused: no CTA of the kernel fits on a multiprocessor");
  }
  MK_ARG(ctas >= 0 && ctas <= cores, "mk_moe_fused: ctas=%d, at most %d co-resident with %d-row tiles (0: all)", ctas,
         cores, C::BM);
  const int grid = ctas > 0 ? ctas : cores;
  MK_ARG(dispatch_ctas >= 0 && dispatch_ctas <= grid, "mk_moe_fused: dispatch_ctas=%d must be in [0, %d]",
         dispatch_ctas, grid);
  Params q = p;
  q.ndisp_ctas = dispatch_ctas > 0 ? dispatch_ctas : grid;
  void* args[] = {&q, &extra...};
  // Cooperative, and programmatic after the plan (as mk::launch) unless
  // MK_MOE_FUSED_PDL=0: the CTAs are placed on the multiprocessors while
  // the plan runs and wait for it in pdl_wait, instead of the launch
  // starting only once the plan has ended.
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)grid);
  cfg.blockDim = dim3(C::kThreads);
  cfg.dynamicSmemBytes = sm;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = (st != nullptr && mk::pdl_on() && fused_pdl()) ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  MK_CUDA(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(fn), args));
  return MK_OK;
}

// launch_tiles runs the persistent launch with p.BM's tiles.
int launch_tiles(const Params& p, int ctas, int dispatch_ctas, cudaStream_t st) {
  int64_t tmax = 0;
  for (int r = 0; r < p.R; ++r) tmax = p.rk[r].T > tmax ? p.rk[r].T : tmax;
  if (p.BM == 16) {
    const bool pair = mkmoe::dec_pair();
    if (small_stages(p.H, tmax) == 8)
      return pair ? launch_fused<MmaSmall8P>(p, ctas, dispatch_ctas, st)
                  : launch_fused<MmaSmall8>(p, ctas, dispatch_ctas, st);
    return pair ? launch_fused<MmaSmallP>(p, ctas, dispatch_ctas, st)
                : launch_fused<MmaSmall>(p, ctas, dispatch_ctas, st);
  }
  if (p.BM == 64) return launch_fused<MmaLarge>(p, ctas, dispatch_ctas, st);
  FusedMaps m;
  const int rc = maps_for(p, &m);
  if (rc != MK_OK) return rc;
  return launch_fused<WgTiles>(p, ctas, dispatch_ctas, st, m);
}

}  // namespace

extern "C" {

int32_t mk_moe_fused_workspace(int32_t ranks, const int64_t* tokens, const int32_t* slots, int32_t k, int32_t e,
                               int64_t h, int64_t i, int32_t with_separate, uint64_t* ctl_bytes, uint64_t* rank_bytes,
                               int32_t* tile_m, int32_t tile, int64_t max_rows) {
  int rc = check_shapes("mk_moe_fused_workspace", ranks, tokens, slots, k, e, h, i, tile, max_rows);
  if (rc != MK_OK) return rc;
  MK_ARG(ctl_bytes && rank_bytes && tile_m, "mk_moe_fused_workspace: null result pointer");
  const int cfg = pick_tile(ranks, tokens, slots, k, tile);
  for (int r = 0; r < ranks; ++r) {
    RankLayout L;
    rc = rank_layout(ranks, tokens, slots, r, k, e, h, i, kTiles[cfg].bm, with_separate != 0, max_rows, &L);
    if (rc != MK_OK) return rc;
    rank_bytes[r] = L.total;
  }
  *ctl_bytes = kCtlBytes;
  *tile_m = kTiles[cfg].bm;
  return MK_OK;
}

int32_t mk_moe_fused(uint64_t stream, int32_t ranks, const uint64_t* ptrs, const int64_t* tokens,
                     const int32_t* slots, int32_t k, int32_t e, int64_t h, int64_t i, uint64_t place,
                     int32_t act_kind, uint32_t alpha_bits, uint32_t limit_bits, uint64_t ctl, uint64_t ctl_bytes,
                     const uint64_t* rank_bytes, int32_t ctas, int32_t dispatch_ctas, int64_t timeout_ns,
                     int32_t fault_rank, int32_t tile, int64_t max_rows, const mk_moe_fused_router* router) {
  MK_THREAD("mk_moe_fused");
  Params p;
  int rc = build("mk_moe_fused", &p, ranks, ptrs, tokens, slots, k, e, h, i, place, act_kind, alpha_bits, limit_bits,
                 ctl, ctl_bytes, rank_bytes, false, tile, max_rows);
  if (rc != MK_OK) return rc;
  MK_ARG(timeout_ns > 0, "mk_moe_fused: timeout_ns=%lld must be > 0", (long long)timeout_ns);
  MK_ARG(fault_rank >= -1 && fault_rank <= ranks, "mk_moe_fused: fault_rank=%d must be -1, a rank or ranks",
         fault_rank);
  p.timeout_ns = timeout_ns;
  p.fault_rank = fault_rank < ranks ? fault_rank : -1;
  p.fault_stage = fault_rank == ranks;
  cudaStream_t st = mk::as_stream(stream);
  rc = route(&p, ptrs, router, st);
  if (rc != MK_OK) return rc;
  rc = plan(p, st);  // also zeroes the queue counters
  if (rc != MK_OK) return rc;
  return launch_tiles(p, ctas, dispatch_ctas, st);
}

int32_t mk_moe_fused_rank(uint64_t stream, int32_t ranks, int32_t me, const uint64_t* ptrs, const int64_t* tokens,
                          const int32_t* slots, int32_t k, int32_t e, int64_t h, int64_t i, uint64_t place,
                          int32_t act_kind, uint32_t alpha_bits, uint32_t limit_bits, uint64_t ctl, uint64_t ctl_bytes,
                          const uint64_t* rank_bytes, int32_t ctas, int32_t dispatch_ctas, int64_t timeout_ns,
                          int32_t epoch, int32_t tile, int64_t max_rows, const mk_moe_fused_router* router) {
  MK_THREAD("mk_moe_fused_rank");
  MK_ARG(ranks >= 1 && ranks <= kMaxRanks && me >= 0 && me < ranks, "mk_moe_fused_rank: me=%d of %d ranks", me,
         ranks);
  MK_ARG(epoch >= 1, "mk_moe_fused_rank: epoch=%d must be >= 1", epoch);
  Params p;
  int rc = build("mk_moe_fused_rank", &p, ranks, ptrs, tokens, slots, k, e, h, i, place, act_kind, alpha_bits,
                 limit_bits, ctl, ctl_bytes, rank_bytes, false, tile, max_rows, me, epoch);
  if (rc != MK_OK) return rc;
  MK_ARG(timeout_ns > 0, "mk_moe_fused_rank: timeout_ns=%lld must be > 0", (long long)timeout_ns);
  p.timeout_ns = timeout_ns;
  cudaStream_t st = mk::as_stream(stream);
  rc = route(&p, ptrs, router, st);
  if (rc != MK_OK) return rc;
  rc = plan(p, st);
  if (rc != MK_OK) return rc;
  return launch_tiles(p, ctas, dispatch_ctas, st);
}

int32_t mk_moe_fused_separate(uint64_t stream, int32_t ranks, const uint64_t* ptrs, const int64_t* tokens,
                              const int32_t* slots, int32_t k, int32_t e, int64_t h, int64_t i, uint64_t place,
                              int32_t act_kind, uint32_t alpha_bits, uint32_t limit_bits, uint64_t ctl,
                              uint64_t ctl_bytes, const uint64_t* rank_bytes, int32_t tile, int64_t max_rows,
                              const mk_moe_fused_router* router) {
  MK_THREAD("mk_moe_fused_separate");
  Params p;
  int rc = build("mk_moe_fused_separate", &p, ranks, ptrs, tokens, slots, k, e, h, i, place, act_kind, alpha_bits,
                 limit_bits, ctl, ctl_bytes, rank_bytes, true, tile, max_rows);
  if (rc != MK_OK) return rc;
  cudaStream_t st = mk::as_stream(stream);
  rc = route(&p, ptrs, router, st);
  if (rc != MK_OK) return rc;
  rc = plan(p, st);
  if (rc != MK_OK) return rc;
  if (p.disp_pre[ranks] > 0) {
    dispatch_kernel<<<p.disp_pre[ranks], kThreads, 0, st>>>(p);
    MK_LAUNCHED("moe_fused dispatch (separate)");
  }
  for (int d = 0; d < ranks; ++d) {
    const RankP& q = p.rk[d];
    if (q.S == 0 || q.rows_cap == 0) continue;
    rc = mk_moe_experts(stream, reinterpret_cast<uint64_t>(q.y), reinterpret_cast<uint64_t>(q.recv),
                        reinterpret_cast<uint64_t>(q.row_slot), reinterpret_cast<uint64_t>(q.row_w), q.rows_cap, 1,
                        q.S, h, i, reinterpret_cast<uint64_t>(q.gu), 0, reinterpret_cast<uint64_t>(q.dn), 0, act_kind,
                        alpha_bits, limit_bits, 0, reinterpret_cast<uint64_t>(q.moews), q.moews_bytes);
    if (rc != MK_OK) return rc;
  }
  if (p.comb_pre[ranks] > 0) {
    combine_kernel<<<p.comb_pre[ranks], kThreads, 0, st>>>(p);
    MK_LAUNCHED("moe_fused combine (separate)");
  }
  return MK_OK;
}

int32_t mk_moe_fused_check(uint64_t ctl, int32_t* rec) {
  MK_THREAD("mk_moe_fused_check");
  MK_ARG(ctl != 0 && rec != nullptr, "mk_moe_fused_check: ctl and rec must be non-null");
  MK_CUDA(cudaMemcpy(rec, reinterpret_cast<void*>(ctl), MK_MOE_FUSED_ERR_WORDS * sizeof(int32_t),
                     cudaMemcpyDeviceToHost));
  if (rec[MK_MOE_FUSED_ERR_SET] != 0)
    MK_CUDA(cudaMemset(reinterpret_cast<void*>(ctl), 0, MK_MOE_FUSED_ERR_WORDS * sizeof(int32_t)));
  return MK_OK;
}

}  // extern "C"
