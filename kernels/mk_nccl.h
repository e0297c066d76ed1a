/* mk_nccl.h — the part of the libmkernel C ABI for NCCL, the fallback and
 * baseline transport (nccl.cu). Included by mkernel.h; the rules of
 * mkernel.h hold.
 *
 * libmkernel does not link against NCCL: mk_nccl_open dlopen()s libnccl.so.2
 * from a path the caller found, so the library still loads where NCCL is
 * absent, and every other mk_nccl_* call fails with MK_ERR_NO_NCCL until
 * mk_nccl_open succeeded. A communicator is an opaque uint64_t handle (an
 * ncclComm_t). Collectives are asynchronous on the given stream, like the
 * ops; they need the device current on the calling thread (MK_THREAD rules).
 * NCCL's own failures return MK_ERR_NCCL with ncclGetErrorString's text, the
 * library's last error text (ncclGetLastError) and, for a communicator, its
 * asynchronous error state (ncclCommGetAsyncError) in mk_last_error().
 *
 * NVLink multicast (NVLS) stays off on these machines: mk_nccl_open and
 * mk_nccl_comm_init set NCCL_NVLS_ENABLE=0 in the process environment when
 * it is unset, before NCCL reads it. Nothing here calls cuMulticastCreate. */
#ifndef MK_NCCL_H
#define MK_NCCL_H
#include "mkernel.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Status codes of this family (after mkernel.h's 0..5). */
enum {
  MK_ERR_NCCL = 6,   /* an NCCL call failed (or its communicator holds an asynchronous error) */
  MK_ERR_NO_NCCL = 7 /* NCCL is not loaded: mk_nccl_open has not succeeded, or failed */
};

/* The size of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES). */
#define MK_NCCL_UNIQUE_ID_BYTES 128

/* mk_nccl_open dlopen()s the NCCL library at path (e.g. ".../nvidia/nccl/lib/
 * libnccl.so.2") and binds the functions below; NCCL 2.7 or later (point-to-
 * point). Once per process: a second call with the same path is a no-op, with
 * another path MK_ERR_ARG. Failure to load or bind: MK_ERR_NO_NCCL. Any thread. */
MK_API int32_t mk_nccl_open(const char* path);
/* *version = ncclGetVersion's code (e.g. 22805 for 2.28.5). Any thread. */
MK_API int32_t mk_nccl_version(int32_t* version);
/* Writes a fresh ncclUniqueId (128 bytes) to id: rank 0 makes it and sends it
 * to every rank before mk_nccl_comm_init. Any thread. */
MK_API int32_t mk_nccl_unique_id(uint8_t* id);
/* Joins the communicator of `size` ranks named by id as `rank`, on the device
 * of mk_init (ncclCommInitRank: blocks until every rank has joined). *comm is
 * the handle (0 on failure). */
MK_API int32_t mk_nccl_comm_init(int32_t rank, int32_t size, const uint8_t* id, uint64_t* comm);
/* MK_ERR_NCCL when the communicator holds an asynchronous error (a peer
 * failed, a network error), with its text; else MK_OK. Does not wait. */
MK_API int32_t mk_nccl_comm_check(uint64_t comm);
/* Finalizes (ncclCommFinalize, where the library has it: waits for the
 * communicator's work) and destroys the communicator. Every rank calls it. */
MK_API int32_t mk_nccl_comm_destroy(uint64_t comm);
/* Aborts the communicator (ncclCommAbort): stops its work and frees it; for
 * a failed world. */
MK_API int32_t mk_nccl_comm_abort(uint64_t comm);

/* recv [count] = the sum over ranks of send [count], float32 (ncclAllReduce,
 * ncclSum); send may equal recv (in place). */
MK_API int32_t mk_nccl_all_reduce_f32_sum(uint64_t comm, uint64_t send, uint64_t recv, uint64_t count,
                                          uint64_t stream);
/* recv [size * bytes] = every rank's send [bytes] in rank order
 * (ncclAllGather on bytes). */
MK_API int32_t mk_nccl_all_gather(uint64_t comm, uint64_t send, uint64_t recv, uint64_t bytes,
                                  uint64_t stream);
/* All-to-all with variable counts: for every rank p, send_counts[p] elements
 * of elem_bytes bytes from send + send_offsets[p]*elem_bytes go to rank p,
 * and recv_counts[p] elements from rank p land at recv + recv_offsets[p]*
 * elem_bytes. The count arrays (host, int64 [size]) must agree between ranks:
 * recv_counts[p] on this rank = send_counts[this rank] on rank p. A zero
 * count moves nothing; this rank's own part is a device copy; the rest is one
 * ncclGroupStart / ncclSend+ncclRecv per peer / ncclGroupEnd. */
MK_API int32_t mk_nccl_all_to_all_v(uint64_t comm, uint64_t send, const int64_t* send_counts,
                                    const int64_t* send_offsets, uint64_t recv, const int64_t* recv_counts,
                                    const int64_t* recv_offsets, int64_t elem_bytes, uint64_t stream);

#ifdef __cplusplus
}
#endif
#endif /* MK_NCCL_H */
