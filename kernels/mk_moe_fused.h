/* mk_moe_fused.h — the part of the libmkernel C ABI for the persistent fused
 * MoE layer over emulated expert-parallel ranks (moe_fused.cu).
 * Included by mkernel.h; the rules of mkernel.h hold. */
#ifndef MK_MOE_FUSED_H
#define MK_MOE_FUSED_H
#include "mkernel.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The most ranks one fused launch takes, and the most expert slots a rank holds. */
#define MK_MOE_FUSED_MAX_RANKS 8
#define MK_MOE_FUSED_MAX_SLOTS 4096

/* Per-rank device pointers in the ptrs array, in this order (MK_MOE_FUSED_NPTR each). */
enum {
  MK_MOE_FUSED_X = 0,    /* [T_r, H] bf16: the rank's tokens */
  MK_MOE_FUSED_IDS,      /* [T_r, K] int32: routed experts (global ids, from mk_moe_route; written by the
                            call when it routes: mk_moe_fused_router) */
  MK_MOE_FUSED_WEIGHTS,  /* [T_r, K] f32: their weights (likewise) */
  MK_MOE_FUSED_OUT,      /* [T_r, H] f32: the layer's output (fully written) */
  MK_MOE_FUSED_SHARED,   /* [T_r, H] f32 or 0: a dense (shared-expert) output added to out */
  MK_MOE_FUSED_GATE_UP,  /* [slots_r, 2I, H] bf16: per local slot gate rows then up rows */
  MK_MOE_FUSED_DOWN,     /* [slots_r, H, I] bf16 */
  MK_MOE_FUSED_COUNTS,   /* [slots_r] int64 or 0: += rows each local slot received */
  MK_MOE_FUSED_WS,       /* the rank's workspace (mk_moe_fused_workspace's rank_bytes[r]) */
  MK_MOE_FUSED_NPTR
};

/* The error record's words (int32) at the start of the control workspace,
 * read by mk_moe_fused_check. */
enum {
  MK_MOE_FUSED_ERR_SET = 0, /* 1 when a wait timed out */
  MK_MOE_FUSED_ERR_RANK,    /* the rank whose data was waited for (the tile's or token's rank) */
  MK_MOE_FUSED_ERR_ROLE,    /* 1 compute GEMM1 (waited for dispatch), 2 compute GEMM2 (for GEMM1), 3 combine (for GEMM2),
                               rank-local only: 4 plan (for a source's routing), 5 dispatch or combine (for a
                               destination's plan); 6 capacity: the rank (ERR_RANK) was routed more rows than its
                               workspace holds (max_rows), nothing was computed; 7 compute (the wgmma tiles):
                               a wait inside the CTA's own stage or task ring (the tile's rank and row tile, or -1) */
  MK_MOE_FUSED_ERR_TILE,    /* row tile (roles 1, 2), token (role 3), -1 (roles 4, 5, 6) */
  MK_MOE_FUSED_ERR_SEEN,    /* the counter's value when it gave up (role 6: the rows the rank needed, padded; role 7: 0) */
  MK_MOE_FUSED_ERR_WANT,    /* the value it waited for (role 6: the rows its workspace holds) */
  MK_MOE_FUSED_ERR_WORDS = 8
};
/* The task trace (diagnostics; both persistent kernels). int32 word
 * MK_MOE_FUSED_TRACE_CAP of the control workspace is the room for records
 * that the caller set (0, the default: no trace); word
 * MK_MOE_FUSED_TRACE_COUNT is how many records the last launch wanted to
 * write (the plan zeroes it; it may exceed the room). Records start at
 * byte MK_MOE_FUSED_TRACE_OFFSET, MK_MOE_FUSED_TRACE_WORDS uint64 each
 * (times are %globaltimer, ns):
 *   [0] task index (bits 0-31) | kind << 32 | SM << 40 (8 bits) | block
 *       << 48; kind 0: a CTA (the task index is the block), 1 GEMM1,
 *       2 GEMM2, 3 combine, 4 dispatch
 *   [1] when the producer took the task from the queue (kind 0: entry)
 *   [2] when its inputs were there (the producer's wait ended)
 *   [3] when the consumers started it (kind 0: set-up done); the mma.sync
 *       tiles' kernel, whose every thread takes every role: [2] again
 *   [4] when they finished it, signals included (kind 0: exit)
 *   [5] GEMM: row tile << 32 | column block, and for a split reduction
 *       split << 16 | splits << 24 besides; combine and dispatch: the
 *       first token; kind 0: the CTA's tasks
 * The room must fit the control workspace: ctl_bytes >= OFFSET + room ×
 * WORDS × 8. */
enum {
  MK_MOE_FUSED_TRACE_CAP = 8,
  MK_MOE_FUSED_TRACE_COUNT = 18,
  MK_MOE_FUSED_TRACE_OFFSET = 256,
  MK_MOE_FUSED_TRACE_WORDS = 6
};

/* The router of a fused call (ABI 29; a null pointer: ids and weights are
 * inputs). With it the call routes every rank's tokens itself with
 * mk_moe_route (before its plan, on the same stream) from logits[r] (device
 * [T_r, e] f32) with the score bias (device [e] f32 or 0), flags (MK_MOE_*),
 * num_groups, topk_groups and the scaling factor's bits of mk_moe_route,
 * writing each rank's ids and weights (ptrs' IDS and WEIGHTS). */
typedef struct {
  uint64_t logits[MK_MOE_FUSED_MAX_RANKS];
  uint64_t score_bias;
  int32_t flags, num_groups, topk_groups;
  uint32_t scaling_bits;
} mk_moe_fused_router;

/* Workspace sizes for R ranks with tokens[r] tokens and slots[r] local expert
 * slots each (host arrays), top-k over e experts, hidden h, intermediate i:
 * ctl_bytes for the shared control workspace, rank_bytes[r] (host array
 * [ranks]) for rank r's own workspace (receive rows, activations, returned
 * expert outputs, flags; sized for the worst case, every row to one rank),
 * and the row tile every (rank, slot) is padded to (tile_m). with_separate
 * != 0 adds room for mk_moe_fused_separate. tile: 0 picks the row tile from
 * the rows per active slot; 16 or 64 (mma.sync tiles) or 128 (the sm_90a
 * wgmma tiles: 128×256, TMA, a producer warpgroup, 384-thread CTAs) forces it.
 * max_rows > 0 sizes each rank's receive side for at most max_rows (token, k)
 * rows (plus tile padding) instead of every rank's rows (0: the worst case,
 * which at 8 ranks is 8× the balanced share); a layer that routes more to a
 * rank than its workspace holds computes nothing and sets the error record
 * (role 6). Every call on one set of workspaces must pass the same tile and
 * max_rows. */
MK_API int32_t mk_moe_fused_workspace(int32_t ranks, const int64_t* tokens, const int32_t* slots, int32_t k,
                                      int32_t e, int64_t h, int64_t i, int32_t with_separate, uint64_t* ctl_bytes,
                                      uint64_t* rank_bytes, int32_t* tile_m, int32_t tile, int64_t max_rows);

/* One MoE layer's routed experts over `ranks` emulated expert-parallel ranks
 * (1..8): a small plan launch (counts per (rank, slot), row offsets padded to
 * the row tile, every (token, k)'s destination row; expert-load counters),
 * then ONE persistent cooperative launch whose CTAs take roles from queues:
 *   dispatch: copy x_r[t] to rank d's receive row of each (t, k) routed to
 *             another rank d, +1 on that row tile's arrival counter (release);
 *             rows routed to their own rank are not copied (GEMM1 reads them
 *             from x_r), and with one rank nothing is dispatched;
 *   compute:  GEMM1 (+ SwiGLU) of a (row tile, column block) once the tile's
 *             remote rows have all arrived; GEMM2 of a (row tile, column block) once
 *             every GEMM1 block of the tile is done; outputs written back to
 *             the source rank's return rows (f32; bf16 with wgmma tiles and
 *             the environment's MK_MOE_FUSED_RET_BF16=1), +1 per row on its
 *             token counter;
 *   combine:  out_r[t] = Σ_k w[t,k] · y[t,k] in k order (+ shared_r[t]) once
 *             the token's counter is full: deterministic. At decode sizes
 *             (≤ 4 tokens a rank, 16-row tiles; MK_MOE_FUSED_FOLD=0: off)
 *             the GEMM2 task that returns a token's last row of a column
 *             block sums that block instead, in the same order.
 * place: device int32 [ranks*e]: for source rank r and expert x, (d << 16) |
 * slot, the (rank, local slot) that serves r's rows of x (Go picks among
 * replicas), or -1 (such rows are dropped: contribute 0). act_kind:
 * MK_MOE_SWIGLU or MK_MOE_SWIGLU_CLAMPED (alpha, limit as in mk_moe_experts).
 * ctas: CTAs of the persistent launch (0: all co-resident ones);
 * dispatch_ctas: CTAs that start with the dispatch role (0: all), the others
 * start on compute; every CTA joins the compute and combine queue when the
 * dispatch queue is empty. timeout_ns > 0 bounds every wait; a timeout writes
 * the error record (rank, role, tile) once and ends the kernel
 * (mk_moe_fused_check reads it). fault_rank >= 0 disables that source rank's
 * dispatch (testing the watchdog); fault_rank == ranks makes the first stage
 * that a wgmma tiles' CTA fills never get its weights (testing the watchdog
 * of the CTA's own rings: record role 7, or the role of a wait on that
 * task, whichever gives up first); -1 otherwise. tokens, slots: host [ranks].
 * H and I multiples of 8. tile and max_rows as for mk_moe_fused_workspace; a
 * set error record (an unchecked earlier failure, or this call's plan over
 * capacity) makes the persistent launch do nothing. Asynchronous on stream. */
MK_API int32_t mk_moe_fused(uint64_t stream, int32_t ranks, const uint64_t* ptrs, const int64_t* tokens,
                            const int32_t* slots, int32_t k, int32_t e, int64_t h, int64_t i, uint64_t place,
                            int32_t act_kind, uint32_t alpha_bits, uint32_t limit_bits, uint64_t ctl,
                            uint64_t ctl_bytes, const uint64_t* rank_bytes, int32_t ctas, int32_t dispatch_ctas,
                            int64_t timeout_ns, int32_t fault_rank, int32_t tile, int64_t max_rows,
                            const mk_moe_fused_router* router);

/* The same result from separate launches (the baseline): the plan launch, a
 * dispatch launch, mk_moe_experts on each rank's receive rows (align, grouped
 * GEMM1, grouped GEMM2, its row combine), and a combine launch. Needs
 * workspaces sized with with_separate. Counters are not updated. */
MK_API int32_t mk_moe_fused_separate(uint64_t stream, int32_t ranks, const uint64_t* ptrs, const int64_t* tokens,
                                     const int32_t* slots, int32_t k, int32_t e, int64_t h, int64_t i,
                                     uint64_t place, int32_t act_kind, uint32_t alpha_bits, uint32_t limit_bits,
                                     uint64_t ctl, uint64_t ctl_bytes, const uint64_t* rank_bytes, int32_t tile,
                                     int64_t max_rows, const mk_moe_fused_router* router);

/* The same layer as mk_moe_fused for ONE rank `me` of `ranks` whose peers
 * run their own mk_moe_fused_rank (other processes, one per GPU or several
 * on one GPU, or other streams): every rank calls it with the same tokens,
 * slots, k, e, h, i, place contents and epoch. ptrs: [ranks * MK_MOE_FUSED_NPTR]
 * as for mk_moe_fused, but only me's entries are read in full; a peer's
 * entry needs only MK_MOE_FUSED_WS, the peer's workspace as mapped in this
 * process (mk_ipc_open), and rank_bytes[r] its size. The plan launch pushes
 * me's ids into every rank's workspace and raises a flag there (system
 * scope), waits for every source's ids, plans me's tiles, writes each
 * source's destination rows into that source's workspace and raises a flag
 * there; the persistent launch then runs only me's dispatch (stores into the
 * peers' receive rows and counters), me's GEMM tasks (outputs stored into
 * the sources' return rows) and me's combine. Flags are epochs: epoch >= 1,
 * the same on every rank for one layer call and +1 per call on a set of
 * workspaces; before the first call every rank's workspace must be zeroed
 * (or 0xff-filled). Every wait is bounded by timeout_ns (record roles 4 and
 * 5 name a peer that did not arrive); ctl is this process's own. The
 * peers' launches must be able to run at the same time as this one (other
 * GPUs, or time-sliced contexts on one GPU). A router routes me's tokens
 * only (router->logits[me]; the others are not read). Asynchronous on stream. */
MK_API int32_t mk_moe_fused_rank(uint64_t stream, int32_t ranks, int32_t me, const uint64_t* ptrs,
                                 const int64_t* tokens, const int32_t* slots, int32_t k, int32_t e, int64_t h,
                                 int64_t i, uint64_t place, int32_t act_kind, uint32_t alpha_bits,
                                 uint32_t limit_bits, uint64_t ctl, uint64_t ctl_bytes, const uint64_t* rank_bytes,
                                 int32_t ctas, int32_t dispatch_ctas, int64_t timeout_ns, int32_t epoch,
                                 int32_t tile, int64_t max_rows, const mk_moe_fused_router* router);

/* Synchronously (after all earlier work) copies ctl's error record into rec
 * [MK_MOE_FUSED_ERR_WORDS] and clears it on the device. */
MK_API int32_t mk_moe_fused_check(uint64_t ctl, int32_t* rec);

#ifdef __cplusplus
}
#endif
#endif /* MK_MOE_FUSED_H */
