/* mk_ring.h — the part of the libmkernel C ABI for ring attention (ring.cu).
 * Included by mkernel.h; the rules of mkernel.h hold. */
#ifndef MK_RING_H
#define MK_RING_H
#include "mkernel.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The most ranks one ring launch takes. */
#define MK_RING_MAX_RANKS 8
/* Per-rank device pointers in the ptrs array, in this order (MK_RING_NPTR each). */
enum {
  MK_RING_Q = 0,   /* [Lq_r, heads*head_dim] bf16: the rank's queries */
  MK_RING_K,       /* [Lk_r, kv_heads*head_dim] bf16: the rank's own keys */
  MK_RING_V,       /* [Lk_r, kv_heads*v_head_dim] bf16: its own values */
  MK_RING_KBUF0,   /* [max Lk, kv_heads*head_dim] bf16: receive buffers (double) */
  MK_RING_KBUF1,
  MK_RING_VBUF0,   /* [max Lk, kv_heads*v_head_dim] bf16 */
  MK_RING_VBUF1,
  MK_RING_OUT,     /* [Lq_r, heads*v_head_dim] bf16 or f32 by out_dtype */
  MK_RING_LSE,     /* [Lq_r, heads] f32 or 0: natural-log log-sum-exp of the scores (sinks excluded) */
  MK_RING_NPTR
};
/* The error record's words (int32), read by mk_ring_check. */
enum {
  MK_RING_ERR_SET = 0, /* 1 when a wait timed out */
  MK_RING_ERR_RANK,    /* the waiting rank */
  MK_RING_ERR_ROLE,    /* 0 compute, 1 communication */
  MK_RING_ERR_STEP,    /* ring step */
  MK_RING_ERR_TILE,    /* compute: the query tile's slot; comm: the comm CTA's part */
  MK_RING_ERR_WHAT,    /* waited for: 0 a chunk to arrive, 1 a buffer's release, 2 the slot's previous step */
  MK_RING_ERR_SEEN,    /* the flag's value when it gave up */
  MK_RING_ERR_WANT,    /* the value it waited for */
  MK_RING_ERR_WORDS
};

/* Ring attention over `ranks` emulated context-parallel ranks (1..8) in ONE
 * persistent cooperative launch. Rank r holds queries at the positions of its
 * two spans qspans[r] = {lo0, hi0, lo1, hi1} (rows in that order) and
 * keys/values at kvspans[r] (likewise); spans are half-open, may be empty.
 * Compute CTAs attend each rank's queries to the KV chunk in hand (step s:
 * the chunk of rank (r - s) mod ranks) with an online softmax carried across
 * steps, while communication CTAs forward the chunk to rank r+1's receive
 * buffer (s+1)%2, signalled per chunk with flags; a buffer is rewritten only
 * once every reader released it. Masks use global positions: causal = 1,
 * key j is visible to query position p when j <= p and (window 0 or
 * j > p - window); causal = 0: every key (window must be 0). GQA: query head
 * h reads kv head h/(heads/kv_heads). sinks: f32 [heads] or 0.
 *
 * ptrs: host array [ranks*MK_RING_NPTR] of device pointers (see MK_RING_*);
 * qspans, kvspans: host int32 [ranks*4]. ws: the workspace (mk_ring_workspace
 * bytes); its error record (the first MK_RING_ERR_WORDS int32) must be zero
 * before the first launch (mk_ring_check clears it). timeout_ns bounds every
 * wait on a flag (> 0); a wait that exceeds it writes the error record and
 * ends the kernel; mk_ring_check reports it. fault_rank >= 0 disables that
 * rank's communication CTAs (fault injection, for testing the watchdog);
 * -1 otherwise. Asynchronous on stream. */
MK_API int32_t mk_ring_attn_bf16(uint64_t stream, int32_t ranks, const uint64_t* ptrs, const int32_t* qspans,
                                 const int32_t* kvspans, int32_t out_dtype, int32_t heads, int32_t kv_heads,
                                 int32_t head_dim, int32_t v_head_dim, uint32_t scale_bits, int32_t window,
                                 uint64_t sinks, int32_t causal, uint64_t ws, uint64_t ws_bytes, int64_t timeout_ns,
                                 int32_t fault_rank);

/* mk_ring_attn_bf16 with gather buffers (ABI 12): per rank, KBUF0 and VBUF0
 * hold (ranks-1)*maxLk rows (maxLk the largest rank's kv rows), the chunk of
 * step s in rows (s-1)*maxLk..; KBUF1 and VBUF1 are ignored. The chunks
 * still travel rank to rank, but none is overwritten during the call, so a
 * compute CTA takes one query tile through all the steps with its softmax
 * state in registers, waiting only for each chunk it sees to arrive (no
 * state round trip through the workspace, one work item per tile instead of
 * one per tile and step). Same arguments, workspace and watchdog. */
MK_API int32_t mk_ring_attn_gather_bf16(uint64_t stream, int32_t ranks, const uint64_t* ptrs,
                                        const int32_t* qspans, const int32_t* kvspans, int32_t out_dtype,
                                        int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim,
                                        uint32_t scale_bits, int32_t window, uint64_t sinks, int32_t causal,
                                        uint64_t ws, uint64_t ws_bytes, int64_t timeout_ns, int32_t fault_rank);
/* The same ring for ONE rank `me` of `ranks` whose peers run their own
 * mk_ring_attn_rank (other processes, one per GPU or several on one GPU, or
 * other streams): every rank calls it with the same qspans, kvspans, shape
 * arguments and epoch. The launch holds only me's communication CTAs and
 * me's compute work; me's output is what mk_ring_attn_bf16 computes for
 * rank me, bit for bit. ptrs: [ranks*MK_RING_NPTR] as for mk_ring_attn_bf16,
 * but only me's entry is read in full, and rank me+1's KBUF0/1 and VBUF0/1
 * (its receive buffers as mapped in this process, mk_ipc_open); the other
 * entries are ignored. wss: host [ranks] of every rank's workspace as
 * mapped here (wss[me] this rank's own, ws_bytes its size: mk_ring_workspace
 * bytes suffice); only me−1's, me's and me+1's are read. The comm CTAs
 * write me's chunk into rank me+1's receive buffers and raise flags in
 * me+1's workspace; me+1 returns buffer releases into me's (system scope).
 * Flags are epochs: epoch >= 1, the same on every rank for one call and +1
 * per call on a set of workspaces (consecutive calls then need no host
 * synchronisation between the ranks); before the first call every rank's
 * workspace must be zeroed (its first 4096 bytes at least), and again on
 * every rank after a watchdog error. ctas: CTAs of the launch (0: all
 * co-resident; with several ranks on one GPU pass at most a 1/ranks share
 * so that all launches are co-resident). timeout_ns > 0 bounds every wait;
 * the error record (in wss[me]) names me, the role, step and flag; a peer
 * that never launches ends this launch with a record of what = 0 (chunk
 * arrival) or 1 (buffer release). The peers' launches must be able to run
 * at the same time as this one. Asynchronous on stream. */
MK_API int32_t mk_ring_attn_rank(uint64_t stream, int32_t ranks, int32_t me, const uint64_t* ptrs,
                                 const int32_t* qspans, const int32_t* kvspans, int32_t out_dtype, int32_t heads,
                                 int32_t kv_heads, int32_t head_dim, int32_t v_head_dim, uint32_t scale_bits,
                                 int32_t window, uint64_t sinks, int32_t causal, const uint64_t* wss,
                                 uint64_t ws_bytes, int32_t ctas, int64_t timeout_ns, int32_t epoch);

/* mk_ring_attn_rank with gather buffers (ABI 22): per rank, KBUF0 and VBUF0
 * hold (ranks-1)*maxLk rows as for mk_ring_attn_gather_bf16 (rank me's own,
 * and rank me+1's as mapped in this process); KBUF1 and VBUF1 are ignored.
 * Head dims 128/128 run on the wgmma kernel. No slot is rewritten during a
 * call; across calls, before rank me's comm CTAs write rank me+1's slots in
 * epoch e >= 2 they wait until rank me+1's launch of epoch e-1 has ended
 * (its last CTA stamps that into me's workspace, system scope). Same
 * arguments, workspace, epochs and watchdog as mk_ring_attn_rank; a rank
 * calls one of the two for every epoch of a set of workspaces, not both. */
MK_API int32_t mk_ring_attn_rank_gather(uint64_t stream, int32_t ranks, int32_t me, const uint64_t* ptrs,
                                        const int32_t* qspans, const int32_t* kvspans, int32_t out_dtype,
                                        int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim,
                                        uint32_t scale_bits, int32_t window, uint64_t sinks, int32_t causal,
                                        const uint64_t* wss, uint64_t ws_bytes, int32_t ctas, int64_t timeout_ns,
                                        int32_t epoch);

/* The same result from separate launches (the baseline): per step one
 * attention launch for all ranks writing normalised partial outputs and
 * their log-sum-exp, the chunk copies (cudaMemcpyAsync), and one merge
 * launch; the last merge applies the sinks and writes out and lse. Same
 * arguments and workspace, no watchdog (nothing waits). */
MK_API int32_t mk_ring_separate_bf16(uint64_t stream, int32_t ranks, const uint64_t* ptrs, const int32_t* qspans,
                                     const int32_t* kvspans, int32_t out_dtype, int32_t heads, int32_t kv_heads,
                                     int32_t head_dim, int32_t v_head_dim, uint32_t scale_bits, int32_t window,
                                     uint64_t sinks, int32_t causal, uint64_t ws, uint64_t ws_bytes);

/* The workspace bytes both ring launches need for these shapes. */
MK_API int32_t mk_ring_workspace(int32_t ranks, const int32_t* qspans, int32_t heads, int32_t kv_heads,
                                 int32_t head_dim, int32_t v_head_dim, uint64_t* bytes);

/* Synchronously (after all earlier work) copies ws's error record into
 * rec [MK_RING_ERR_WORDS] and clears it on the device. */
MK_API int32_t mk_ring_check(uint64_t ws, int32_t* rec);

#ifdef __cplusplus
}
#endif
#endif /* MK_RING_H */
