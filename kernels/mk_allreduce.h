/* mk_allreduce.h — the part of the libmkernel C ABI for the all-reduce of
 * float32 vectors over expert-parallel ranks that are separate processes
 * (allreduce.cu): each rank launches its own kernel; peers' workspaces are
 * mapped through CUDA IPC. Included by mkernel.h; the rules of mkernel.h hold. */
#ifndef MK_ALLREDUCE_H
#define MK_ALLREDUCE_H
#include "mkernel.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The most ranks one all-reduce takes. */
#define MK_AR_MAX_RANKS 8
/* Bytes of a workspace's control block, before its data. */
#define MK_AR_CTL_BYTES 4096

/* The error record's words (int32) at the start of a workspace, read by
 * mk_allreduce_check. */
enum {
  MK_AR_ERR_SET = 0, /* 1 when a wait timed out */
  MK_AR_ERR_RANK,    /* the waiting rank */
  MK_AR_ERR_PHASE,   /* 0: waiting for peers to finish reading the previous call; 1: for their data */
  MK_AR_ERR_PEER,    /* the rank it waited for */
  MK_AR_ERR_SEEN,    /* the flag's value when it gave up */
  MK_AR_ERR_WANT,    /* the value it waited for */
  MK_AR_ERR_WORDS
};

/* mk_allreduce_workspace: the bytes of one rank's workspace for vectors of up
 * to n floats (the control block, then n floats rounded up to 256 bytes). */
MK_API int32_t mk_allreduce_workspace(int64_t n, int64_t* bytes);

/* mk_allreduce_f32_rank: rank `me` of `ranks` (1..MK_AR_MAX_RANKS) sums the
 * ranks' src vectors of n floats into its dst: dst = Σ_{s=0..ranks-1} src_s,
 * added in rank order, so every rank gets the same bits. src and dst are
 * this rank's device memory and may be the same. ws: host array [ranks] of
 * device pointers to every rank's workspace (ws[me] its own; the others
 * mapped from the peers with mk_ipc_open), each of mk_allreduce_workspace(cap)
 * bytes, zero-filled before any rank's first call; n <= cap.
 *
 * Each call takes the next epoch from a counter in the rank's own workspace
 * (nothing on the host changes between calls, so a captured graph replays
 * it), copies src into its workspace, signals every peer, waits for every
 * peer's data, sums, then tells every peer it has finished reading (a rank
 * overwrites its data only once every peer has read the previous call's).
 * Flags are written with release and read with acquire at system scope.
 * Every rank must make the same sequence of calls.
 *
 * ctas: CTAs of the launch (0: one per SM, fewer for small n); they must
 * all be resident at once (several ranks sharing a GPU in one process:
 * at most SMs/ranks each). timeout_ns bounds every wait (> 0); a wait that
 * exceeds it writes the error record and ends the kernel (dst is then
 * garbage and the workspaces unusable); mk_allreduce_check reports it.
 * Asynchronous on stream. */
MK_API int32_t mk_allreduce_f32_rank(uint64_t stream, int32_t ranks, int32_t me, const uint64_t* ws, uint64_t src,
                                     uint64_t dst, int64_t n, int64_t cap, int32_t ctas, int64_t timeout_ns);

/* mk_allreduce_check copies the error record of workspace ws (synchronous)
 * into rec [MK_AR_ERR_WORDS]; rec[MK_AR_ERR_SET] != 0 when a call timed out. */
MK_API int32_t mk_allreduce_check(uint64_t ws, int32_t* rec);

#ifdef __cplusplus
}
#endif
#endif
