// ring.cu — ring attention over emulated context-parallel ranks in one
// persistent cooperative kernel (mk_ring_attn_bf16), and the same ring from
// separate launches as a baseline (mk_ring_separate_bf16); see mk_ring.h.
//
// Work. A query "slot" is one tile of BM = 64*MT rows of one rank: hpb query
// heads of one kv head × rph positions of one of the rank's two query spans
// (the tiling of flash.cu). Step s of rank r attends every slot of r to the
// KV chunk of rank (r − s) mod R. Compute CTAs take (step, slot) items from a
// per-step queue (one atomic counter per step, heaviest tiles first), so the
// steps advance in order across the grid; a slot's online-softmax state (the
// unnormalised O, the running max m and sum l, per thread in its MMA
// fragment layout) lives in registers during a step and in the workspace
// between steps; the last step normalises, applies sinks and writes out and
// the log-sum-exp. Per item the inner loop is flash.cu's: cp.async 2-stage
// K/V tiles, mma.sync m16n8k16 bf16, exp2 online softmax with a lazily
// raised max; masks use global positions, so the zigzag split and chunks of
// two spans need nothing special. The tile step is attn_tile.cuh's
// attend_tile (flash.cu's too), run over one contiguous key span at a time
// with the CTA-uniform values in shared memory (SpanSh).
//
// At head dims 128/128 the gather mode, one rank alone and the separate
// baseline's steps run on ring_wg instead (flash_wg's CTA: wgmma, 128-row
// tiles of one head; see its comment); MK_RING_WG=0 keeps them here.
//
// Gather mode (mode 2, mk_ring_attn_gather_bf16): every rank has a receive
// slot per step (kb[0] / vb[0] hold gcap rows per step 1..R-1), so no
// buffer is rewritten during the call: compute CTAs take whole slots from
// one queue and run all R steps with the state in registers (run_slot),
// waiting only for each chunk's arrival; the comm CTAs forward as below
// without buffer-release waits; no consumed or done flags.
//
// Communication. ncomm CTAs per rank forward the chunk in hand at step s
// (the own shard at s = 0, else receive buffer s%2) into rank r+1's receive
// buffer (s+1)%2 for step s+1. Flags in the workspace, zeroed per launch:
//   arrived[r][s]  += 1 by each comm CTA that finished writing rank r's chunk
//                  for step s (full at ncomm);
//   consumed[r][s] += 1 by each compute item of rank r that finished step s,
//                  and by each comm CTA of r that finished forwarding it
//                  (full at items_r + ncomm): buffer s%2 of r may then be
//                  rewritten (by rank r−1's comm CTAs, for step s+2);
//   done[slot]     = s+1 (st.release) once a slot's step s stored its state:
//                  chunks run up to one step ahead of the slowest item, so
//                  the CTA that takes the slot's step s+1 may start while
//                  another CTA still runs its step s, and waits for this.
// Protocol: a writer's threads store, bar.sync, then one thread does
// fence.acq_rel.gpu (__threadfence) and red.release.gpu.add on the flag; a
// reader's one thread spins with ld.acquire.gpu on the flag, then bar.sync,
// then its threads read the data through L2 only (cp.async.cg / ld.cg), so
// no stale L1 line is read. Release→acquire on the flag plus the CTA
// barriers on both sides order the data writes before the reads (PTX memory
// model: causality order is transitive through bar.sync). Every CTA
// processes steps in increasing order and takes step s+1 items only once
// step s's queue is empty (so every step-s item has been taken by a running
// CTA), and all CTAs are co-resident (cooperative launch): a wait at step s
// is only ever on work of steps < s, so the waits form a DAG and end.
//
// Watchdog. Every spin is bounded by timeout_ns on %globaltimer; on timeout
// the CTA writes the error record (rank, role, step, tile, flag seen/wanted)
// once (atomicCAS on word 0) and exits; other CTAs' waits see the record and
// exit too. The host reads it with mk_ring_check.
//
// Ranks are emulated: every rank's buffers are separate device pointers
// passed per rank (a peer's pointer from CUDA IPC would do the same).
//
// Rank-local mode (mk_ring_attn_rank, Params.me >= 0): the same kernel
// serves ONE rank per launch, its peers being other launches (other
// processes through CUDA IPC mappings, on other GPUs or on this one, or
// other streams). The launch holds only rank me's ncomm comm CTAs and its
// compute items (the per-step queues count me's slots only); the queue,
// consumed counters, slot flags and state stay in me's own workspace and
// are zeroed per launch on me's stream, as in the emulated mode. What a
// peer writes lives in the memory of the rank that waits (the "remote
// flags" at kRemoteOff of each workspace, never zeroed between calls):
//   arr[s][part] = epoch  written by rank me−1's comm CTA `part` once its
//                  part of me's chunk for step s is in me's receive buffer
//                  s%2 (fence.sc.sys, then st.release.sys);
//   rel[b] = epoch*8 + s written by rank me+1 into me's workspace when the
//                  last reader of its buffer b = s%2 holding step s's chunk
//                  (its compute items of step s and its comm CTAs
//                  forwarding it: an acq_rel atomic on its local consumed
//                  counter names the last one) is done (fence.sc.sys, then
//                  st.release.sys): me's comm CTAs may overwrite it.
// Waits on them use ld.acquire.sys. Flags hold epochs (>= 1, +1 per call
// on one set of workspaces), so consecutive calls synchronise themselves:
// before writing a peer's buffer b, a comm CTA waits for the release of
// that buffer's previous use, step s−1 of this epoch or, for the first two
// steps, the last step that used b in the previous epoch (rel is monotone
// per buffer since every use waits for the one before). For that the comm
// CTAs also wait for the last step's chunk and count as its readers. No
// rank resets anything a peer writes, so no rank waits for a peer to reset.
#include <cmath>
#include <cstring>
#include <utility>

#include "attn_tile.cuh"
#include "flash_wg.cuh"

#include "sysflag.cuh"

namespace {

using namespace mk;  // the flag helpers of sysflag.cuh

constexpr int kMaxRanks = MK_RING_MAX_RANKS;
constexpr float kLn2 = 0.6931471805599453f;

// Workspace layout (bytes): [0, 64) error record; [64, 4096) control words;
// [4096, ...) the ring's per-slot step flags (int32 [slots], rounded up to
// 256 bytes) then the ring state, or the separate ring's accumulators and
// partials. Everything from kCtlOff to the end of the flags is zeroed per
// launch.
constexpr int64_t kCtlOff = 64;
constexpr int64_t kStateOff = 4096;
constexpr int kQueue = 0;                                  // [kMaxRanks] per step
constexpr int kArrived = kQueue + kMaxRanks;               // [rank][step]
constexpr int kConsumed = kArrived + kMaxRanks * kMaxRanks;  // [rank][step]
constexpr int kExit = kConsumed + kMaxRanks * kMaxRanks;    // rank-local gather: CTAs of the launch that finished
constexpr int kMaxComm = 16;   // comm CTAs a rank at most (MK_RING_NCOMM, a measurement)
constexpr int kGatherComm = 8;  // the emulated gather ring's by default, at most
constexpr int kLocalComm = 4;  // the rank-local gather ring's
constexpr int kCtlWords = kExit + 1;
// Rank-local mode: the remote flags (int32, written by the peers, never
// zeroed by a launch): arr [kMaxRanks steps][kMaxComm parts], then rel [2].
constexpr int64_t kRemoteOff = 2048;
constexpr int kRemArr = 0;
constexpr int kRemRel = kMaxRanks * kMaxComm;
constexpr int kRemDone = kRemRel + 2;  // rank-local gather: epoch whose launch rank me+1 finished (written by it)
constexpr int kRemWords = kRemDone + 1;
static_assert(kCtlOff + kCtlWords * 4 <= kRemoteOff && kRemoteOff + kRemWords * 4 <= kStateOff,
              "workspace control layout");

struct RankPtrs {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  bf16* kb[2];
  bf16* vb[2];
  void* out;
  float* lse;
  float* state;  // ring: this rank's slots' state; separate: unused
};

struct Params {
  RankPtrs rk[kMaxRanks];
  int qs[kMaxRanks][4];  // query spans lo0, hi0, lo1, hi1
  int ks[kMaxRanks][4];  // kv spans
  int tc[kMaxRanks][2];  // query tiles per span
  int items[kMaxRanks];  // real slots per rank
  const float* sinks;
  int* ctl;
  int* done;  // [slots]: the number of steps finished per slot (mode 0)
  int* err;
  int64_t q_stride, k_stride, v_stride, o_stride;
  long long timeout_ns;
  int ranks, heads, group, hd, vhd, window, causal, out_f32, vec;
  int hpb, rph_log2, hg, tmax;
  int mode;         // 0: the ring; 1: one step (separate baseline); 2: the ring into gather buffers
                    // (kb[0]/vb[0] hold gcap rows per step 1..R-1; no buffer is rewritten)
  int gcap;         // mode 2: rows per gather slot (the largest chunk)
  int step;         // mode 1: the step
  int ncomm;        // mode 0: comm CTAs per rank (0 when ranks == 1)
  int fault_rank;   // rank whose comm CTAs do nothing, or -1
  int apply_sinks;  // finalisation applies sinks (mode 0; mode 1 never)
  float scale_log2;
  // Rank-local mode: me >= 0 is the one rank this launch serves; -1: every rank (emulated).
  int me;
  int epoch;        // rank-local: this call's number (>= 1, +1 per call)
  int* rem_in;      // me's remote flags (its own workspace)
  int* rem_next;    // rank me+1's remote flags (mapped): arr written here
  int* rem_prev;    // rank me−1's remote flags (mapped): rel written here
  // ring_wg (modes 1 and 2 at head dims 128/128): 128-row query tiles per
  // rank and span.
  int wtc[kMaxRanks][2];
  // ring_wg's queue order (wg_layout): entry e < wno is span wo[e] & 1 of
  // rank wo[e] >> 1, whose tiles are the queue's tile numbers [wcum[e],
  // wcum[e + 1]) (heads slots each, the span's heaviest tile first).
  int wo[2 * kMaxRanks];
  int wcum[2 * kMaxRanks + 1];
  int wno;
  int cs;          // MK_RING_CS=1: the comm CTAs' copies stream (evict first: copy_part)
  int noprefetch;  // MK_RING_PREFETCH=0: a ring_wg CTA takes its next slot only after B
  int tma;  // ring_wg: whole key tiles by TMA through RingMaps, else cp.async
  int nocopy;  // MK_RING_NOCOPY=1 (a measurement, wrong results): the comm CTAs signal without copying
  int noready;  // MK_RING_READY=0: ring_wg waits for every step's chunk in every slot (else ready_steps)
  int bulk;     // ring_wg's comm CTAs copy by TMA bulk copies (copy_bulk): emulated by default, MK_RING_BULK=0/1
};
static_assert(sizeof(Params) <= 4096, "Params is a kernel parameter (4 KB)");

// RingMaps: ring_wg's TMA maps of each rank's keys and values (a second
// kernel parameter, as CUDA 12.1+ allows 32 KB of them; zeros where a rank
// is not computed by the launch): buffer 0 the rank's own shard, 1 its
// kb[0] / vb[0] (the gather slots in mode 2), 2 kb[1] / vb[1]; rows of
// k_stride / v_stride elements read in boxes of 16 rows × 64 columns.
struct RingMaps {
  mkwg::TmaMap k[kMaxRanks][3];
  mkwg::TmaMap v[kMaxRanks][3];
};
static_assert(sizeof(Params) + sizeof(RingMaps) <= 32764, "ring_wg's parameters (32 KB)");

// ---- flag access (the tile code is in attn_tile.cuh; the PTX in sysflag.cuh) ----

// wait_geq spins (one thread) until *flag >= want, the error record is set,
// or timeout_ns passes (then it writes the record). True when the flag came.
__device__ bool wait_geq(const Params& p, const int* flag, int want, int rank, int role, int step, int tile,
                         int what) {
  return poll_geq<128>(flag, want, p.me >= 0, p.err, p.timeout_ns, [&](int v) {
    if (atomicCAS(p.err, 0, 1) == 0) {
      p.err[MK_RING_ERR_RANK] = rank;
      p.err[MK_RING_ERR_ROLE] = role;
      p.err[MK_RING_ERR_STEP] = step;
      p.err[MK_RING_ERR_TILE] = tile;
      p.err[MK_RING_ERR_WHAT] = what;
      p.err[MK_RING_ERR_SEEN] = v;
      p.err[MK_RING_ERR_WANT] = want;
      __threadfence();
    }
  });
}

__device__ __forceinline__ int* arrived(const Params& p, int r, int s) { return p.ctl + kArrived + r * kMaxRanks + s; }
__device__ __forceinline__ int* consumed(const Params& p, int r, int s) {
  return p.ctl + kConsumed + r * kMaxRanks + s;
}

// wait_arrival (one thread) waits until rank r's chunk for step s is whole
// in its receive buffer s%2: emulated, the arrived counter is full; rank-
// local, every comm part of rank r−1 stamped this epoch into r's arr flags.
__device__ bool wait_arrival(const Params& p, int r, int s, int role, int tile) {
  if (p.me < 0) return wait_geq(p, arrived(p, r, s), p.ncomm, r, role, s, tile, 0);
  for (int part = 0; part < p.ncomm; ++part)
    if (!wait_geq(p, p.rem_in + kRemArr + s * kMaxComm + part, p.epoch, r, role, s, tile, 0)) return false;
  return true;
}

// signal_arrival (one thread, after its CTA's stores of part `part` of the
// chunk for step s of rank dst and a barrier) publishes them.
__device__ void signal_arrival(const Params& p, int dst, int s, int part) {
  if (p.me < 0) {
    __threadfence();
    red_release_add(arrived(p, dst, s), 1);
  } else {
    __threadfence_system();
    st_release_sys(p.rem_next + kRemArr + s * kMaxComm + part, p.epoch);
  }
}

// signal_consumed (one thread, after its CTA's reads of rank r's chunk of
// step s and a barrier): emulated, +1 on consumed[r][s]; rank-local, +1 on
// the local counter, and its last reader (items_r + ncomm of them) stamps
// rel[s%2] = epoch*8 + s into rank r−1's workspace (step 0 reads r's own
// shard: nothing to release).
__device__ void signal_consumed(const Params& p, int r, int s) {
  if (p.me < 0) {
    red_release_add(consumed(p, r, s), 1);
    return;
  }
  if (s == 0) return;
  if (atom_acq_rel_add(consumed(p, r, s), 1) == p.items[r] + p.ncomm - 1) {
    __threadfence_system();
    st_release_sys(p.rem_prev + kRemRel + (s & 1), p.epoch * kMaxRanks + s);
  }
}

// wait_buffer_free (one thread): rank r's comm part may write rank r+1's
// receive buffer (s+1)%2 for step s+1 once that buffer's previous use was
// released: step s−1 (s >= 2); rank-local, for s < 2, the last step that
// used it in the previous epoch.
__device__ bool wait_buffer_free(const Params& p, int r, int s, int part) {
  const int R = p.ranks, dst = (r + 1) % R;
  if (p.me < 0) {
    if (s < 2) return true;
    return wait_geq(p, consumed(p, dst, s - 1), p.items[dst] + p.ncomm, r, 1, s, part, 1);
  }
  const int b = (s + 1) & 1;
  int want = 0;
  if (s >= 2) {
    want = p.epoch * kMaxRanks + (s - 1);
  } else if (p.epoch >= 2) {
    const int t = (R - 1) % 2 == b ? R - 1 : R - 2;  // the last step whose chunk sat in buffer b
    if (t >= 1) want = (p.epoch - 1) * kMaxRanks + t;
  }
  if (want == 0) return true;
  return wait_geq(p, p.rem_in + kRemRel + b, want, r, 1, s, part, 1);
}

constexpr int kCopyDepth = 8;

// copy_run copies the 16-byte words i, i + nt, … below hi in rounds of
// kCopyDepth (a thread's loads of a round in flight together) and returns
// the first word it left for the caller's tail; CS: streaming (evict-first)
// loads and stores, else L2-only ones.
template <bool CS>
__device__ __forceinline__ int64_t copy_run(uint4* d, const uint4* s, int64_t i, int64_t hi, int nt) {
  for (; i + (kCopyDepth - 1) * nt < hi; i += kCopyDepth * nt) {
    uint4 x[kCopyDepth];
#pragma unroll
    for (int u = 0; u < kCopyDepth; ++u) x[u] = CS ? __ldcs(s + i + u * nt) : __ldcg(s + i + u * nt);
#pragma unroll
    for (int u = 0; u < kCopyDepth; ++u) {
      if (CS)
        __stcs(d + i + u * nt, x[u]);
      else
        __stcg(d + i + u * nt, x[u]);
    }
  }
  return i;
}

// copy_part copies part `part` of `parts` of n bytes from src to dst through
// L2 (16-byte accesses when both are 16-byte aligned, else 2-byte ones).
__device__ void copy_part(char* dst, const char* src, int64_t n, int part, int parts, bool cs = false) {
  const int nt = blockDim.x;  // 128 (ring_kernel) or 384 (ring_wg)
  const bool v16 = ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0;
  if (v16) {
    const int64_t n16 = n / 16;
    const int64_t per = (n16 + parts - 1) / parts;
    const int64_t lo = per * part, hi = min(n16, lo + per);
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    int64_t i = lo + threadIdx.x;
    // kCopyDepth 16-byte loads in flight per thread: a comm CTA's copy is
    // bound by the bytes it keeps in flight (latency × rate). cs: loads and
    // stores marked streaming (evict first), so the hops' 8R MB do not
    // push the compute CTAs' key tiles out of L2 (MK_RING_CS=1).
    i = cs ? copy_run<true>(d, s, i, hi, nt) : copy_run<false>(d, s, i, hi, nt);
    for (; i < hi; i += nt) __stcg(d + i, __ldcg(s + i));
    if (part == parts - 1)
      for (int64_t b = n16 * 16 + threadIdx.x; b < n; b += nt) dst[b] = __ldcg(src + b);
  } else {
    const int64_t n2 = n / 2;
    const int64_t per = (n2 + parts - 1) / parts;
    const int64_t lo = per * part, hi = min(n2, lo + per);
    const unsigned short* s = reinterpret_cast<const unsigned short*>(src);
    unsigned short* d = reinterpret_cast<unsigned short*>(dst);
    for (int64_t i = lo + threadIdx.x; i < hi; i += nt) __stcg(d + i, __ldcg(s + i));
  }
}

// copy_bulk is copy_part by TMA's 1-D bulk copies through shared memory
// (MK_RING_BULK=1, ring_wg's comm CTAs): thread 0 streams the part's
// 16-byte-aligned bytes through kCopyBufs buffers of kCopyBuf bytes at
// stage (global → shared completing on bars[b], then shared → global as a
// bulk group), so one thread keeps up to kCopyBufs × kCopyBuf bytes in
// flight where copy_part's 384 threads keep 8 loads of 16 bytes each;
// count carries the buffers' uses across calls (their mbarrier phases).
// Its stores are complete and fenced for the generic release that
// publishes them (signal_arrival) before it returns. Unaligned data goes
// to copy_part.
constexpr int kCopyBufs = 7;  // ring_wg's whole shared memory (Q and the K / V stages) while it copies
constexpr int kCopyBuf = 32768;
__device__ void copy_bulk(char* dst, const char* src, int64_t n, int part, int parts, unsigned char* stage,
                          uint64_t* bars, uint32_t& count) {
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) != 0) {
    copy_part(dst, src, n, part, parts);
    return;
  }
  const int64_t n16 = n / 16, per = (n16 + parts - 1) / parts;
  const int64_t lo = per * part * 16, hi = min(n16, per * (part + 1)) * 16;
  if (threadIdx.x == 0 && hi > lo) {
    const int64_t pieces = (hi - lo + kCopyBuf - 1) / kCopyBuf;
    auto bytes_of = [&](int64_t i) { return (uint32_t)min((int64_t)kCopyBuf, hi - lo - i * kCopyBuf); };
    auto load = [&](int64_t i) {
      const int b = (int)((count + i) % kCopyBufs);
      mkwg::mbar_expect_tx(bars + b, bytes_of(i));
      mkwg::bulk_g2s(stage + b * kCopyBuf, src + lo + i * kCopyBuf, bytes_of(i), bars + b);
    };
    for (int64_t i = 0; i < pieces && i < kCopyBufs; ++i) load(i);
    for (int64_t i = 0; i < pieces; ++i) {
      const uint32_t c = count + (uint32_t)i;
      const int b = (int)(c % kCopyBufs);
      mkwg::mbar_wait(bars + b, (c / kCopyBufs) & 1);
      mkwg::bulk_s2g(dst + lo + i * kCopyBuf, stage + b * kCopyBuf, bytes_of(i));
      mkwg::bulk_commit();
      if (i + kCopyBufs < pieces) {
        mkwg::bulk_wait_read();  // piece i's store has read buffer b: refill it
        load(i + kCopyBufs);
      }
    }
    count += (uint32_t)pieces;
    mkwg::bulk_wait_all();
    asm volatile("fence.proxy.async.global;\n" ::: "memory");  // the async proxy's stores before the generic release
  }
  if (part == parts - 1)
    for (int64_t b = n16 * 16 + threadIdx.x; b < n; b += blockDim.x) dst[b] = __ldcg(src + b);
}

// Slot is one query tile: rank r's rows i0..iend-1 of query span [qlo, qlo+L)
// (buffer rows from qrow0), query heads h0..h0+hpb-1 of kv head kvh.
struct Slot {
  int r, tile;  // tile: the slot's index within rank r (t·hg + head group)
  int qlo, L, qrow0, i0, iend, h0, kvh;
};

// slot_at is slot (rank r, tile t, head group hg); t counts span 1's tiles
// from its last, then span 0's from its last (heaviest tiles first).
__device__ __forceinline__ Slot slot_at(const Params& p, int r, int t, int hg) {
  Slot q;
  q.r = r;
  q.tile = t * p.hg + hg;
  const int tc1 = p.tc[r][1], tc0 = p.tc[r][0];
  const int seg = t < tc1 ? 1 : 0, ti = t < tc1 ? tc1 - 1 - t : tc0 - 1 - (t - tc1);
  q.qlo = p.qs[r][2 * seg];
  q.L = p.qs[r][2 * seg + 1] - q.qlo;
  q.qrow0 = seg == 0 ? 0 : p.qs[r][1] - p.qs[r][0];
  q.i0 = ti << p.rph_log2;
  q.iend = min(q.i0 + (1 << p.rph_log2), q.L);
  q.h0 = hg * p.hpb;
  q.kvh = q.h0 / p.group;
  return q;
}

// key_tiles is the number of bn-key tiles of span [lo, hi) that query
// rows [qlo + i0, qlo + iend) see (causal, window), the first of them in
// *nlo.
__device__ __forceinline__ int key_tiles(const Params& p, int qlo, int i0, int iend, int lo, int hi, int bn, int* nlo) {
  *nlo = 0;
  if (hi <= lo || iend <= i0) return 0;
  const int jmax = p.causal ? min(hi - 1, qlo + iend - 1) : hi - 1;
  const int jmin = (p.causal && p.window > 0) ? max(lo, qlo + i0 - p.window + 1) : lo;
  if (jmax < jmin) return 0;
  *nlo = (jmin - lo) / bn;
  return (jmax - lo) / bn - *nlo + 1;
}

// chunk_span is half h (0 or 1) of the chunk rank r holds at step s: the
// positions [*lo, *hi) it holds from buffer row *koff.
__device__ __forceinline__ void chunk_span(const Params& p, int r, int s, int h, int* lo, int* hi, int* koff) {
  const int src = (r - s + p.ranks) % p.ranks;
  *lo = p.ks[src][2 * h];
  *hi = p.ks[src][2 * h + 1];
  *koff = h == 0 ? 0 : p.ks[src][1] - p.ks[src][0];
}

// span_at is half h (0 or 1) of step s's chunk as slot q sees it: the
// positions [*lo, *hi) it holds from buffer row *koff, the first key tile
// the slot sees in *nlo; returns how many tiles the slot sees.
__device__ __forceinline__ int span_at(const Params& p, const Slot& q, int s, int h, int* lo, int* hi, int* koff,
                                       int* nlo) {
  chunk_span(p, q.r, s, h, lo, hi, koff);
  return key_tiles(p, q.qlo, q.i0, q.iend, *lo, *hi, kBN, nlo);
}

// chunk_tiles is the number of key tiles of step s's chunk that slot q sees.
__device__ __forceinline__ int chunk_tiles(const Params& p, const Slot& q, int s) {
  int lo, hi, koff, nlo;
  return span_at(p, q, s, 0, &lo, &hi, &koff, &nlo) + span_at(p, q, s, 1, &lo, &hi, &koff, &nlo);
}

// chunk_k / chunk_v: rank r's buffer holding the chunk of step s (its own
// shard at s = 0; else receive buffer s%2, or gather slot s-1).
__host__ __device__ __forceinline__ bf16* chunk_k(const Params& p, int r, int s) {
  if (s == 0) return const_cast<bf16*>(p.rk[r].k);
  return p.mode == 2 ? p.rk[r].kb[0] + (int64_t)(s - 1) * p.gcap * p.k_stride : p.rk[r].kb[s & 1];
}
__host__ __device__ __forceinline__ bf16* chunk_v(const Params& p, int r, int s) {
  if (s == 0) return const_cast<bf16*>(p.rk[r].v);
  return p.mode == 2 ? p.rk[r].vb[0] + (int64_t)(s - 1) * p.gcap * p.v_stride : p.rk[r].vb[s & 1];
}

// hop_rows is the part [*r0, *r1) of the rows (half 0's, then half 1's) of
// the chunk rank r holds at step s that go on to rank r+1: a half goes on
// only while a rank still to receive the chunk (r+1 .. r+R−1−s) can see one
// of its keys. Under a causal mask that is a rank whose last query position
// is at least the half's first key; without one, every half goes on. The
// test is conservative (a window hides more keys, never fewer): a slot
// loads only the tiles it sees (key_tiles), a subset. With the zigzag
// split rank r holding chunks R−1−r and R+r of 2R (kernels.RingZigzag),
// chunk src's late half is seen only by ranks src .. R−1, so it stops at
// rank R−1 instead of going round: a quarter of the ring's copies
// (fifty-second pass; the separate baseline copies the same rows).
// ks, qs: Params' spans (host or device).
__host__ __device__ inline void hop_rows(const int (*qs)[4], const int (*ks)[4], int R, int causal, int r, int s,
                                         int* r0, int* r1) {
  const int src = (r - s + R) % R;
  const int n0 = ks[src][1] - ks[src][0], n1 = ks[src][3] - ks[src][2];
  bool need0 = !causal, need1 = !causal;
  for (int j = 1; causal && j <= R - 1 - s; ++j) {
    const int d = (r + j) % R;
    int qmax = -1;  // rank d's last query position
    if (qs[d][1] > qs[d][0]) qmax = qs[d][1] - 1;
    if (qs[d][3] > qs[d][2] && qs[d][3] - 1 > qmax) qmax = qs[d][3] - 1;
    need0 = need0 || (n0 > 0 && qmax >= ks[src][0]);
    need1 = need1 || (n1 > 0 && qmax >= ks[src][2]);
  }
  *r0 = need0 ? 0 : n0;
  *r1 = need1 ? n0 + n1 : n0;
}

// comm_role forwards rank r's chunks (part `part` of ncomm) around the ring:
// the chunk in hand at step s goes to rank r+1's buffer for step s+1
// (receive buffer (s+1)%2 once its previous readers released it, or gather
// slot s, which nobody else writes). False when a wait gave up.
__device__ bool comm_role(const Params& p, int r, int part, unsigned char* stage) {
  const int R = p.ranks, dst = (r + 1) % R;
  __shared__ int ok_sh;
  __shared__ uint64_t cbar[kCopyBufs];  // copy_bulk's buffers
  uint32_t count = 0;                   // thread 0's: copy_bulk's buffer uses
  const bool bulk = p.bulk && stage != nullptr;
  if (bulk && threadIdx.x == 0) {
    for (int b = 0; b < kCopyBufs; ++b) mkwg::mbar_init(cbar + b, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  for (int s = 0; s + 1 < R; ++s) {
    if (threadIdx.x == 0) {
      bool ok = true;
      // Rank-local gather: rank r+1's gather slots are rewritten each call,
      // so its launch of the previous epoch must have finished reading them
      // (its last CTA stamps kRemDone here: rank_exit).
      if (s == 0 && p.mode == 2 && p.me >= 0 && p.epoch >= 2)
        ok = wait_geq(p, p.rem_in + kRemDone, p.epoch - 1, r, 1, s, part, 1);
      if (ok && s >= 1) ok = wait_arrival(p, r, s, 1, part);
      // Buffer (s+1)%2 of dst last served step s-1 (a receive buffer from step 1 on).
      if (ok && p.mode != 2) ok = wait_buffer_free(p, r, s, part);
      ok_sh = ok;
    }
    __syncthreads();
    if (!ok_sh) return false;
    int r0, r1;  // the rows that go on (hop_rows): those a rank still to receive them can see
    hop_rows(p.qs, p.ks, R, p.causal, r, s, &r0, &r1);
    const int64_t rows = r1 - r0, ko = (int64_t)r0 * p.k_stride, vo = (int64_t)r0 * p.v_stride;
    if (!p.nocopy && bulk && rows > 0) {
      copy_bulk(reinterpret_cast<char*>(chunk_k(p, dst, s + 1) + ko), reinterpret_cast<const char*>(chunk_k(p, r, s) + ko),
                rows * p.k_stride * 2, part, p.ncomm, stage, cbar, count);
      copy_bulk(reinterpret_cast<char*>(chunk_v(p, dst, s + 1) + vo), reinterpret_cast<const char*>(chunk_v(p, r, s) + vo),
                rows * p.v_stride * 2, part, p.ncomm, stage, cbar, count);
    } else if (!p.nocopy && rows > 0) {
      copy_part(reinterpret_cast<char*>(chunk_k(p, dst, s + 1) + ko), reinterpret_cast<const char*>(chunk_k(p, r, s) + ko),
                rows * p.k_stride * 2, part, p.ncomm, p.cs);
      copy_part(reinterpret_cast<char*>(chunk_v(p, dst, s + 1) + vo), reinterpret_cast<const char*>(chunk_v(p, r, s) + vo),
                rows * p.v_stride * 2, part, p.ncomm, p.cs);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      signal_arrival(p, dst, s + 1, part);
      if (p.mode != 2) signal_consumed(p, r, s);  // done reading rank r's chunk of step s
    }
  }
  if (p.me >= 0 && R > 1 && p.mode != 2) {
    // Rank-local: the last step's chunk is released across calls too, so
    // the comm CTAs read it "as forwarders": they wait for it, then count.
    if (threadIdx.x == 0) ok_sh = wait_arrival(p, r, R - 1, 1, part);
    __syncthreads();
    if (!ok_sh) return false;
    if (threadIdx.x == 0) signal_consumed(p, r, R - 1);
  }
  return true;
}

// rank_exit (thread 0 of a CTA of a rank-local gather launch, once every
// read of the CTA is done and past a CTA barrier): counts the CTA out; the
// last one stamps this epoch into rank me−1's workspace (kRemDone), which
// lets me−1's comm CTAs write this rank's gather slots in the next call.
// A CTA that gave up (watchdog) never counts: the workspaces must be
// zeroed after an error anyway.
__device__ void rank_exit(const Params& p) {
  if (p.me < 0 || p.mode != 2 || p.ranks == 1) return;
  if (atom_acq_rel_add(p.ctl + kExit, 1) == (int)gridDim.x - 1) {
    __threadfence_system();
    st_release_sys(p.rem_prev + kRemDone, p.epoch);
  }
}

// load_q starts the copy of slot q's query tile into sq (one commit group).
template <int D, int DV, int MT>
__device__ __forceinline__ void load_q(const Params& p, const Slot& q, bf16* sq) {
  using C = Cfg<D, DV, MT>;
  constexpr int TPR = kThreads / C::BM;
  const int row = threadIdx.x / TPR, sub = threadIdx.x % TPR;
  const int qi = q.i0 + (row & ((1 << p.rph_log2) - 1)), qh = q.h0 + (row >> p.rph_log2);
  const bf16* src = qi < q.L ? p.rk[q.r].q + (int64_t)(q.qrow0 + qi) * p.q_stride + (int64_t)qh * p.hd : nullptr;
  load_row<C::WQ>(sq, row, src, p.hd, sub, TPR, p.vec != 0, p.rk[q.r].q);
  cp_async_commit();
}

// State is a warp's online-softmax state for its rows of a slot, in the MMA
// fragment layout (attend_tile): unnormalised O, running max m, sum l.
template <int DV, int MT>
struct State {
  float o[MT][DV / 8][4];
  float m[MT][2], l[MT][2];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
      for (int nt = 0; nt < DV / 8; ++nt) o[mi][nt][0] = o[mi][nt][1] = o[mi][nt][2] = o[mi][nt][3] = 0.f;
      m[mi][0] = m[mi][1] = -INFINITY;
      l[mi][0] = l[mi][1] = 0.f;
    }
  }
  // load / store: the thread's values at st (stride kThreads, coalesced), through L2.
  __device__ __forceinline__ void load(const float* st) {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
      for (int nt = 0; nt < DV / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mi][nt][e] = __ldcg(st + ((mi * (DV / 8) + nt) * 4 + e) * kThreads);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        m[mi][hh] = __ldcg(st + (MT * (DV / 8) * 4 + mi * 4 + hh * 2) * kThreads);
        l[mi][hh] = __ldcg(st + (MT * (DV / 8) * 4 + mi * 4 + hh * 2 + 1) * kThreads);
      }
    }
  }
  __device__ __forceinline__ void store(float* st) const {
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
      for (int nt = 0; nt < DV / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) __stcg(st + ((mi * (DV / 8) + nt) * 4 + e) * kThreads, o[mi][nt][e]);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        __stcg(st + (MT * (DV / 8) * 4 + mi * 4 + hh * 2) * kThreads, m[mi][hh]);
        __stcg(st + (MT * (DV / 8) * 4 + mi * 4 + hh * 2 + 1) * kThreads, l[mi][hh]);
      }
    }
  }
};

// SpanSh is what the tile loop of one span needs besides the state and
// the ldmatrix addresses. It lives in shared memory (the values are the
// same for the whole CTA): the loop's barriers make the compiler read it
// again where it is used instead of holding it in registers, which the
// 255-register tile loop would spill to local memory (ncu, 16k tokens:
// 2.9× flash.cu's local loads and 19 % more time before this).
struct SpanSh {
  const bf16* kb;  // the span's first key row, at the slot's kv head
  const bf16* vb;
  int nrows;       // rows in the span
  int row0;        // the first tile's first row within the span
  int j0;          // its position
  int cnt;         // tiles
  TileRows tr;
};

// span_fill describes one span of a chunk in sp (thread 0 only, between
// barriers): key tiles nlo.. nlo+cnt-1 of the span holding positions
// [klo, khi) at buffer rows koff.. of kc / vc, seen by slot q.
__device__ __forceinline__ void span_fill(const Params& p, const Slot& q, SpanSh& sp, const bf16* kc,
                                          const bf16* vc, int klo, int khi, int koff, int nlo, int cnt) {
  sp.kb = kc + (int64_t)koff * p.k_stride + (int64_t)q.kvh * p.hd;
  sp.vb = vc + (int64_t)koff * p.v_stride + (int64_t)q.kvh * p.vhd;
  sp.nrows = khi - klo;
  sp.row0 = nlo * kBN;
  sp.j0 = klo + nlo * kBN;
  sp.cnt = cnt;
  sp.tr = TileRows{q.qlo + q.i0, q.qlo + q.iend, khi, 1 << p.rph_log2};
}

// span_run folds the span described in sp (shared memory, span_fill) into
// the state. One contiguous range per call, so the loop is flash.cu's.
// Each span starts in K/V stage 0: the caller's barrier before span_fill
// has every warp done with both stages. The stage offsets then follow the
// loop counter alone, which the compiler keeps in a uniform register
// (flash.cu's ldmatrix addressing, base + uniform offset).
template <int D, int DV, int MT>
__device__ __forceinline__ void span_run(const Params& p, const SpanSh& sp, State<DV, MT>& st, bf16* sq, bf16* sk,
                                         bf16* sv) {
  using C = Cfg<D, DV, MT>;
  constexpr int KTPR = kThreads / kBN;
  auto load_kv = [&](int n, int stage) {  // tile n of the span's visible ones
    const int lrow = threadIdx.x / KTPR, lsub = threadIdx.x % KTPR;
    const int j = sp.row0 + n * kBN + lrow;  // key row within the span
    const bool in = j < sp.nrows;
    const bf16* kb = sp.kb;
    const bf16* vb = sp.vb;
    load_row<C::WQ>(sk + stage * C::KE, lrow, in ? kb + (int64_t)j * p.k_stride : nullptr, p.hd, lsub, KTPR,
                    p.vec != 0, kb);
    load_row<C::WV>(sv + stage * C::VE, lrow, in ? vb + (int64_t)j * p.v_stride : nullptr, p.vhd, lsub, KTPR,
                    p.vec != 0, vb);
  };
  const int wrow = (threadIdx.x / 32) * 16 * MT;
  const TileAddr<D, DV, MT> ad(sq, sk, sv, wrow, threadIdx.x % 32);
  const int ntl = sp.cnt;
  load_kv(0, 0);
  cp_async_commit();
  for (int it = 0; it < ntl; ++it) {
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < ntl) load_kv(it + 1, (it + 1) % kStages);
    cp_async_commit();
    const uint32_t koff = 2 * (it % kStages) * C::KE, voff = 2 * (it % kStages) * C::VE;
    attend_tile<D, DV, MT>(st.o, st.m, st.l, ad, koff, voff, sp.j0 + it * kBN, sp.tr,
                           p.causal, p.window, wrow, p.scale_log2);
  }
}

// attend_span folds key tiles nlo.. nlo+cnt-1 of one span of a chunk into
// the state (span_fill, then span_run). q and sp are in shared memory.
template <int D, int DV, int MT>
__device__ __forceinline__ void attend_span(const Params& p, const Slot& q, SpanSh& sp, State<DV, MT>& st,
                                            const bf16* kc, const bf16* vc, int klo, int khi, int koff, int nlo,
                                            int cnt, bf16* sq, bf16* sk, bf16* sv) {
  __syncthreads();  // every warp is done with the previous span's sp
  if (threadIdx.x == 0) span_fill(p, q, sp, kc, vc, klo, khi, koff, nlo, cnt);
  __syncthreads();
  span_run<D, DV, MT>(p, sp, st, sq, sk, sv);
}

// attend_chunk folds what slot q sees of step s's chunk (its two spans,
// stored one after the other) into the state. One loop over the spans, not
// unrolled: a second inlined copy of the tile loop (32 KB of SASS each)
// would double the hot code the SM's instruction caches serve when its two
// CTAs are in different spans.
template <int D, int DV, int MT>
__device__ __forceinline__ void attend_chunk(const Params& p, const Slot& q, SpanSh& sp, int s, State<DV, MT>& st,
                                             bf16* sq, bf16* sk, bf16* sv) {
#pragma unroll 1
  for (int h = 0; h < 2; ++h) {
    // Everything here is recomputed per span from q (shared memory) and p:
    // a value held across span 0's tile loop would cost it registers.
    int lo, hi, koff, nlo;
    const int cnt = span_at(p, q, s, h, &lo, &hi, &koff, &nlo);
    if (cnt > 0)
      attend_span<D, DV, MT>(p, q, sp, st, chunk_k(p, q.r, s), chunk_v(p, q.r, s), lo, hi, koff, nlo, cnt, sq, sk,
                             sv);
  }
}

// finish normalises slot q's state (sinks join the denominator when
// applied) and stores out (bf16, or f32 when out_f32) and the lse.
template <int D, int DV, int MT>
__device__ __forceinline__ void finish(const Params& p, const Slot& q, const State<DV, MT>& st, int out_f32) {
  constexpr int NO = DV / 8;
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int wrow = (threadIdx.x / 32) * 16 * MT, rph = 1 << p.rph_log2;
  const RankPtrs& rk = p.rk[q.r];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float ll = st.l[mi][hh];
      ll += __shfl_xor_sync(0xffffffffu, ll, 1);
      ll += __shfl_xor_sync(0xffffffffu, ll, 2);
      const int row = wrow + mi * 16 + g + hh * 8;
      const int h = q.h0 + (row >> p.rph_log2), i = q.i0 + (row & (rph - 1));
      float f = 1.f, den = ll;
      if (p.apply_sinks && p.sinks != nullptr) {
        const float sink2 = p.sinks[h] * kLog2e;
        const float mm = fmaxf(st.m[mi][hh], sink2);
        f = ex2(st.m[mi][hh] - mm);
        den = ll * f + ex2(sink2 - mm);
      }
      const float inv = den > 0.f ? f / den : 0.f;
      if (i >= q.L) continue;
      const int64_t qrow = q.qrow0 + i;
      if (rk.lse != nullptr && t4 == 0)
        rk.lse[qrow * p.heads + h] = ll > 0.f ? (st.m[mi][hh] + log2f(ll)) * kLn2 : -INFINITY;
      const int64_t base = qrow * p.o_stride + (int64_t)h * p.vhd;
#pragma unroll
      for (int nt = 0; nt < NO; ++nt) {
        const int col = nt * 8 + 2 * t4;
        if (col >= p.vhd) continue;
        const float v0 = st.o[mi][nt][2 * hh] * inv, v1 = st.o[mi][nt][2 * hh + 1] * inv;
        if (out_f32) {
          float* dst = static_cast<float*>(rk.out) + base + col;
          dst[0] = v0;
          if (col + 1 < p.vhd) dst[1] = v1;
        } else {
          bf16* dst = static_cast<bf16*>(rk.out) + base + col;
          dst[0] = __float2bfloat16_rn(v0);
          if (col + 1 < p.vhd) dst[1] = __float2bfloat16_rn(v1);
        }
      }
    }
  }
}

// slot_sh fills q (shared memory) with slot (rank r, tile t, head group
// hg) for the whole CTA.
__device__ __forceinline__ void slot_sh(const Params& p, Slot& q, int r, int t, int hg) {
  if (threadIdx.x == 0) q = slot_at(p, r, t, hg);
  __syncthreads();
}

// run_item attends slot (rank r, tile t, head group hg) to the chunk of
// step s (mode 0: the state goes through the workspace between steps; mode
// 1: one step, normalised partial output in f32).
template <int D, int DV, int MT>
__device__ void run_item(const Params& p, int r, int s, int t, int hg, bf16* sq, bf16* sk, bf16* sv) {
  using C = Cfg<D, DV, MT>;
  __shared__ Slot q;
  __shared__ SpanSh sp;
  slot_sh(p, q, r, t, hg);
  const int ntiles = chunk_tiles(p, q, s);
  const bool first = p.mode == 1 || s == 0;
  const bool last = p.mode == 1 || s == p.ranks - 1;
  if (ntiles == 0 && !first && !last) return;  // nothing visible, state unchanged

  State<DV, MT> st;
  // The state's workspace address is computed where it is used, from q in
  // shared memory: nothing the tile loop does not need stays live across it.
  auto sv_state = [&]() -> float* {
    return p.mode == 0 ? p.rk[q.r].state + (int64_t)q.tile * C::NS * kThreads + threadIdx.x : nullptr;
  };
  if (first)
    st.init();
  else
    st.load(sv_state());
  if (ntiles > 0) {
    load_q<D, DV, MT>(p, q, sq);
    attend_chunk<D, DV, MT>(p, q, sp, s, st, sq, sk, sv);
    cp_async_wait<0>();
  }
  if (!last) {
    st.store(sv_state());
    return;
  }
  finish<D, DV, MT>(p, q, st, p.mode == 1 ? 1 : p.out_f32);
}

// Walk is run_slot's cursor over the spans of a slot's chunks, in shared
// memory: the next (step, half) to look at, the last step whose chunk
// arrival was waited for, and what next_span found.
struct Walk {
  int s, h, waited;
  int found;  // 1: a span is described in sp; 0: no span left; -1: a wait gave up
};

// next_span (thread 0) advances w to the next span of slot q that has key
// tiles the slot sees, waits for its chunk when it is the first of a step
// past 0, and describes it in sp. Returns w->found.
__device__ __forceinline__ int next_span(const Params& p, const Slot& q, SpanSh& sp, Walk* w) {
  while (w->s < p.ranks) {
    const int s = w->s, h = w->h;
    if (++w->h == 2) {
      w->h = 0;
      ++w->s;
    }
    int lo, hi, koff, nlo;
    const int cnt = span_at(p, q, s, h, &lo, &hi, &koff, &nlo);
    if (cnt == 0) continue;
    if (s > 0 && w->waited != s) {
      if (!wait_arrival(p, q.r, s, 0, q.tile)) return w->found = -1;
      w->waited = s;
    }
    span_fill(p, q, sp, chunk_k(p, q.r, s), chunk_v(p, q.r, s), lo, hi, koff, nlo, cnt);
    return w->found = 1;
  }
  return w->found = 0;
}

// run_slot attends slot (rank r, tile t, head group hg) to every chunk in
// step order (mode 2, gather buffers: no chunk is overwritten, so a CTA
// keeps the slot's state in registers across the steps and waits for each
// chunk it sees to arrive). False when a wait gave up. The loop holds
// nothing but the state across its tile loop: thread 0 walks the spans
// (next_span) and describes each in shared memory, then every thread runs
// it (span_run) — the step and span bookkeeping as registers live across
// the tile loop cost it its ldmatrix prefetch under nvcc 13 (24–28 of 80
// results used within 2 instructions; scripts/sass_ldsm.py).
template <int D, int DV, int MT>
__device__ bool run_slot(const Params& p, int r, int t, int hg, bf16* sq, bf16* sk, bf16* sv) {
  __shared__ Slot q;
  __shared__ SpanSh sp;
  __shared__ Walk w;
  if (threadIdx.x == 0) w = Walk{0, 0, 0, 0};
  slot_sh(p, q, r, t, hg);  // its barrier also publishes w
  State<DV, MT> st;
  st.init();
  load_q<D, DV, MT>(p, q, sq);  // every slot sees its own positions in its own chunk
  for (;;) {
    __syncthreads();  // every warp is done with the previous span's sp
    if (threadIdx.x == 0) next_span(p, q, sp, &w);
    __syncthreads();
    const int found = w.found;
    if (found < 0) return false;
    if (found == 0) break;
    span_run<D, DV, MT>(p, sp, st, sq, sk, sv);
  }
  cp_async_wait<0>();
  finish<D, DV, MT>(p, q, st, p.out_f32);
  return true;
}

// ring_kernel: mode 0, the whole ring (comm CTAs first in the grid, then
// compute CTAs); mode 1, step p.step of every rank, compute only; mode 2
// (GATHER), the ring into gather buffers (comm CTAs first, then
// slot-at-a-time compute CTAs). GATHER is a template parameter, not only
// p.mode, so that each kind is its own kernel with its own register
// allocation: at 255 registers the allocator's choices for one path's tile
// loop changed with the other path's code (scripts/sass_ldsm.py).
template <int D, int DV, int MT, bool GATHER>
__global__ void __launch_bounds__(kThreads, 2) ring_kernel(const __grid_constant__ Params p) {
  using C = Cfg<D, DV, MT>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw);
  bf16* sk = sq + C::QE;
  bf16* sv = sk + kStages * C::KE;
  __shared__ int idx_sh, ok_sh;
  const int R = p.ranks;
  const bool local = p.me >= 0;  // rank-local: only rank me's comm CTAs and slots
  const int ncomm_all = p.mode != 1 ? p.ncomm * (local ? 1 : R) : 0;
  if ((int)blockIdx.x < ncomm_all) {
    const int r = local ? p.me : blockIdx.x / p.ncomm, part = blockIdx.x % p.ncomm;
    if (r == p.fault_rank) return;  // fault injection: this rank never sends
    if (!comm_role(p, r, part, nullptr)) return;
    // Sent everything: join the compute below.
  }
  const int nslots = p.tmax * p.hg * (local ? 1 : R);
  if constexpr (GATHER) {
    for (;;) {
      const int idx = block_take(p.ctl + kQueue, &idx_sh);  // (its barriers: every earlier read is done)
      if (idx >= nslots) {
        if (threadIdx.x == 0) rank_exit(p);
        return;
      }
      // idx = r * (tmax * hg) + t * hg + hg_i: one rank's slots after
      // another, heaviest tiles first (see the mode-0 loop for why);
      // rank-local, idx = t * hg + hg_i of rank me.
      const int per = p.tmax * p.hg;
      const int r = local ? p.me : idx / per, rest = local ? idx : idx % per;
      const int hg = rest % p.hg, t = rest / p.hg;
      if (t >= p.tc[r][0] + p.tc[r][1]) continue;
      if (!run_slot<D, DV, MT>(p, r, t, hg, sq, sk, sv)) return;
      __syncthreads();  // every warp is done with the slot's shared memory
    }
  } else {
  int s = p.mode == 1 ? p.step : 0;
  const int s_end = p.mode == 1 ? p.step + 1 : R;
  while (s < s_end) {
    const int idx = block_take(p.ctl + kQueue + s, &idx_sh);
    if (idx >= nslots) {
      ++s;
      continue;
    }
    // idx = r * (tmax * hg) + t * hg + hg_i: one rank's slots after
    // another, heaviest tiles first; rank-local, idx = t * hg + hg_i (rank
    // me's slots only). gidx is the slot's emulated index (its flag's).
    // Ranks one after another, not interleaved: the CTAs in flight then
    // read one rank's chunk of the step, as flash's CTAs share one
    // sequence's K/V, and L2 serves most of it. Interleaved, emulated ranks
    // put R chunks' K/V in flight at once: ncu, 64k positions, R = 8, 246
    // GB read from DRAM against flash's 16.8 GB (L2 hit rate 42 % against
    // 93 %). On real GPUs each rank has its own L2, so only the emulation
    // paid this.
    const int per = p.tmax * p.hg;
    const int r = local ? p.me : idx / per, rest = local ? idx : idx % per;
    const int gidx = rest * R + r;
    const int hg = rest % p.hg, t = rest / p.hg;
    if (t >= p.tc[r][0] + p.tc[r][1]) continue;  // this rank has fewer tiles
    if (p.mode == 0 && s > 0) {
      // The chunk of step s has arrived, and this slot's step s-1 (perhaps
      // on another CTA, since chunks run one step ahead) has stored its state.
      if (threadIdx.x == 0) {
        const int tile = t * p.hg + hg;
        ok_sh = wait_arrival(p, r, s, 0, tile) && wait_geq(p, p.done + gidx, s, r, 0, s, tile, 2);
      }
      __syncthreads();
      if (!ok_sh) return;
    }
    run_item<D, DV, MT>(p, r, s, t, hg, sq, sk, sv);
    __syncthreads();  // all reads of the chunk and of shared memory, all state stores, are done
    if (p.mode == 0 && threadIdx.x == 0) {
      __threadfence();
      st_release(p.done + gidx, s + 1);
      signal_consumed(p, r, s);
    }
  }
  }
}

// ---- the ring on the wgmma kernel (ring_wg) ----
//
// ring_wg runs modes 2 (the gather ring) and 1 (one step of the separate
// baseline) at head dims 128/128 on flash_wg's CTA (flash_wg.cuh: a
// producer warpgroup copying K/V tiles of 128 keys into a 3-stage ring, two
// consumer warpgroups of 64 query rows running wgmma). A slot is 128 query
// positions of one span of one rank and ONE head (consecutive slots are the
// heads of one tile, so a GQA group's K/V tiles are read from L2); CTAs
// take slots from one queue, heaviest first, and keep their barrier
// phases across slots (the ring index gb). The producer walks the slot's
// key tiles step by step, span by span (a tile never crosses a span, so
// its keys are consecutive positions and consecutive buffer rows), waits
// (one thread, bounded: wait_arrival's watchdog) for each step's chunk
// before its first tile, and publishes each tile's first position and end
// in shared memory with one plain arrival on the stage's K barrier (release;
// the consumers' wait acquires it); the masks use global positions, so the
// zigzag split needs nothing else. A wait that gives up sets the CTA's
// abort word: the producer still delivers (zero-filled) tiles so that the
// consumers finish, and the CTA leaves after the slot. The comm CTAs are
// the first ones of the grid, as in ring_kernel, all 384 threads copying.

// WSlot is the slot a ring_wg CTA works on (shared memory): rank r, head h,
// span rows [qlo, qlo + L) from query buffer row qrow0, this tile's rows
// i0 .. iend − 1, its key tiles (ntiles; −1: no slot left), its watchdog id.
struct WSlot {
  int r, h, qlo, L, qrow0, i0, iend, ntiles, id;
  int ready;  // mode 2: steps (bit s) whose chunk of rank r is known to be whole: no wait for them
};

// ready_steps (thread 0 of a ring_wg CTA, mode 2) is the mask of steps
// 1 .. s_hi − 1 whose chunk of rank r has certainly arrived: those this CTA
// waited for before (known: [rank, mask], thread 0's alone, kept across
// slots since no chunk is rewritten within a launch) and, emulated, those
// whose arrival counters read full now — relaxed loads issued together,
// then one fence (acquire by fence, as wait_arrival's load would be; barrier
// A then orders it before every thread's reads of the slot). A slot waits
// (wait_arrival and the producer's barrier after it) only for the other
// steps: R = 8 without copies spent 1.51 warp-cycles an issue on barriers
// against 1.13 at R = 1, the producer's barrier after each step's
// round trip to the flag (ncu, twenty-ninth pass).
__device__ int ready_steps(const Params& p, int r, int s_hi, int* known) {
  if (known[0] != r) {
    known[0] = r;
    known[1] = 0;
  }
  const int all = ((1 << s_hi) - 1) & ~1;
  if ((known[1] & all) == all || p.me >= 0) return known[1];
  int v[kMaxRanks];
#pragma unroll
  for (int s = 1; s < kMaxRanks; ++s) v[s] = s < s_hi && !((known[1] >> s) & 1) ? ld_relaxed(arrived(p, r, s)) : 0;
  int m = 0;
#pragma unroll
  for (int s = 1; s < kMaxRanks; ++s) m |= s < s_hi && v[s] >= p.ncomm ? 1 << s : 0;
  if (m != 0) __threadfence();
  known[1] |= m;
  return known[1];
}

// wslot_take (thread 0) takes the next slot of q: queue number idx is
// tile idx / heads of the order wg_layout laid out (p.wo, p.wcum), head
// idx % heads (a tile's heads consecutive: they share its K/V in L2).
__device__ WSlot wslot_take(const Params& p, int* q, int s_lo, int s_hi) {
  WSlot w{};
  const int idx = atomicAdd(q, 1);
  if (idx >= p.wcum[p.wno] * p.heads) {
    w.ntiles = -1;
    return w;
  }
  const int T = idx / p.heads;
  w.h = idx - T * p.heads;
  int e = 0;
  while (T >= p.wcum[e + 1]) ++e;
  const int seg = p.wo[e] & 1;
  w.r = p.wo[e] >> 1;
  const int tc1 = p.wtc[w.r][1], ti = p.wtc[w.r][seg] - 1 - (T - p.wcum[e]);
  w.qlo = p.qs[w.r][2 * seg];
  w.L = p.qs[w.r][2 * seg + 1] - w.qlo;
  w.qrow0 = seg == 0 ? 0 : p.qs[w.r][1] - p.qs[w.r][0];
  w.i0 = ti * fwg::kBM;
  w.iend = min(w.i0 + fwg::kBM, w.L);
  // The watchdog's tile id: the rank's tiles counted span 1's last first.
  w.id = (seg == 1 ? tc1 - 1 - ti : tc1 + p.wtc[w.r][0] - 1 - ti) * p.heads + w.h;
  w.ntiles = 0;
  for (int s = s_lo; s < s_hi; ++s)
    for (int hh = 0; hh < 2; ++hh) {
      int lo, hi, koff, nlo;
      chunk_span(p, w.r, s, hh, &lo, &hi, &koff);
      w.ntiles += key_tiles(p, w.qlo, w.i0, w.iend, lo, hi, fwg::kBN, &nlo);
    }
  return w;
}

// WIN: a sliding window (p.window > 0). Without it the consumers' masks
// know at compile time that there is none: a runtime window held a
// register across their tile loop and made them spill there (ptxas proxy:
// 41 spill instructions in the consumers' code, 17 without; flash_wg has
// 0). Measured against the runtime window at 16k (H200, twenty-ninth
// pass, two rounds): level within the ring's run-to-run spread (R = 4
// +10.3 / +11.3 % against +17.5 / +12.4 %, R = 2 and 8 within ±2).
template <bool WIN>
__global__ void __launch_bounds__(fwg::kThreadsWG, 1)
    ring_wg(const __grid_constant__ Params p, const __grid_constant__ RingMaps maps) {
  using fwg::kD;
  using fwg::kST;
  constexpr int BN = fwg::kBN;  // keys a tile (attn_tile.cuh's kBN is ring_kernel's 64)
  extern __shared__ unsigned char rwg_raw[];
  const fwg::Smem sm = fwg::carve(rwg_raw);
  __shared__ WSlot slot_sh;
  __shared__ WSlot next_sh;    // thread 0's: the slot taken while the consumers finish the last one
  __shared__ int known_sh[2];  // thread 0's: ready_steps' cache
  int* abort_sh = sm.flag();
  const int tid = threadIdx.x, wg = tid / 128, wl = tid % 128;
  const int R = p.ranks;
  if (tid == 0) {
    fwg::init_barriers(sm, 1);  // + the producer's plain arrival with the tile's key bounds
    *abort_sh = 0;
    known_sh[0] = -1;
    known_sh[1] = 0;
  }
  __syncthreads();
  const bool local = p.me >= 0;  // rank-local: only rank me's comm CTAs and slots
  const int ncomm_all = p.mode == 2 ? p.ncomm * (local ? 1 : R) : 0;
  if ((int)blockIdx.x < ncomm_all) {
    const int r = local ? p.me : blockIdx.x / p.ncomm, part = blockIdx.x % p.ncomm;
    if (r == p.fault_rank) return;  // fault injection: this rank never sends
    // Its whole shared memory (Q and the K / V stages, 7 × 32 KB, unused until the CTA joins the compute) stages copy_bulk's buffers.
    if (!comm_role(p, r, part, sm.q())) return;
    // Sent everything: join the compute below.
  }
  const int s_lo = p.mode == 1 ? p.step : 0, s_hi = p.mode == 1 ? p.step + 1 : R;
  int* queue = p.ctl + kQueue + (p.mode == 1 ? p.step : 0);

  if (wg == 0) {  // producer
    mkwg::setmaxnreg_dec<56>();
    if (tid == 0 && !p.noprefetch) next_sh = wslot_take(p, queue, s_lo, s_hi);
    for (int gb = 0;;) {
      if (tid == 0) {
        WSlot t = p.noprefetch ? wslot_take(p, queue, s_lo, s_hi) : next_sh;
        t.ready = t.ntiles >= 0 && p.mode == 2 && !p.noready ? ready_steps(p, t.r, s_hi, known_sh) : 0;
        slot_sh = t;
      }
      __syncthreads();  // A: the slot is in slot_sh
      const WSlot& w = slot_sh;  // read from shared memory where used (the producer has 56 registers)
      if (w.ntiles < 0) {
        // Every copy of the CTA landed before B of its last slot (or the
        // comm role's barriers): rank-local gather counts the CTA out.
        if (tid == 0) rank_exit(p);
        break;
      }
      const RankPtrs& rk = p.rk[w.r];
      fwg::load_q(sm, wl, [&](int r) -> const bf16* {
        const int qi = w.i0 + r;
        return qi < w.iend ? rk.q + (int64_t)(w.qrow0 + qi) * p.q_stride + (int64_t)w.h * kD : nullptr;
      }, rk.q);
      const int kvh = w.h / p.group, r0 = wl / 16;
      int g = gb;
      for (int s = s_lo; s < s_hi; ++s) {
        bool waited = false;
        for (int hh = 0; hh < 2; ++hh) {
          int lo, hi, koff, nlo;
          chunk_span(p, w.r, s, hh, &lo, &hi, &koff);
          const int cnt = key_tiles(p, w.qlo, w.i0, w.iend, lo, hi, BN, &nlo);
          if (cnt == 0) continue;
          if (p.mode == 2 && s > 0 && !waited && !((w.ready >> s) & 1)) {  // the chunk of step s has arrived
            waited = true;
            if (wl == 0 && *abort_sh == 0) {
              if (wait_arrival(p, w.r, s, 0, w.id)) known_sh[1] |= 1 << s;  // known_sh[0] is w.r (ready_steps)
              else *abort_sh = 1;
            }
            asm volatile("bar.sync 1, 128;\n" ::: "memory");  // the producer warpgroup's own barrier
          }
          const bool ok = *abort_sh == 0;
          const bf16* kp = chunk_k(p, w.r, s) + (int64_t)kvh * kD;
          const bf16* vp = chunk_v(p, w.r, s) + (int64_t)kvh * kD;
          for (int i = 0; i < cnt; ++i, ++g) {
            const int t = nlo + i, kb = lo + t * BN, n = min(BN, hi - kb), brow = koff + t * BN;
            const int st = g % kST;
            fwg::wait_empty(sm, g);
            if (p.tma && ok && n == BN) {
              // A whole tile by TMA (as flash_wg): thread 0 publishes the
              // bounds and issues 32 boxes from the chunk's buffer (rows
              // contiguous), the other 127 threads arrive; full_k counts
              // 127 + the bounds' arrival + the expect_tx one. The chunk
              // was written by generic stores (the comm CTAs, or a peer),
              // seen through this thread's acquire in wait_arrival: the
              // proxy fence orders them before the async proxy's reads.
              if (wl == 0) {
                sm.keys()[2 * st] = kb;
                sm.keys()[2 * st + 1] = kb + n;
                mkwg::mbar_arrive(sm.full_k(st));
                const int mi = s == 0 ? 0 : p.mode == 2 ? 1 : 1 + (s & 1);
                const int y0 = (p.mode == 2 && s > 0 ? (s - 1) * p.gcap : 0) + brow;
                asm volatile("fence.proxy.async.global;\n" ::: "memory");
                fwg::tma_tile(sm, st, &maps.k[w.r][mi], &maps.v[w.r][mi], kvh * kD, kvh * kD,
                              [&](int j) { return y0 + 16 * j; });
              } else {
                mkwg::mbar_arrive(sm.full_k(st));
                mkwg::mbar_arrive(sm.full_v(st));
              }
              continue;
            }
            // Buffer rows of this thread's keys (tile rows r0 + 8 j), -1 past
            // the span or after an abort.
            const int nr = ok ? n - r0 : 0, br = brow + r0;
            int32_t row[16];
#pragma unroll
            for (int j = 0; j < 16; j++) row[j] = 8 * j < nr ? br + 8 * j : -1;
            fwg::copy_k(sm, st, wl, kp, p.k_stride, row);
            if (wl == 0) {
              sm.keys()[2 * st] = kb;
              sm.keys()[2 * st + 1] = kb + n;
              mkwg::mbar_arrive(sm.full_k(st));  // release: the bounds before the consumers' acquire
            }
            fwg::copy_v(sm, st, wl, vp, p.v_stride, row);
          }
        }
      }
      // The next slot (the queue's atomic and its span walk: 2R spans) is
      // taken while the consumers still work through this slot's last
      // stages, not between B and A with every warp waiting.
      if (tid == 0 && !p.noprefetch) next_sh = wslot_take(p, queue, s_lo, s_hi);
      asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy into Q or a stage outlives the slot
      gb = g;
      __syncthreads();  // B: the consumers are done with Q and slot_sh
      if (*abort_sh) return;
    }
    return;
  }

  mkwg::setmaxnreg_inc<224>();
  const int cw = wg - 1, lane = tid % 32;
  const int ra = cw * 64 + (wl / 32) * 16 + lane / 4;  // this thread's rows: ra and ra + 8
  const bool f32 = p.mode == 1 || p.out_f32;          // mode 1: normalised f32 partials
  for (int gb = 0, n = 0;; ++n) {
    __syncthreads();  // A
    const int ntiles = slot_sh.ntiles;
    if (ntiles < 0) break;
    fwg::Acc a;
    fwg::consume(sm, gb, ntiles, n & 1, [&](int, int st, int& kb, int& kend) {
      kb = sm.keys()[2 * st];
      kend = sm.keys()[2 * st + 1];
    }, slot_sh.qlo + slot_sh.i0 + ra, p.causal, WIN ? p.window : 0, p.scale_log2, cw, wl, a);
    gb += ntiles;
    // The slot read again from shared memory (valid until B): held in
    // registers across the tile loop it made the consumers spill there.
    const WSlot w = slot_sh;
    // O / l (sinks join the denominator when applied), rows ra and ra + 8
    // where they are real, and the log-sum-exp of the scores (sinks
    // excluded; natural log).
    const RankPtrs& rk = p.rk[w.r];
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
      const int i = w.i0 + ra + 8 * hh;
      if (i >= w.L) continue;
      const float m = hh ? a.mb : a.ma, l = hh ? a.lb : a.la;
      const float m2 = m == -INFINITY ? -INFINITY : m * p.scale_log2;
      float f = 1.f, den = l;
      if (p.apply_sinks && p.sinks != nullptr) {
        const float sk = p.sinks[w.h] * kLog2e, mm = fmaxf(m2, sk);
        f = ex2(m2 - mm);
        den = l * f + ex2(sk - mm);
      }
      const float inv = den > 0.f ? f / den : 0.f;
      const int64_t qrow = w.qrow0 + i;
      if (rk.lse != nullptr && lane % 4 == 0) rk.lse[qrow * p.heads + w.h] = l > 0.f ? (m2 + log2f(l)) * kLn2 : -INFINITY;
      const int64_t obase = qrow * p.o_stride + (int64_t)w.h * kD;
#pragma unroll
      for (int j = 0; j < 16; j++) {
        const int col = 8 * j + 2 * (lane % 4);
        const float x0 = a.o[4 * j + 2 * hh] * inv, x1 = a.o[4 * j + 2 * hh + 1] * inv;
        if (f32)
          *reinterpret_cast<float2*>(static_cast<float*>(rk.out) + obase + col) = make_float2(x0, x1);
        else
          *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(rk.out) + obase + col) = __floats2bfloat162_rn(x0, x1);
      }
    }
    __syncthreads();  // B
    if (*abort_sh) return;
  }
}

// ---- merge (separate baseline) ----

struct MergeParams {
  float* acc_o[kMaxRanks];  // [Lq_r, heads, vhd] normalised so far
  float* acc_l[kMaxRanks];  // [Lq_r, heads]
  const float* po[kMaxRanks];  // this step's partial, or null (finish only)
  const float* pl[kMaxRanks];
  void* out[kMaxRanks];
  float* lse[kMaxRanks];
  int64_t row0[kMaxRanks + 1];  // prefix sums of (row, head) pairs per rank
  const float* sinks;
  int heads, vhd, final_step, out_f32;
};

// merge_kernel: one warp per (rank, row, head): acc = merge(acc, partial)
// by log-sum-exp; on the final step it applies sinks and writes out and lse.
__global__ void merge_kernel(const __grid_constant__ MergeParams p, int ranks) {
  const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= p.row0[ranks]) return;
  int r = 0;
  while (w >= p.row0[r + 1]) ++r;
  const int64_t pr = w - p.row0[r];  // (row, head) pair within rank r
  float a = p.acc_l[r][pr];
  float wa = 1.f, wb = 0.f;
  float lse = a;
  if (p.po[r] != nullptr) {
    const float b = p.pl[r][pr];
    const float mm = fmaxf(a, b);
    if (mm == -INFINITY) {
      wa = 0.f;
    } else {
      const float ea = expf(a - mm), eb = expf(b - mm);
      wa = ea / (ea + eb);
      wb = eb / (ea + eb);
      lse = mm + logf(ea + eb);
    }
  }
  float f = 1.f;
  if (p.final_step && p.sinks != nullptr && lse != -INFINITY) {
    const int h = (int)(pr % p.heads);
    f = 1.f / (1.f + expf(p.sinks[h] - lse));
  }
  float* ao = p.acc_o[r] + pr * p.vhd;
  const float* bo = p.po[r] != nullptr ? p.po[r] + pr * p.vhd : nullptr;
  for (int c = lane; c < p.vhd; c += 32) {
    float v = wa * ao[c];
    if (bo != nullptr && wb != 0.f) v += wb * bo[c];
    if (!p.final_step) {
      ao[c] = v;
    } else if (p.out_f32) {
      static_cast<float*>(p.out[r])[pr * p.vhd + c] = v * f;
    } else {
      static_cast<bf16*>(p.out[r])[pr * p.vhd + c] = __float2bfloat16_rn(v * f);
    }
  }
  if (lane == 0) {
    if (!p.final_step)
      p.acc_l[r][pr] = lse;
    else if (p.lse[r] != nullptr)
      p.lse[r][pr] = lse;
  }
}

// ---- host side ----

struct Shape {
  int d, dv, mt, hpb, rph, hg;
  int ns;  // state floats per thread
};

// shape_for picks the template (padded dims, MT) and the tiling for these dims.
bool shape_for(int heads, int kv_heads, int hd, int vhd, Shape* sh) {
  auto pad = [](int x) { return x <= 64 ? 64 : x <= 128 ? 128 : x <= 192 ? 192 : 256; };
  int d = pad(hd), dv = pad(vhd);
  if (d == 192 && dv <= 128)
    dv = 128;
  else if (d != dv || d == 192)
    d = dv = (d > dv ? d : dv) == 192 ? 256 : (d > dv ? d : dv);
  const int group = heads / kv_heads;
  sh->d = d;
  sh->dv = dv;
  sh->mt = d <= 128 ? 2 : 1;
  sh->hpb = group % 4 == 0 ? 4 : group % 2 == 0 ? 2 : 1;
  sh->rph = 64 * sh->mt / sh->hpb;
  sh->hg = heads / sh->hpb;
  sh->ns = sh->mt * (dv / 8) * 4 + sh->mt * 4;
  return true;
}

struct Layout {
  int tc[kMaxRanks][2];
  int items[kMaxRanks];
  int tmax;
  int64_t done_bytes;  // the per-slot step flags, rounded up to 256
  int64_t qrows[kMaxRanks];
  int64_t state_bytes[kMaxRanks];  // ring state per rank
  int64_t ring_bytes, sep_bytes;
};

int layout_for(int ranks, const int32_t* qspans, int heads, const Shape& sh, int vhd, Layout* lo) {
  lo->tmax = 0;
  lo->ring_bytes = kStateOff;
  int64_t pairs = 0;
  for (int r = 0; r < ranks; ++r) {
    int64_t rows = 0;
    for (int sp = 0; sp < 2; ++sp) {
      const int n = qspans[4 * r + 2 * sp + 1] - qspans[4 * r + 2 * sp];
      lo->tc[r][sp] = (n + sh.rph - 1) / sh.rph;
      rows += n;
    }
    lo->qrows[r] = rows;
    lo->items[r] = (lo->tc[r][0] + lo->tc[r][1]) * sh.hg;
    lo->tmax = lo->tc[r][0] + lo->tc[r][1] > lo->tmax ? lo->tc[r][0] + lo->tc[r][1] : lo->tmax;
    pairs += rows * heads;
  }
  lo->done_bytes = ((int64_t)lo->tmax * sh.hg * ranks * 4 + 255) / 256 * 256;
  lo->ring_bytes += lo->done_bytes;
  for (int r = 0; r < ranks; ++r) {
    lo->state_bytes[r] = ranks > 1 ? (int64_t)lo->tmax * sh.hg * sh.ns * kThreads * 4 : 0;
    lo->ring_bytes += lo->state_bytes[r];
  }
  // Separate: acc o + acc l + partial o + partial l, f32.
  lo->sep_bytes = kStateOff + 2 * (pairs * vhd * 4 + pairs * 4) + 256;
  return MK_OK;
}

int check_common(const char* fn, int32_t ranks, const uint64_t* ptrs, const int32_t* qspans, const int32_t* kvspans,
                 int32_t out_dtype, int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim,
                 float scale, int32_t window, int32_t causal, uint64_t ws, int me = -1, int gather = 0) {
  MK_ARG(ranks >= 1 && ranks <= kMaxRanks, "%s: ranks=%d must be in [1, %d]", fn, ranks, kMaxRanks);
  MK_ARG(ptrs && qspans && kvspans, "%s: ptrs, qspans and kvspans must be non-null", fn);
  MK_ARG(ws != 0 && ws % 16 == 0, "%s: ws must be a non-null 16-byte aligned workspace", fn);
  MK_ARG(out_dtype == MK_DTYPE_BF16 || out_dtype == MK_DTYPE_F32, "%s: out_dtype %d is not bf16 or f32", fn, out_dtype);
  MK_ARG(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0, "%s: heads=%d must be a positive multiple of kv_heads=%d",
         fn, heads, kv_heads);
  MK_ARG(head_dim >= 1 && head_dim <= 256 && v_head_dim >= 1 && v_head_dim <= 256,
         "%s: head_dim=%d and v_head_dim=%d must be in [1, 256]", fn, head_dim, v_head_dim);
  MK_ARG(std::isfinite(scale) && scale > 0, "%s: scale %g must be finite and > 0", fn, (double)scale);
  MK_ARG(window >= 0, "%s: window=%d must be >= 0", fn, window);
  MK_ARG(causal == 0 || causal == 1, "%s: causal=%d must be 0 or 1", fn, causal);
  MK_ARG(causal == 1 || window == 0, "%s: a window (%d) needs causal=1", fn, window);
  for (int r = 0; r < ranks; ++r) {
    for (int sp = 0; sp < 2; ++sp) {
      const int qa = qspans[4 * r + 2 * sp], qb = qspans[4 * r + 2 * sp + 1];
      const int ka = kvspans[4 * r + 2 * sp], kb = kvspans[4 * r + 2 * sp + 1];
      MK_ARG(qa >= 0 && qb >= qa, "%s: rank %d query span %d [%d, %d) is not a range of positions", fn, r, sp, qa, qb);
      MK_ARG(ka >= 0 && kb >= ka, "%s: rank %d kv span %d [%d, %d) is not a range of positions", fn, r, sp, ka, kb);
    }
    // Rank-local: only me's entry is read in full, and the next rank's
    // receive buffers (its peer mappings); the other entries are ignored.
    const bool mine = me < 0 || r == me, next = me < 0 || r == (me + 1) % ranks;
    const uint64_t* pr = ptrs + (int64_t)r * MK_RING_NPTR;
    const bool has_q = qspans[4 * r + 1] > qspans[4 * r] || qspans[4 * r + 3] > qspans[4 * r + 2];
    const bool has_k = kvspans[4 * r + 1] > kvspans[4 * r] || kvspans[4 * r + 3] > kvspans[4 * r + 2];
    MK_ARG(!mine || !has_q || (pr[MK_RING_Q] && pr[MK_RING_OUT]), "%s: rank %d has queries but a null q or out", fn,
           r);
    MK_ARG(!mine || !has_k || (pr[MK_RING_K] && pr[MK_RING_V]), "%s: rank %d has keys but a null k or v", fn, r);
    MK_ARG(!(mine || next) || ranks == 1 ||
               (pr[MK_RING_KBUF0] && pr[MK_RING_VBUF0] && (gather || (pr[MK_RING_KBUF1] && pr[MK_RING_VBUF1]))),
           "%s: rank %d: the receive buffers must be non-null when ranks > 1", fn, r);
  }
  return MK_OK;
}

// fill_params sets everything but mode/step/ncomm/fault.
void fill_params(Params* p, int32_t ranks, const uint64_t* ptrs, const int32_t* qspans, const int32_t* kvspans,
                 int32_t out_dtype, int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim, float scale,
                 int32_t window, uint64_t sinks, int32_t causal, uint64_t ws, const Shape& sh, const Layout& lo,
                 int me = -1) {
  std::memset(p, 0, sizeof *p);
  // ring_wg's slots skip the waits for chunks known to have arrived
  // (ready_steps), emulated or rank-local; MK_RING_READY=0: every slot
  // waits for every step's chunk, as before the fifty-second pass. The
  // default since that pass's call 2 (H200, bench ring at 16k, three
  // interleaved rounds with the pruned hops): R = 8 +9.4 … +11.0 % over
  // one rank against +12.8 … +13.4 % waiting, R = 4 +3.2 … +3.9 against
  // +3.8 … +4.3, R = 2 level.
  static const int noready_env = mk::env_is("MK_RING_READY", '0') ? 1 : 0;
  p->noready = noready_env;
  // ring_wg's comm CTAs forward chunks by TMA bulk copies through shared
  // memory, one thread keeping 224 KB in flight (copy_bulk), in the
  // emulated ring by default since the fifty-second pass (call 4, 16k,
  // five interleaved rounds with the pruned hops and ready_steps): R = 8
  // +9.4 … +10.7 % over one rank against +10.9 … +11.9 % with register
  // copies, R = 4 +2.9 … +3.2 against +2.9 … +3.5, R = 2 level; with 4
  // comm CTAs a rank instead of 8 they lose (+12.3 % at R = 8).
  // MK_RING_BULK=0: register copies (copy_part); MK_RING_BULK=1: bulk in
  // the rank-local ring too (its tests have not run that way).
  static const int bulk_off = mk::env_is("MK_RING_BULK", '0') ? 1 : 0;
  static const int bulk_all = mk::env_is("MK_RING_BULK", '1') ? 1 : 0;
  p->bulk = bulk_all || (me < 0 && !bulk_off);
  // MK_RING_PREFETCH=0: ring_wg takes each slot between its barriers B and
  // A (every warp waiting), as before the fifty-first pass.
  static const int noprefetch_env = mk::env_is("MK_RING_PREFETCH", '0') ? 1 : 0;
  p->noprefetch = noprefetch_env;
  // MK_RING_CS=1: the comm CTAs' register copies load and store streaming
  // (evict first), so the hops do not evict the compute's key tiles from
  // L2. Opt-in: one measurement, inside the sequential timing's noise.
  static const int cs_env = mk::env_is("MK_RING_CS", '1') ? 1 : 0;
  p->cs = cs_env;
  bool vec = head_dim % 8 == 0 && v_head_dim % 8 == 0;
  char* base = reinterpret_cast<char*>(ws);
  int64_t state_off = kStateOff + lo.done_bytes;
  for (int r = 0; r < ranks; ++r) {
    const uint64_t* pr = ptrs + (int64_t)r * MK_RING_NPTR;
    RankPtrs& rk = p->rk[r];
    rk.q = mk::dev<const bf16>(pr[MK_RING_Q]);
    rk.k = mk::dev<const bf16>(pr[MK_RING_K]);
    rk.v = mk::dev<const bf16>(pr[MK_RING_V]);
    rk.kb[0] = mk::dev<bf16>(pr[MK_RING_KBUF0]);
    rk.kb[1] = mk::dev<bf16>(pr[MK_RING_KBUF1]);
    rk.vb[0] = mk::dev<bf16>(pr[MK_RING_VBUF0]);
    rk.vb[1] = mk::dev<bf16>(pr[MK_RING_VBUF1]);
    rk.out = reinterpret_cast<void*>(pr[MK_RING_OUT]);
    rk.lse = mk::dev<float>(pr[MK_RING_LSE]);
    // Rank-local: the workspace is me's own and holds only me's state.
    rk.state = me < 0 ? reinterpret_cast<float*>(base + state_off)
                      : r == me ? reinterpret_cast<float*>(base + kStateOff + lo.done_bytes) : nullptr;
    state_off += lo.state_bytes[r];
    for (int i = MK_RING_Q; i <= MK_RING_VBUF1; ++i) vec = vec && pr[i] % 16 == 0;
    for (int i = 0; i < 4; ++i) {
      p->qs[r][i] = qspans[4 * r + i];
      p->ks[r][i] = kvspans[4 * r + i];
    }
    p->tc[r][0] = lo.tc[r][0];
    p->tc[r][1] = lo.tc[r][1];
    p->items[r] = lo.items[r];
  }
  p->sinks = mk::dev<const float>(sinks);
  p->err = reinterpret_cast<int*>(base);
  p->ctl = reinterpret_cast<int*>(base + kCtlOff);
  p->done = reinterpret_cast<int*>(base + kStateOff);
  p->q_stride = (int64_t)heads * head_dim;
  p->k_stride = (int64_t)kv_heads * head_dim;
  p->v_stride = (int64_t)kv_heads * v_head_dim;
  p->o_stride = (int64_t)heads * v_head_dim;
  p->ranks = ranks;
  p->heads = heads;
  p->group = heads / kv_heads;
  p->hd = head_dim;
  p->vhd = v_head_dim;
  p->window = window;
  p->causal = causal;
  p->out_f32 = out_dtype == MK_DTYPE_F32;
  p->vec = vec;
  p->hpb = sh.hpb;
  p->rph_log2 = __builtin_ctz(sh.rph);
  p->hg = sh.hg;
  p->tmax = lo.tmax;
  p->fault_rank = -1;
  p->scale_log2 = scale * kLog2e;
  p->me = me;
}

using KernelFn = void (*)(Params);

// kernel_for is the ring kernel for shape sh: the gather-buffer kind
// (mode 2) when gather, else the one of modes 0 and 1.
KernelFn kernel_for(const Shape& sh, bool gather, size_t* smem) {
#define MK_RING_CASE(D, DV, MT)                                                   \
  if (sh.d == D && sh.dv == DV && sh.mt == MT) {                                  \
    *smem = Cfg<D, DV, MT>::smem;                                                 \
    return gather ? ring_kernel<D, DV, MT, true> : ring_kernel<D, DV, MT, false>; \
  }
  MK_RING_CASE(64, 64, 2)
  MK_RING_CASE(128, 128, 2)
  MK_RING_CASE(192, 128, 1)
  MK_RING_CASE(256, 256, 1)
#undef MK_RING_CASE
  return nullptr;
}

// prepare sets the kernel's shared-memory attribute once and returns how
// many CTAs of it fit on the device at once.
int prepare(KernelFn fn, size_t smem, int* coresident, int threads = kThreads) {
  static KernelFn done[16];
  static int ndone = 0;
  bool seen = false;
  for (int i = 0; i < ndone; ++i) seen = seen || done[i] == fn;
  if (!seen) {
    MK_CUDA(cudaFuncSetAttribute(reinterpret_cast<const void*>(fn), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem));
    if (ndone < 16) done[ndone++] = fn;
  }
  int occ = 0, dev = 0, sms = 0;
  MK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, reinterpret_cast<const void*>(fn), threads, smem));
  MK_CUDA(cudaGetDevice(&dev));
  MK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  *coresident = occ * sms;
  if (*coresident <= 0) return mk::fail(MK_ERR_CUDA, "ring attention: no CTA of the kernel fits on a multiprocessor");
  return MK_OK;
}

}  // namespace

extern "C" MK_API int32_t mk_ring_workspace(int32_t ranks, const int32_t* qspans, int32_t heads, int32_t kv_heads,
                                            int32_t head_dim, int32_t v_head_dim, uint64_t* bytes) {
  MK_ARG(bytes && qspans, "mk_ring_workspace: bytes and qspans must be non-null");
  MK_ARG(ranks >= 1 && ranks <= kMaxRanks, "mk_ring_workspace: ranks=%d must be in [1, %d]", ranks, kMaxRanks);
  MK_ARG(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0,
         "mk_ring_workspace: heads=%d must be a positive multiple of kv_heads=%d", heads, kv_heads);
  MK_ARG(head_dim >= 1 && head_dim <= 256 && v_head_dim >= 1 && v_head_dim <= 256,
         "mk_ring_workspace: head_dim=%d and v_head_dim=%d must be in [1, 256]", head_dim, v_head_dim);
  for (int i = 0; i < 2 * ranks; ++i)
    MK_ARG(qspans[2 * i] >= 0 && qspans[2 * i + 1] >= qspans[2 * i], "mk_ring_workspace: query span %d [%d, %d)", i,
           qspans[2 * i], qspans[2 * i + 1]);
  Shape sh;
  shape_for(heads, kv_heads, head_dim, v_head_dim, &sh);
  Layout lo;
  layout_for(ranks, qspans, heads, sh, v_head_dim, &lo);
  *bytes = (uint64_t)(lo.ring_bytes > lo.sep_bytes ? lo.ring_bytes : lo.sep_bytes);
  return MK_OK;
}

namespace {

// wg_on reports MK_RING_WG (read once): 0 keeps modes 1 and 2 on
// ring_kernel (mma.sync) at every head dim; else (the default) ring_wg
// takes them where wg_fits.
bool wg_on() {
  static const bool on = !mk::env_is("MK_RING_WG", '0');
  return on;
}

// wg_fits reports whether ring_wg takes a launch: head dims 128/128,
// 16-byte aligned q/k/v and buffers (p.vec), and the outputs of ranks
// 0..nout−1 aligned for its paired stores (out_f32: what the kernel stores;
// nout 0 when the outputs are the workspace's, as in mode 1).
bool wg_fits(const Params& p, int nout, int head_dim, int v_head_dim, bool out_f32) {
  if (!wg_on() || head_dim != 128 || v_head_dim != 128 || !p.vec) return false;
  for (int r = 0; r < nout; ++r)
    if (reinterpret_cast<uintptr_t>(p.rk[r].out) % (out_f32 ? 8 : 4) != 0) return false;
  return true;
}

// wg_layout fills ring_wg's tiles of 128 query rows per rank and span,
// and its queue order (p->wo, p->wcum): the spans of the ranks the launch
// computes (rank-local: me's), the latest first — under a causal mask the
// heaviest tiles, so the queue runs longest first across ranks, as flash's
// does over one sequence (the rank-major order before it, MK_RING_ORDER=
// rank, ended each launch on the last rank's tiles of nearly equal weight;
// a schedule model put that at +0.7 % at 16k for R = 2–8). Equal starts
// keep rank order. A span's tiles are taken heaviest first (wslot_take).
void wg_layout(Params* p, int ranks, const int32_t* qspans) {
  static const bool rank_order = [] {
    const char* v = getenv("MK_RING_ORDER");
    return v != nullptr && std::strcmp(v, "rank") == 0;
  }();
  p->wno = 0;
  for (int r = 0; r < ranks; ++r) {
    for (int sp = 0; sp < 2; ++sp)
      p->wtc[r][sp] = (qspans[4 * r + 2 * sp + 1] - qspans[4 * r + 2 * sp] + fwg::kBM - 1) / fwg::kBM;
    if (p->me >= 0 && r != p->me) continue;
    for (int sp = 1; sp >= 0; --sp)
      if (p->wtc[r][sp] > 0) p->wo[p->wno++] = r << 1 | sp;
  }
  auto start = [&](int e) { return qspans[4 * (e >> 1) + 2 * (e & 1)]; };
  if (!rank_order)  // insertion sort, stable: later starts first
    for (int i = 1; i < p->wno; ++i)
      for (int j = i; j > 0 && start(p->wo[j]) > start(p->wo[j - 1]); --j) std::swap(p->wo[j], p->wo[j - 1]);
  p->wcum[0] = 0;
  for (int e = 0; e < p->wno; ++e) p->wcum[e + 1] = p->wcum[e] + p->wtc[p->wo[e] >> 1][p->wo[e] & 1];
}

// rank_items is rank r's work items (slots) in the launch's kernel: ring_wg's
// 128-row tiles × heads (after wg_layout), else the layout's.
int64_t rank_items(const Params& p, const Layout& lo, bool wg, int r) {
  return wg ? (int64_t)(p.wtc[r][0] + p.wtc[r][1]) * p.heads : lo.items[r];
}

// ring_wg_kernel is ring_wg as a KernelFn (a handle for the attribute,
// occupancy and launch calls; launch_ring passes its RingMaps), with a
// sliding window or without.
KernelFn ring_wg_kernel(bool win) {
  return win ? reinterpret_cast<KernelFn>(ring_wg<true>) : reinterpret_cast<KernelFn>(ring_wg<false>);
}

// ring_maps fills ring_wg's TMA maps for the ranks the launch computes
// (me only when rank-local) and sets p->tma where every one of them could
// be made (MK_RING_TMA=0: never, the cp.async copies for A/Bs).
// The last launch's maps are kept with the buffers they were made for (the
// library runs on its one owning thread): a ring over the same buffers
// again (the engine's layers, a benchmark's iterations, the separate
// baseline's steps) skips up to 48 driver calls.
void ring_maps(Params* p, RingMaps* m) {
  struct Key {
    const void* b[kMaxRanks][6];
    int64_t ks, vs;
    int ranks, me;
  };
  static Key last_key;
  static RingMaps last_maps;
  static int last_ok = -1;
  Key key;
  std::memset(&key, 0, sizeof key);
  for (int r = 0; r < p->ranks && r < kMaxRanks; ++r) {
    const RankPtrs& rk = p->rk[r];
    const void* b[6] = {rk.k, rk.kb[0], rk.kb[1], rk.v, rk.vb[0], rk.vb[1]};
    std::memcpy(key.b[r], b, sizeof b);
  }
  key.ks = p->k_stride;
  key.vs = p->v_stride;
  key.ranks = p->ranks;
  key.me = p->me;
  if (last_ok >= 0 && std::memcmp(&key, &last_key, sizeof key) == 0) {
    *m = last_maps;
    p->tma = last_ok;
    return;
  }
  std::memset(m, 0, sizeof *m);
  static const bool env = !mk::env_is("MK_RING_TMA", '0');
  bool ok = env && p->vec && p->hd == 128 && p->vhd == 128;
  for (int r = 0; ok && r < p->ranks; ++r) {
    if (p->me >= 0 && r != p->me) continue;
    const RankPtrs& rk = p->rk[r];
    const void* ks[3] = {rk.k, rk.kb[0], rk.kb[1]};
    const void* vs[3] = {rk.v, rk.vb[0], rk.vb[1]};
    for (int b = 0; ok && b < 3; ++b) {
      if (ks[b] != nullptr) ok = fwg::tile_map(m->k[r][b], ks[b], p->k_stride);
      if (ok && vs[b] != nullptr) ok = fwg::tile_map(m->v[r][b], vs[b], p->v_stride);
    }
  }
  p->tma = ok;
  last_key = key;
  last_maps = *m;
  last_ok = ok;
}

// launch_ring launches kf (ring_kernel, or ring_wg with p->tma and its maps
// filled here) cooperatively, or as a plain launch for one step (mode 1).
int launch_ring(KernelFn kf, bool wg, bool coop, int64_t grid, size_t smem, cudaStream_t st, Params* p) {
  RingMaps m;
  if (wg) ring_maps(p, &m);
  else p->tma = 0;
  void* args[] = {p, &m};  // ring_kernel reads the first only
  const dim3 g((unsigned)grid), b(wg ? fwg::kThreadsWG : kThreads);
  if (coop) MK_CUDA(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kf), g, b, args, smem, st));
  else MK_CUDA(cudaLaunchKernel(reinterpret_cast<const void*>(kf), g, b, args, smem, st));
  return MK_OK;
}

// wg_prepare is prepare for ring_wg (win: its sliding-window form).
int wg_prepare(bool win, int* coresident) {
  return prepare(ring_wg_kernel(win), fwg::kSmem, coresident, fwg::kThreadsWG);
}

// pick_kernel picks a launch's kernel — ring_wg when wg, else ring_kernel's
// gather kind or its modes 0 / 1 — sets its shared-memory attribute once
// and returns in *cores how many of its CTAs are co-resident.
int pick_kernel(const char* fn, const Shape& sh, int head_dim, int v_head_dim, bool wg, bool gather, bool win,
                KernelFn* kf, size_t* smem, int* cores) {
  *smem = fwg::kSmem;
  *kf = wg ? ring_wg_kernel(win) : kernel_for(sh, gather, smem);
  MK_ARG(*kf != nullptr, "%s: no kernel for head dims %d/%d", fn, head_dim, v_head_dim);
  return wg ? wg_prepare(win, cores) : prepare(*kf, *smem, cores);
}

// ring_launch is mk_ring_attn_bf16 (gather 0) and mk_ring_attn_gather_bf16
// (gather 1): the emulated ring in one cooperative launch.
int32_t ring_launch(const char* fn, int gather, uint64_t stream, int32_t ranks, const uint64_t* ptrs,
                    const int32_t* qspans, const int32_t* kvspans, int32_t out_dtype, int32_t heads, int32_t kv_heads,
                    int32_t head_dim, int32_t v_head_dim, uint32_t scale_bits, int32_t window, uint64_t sinks,
                    int32_t causal, uint64_t ws, uint64_t ws_bytes, int64_t timeout_ns, int32_t fault_rank) {
  const float scale = mk::float_from_bits(scale_bits);
  int rc = check_common(fn, ranks, ptrs, qspans, kvspans, out_dtype, heads, kv_heads, head_dim, v_head_dim, scale,
                        window, causal, ws, -1, gather);
  if (rc != MK_OK) return rc;
  MK_ARG(timeout_ns > 0, "%s: timeout_ns=%lld must be > 0", fn, (long long)timeout_ns);
  MK_ARG(fault_rank >= -1 && fault_rank < ranks, "%s: fault_rank=%d must be -1 or a rank", fn, fault_rank);
  Shape sh;
  shape_for(heads, kv_heads, head_dim, v_head_dim, &sh);
  Layout lo;
  layout_for(ranks, qspans, heads, sh, v_head_dim, &lo);
  const uint64_t need = (uint64_t)(lo.ring_bytes > lo.sep_bytes ? lo.ring_bytes : lo.sep_bytes);
  MK_ARG(ws_bytes >= need, "%s: workspace of %llu bytes, %llu needed", fn, (unsigned long long)ws_bytes,
         (unsigned long long)need);
  Params p;
  fill_params(&p, ranks, ptrs, qspans, kvspans, out_dtype, heads, kv_heads, head_dim, v_head_dim, scale, window, sinks,
              causal, ws, sh, lo);
  // The gather ring at head dims 128 runs on the wgmma CTA (ring_wg), and
  // so does one rank alone (mode 2 without chunks to wait for).
  const bool wg = (gather || ranks == 1) && wg_fits(p, ranks, head_dim, v_head_dim, out_dtype == MK_DTYPE_F32);
  KernelFn kf = nullptr;
  size_t smem = 0;
  int cores = 0;
  rc = pick_kernel(fn, sh, head_dim, v_head_dim, wg, gather != 0, p.window > 0, &kf, &smem, &cores);
  if (rc != MK_OK) return rc;
  p.mode = gather || wg ? 2 : 0;
  p.gcap = 0;
  for (int r = 0; r < ranks; ++r) {
    const int rows = (kvspans[4 * r + 1] - kvspans[4 * r]) + (kvspans[4 * r + 3] - kvspans[4 * r + 2]);
    p.gcap = rows > p.gcap ? rows : p.gcap;
  }
  // Comm CTAs per rank. Gather mode: a slot waits for each chunk in turn,
  // so the hops must keep ahead of the first slots; they join the compute
  // once they have sent everything. Measured at 16k tokens (bench ring,
  // MK_RING_NCOMM; H200, twenty-ninth pass, two rounds): 8 per rank
  // against 4 gave 3.77 against 3.84–3.94 ms at R = 2, 3.91–4.04 against
  // 4.07–4.09 at R = 4, 4.24–4.37 against 4.36–4.50 at R = 8; 2 and 1
  // per rank were 4–23 % slower than 4 (one rank alone: 3.65–3.69). At
  // most half the co-resident CTAs copy (a GPU with fewer SMs gets fewer).
  const int gcomm = cores / (2 * ranks) < 1 ? 1 : cores / (2 * ranks) > kGatherComm ? kGatherComm : cores / (2 * ranks);
  p.ncomm = ranks == 1 ? 0 : gather ? gcomm : (4 / ranks > 1 ? 4 / ranks : 1);
  static const int ncomm_env = [] {  // MK_RING_NCOMM=1..16: comm CTAs per rank (measurement; at most the grid)
    const char* v = getenv("MK_RING_NCOMM");
    const int n = v ? atoi(v) : 0;
    return n >= 1 && n <= kMaxComm ? n : 0;
  }();
  if (ranks > 1 && ncomm_env > 0) p.ncomm = ncomm_env;
  // MK_RING_NOCOPY=1 (a measurement only: the gather slots keep whatever
  // the previous call left, so results are wrong unless an identical call
  // ran before): the comm CTAs signal each hop without copying, which
  // separates what the emulated hops' copies cost from the ring's
  // structure (steps, spans, waits).
  static const int nocopy_env = [] {
    const char* v = getenv("MK_RING_NOCOPY");
    return v && v[0] == '1' ? 1 : 0;
  }();
  p.nocopy = nocopy_env;

  p.fault_rank = fault_rank;
  p.apply_sinks = 1;
  p.timeout_ns = timeout_ns;
  if (wg) wg_layout(&p, ranks, qspans);
  int64_t slots = 0;
  for (int r = 0; r < ranks; ++r) slots += rank_items(p, lo, wg, r);
  const int comm = p.ncomm * ranks;
  MK_ARG(comm < cores, "%s: %d communication CTAs leave no room for compute (%d co-resident)", fn, comm, cores);
  int64_t grid = comm + (slots > 0 ? slots : 1);
  if (grid > cores) grid = cores;
  cudaStream_t st = mk::as_stream(stream);
  MK_CUDA(cudaMemsetAsync(p.ctl, 0, kStateOff - kCtlOff + lo.done_bytes, st));
  return launch_ring(kf, wg, true, grid, smem, st, &p);
}

}  // namespace

extern "C" MK_API int32_t mk_ring_attn_bf16(uint64_t stream, int32_t ranks, const uint64_t* ptrs,
                                            const int32_t* qspans, const int32_t* kvspans, int32_t out_dtype,
                                            int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim,
                                            uint32_t scale_bits, int32_t window, uint64_t sinks, int32_t causal,
                                            uint64_t ws, uint64_t ws_bytes, int64_t timeout_ns, int32_t fault_rank) {
  MK_THREAD("mk_ring_attn_bf16");
  return ring_launch("mk_ring_attn_bf16", 0, stream, ranks, ptrs, qspans, kvspans, out_dtype, heads, kv_heads,
                     head_dim, v_head_dim, scale_bits, window, sinks, causal, ws, ws_bytes, timeout_ns, fault_rank);
}

extern "C" MK_API int32_t mk_ring_attn_gather_bf16(uint64_t stream, int32_t ranks, const uint64_t* ptrs,
                                                   const int32_t* qspans, const int32_t* kvspans, int32_t out_dtype,
                                                   int32_t heads, int32_t kv_heads, int32_t head_dim,
                                                   int32_t v_head_dim, uint32_t scale_bits, int32_t window,
                                                   uint64_t sinks, int32_t causal, uint64_t ws, uint64_t ws_bytes,
                                                   int64_t timeout_ns, int32_t fault_rank) {
  MK_THREAD("mk_ring_attn_gather_bf16");
  return ring_launch("mk_ring_attn_gather_bf16", 1, stream, ranks, ptrs, qspans, kvspans, out_dtype, heads, kv_heads,
                     head_dim, v_head_dim, scale_bits, window, sinks, causal, ws, ws_bytes, timeout_ns, fault_rank);
}

namespace {

// rank_launch is mk_ring_attn_rank (gather 0: the two receive buffers,
// ring_kernel's mode 0) and mk_ring_attn_rank_gather (gather 1: mode 2,
// ring_wg at head dims 128/128, else ring_kernel's gather kind).
int32_t rank_launch(const char* fn, int gather, uint64_t stream, int32_t ranks, int32_t me, const uint64_t* ptrs,
                    const int32_t* qspans, const int32_t* kvspans, int32_t out_dtype, int32_t heads, int32_t kv_heads,
                    int32_t head_dim, int32_t v_head_dim, uint32_t scale_bits, int32_t window, uint64_t sinks,
                    int32_t causal, const uint64_t* wss, uint64_t ws_bytes, int32_t ctas, int64_t timeout_ns,
                    int32_t epoch) {
  MK_ARG(ranks >= 1 && ranks <= kMaxRanks && me >= 0 && me < ranks, "%s: me=%d of %d ranks", fn, me, ranks);
  MK_ARG(wss != nullptr, "%s: wss must be non-null", fn);
  const int prev = (me + ranks - 1) % ranks, next = (me + 1) % ranks;
  for (int r : {me, prev, next})
    MK_ARG(wss[r] != 0 && wss[r] % 16 == 0, "%s: the workspace of rank %d must be non-null and 16-byte aligned", fn,
           r);
  const float scale = mk::float_from_bits(scale_bits);
  int rc = check_common(fn, ranks, ptrs, qspans, kvspans, out_dtype, heads, kv_heads, head_dim, v_head_dim, scale,
                        window, causal, wss[me], me, gather);
  if (rc != MK_OK) return rc;
  MK_ARG(timeout_ns > 0, "%s: timeout_ns=%lld must be > 0", fn, (long long)timeout_ns);
  MK_ARG(epoch >= 1 && epoch < INT32_MAX / kMaxRanks, "%s: epoch=%d must be in [1, %d)", fn, epoch,
         INT32_MAX / kMaxRanks);
  Shape sh;
  shape_for(heads, kv_heads, head_dim, v_head_dim, &sh);
  Layout lo;
  layout_for(ranks, qspans, heads, sh, v_head_dim, &lo);
  const uint64_t need = (uint64_t)(kStateOff + lo.done_bytes + lo.state_bytes[me]);
  MK_ARG(ws_bytes >= need, "%s: workspace of %llu bytes, %llu needed", fn, (unsigned long long)ws_bytes,
         (unsigned long long)need);

  Params p;
  fill_params(&p, ranks, ptrs, qspans, kvspans, out_dtype, heads, kv_heads, head_dim, v_head_dim, scale, window, sinks,
              causal, wss[me], sh, lo, me);
  const bool wg = gather && wg_fits(p, ranks, head_dim, v_head_dim, out_dtype == MK_DTYPE_F32);
  KernelFn kf = nullptr;
  size_t smem = 0;
  int cores = 0;
  rc = pick_kernel(fn, sh, head_dim, v_head_dim, wg, gather != 0, p.window > 0, &kf, &smem, &cores);
  if (rc != MK_OK) return rc;
  MK_ARG(ctas >= 0 && ctas <= cores, "%s: ctas=%d, at most %d co-resident (0: all)", fn, ctas, cores);
  p.mode = gather ? 2 : 0;
  // Comm CTAs a rank: a function of ranks alone, since a receiver waits for
  // every part its sender has. Gather: 4 (one process a GPU, the hops
  // over NVLink: −1.4 / −3.8 % against flash with every key local at 16k
  // over two GPUs, twenty-ninth pass).
  p.ncomm = ranks == 1 ? 0 : gather ? kLocalComm : (4 / ranks > 1 ? 4 / ranks : 1);
  p.gcap = 0;
  for (int r = 0; r < ranks; ++r) {
    const int rows = (kvspans[4 * r + 1] - kvspans[4 * r]) + (kvspans[4 * r + 3] - kvspans[4 * r + 2]);
    p.gcap = rows > p.gcap ? rows : p.gcap;
  }
  p.apply_sinks = 1;
  p.timeout_ns = timeout_ns;
  p.epoch = epoch;
  p.rem_in = reinterpret_cast<int*>(wss[me] + kRemoteOff);
  p.rem_next = reinterpret_cast<int*>(wss[next] + kRemoteOff);
  p.rem_prev = reinterpret_cast<int*>(wss[prev] + kRemoteOff);
  const int cap = ctas > 0 ? ctas : cores;
  MK_ARG(p.ncomm < cap, "%s: %d communication CTAs leave no room for compute (%d CTAs)", fn, p.ncomm, cap);
  if (wg) wg_layout(&p, ranks, qspans);
  const int64_t items = rank_items(p, lo, wg, me);
  int64_t grid = p.ncomm + (items > 0 ? items : 1);
  if (grid > cap) grid = cap;
  cudaStream_t st = mk::as_stream(stream);
  // Only what this rank's own CTAs touch is zeroed (queues, consumed
  // counters, the exit count, slot flags); the remote flags are epochs,
  // never reset here.
  MK_CUDA(cudaMemsetAsync(p.ctl, 0, kCtlWords * sizeof(int), st));
  MK_CUDA(cudaMemsetAsync(p.done, 0, lo.done_bytes, st));
  return launch_ring(kf, wg, true, grid, smem, st, &p);
}

}  // namespace

extern "C" MK_API int32_t mk_ring_attn_rank(uint64_t stream, int32_t ranks, int32_t me, const uint64_t* ptrs,
                                            const int32_t* qspans, const int32_t* kvspans, int32_t out_dtype,
                                            int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim,
                                            uint32_t scale_bits, int32_t window, uint64_t sinks, int32_t causal,
                                            const uint64_t* wss, uint64_t ws_bytes, int32_t ctas, int64_t timeout_ns,
                                            int32_t epoch) {
  MK_THREAD("mk_ring_attn_rank");
  return rank_launch("mk_ring_attn_rank", 0, stream, ranks, me, ptrs, qspans, kvspans, out_dtype, heads, kv_heads,
                     head_dim, v_head_dim, scale_bits, window, sinks, causal, wss, ws_bytes, ctas, timeout_ns, epoch);
}

extern "C" MK_API int32_t mk_ring_attn_rank_gather(uint64_t stream, int32_t ranks, int32_t me, const uint64_t* ptrs,
                                                   const int32_t* qspans, const int32_t* kvspans, int32_t out_dtype,
                                                   int32_t heads, int32_t kv_heads, int32_t head_dim,
                                                   int32_t v_head_dim, uint32_t scale_bits, int32_t window,
                                                   uint64_t sinks, int32_t causal, const uint64_t* wss,
                                                   uint64_t ws_bytes, int32_t ctas, int64_t timeout_ns,
                                                   int32_t epoch) {
  MK_THREAD("mk_ring_attn_rank_gather");
  return rank_launch("mk_ring_attn_rank_gather", 1, stream, ranks, me, ptrs, qspans, kvspans, out_dtype, heads,
                     kv_heads, head_dim, v_head_dim, scale_bits, window, sinks, causal, wss, ws_bytes, ctas,
                     timeout_ns, epoch);
}

extern "C" MK_API int32_t mk_ring_separate_bf16(uint64_t stream, int32_t ranks, const uint64_t* ptrs,
                                                const int32_t* qspans, const int32_t* kvspans, int32_t out_dtype,
                                                int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim,
                                                uint32_t scale_bits, int32_t window, uint64_t sinks, int32_t causal,
                                                uint64_t ws, uint64_t ws_bytes) {
  MK_THREAD("mk_ring_separate_bf16");
  const float scale = mk::float_from_bits(scale_bits);
  int rc = check_common("mk_ring_separate_bf16", ranks, ptrs, qspans, kvspans, out_dtype, heads, kv_heads, head_dim,
                        v_head_dim, scale, window, causal, ws);
  if (rc != MK_OK) return rc;
  Shape sh;
  shape_for(heads, kv_heads, head_dim, v_head_dim, &sh);
  Layout lo;
  layout_for(ranks, qspans, heads, sh, v_head_dim, &lo);
  const uint64_t need = (uint64_t)(lo.ring_bytes > lo.sep_bytes ? lo.ring_bytes : lo.sep_bytes);
  MK_ARG(ws_bytes >= need, "mk_ring_separate_bf16: workspace of %llu bytes, %llu needed",
         (unsigned long long)ws_bytes, (unsigned long long)need);
  Params p;
  fill_params(&p, ranks, ptrs, qspans, kvspans, out_dtype, heads, kv_heads, head_dim, v_head_dim, scale, window, sinks,
              causal, ws, sh, lo);
  // Each step on the same kernel as the ring's: ring_wg at head dims 128
  // (its outputs here are the workspace's f32 partials).
  const bool wg = wg_fits(p, 0, head_dim, v_head_dim, true);
  KernelFn fn = nullptr;
  size_t smem = 0;
  int cores = 0;
  rc = pick_kernel("mk_ring_separate_bf16", sh, head_dim, v_head_dim, wg, false, p.window > 0, &fn, &smem, &cores);
  if (rc != MK_OK) return rc;
  p.mode = 1;
  p.apply_sinks = 0;
  // Workspace regions: acc o, acc l, partial o, partial l (each rank's rows in order).
  MergeParams mp;
  std::memset(&mp, 0, sizeof mp);
  char* base = reinterpret_cast<char*>(ws) + kStateOff;
  int64_t pairs = 0;
  for (int r = 0; r < ranks; ++r) pairs += lo.qrows[r] * heads;
  float* acc_o = reinterpret_cast<float*>(base);
  float* acc_l = acc_o + pairs * v_head_dim;
  float* par_o = acc_l + pairs;
  float* par_l = par_o + pairs * v_head_dim;
  void* outs[kMaxRanks];
  float* lses[kMaxRanks];
  int64_t off = 0;
  for (int r = 0; r < ranks; ++r) {
    const uint64_t* pr = ptrs + (int64_t)r * MK_RING_NPTR;
    outs[r] = reinterpret_cast<void*>(pr[MK_RING_OUT]);
    lses[r] = mk::dev<float>(pr[MK_RING_LSE]);
    mp.acc_o[r] = acc_o + off * v_head_dim;
    mp.acc_l[r] = acc_l + off;
    mp.po[r] = par_o + off * v_head_dim;
    mp.pl[r] = par_l + off;
    mp.out[r] = outs[r];
    mp.lse[r] = lses[r];
    mp.row0[r] = off;
    off += lo.qrows[r] * heads;
  }
  mp.row0[ranks] = off;
  mp.sinks = p.sinks;
  mp.heads = heads;
  mp.vhd = v_head_dim;
  mp.out_f32 = out_dtype == MK_DTYPE_F32;

  if (wg) wg_layout(&p, ranks, qspans);
  int64_t slots = 0;
  for (int r = 0; r < ranks; ++r) slots += rank_items(p, lo, wg, r);
  int64_t grid = slots > 0 ? slots : 1;
  if (grid > cores) grid = cores;
  cudaStream_t st = mk::as_stream(stream);
  MK_CUDA(cudaMemsetAsync(p.ctl, 0, kCtlWords * sizeof(int), st));
  const int64_t warps = off, mblocks = (warps * 32 + 255) / 256;
  for (int s = 0; s < ranks; ++s) {
    // Copies for step s+1: rank r's chunk of step s to rank r+1's buffer (s+1)%2.
    if (s + 1 < ranks) {
      for (int r = 0; r < ranks; ++r) {
        const int dst = (r + 1) % ranks;
        int r0, r1;  // the rows that go on, as the ring's comm CTAs copy them (hop_rows)
        hop_rows(p.qs, p.ks, ranks, p.causal, r, s, &r0, &r1);
        const int64_t rows = r1 - r0, ko = (int64_t)r0 * p.k_stride, vo = (int64_t)r0 * p.v_stride;
        if (rows == 0) continue;
        const bf16* ks = (s == 0 ? p.rk[r].k : p.rk[r].kb[s & 1]) + ko;
        const bf16* vs = (s == 0 ? p.rk[r].v : p.rk[r].vb[s & 1]) + vo;
        MK_CUDA(cudaMemcpyAsync(p.rk[dst].kb[(s + 1) & 1] + ko, ks, rows * p.k_stride * 2, cudaMemcpyDeviceToDevice, st));
        MK_CUDA(cudaMemcpyAsync(p.rk[dst].vb[(s + 1) & 1] + vo, vs, rows * p.v_stride * 2, cudaMemcpyDeviceToDevice, st));
      }
    }
    // Step s's attention: into the accumulators at step 0, else the partials.
    Params q = p;
    q.step = s;
    for (int r = 0; r < ranks; ++r) {
      q.rk[r].out = s == 0 ? mp.acc_o[r] : const_cast<float*>(mp.po[r]);
      q.rk[r].lse = s == 0 ? mp.acc_l[r] : const_cast<float*>(mp.pl[r]);
    }
    rc = launch_ring(fn, wg, false, grid, smem, st, &q);
    if (rc != MK_OK) return rc;
    MK_LAUNCHED(wg ? "ring_wg (one step)" : "ring_kernel (one step)");
    if (s == 0 && ranks > 1) continue;
    MergeParams m = mp;
    m.final_step = s == ranks - 1;
    if (s == 0)  // ranks == 1: only the finish
      for (int r = 0; r < ranks; ++r) m.po[r] = m.pl[r] = nullptr;
    if (warps > 0) {
      merge_kernel<<<dim3((unsigned)mblocks), 256, 0, st>>>(m, ranks);
      MK_LAUNCHED("merge_kernel");
    }
  }
  return MK_OK;
}

extern "C" MK_API int32_t mk_ring_check(uint64_t ws, int32_t* rec) {
  MK_THREAD("mk_ring_check");
  MK_ARG(ws != 0 && rec != nullptr, "mk_ring_check: ws and rec must be non-null");
  MK_CUDA(cudaMemcpy(rec, reinterpret_cast<void*>(ws), MK_RING_ERR_WORDS * sizeof(int32_t), cudaMemcpyDeviceToHost));
  if (rec[MK_RING_ERR_SET] != 0) MK_CUDA(cudaMemset(reinterpret_cast<void*>(ws), 0, MK_RING_ERR_WORDS * sizeof(int32_t)));
  return MK_OK;
}
