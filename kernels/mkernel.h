/*
 * mkernel.h — the C ABI of libmkernel.so, the CUDA side of mkserve.
 *
 * Go loads this library with purego (no cgo), so the ABI follows the rules in
 * shared/DESIGN.md "The GPU boundary":
 *   - arguments and results are integers and pointers only; a float argument
 *     travels as its IEEE-754 bit pattern in a uint32_t (named *_bits);
 *   - structs travel by pointer, and their layouts are checked from Go
 *     against mk_abi_layout;
 *   - no callbacks;
 *   - every function returns an mk_status (0 = MK_OK); on failure the text of
 *     the failing call is in mk_last_error(), which is per OS thread;
 *   - device memory, streams and events are opaque uint64_t handles
 *     (a device address, a cudaStream_t, a cudaEvent_t); stream 0 is CUDA's
 *     legacy default stream, except between mk_graph_begin and mk_graph_end,
 *     when it is the library's work stream (a blocking stream mk_init makes:
 *     the legacy stream cannot be captured into a graph);
 *   - libmkernel owns the CUDA context: mk_init makes it current on the calling
 *     thread, and every later call must come from that same thread.
 *
 * Tensors are row-major. "bf16" is bfloat16 storage; arithmetic is float32.
 * Ops are asynchronous on the given stream unless their name says otherwise.
 */
#ifndef MKERNEL_H
#define MKERNEL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* MK_API marks the exported symbols (the library builds with hidden visibility). */
#if defined(__GNUC__)
#define MK_API __attribute__((visibility("default")))
#else
#define MK_API
#endif

/* MK_ABI_VERSION changes whenever a signature, struct or meaning changes.
 * 7: rank-local fused MoE and ring (mk_moe_fused_rank, mk_ring_attn_rank),
 *    mk_allreduce_*, mk_moe_localize, mk_fill_f32, the NCCL shim (mk_nccl_*).
 * 8: mk_moe_router_f32, mk_gemv_bf16.
 * 9: mk_paged_attn_variant 3 (the warp-split kernel, auto's choice for head
 *    dims 64/64, 128/128, 192/128), mk_moe_gemv, mk_moe_localize's counts,
 *    mk_norm_rope_f32.
 * 10: mk_gemv_bf16_multi; mk_norm_rope_f32 takes a second tensor and flags
 *    (MK_NORM_ROPE_FAST); mk_add_rmsnorm_f32 may also write bf16 (outb).
 * 11: mk_paged_attn_bf16 takes out_bf16 (the output rounded to bf16 too);
 *    mk_moe_route_experts (out may be 0), mk_moe_combine_add_rmsnorm_f32,
 *    mk_gemm_skinny_bf16.
 * 12: mk_ring_attn_gather_bf16.
 * 13: mk_moe_gemv(2) (routing and the GEMV experts in one launch),
 *    mk_moe_decode_check; mk_moe_workspace's layout has the barrier word.
 * 14: mk_gemm_heads; mk_paged_attn_bf16 takes head dims up to 768 / 512.
 * 15: values inside keys: mk_kv_write_bf16 with vw 0, mk_paged_attn_bf16
 *    with pool_v 0.
 * 16: mk_moe_fused_workspace, mk_moe_fused, mk_moe_fused_rank and
 *    mk_moe_fused_separate take the row tile (128: sm_90a wgmma tiles) and
 *    max_rows (a rank's receive capacity; error record role 6).
 * 17: the fused MoE control workspace's trace words (MK_MOE_FUSED_TRACE_*);
 *     mk_moe_fused's fault_rank == ranks (a stage that never fills) and the
 *     error record's role 7 (a wait inside a wgmma CTA's own rings).
 * 18: mk_gather_rows_feed_f32 (token ids from the previous step's picks),
 *     mk_graph_mark, mk_event_query, mk_sample_greedy_f32 and
 *     mk_sample_draw_f32 (and their _work).
 * 19: mk_stamp, mk_kstamp_*; mk_sample_draw_f32 and mk_sample_draw_work take kmax (top-k rows),
 *     mk_sample_draw_kmax.
 * 20: mk_paged_decode_bf16, mk_paged_decode_fits (mk_decode.h).
 * 21: mk_moe_gemv(3), the resident down kernel.
 * 22: mk_ring_attn_rank_gather; the ring workspace's control words hold the
 *     launch's exit count and the remote flags kRemDone (ring.cu).
 * 23: mk_norm_rope_f32 takes out_bf16.
 * 24: mk_copy_cols_bf16.
 * 25: FP4 expert weights (mk_fp4_dequant_bf16, mk_moe_workspace_fp4,
 *     mk_moe_experts_fp4).
 * 26: mk_moe_fp4_path; mk_moe_experts_fp4 takes the FP4 grouped GEMM
 *     path.
 * 27: the persistent decode layer (mk_layer.h).
 * 28: mk_moe_gemv(-1), auto: the GEMV kernels for one token over experts of
 *     intermediate size >= 8192, the default.
 * 29: mk_moe_fused, mk_moe_fused_rank and mk_moe_fused_separate take a
 *     router (mk_moe_fused_router, or null): the call routes its tokens
 *     itself (mk_moe_route before the plan). */
#define MK_ABI_VERSION 29

/* Status codes. */
enum {
  MK_OK = 0,
  MK_ERR_ARG = 1,       /* a bad argument (shape, pointer, flag) */
  MK_ERR_CUDA = 2,      /* a CUDA runtime call failed */
  MK_ERR_CUBLAS = 3,    /* a cuBLAS / cuBLASLt call failed */
  MK_ERR_NO_DEVICE = 4, /* no NVIDIA driver or no CUDA device */
  MK_ERR_NOT_INIT = 5   /* mk_init has not run (on this thread) */
};

/* Element types for flags. */
enum { MK_DTYPE_BF16 = 0, MK_DTYPE_F32 = 1 };

/* RoPE pairings. */
enum {
  MK_ROPE_NEOX = 0,       /* dimension i with i + rot_dim/2 */
  MK_ROPE_INTERLEAVED = 1 /* dimension 2i with 2i + 1 */
};

/* mk_device_info_t describes the device mk_init opened. */
typedef struct mk_device_info {
  char name[256];                /* offset 0 */
  int32_t device;                /* 256: ordinal */
  int32_t sm_count;              /* 260: multiprocessors */
  int32_t cc_major;              /* 264: compute capability */
  int32_t cc_minor;              /* 268 */
  uint64_t total_mem;            /* 272: bytes */
  uint64_t free_mem;             /* 280: bytes free when asked */
  uint64_t l2_bytes;             /* 288 */
  uint64_t smem_per_block_optin; /* 296: bytes of shared memory a block can opt into */
  int32_t driver_version;        /* 304: e.g. 13000 */
  int32_t runtime_version;       /* 308 */
} mk_device_info_t;              /* size 312 */

/* Struct ids and field ids for mk_abi_layout. */
enum { MK_STRUCT_DEVICE_INFO = 0 };
enum {
  MK_FIELD_SIZE = -1, /* the struct's sizeof */
  MK_DI_NAME = 0,
  MK_DI_DEVICE,
  MK_DI_SM_COUNT,
  MK_DI_CC_MAJOR,
  MK_DI_CC_MINOR,
  MK_DI_TOTAL_MEM,
  MK_DI_FREE_MEM,
  MK_DI_L2_BYTES,
  MK_DI_SMEM_OPTIN,
  MK_DI_DRIVER_VERSION,
  MK_DI_RUNTIME_VERSION
};

/* ---- library, errors, device ---- */

MK_API int32_t mk_abi_version(void);
/* The last error text of the calling thread ("" when none). */
MK_API const char* mk_last_error(void);
/* The offset of a field (or with MK_FIELD_SIZE the size) of a struct, -1 if unknown. */
MK_API int64_t mk_abi_layout(int32_t struct_id, int32_t field_id);
/* The number of CUDA devices; MK_ERR_NO_DEVICE when there is no driver or device. */
MK_API int32_t mk_device_count(int32_t* count);
/* Opens device `device` on the calling thread: context, cuBLASLt handle, workspace. */
MK_API int32_t mk_init(int32_t device);
MK_API int32_t mk_device_info(mk_device_info_t* info);
MK_API int32_t mk_device_sync(void);
/* on = 1 also accepts calls from threads other than mk_init's (the device is
 * made current on each at its first call); the caller must still make the
 * calls one at a time. Call it from mk_init's thread. Default 0. */
MK_API int32_t mk_set_any_thread(int32_t on);

/* ---- memory ---- */

MK_API int32_t mk_malloc(uint64_t bytes, uint64_t* dptr);
MK_API int32_t mk_free(uint64_t dptr);
/* Synchronous copies: ordered after all earlier work (streams are blocking streams). */
MK_API int32_t mk_memcpy_h2d(uint64_t dst, const void* src, uint64_t bytes);
MK_API int32_t mk_memcpy_d2h(void* dst, uint64_t src, uint64_t bytes);
MK_API int32_t mk_memcpy_d2d(uint64_t dst, uint64_t src, uint64_t bytes);
/* Asynchronous copies on a stream; host memory must be pinned (mk_host_alloc_pinned). */
MK_API int32_t mk_memcpy_h2d_async(uint64_t dst, const void* src, uint64_t bytes, uint64_t stream);
MK_API int32_t mk_memcpy_d2h_async(void* dst, uint64_t src, uint64_t bytes, uint64_t stream);
MK_API int32_t mk_memcpy_d2d_async(uint64_t dst, uint64_t src, uint64_t bytes, uint64_t stream);
MK_API int32_t mk_host_alloc_pinned(uint64_t bytes, void** hptr);
MK_API int32_t mk_host_free_pinned(void* hptr);

/* ---- streams and events ---- */

MK_API int32_t mk_stream_create(uint64_t* stream);
MK_API int32_t mk_stream_destroy(uint64_t stream);
MK_API int32_t mk_stream_sync(uint64_t stream);
MK_API int32_t mk_event_create(uint64_t* event);
MK_API int32_t mk_event_destroy(uint64_t event);
MK_API int32_t mk_event_record(uint64_t event, uint64_t stream);
MK_API int32_t mk_event_sync(uint64_t event);
/* *done = 1 when the work before the event's last record has run, else 0
 * (cudaEventQuery; does not block). */
MK_API int32_t mk_event_query(uint64_t event, int32_t* done);
/* Milliseconds between two recorded, completed events, as float32 bits. */
MK_API int32_t mk_event_elapsed(uint64_t start, uint64_t end, uint32_t* ms_bits);

/* ---- CUDA graphs of the work stream ---- */

/* mk_graph_begin starts capturing the work stream in relaxed mode: the work
 * queued on stream 0 until mk_graph_end is recorded, not run.
 * Synchronous copies, mk_free and synchronisation must not happen until
 * then (they fail and invalidate the capture). mk_graph_end ends it and
 * instantiates the graph: *exec is the executable graph, *nodes its node
 * count; on failure *exec is 0 and the capture is over. mk_graph_abort ends
 * a capture and drops it (a no-op when none is active). mk_graph_launch
 * queues exec on the work stream (a blocking stream: it waits for earlier
 * work on stream 0, and later work on stream 0 waits for it); mk_graph_destroy frees it (after its launches
 * completed or were queued: CUDA keeps a launched graph alive). */
MK_API int32_t mk_graph_begin(void);
MK_API int32_t mk_graph_end(uint64_t* exec, uint64_t* nodes);
MK_API int32_t mk_graph_abort(void);
MK_API int32_t mk_graph_launch(uint64_t exec);
MK_API int32_t mk_graph_destroy(uint64_t exec);
/* mk_graph_mark records event into the graph being captured, as an external
 * event node after the work captured so far (cudaEventRecordExternal): after
 * a launch, mk_event_sync on it waits for that part of the graph only (the
 * staged uploads, so that the host may refill them while the rest runs). */
MK_API int32_t mk_graph_mark(uint64_t event);
/* mk_stamp writes the GPU's clock (%globaltimer, ns) to ((uint64_t*)buf)[idx]
 * once the work before it on stream 0 (the capture's work stream while
 * capturing) has finished: a one-warp kernel in the chain, for measuring
 * where a captured step's time goes (it adds its own small latency). */
MK_API int32_t mk_stamp(uint64_t buf, int32_t idx);
/* Kernel stamps: mk_kstamp_begin(buf, cap) writes a clock stamp to
 * ((uint64_t*)buf)[0] now and, until mk_kstamp_begin(0, 0), one after every
 * kernel the library launches through its programmatic-launch path (most
 * of the decode kernels; not cuBLASLt's, nor the few plain <<<>>> launches,
 * whose time falls to the next stamp), up to cap stamps, stamp i after
 * kernel mk_kstamp_name(i) ("start" for 0). While a graph is captured the
 * stamps are captured with it. mk_kstamp_count is the stamps queued since
 * the last begin. */
MK_API int32_t mk_kstamp_begin(uint64_t buf, int32_t cap);
MK_API int32_t mk_kstamp_count(void);
MK_API int32_t mk_kstamp_name(int32_t i, char* out, int32_t cap);

/* ---- CUDA IPC: device memory shared between processes ---- */

/* mk_ipc_get_handle writes the 64-byte IPC handle of the allocation that
 * starts at dptr (from mk_malloc) to handle. mk_ipc_open maps a handle
 * another process made (same or peer-capable device) and returns its
 * address; mk_ipc_close unmaps it. */
#define MK_IPC_HANDLE_BYTES 64
MK_API int32_t mk_ipc_get_handle(uint64_t dptr, void* handle);
MK_API int32_t mk_ipc_open(const void* handle, uint64_t* dptr);
MK_API int32_t mk_ipc_close(uint64_t dptr);

/* ---- ops ---- */

/* C [M,N] = A [M,K] · B [N,K]ᵀ (the Hugging Face Linear layout), bf16 operands,
 * fp32 accumulation, C bf16 or f32 by c_dtype; accumulate = 1 adds to C
 * instead (C += A·Bᵀ, beta = 1), accumulate = 0 overwrites it. cuBLASLt,
 * falling back to cublasGemmEx where cuBLASLt offers no algorithm. One 64 MiB
 * workspace serves every GEMM, so GEMMs on different streams must not overlap
 * in time. */
MK_API int32_t mk_gemm_bf16(uint64_t stream, uint64_t a, uint64_t b, uint64_t c, int32_t c_dtype,
                     int64_t m, int64_t n, int64_t k, int32_t accumulate);
/* The same with float32 A, B and C in full FP32 (CUBLAS_COMPUTE_32F; never
 * TF32): C [M,N] (+)= A [M,K] · B [N,K]ᵀ. */
MK_API int32_t mk_gemm_f32(uint64_t stream, uint64_t a, uint64_t b, uint64_t c, int64_t m, int64_t n,
                           int64_t k, int32_t accumulate);
/* C [M,N] f32 = A [M,K] bf16 · B [N,K]ᵀ bf16 for 1 <= M <= 8 (ABI 8): the
 * skinny GEMM of decode batches, one warp per row of B streaming it in
 * 16-byte pieces, float32 products and sums (gemv.cu). K a multiple of 8; A
 * and B 16-byte aligned. C is overwritten. */
MK_API int32_t mk_gemv_bf16(uint64_t stream, uint64_t c, uint64_t a, uint64_t b, int64_t m, int64_t n,
                            int64_t k);
/* Up to three skinny GEMMs of one A in one launch (ABI 10; q, k and v of a
 * decode step): C_i [M,N_i] f32 = A [M,K] bf16 · B_i [N_i,K]ᵀ (+ bias_i
 * [N_i] f32 when not 0), as mk_gemv_bf16 per projection. N_i = 0 leaves
 * projection i out (at least one N_i > 0). */
MK_API int32_t mk_gemv_bf16_multi(uint64_t stream, uint64_t a, int64_t m, int64_t k, uint64_t c0, uint64_t b0,
                                  uint64_t bias0, int64_t n0, uint64_t c1, uint64_t b1, uint64_t bias1,
                                  int64_t n1, uint64_t c2, uint64_t b2, uint64_t bias2, int64_t n2);
/* A Linear per head (ABI 14; MLA's absorbed projections): for h < heads,
 * C_h [M,N] f32 (+)= A_h [M,K] · B_h [N,K]ᵀ, where A_h is columns
 * h*K..h*K+K-1 of A [M, heads*K], B_h rows h*N..h*N+N-1 of B [heads*N, K],
 * C_h columns h*N.. of C [M, heads*N]. ab_dtype MK_DTYPE_BF16 (fp32
 * accumulation) or MK_DTYPE_F32 (full FP32); accumulate = 1 adds to C.
 * cublasGemmStridedBatchedEx (counted with the fallback calls). */
MK_API int32_t mk_gemm_heads(uint64_t stream, uint64_t a, uint64_t b, uint64_t c, int32_t ab_dtype, int64_t m,
                             int64_t n, int64_t k, int64_t heads, int32_t accumulate);
/* How many GEMMs ran through cuBLASLt and through the cublasGemmEx fallback. */
MK_API int32_t mk_gemm_stats(uint64_t* lt_calls, uint64_t* fallback_calls);

/* out [rows, cols] = x / rms(x over each group of `group` columns) * w [group].
 * cols must be a multiple of group; out may equal x. */
MK_API int32_t mk_rmsnorm_bf16(uint64_t stream, uint64_t out, uint64_t x, uint64_t w, int64_t rows,
                        int64_t cols, int64_t group, uint32_t eps_bits);
/* resid [rows, cols] += x (rounded to bf16), then out = rmsnorm(resid) * w [cols]. */
MK_API int32_t mk_add_rmsnorm_bf16(uint64_t stream, uint64_t resid, uint64_t x, uint64_t w,
                            uint64_t out, int64_t rows, int64_t cols, uint32_t eps_bits);

/* out [n, hidden] = table [vocab, hidden] rows ids [n] (int32). An id outside
 * [0, vocab) gives a row of NaN. */
MK_API int32_t mk_embedding_bf16(uint64_t stream, uint64_t out, uint64_t table, uint64_t ids,
                          int64_t n, int64_t hidden, int64_t vocab);

/* out [T, I] = silu(gate) * up, in [T, 2I] laid out [gate | up]. */
MK_API int32_t mk_swiglu_bf16(uint64_t stream, uint64_t out, uint64_t in, int64_t t, int64_t i);
/* gpt-oss: g = min(gate, limit), u = clamp(up, -limit, limit),
 * out = (u + 1) * g * sigmoid(alpha * g). interleaved = 0: in is [gate | up];
 * interleaved = 1: gate and up alternate (gate at even columns), as in the
 * gpt-oss checkpoints. */
MK_API int32_t mk_swiglu_oss_bf16(uint64_t stream, uint64_t out, uint64_t in, int64_t t, int64_t i,
                           uint32_t alpha_bits, uint32_t limit_bits, int32_t interleaved);

/* Rotates, in place, the first rot_dim dims of every head of x [T, heads*head_dim],
 * row r at position pos[r] (int32): angle = float(pos) * inv_freq[j] (device,
 * float32 [rot_dim/2]), cos and sin scaled by attn_factor. */
MK_API int32_t mk_rope_bf16(uint64_t stream, uint64_t x, uint64_t pos, int64_t t, int64_t heads,
                     int64_t head_dim, int64_t rot_dim, int32_t style, uint64_t inv_freq,
                     uint32_t attn_factor_bits);

/* Element-wise conversions of n values (round to nearest even). */
MK_API int32_t mk_convert_f32_to_bf16(uint64_t stream, uint64_t dst, uint64_t src, int64_t n);
MK_API int32_t mk_convert_bf16_to_f32(uint64_t stream, uint64_t dst, uint64_t src, int64_t n);


/* ---- float32-activation ops (f32ops.cu; the CUDA model backend) ----
 * All tensors float32 unless said; weights w/bias are float32 too. */

/* out [rows, cols] = x / rms(each group of `group` columns) * w [group]; the
 * sum of squares is accumulated in float64. */
MK_API int32_t mk_rmsnorm_f32(uint64_t stream, uint64_t out, uint64_t x, uint64_t w, int64_t rows,
                              int64_t cols, int64_t group, uint32_t eps_bits);
/* sum [rows, cols] = x + r, out = RMSNorm(sum) * w [cols] (ABI 6): the same
 * values as mk_add_f32 then mk_rmsnorm_f32 with group = cols, one launch.
 * outb, when not 0, also gets out rounded to bf16 (RN; ABI 10). */
MK_API int32_t mk_add_rmsnorm_f32(uint64_t stream, uint64_t sum, uint64_t out, uint64_t x, uint64_t r,
                                  uint64_t w, int64_t rows, int64_t cols, uint32_t eps_bits, uint64_t outb);
/* Splits n float32 values x into two bf16 halves: hi = bf16(x), lo =
 * bf16(x - hi) (round to nearest even), so hi + lo carries about 16 bits of
 * x's mantissa; A·Bᵀ = hi·Bᵀ + lo·Bᵀ with two bf16 GEMMs. */
MK_API int32_t mk_split_bf16(uint64_t stream, uint64_t hi, uint64_t lo, uint64_t x, int64_t n);
/* out [n] = a + b. */
MK_API int32_t mk_add_f32(uint64_t stream, uint64_t out, uint64_t a, uint64_t b, int64_t n);
/* out [n] = value (its float32 bits). */
MK_API int32_t mk_fill_f32(uint64_t stream, uint64_t out, int64_t n, uint32_t value_bits);
/* out [n] = clamp(x, -limit, limit) (NaN stays NaN). */
MK_API int32_t mk_clamp_f32(uint64_t stream, uint64_t out, uint64_t x, int64_t n, uint32_t limit_bits);
/* x [rows, cols] += bias [cols], in place. */
MK_API int32_t mk_bias_add_f32(uint64_t stream, uint64_t x, uint64_t bias, int64_t rows, int64_t cols);
/* out [t, i] from in [t, 2i] = [gate | up]: kind 0 silu(gate)*up; kind 1 the
 * gpt-oss clamped form (see mk_swiglu_oss_bf16). */
MK_API int32_t mk_swiglu_f32(uint64_t stream, uint64_t out, uint64_t in, int64_t t, int64_t i,
                             int32_t kind, uint32_t alpha_bits, uint32_t limit_bits);
/* In place RoPE of x [t, heads*head_dim] (see mk_rope_bf16): angle =
 * float32(inv_freq[j] * float32(pos)), cos/sin in float64 rounded, times attn. */
MK_API int32_t mk_rope_f32(uint64_t stream, uint64_t x, uint64_t pos, int64_t t, int64_t heads,
                           int64_t head_dim, int64_t rot_dim, int32_t style, uint64_t inv_freq,
                           uint32_t attn_bits);
/* out [t, heads*head_dim] = mk_rope_f32 of mk_rmsnorm_f32(x, w) per head
 * (w [head_dim], eps), in one launch and out of place; w 0 skips the norm.
 * head_dim <= 256. heads2 > 0 does the same for out2, x2, w2 [t,
 * heads2*head_dim] in the same launch (q and k; ABI 10). flags
 * MK_NORM_ROPE_FAST: float32 sums, rsqrtf and sincosf instead of the
 * float64 arithmetic (a few ulp from it). out_bf16 (or 0) [t,
 * heads*head_dim] gets out rounded to bf16 too (ABI 23). */
enum { MK_NORM_ROPE_FAST = 1 };
MK_API int32_t mk_norm_rope_f32(uint64_t stream, uint64_t out, uint64_t x, uint64_t w, int64_t heads,
                                uint64_t out2, uint64_t x2, uint64_t w2, int64_t heads2, uint64_t pos, int64_t t,
                                int64_t head_dim, int64_t rot_dim, int32_t style, uint64_t inv_freq,
                                uint32_t attn_bits, uint32_t eps_bits, int32_t flags, uint64_t out_bf16);
/* dst[r*dld + h*dhs + doff + c] = src[r*sld + h*shs + soff + c] for r < rows,
 * h < heads, c < width (shs = 0 broadcasts one source head). */
MK_API int32_t mk_copy_cols_f32(uint64_t stream, uint64_t dst, int64_t dld, int64_t doff, int64_t dhs,
                                uint64_t src, int64_t sld, int64_t soff, int64_t shs, int64_t rows,
                                int64_t heads, int64_t width);
/* mk_copy_cols_f32 into a bf16 dst (each value rounded to nearest even; ABI
 * 24): the MLA prefill's q and k built in bf16 for the flash kernel. heads
 * * width < 2^31. */
MK_API int32_t mk_copy_cols_bf16(uint64_t stream, uint64_t dst, int64_t dld, int64_t doff, int64_t dhs,
                                 uint64_t src, int64_t sld, int64_t soff, int64_t shs, int64_t rows,
                                 int64_t heads, int64_t width);
/* dst [n, cols] f32 = rows idx [n] (int32) of src [src_rows, cols] (f32 or bf16
 * by src_dtype); an index outside [0, src_rows) gives a row of NaN. */
MK_API int32_t mk_gather_rows_f32(uint64_t stream, uint64_t dst, uint64_t src, int32_t src_dtype,
                                  uint64_t idx, int64_t n, int64_t cols, int64_t src_rows);
/* mk_gather_rows_f32 with fed rows: idx holds 2n words, the host's ids
 * [0, n) then feed [n, 2n). Row i gathers row feed[i] of the previous
 * step's sampling results when feed[i] >= 0: its token is
 * picks[feed[i] * pick_stride] (mk_sample_f32's out, pick_stride
 * MK_SAMPLE_RESULT_WORDS), feed[i] < pick_rows; else idx[i]. An id or a
 * feed row out of range gives a row of NaN. */
MK_API int32_t mk_gather_rows_feed_f32(uint64_t stream, uint64_t dst, uint64_t src, int32_t src_dtype,
                                       uint64_t idx, uint64_t picks, int64_t pick_stride, int64_t pick_rows,
                                       int64_t n, int64_t cols, int64_t src_rows);
/* out[idx[i], :] += w[i] * src[i, :] for i < n (atomic adds). */
MK_API int32_t mk_scatter_add_rows_f32(uint64_t stream, uint64_t out, uint64_t src, uint64_t idx,
                                       uint64_t w, int64_t n, int64_t cols);
/* out [rows, cols] += sigmoid(gate[r]) * x (gate [rows], or 0 for a factor of 1). */
MK_API int32_t mk_gated_add_f32(uint64_t stream, uint64_t out, uint64_t x, uint64_t gate, int64_t rows,
                                int64_t cols);
/* pool_k[slots[i], :kw] = k[i]; pool_v[slots[i], :vw] = v[i] for i < n; rows with slots[i] < 0 are skipped. */
MK_API int32_t mk_kv_write_f32(uint64_t stream, uint64_t pool_k, uint64_t pool_v, uint64_t k,
                               uint64_t v, uint64_t slots, int64_t n, int64_t kw, int64_t vw);
/* Paged causal attention for n query rows: row b is q/out row rows[b] at
 * position pos[b]; its keys/values j in [max(0, pos-window+1), pos] (window 0:
 * from 0) are at pool row blocks[table[b] + j/block_size]*block_size +
 * j%block_size of pool_k [*, kv_heads*head_dim] / pool_v [*, kv_heads*v_head_dim].
 * q [*, heads*head_dim], out [*, heads*v_head_dim]; GQA; sinks [heads] join the
 * softmax denominator when non-zero. float32 throughout, online softmax. */
MK_API int32_t mk_attention_f32(uint64_t stream, uint64_t out, uint64_t q, uint64_t pool_k,
                                uint64_t pool_v, uint64_t rows, uint64_t pos, uint64_t table,
                                uint64_t blocks, int64_t n, int32_t heads, int32_t kv_heads,
                                int32_t head_dim, int32_t v_head_dim, int32_t block_size,
                                uint32_t scale_bits, int32_t window, uint64_t sinks);

#ifdef __cplusplus
}
#endif

/* The op families in their own headers (each includes this one). */
#include "mk_flash.h"  /* flash attention for prefill */
#include "mk_decode.h" /* paged decode attention, bf16 KV cache */
#include "mk_moe.h"    /* MoE routing, grouped expert GEMM */
#include "mk_sample.h" /* sampling on the device */
#include "mk_ring.h"   /* ring attention over emulated context-parallel ranks */
#include "mk_moe_fused.h" /* the persistent fused MoE layer over emulated expert-parallel ranks */
#include "mk_allreduce.h" /* all-reduce over ranks in separate processes (CUDA IPC) */
#include "mk_nccl.h"   /* NCCL, loaded at run time: the fallback and baseline transport */
#include "mk_layer.h"  /* the persistent decode layer */

#endif /* MKERNEL_H */
