/* mk_moe.h — the part of the libmkernel C ABI for MoE routing and the tensor-core grouped GEMM of the experts (moe.cu).
 * Included by mkernel.h; the rules of mkernel.h hold. */
#ifndef MK_MOE_H
#define MK_MOE_H
#include "mkernel.h"
#ifdef __cplusplus
extern "C" {
#endif

/* Router flags (mk_moe_route's flags argument, OR-ed). */
enum {
  MK_MOE_SIGMOID = 1,      /* sigmoid scores (else softmax over all experts) */
  MK_MOE_SOFTMAX_TOPK = 2, /* top-k on raw logits, softmax over the k (needs softmax scoring) */
  MK_MOE_NORM_TOPK = 4     /* renormalise the k weights to sum 1 (+1e-20 under sigmoid) */
};

/* Expert activations. */
enum {
  MK_MOE_SWIGLU = 0,        /* silu(gate) * up */
  MK_MOE_SWIGLU_CLAMPED = 1 /* gpt-oss: see mk_swiglu_oss_bf16 */
};

/* Routes T tokens with exactly moe.Route's semantics (moe/route.go):
 * logits [T, E] f32 → ids [T, K] int32 and weights [T, K] f32, each token's
 * k outputs by descending weight, ties to the lower expert. score_bias [E]
 * f32 or 0 (selection only); num_groups > 0 enables group-limited routing
 * (top topk_groups groups by the sum of their two best biased scores, the
 * others masked to -inf); scaling_bits: routed scaling factor (0 or 1: none).
 * Softmax and sigmoid are computed in float64 and rounded once, as in Go.
 * E <= 2048, 1 <= K <= E. */
MK_API int32_t mk_moe_route(uint64_t stream, uint64_t ids, uint64_t weights, uint64_t logits,
                            uint64_t score_bias, int64_t t, int32_t e, int32_t k, int32_t flags,
                            int32_t num_groups, int32_t topk_groups, uint32_t scaling_bits);

/* The router GEMM of a few tokens (ABI 8; gemv.cu): logits [T, E] f32 = x
 * [T, H] f32 · W [E, H] bf16ᵀ (+ bias [E] f32, or 0), float32 products and
 * sums (x is not rounded); when xb is non-zero, xb [T, H] bf16 = x rounded
 * to nearest even as well (the experts' input). 1 <= T <= 8; H a multiple
 * of 8; x, W and xb 16-byte aligned. */
MK_API int32_t mk_moe_router_f32(uint64_t stream, uint64_t logits, uint64_t x, uint64_t w, uint64_t bias,
                                 uint64_t xb, int64_t t, int32_t e, int64_t h);

/* Bytes of workspace mk_moe_experts needs for these sizes, and the row tile
 * (rows per expert are padded to it) it will use. */
MK_API int32_t mk_moe_workspace(int64_t t, int32_t k, int32_t e, int64_t h, int64_t i,
                                uint64_t* bytes, int32_t* tile_m);

/* The routed experts of one MoE layer on the GPU, with no host synchronisation:
 *   align:   ids [T, K] → per-expert row lists padded to the row tile; counts
 *            [E] int64 (or 0) += tokens per expert;
 *   GEMM1:   h = x[token] · GateUp[e]ᵀ (+ gate_up_bias[e]) for every (token, e)
 *            row, x [T, H] bf16, GateUp [E*2I, H] bf16 (per expert gate rows
 *            then up rows), one grouped tensor-core launch; the activation
 *            (act_kind) in its epilogue → act [rows, I] bf16;
 *   GEMM2:   y = act · Down[e]ᵀ (+ down_bias[e]) → [rows, H] f32, Down [E*H, I] bf16;
 *   combine: out [T, H] f32 = Σ_k weights[t,k] · y[row of (t,k)], in k order.
 * Biases are f32 [E, 2I] / [E, H] or 0. H and I must be multiples of 8.
 * ws: mk_moe_workspace bytes of device memory. out is fully written.
 * With mk_moe_gemv(1) (or MK_MOE_GEMV=1), up to 4 tokens with T*K <= 32
 * (by default one token with I >= 8192: mk_moe_gemv) take two GEMV-style
 * kernels instead (each chosen expert's gate/up rows,
 * then its down rows with the combine folded in, streamed once per step);
 * the same semantics. */
MK_API int32_t mk_moe_experts(uint64_t stream, uint64_t out, uint64_t x, uint64_t ids,
                              uint64_t weights, int64_t t, int32_t k, int32_t e, int64_t h,
                              int64_t i, uint64_t gate_up, uint64_t gate_up_bias, uint64_t down,
                              uint64_t down_bias, int32_t act_kind, uint32_t alpha_bits,
                              uint32_t limit_bits, uint64_t counts, uint64_t ws, uint64_t ws_bytes);

/* mk_moe_route then mk_moe_experts in one call (ABI 11): ids and weights
 * [t, k] are written as mk_moe_route writes them, then the experts run on
 * them, with the same results as the two calls. With MK_MOE_ROUTE_ALIGN=1,
 * for t <= 32, e <= 256 and k <= 32 on the grouped GEMMs, the routing and
 * the experts' align run as one launch (off by default: slower in whole
 * decode steps, ninth pass of docs/PERF.md). out may be 0:
 * then no combine runs and mk_moe_combine_add_rmsnorm_f32 must follow with
 * the same workspace (not on the GEMV path of mk_moe_gemv(1)). */
MK_API int32_t mk_moe_route_experts(uint64_t stream, uint64_t out, uint64_t x, uint64_t ids,
                                    uint64_t weights, uint64_t logits, uint64_t score_bias, int64_t t,
                                    int32_t k, int32_t e, int32_t flags, int32_t num_groups,
                                    int32_t topk_groups, uint32_t scaling_bits, int64_t h, int64_t i,
                                    uint64_t gate_up, uint64_t gate_up_bias, uint64_t down,
                                    uint64_t down_bias, int32_t act_kind, uint32_t alpha_bits,
                                    uint32_t limit_bits, uint64_t counts, uint64_t ws, uint64_t ws_bytes);

/* The combine of an mk_moe_route_experts call made with out 0, folded into
 * the residual add and RMSNorm after the layer (ABI 11): for each of the t
 * rows, sum = x + Σ_k weights[t,k]·(expert row of (t,k) in ws), summed as
 * mk_moe_experts's combine sums it; out = RMSNorm(sum)·norm_w as
 * mk_add_rmsnorm_f32 (eps as float bits); out_bf16, when not 0, gets out
 * rounded to bf16. All f32 [t, h] but out_bf16; ws, t, k, e, h and i those
 * of the experts' call. h must be a multiple of 4 up to 8192, rows 16-byte
 * aligned. */
MK_API int32_t mk_moe_combine_add_rmsnorm_f32(uint64_t stream, uint64_t sum, uint64_t out, uint64_t out_bf16,
                                              uint64_t x, uint64_t weights, uint64_t ws, uint64_t ws_bytes,
                                              int64_t t, int32_t k, int32_t e, int64_t h, int64_t i,
                                              uint64_t norm_w, uint32_t eps_bits);

/* c [m, n] f32 = a [m, k] bf16 · w [n, k]ᵀ bf16 (+ bias [n] f32, or 0) for
 * 1 <= m <= 64 (ABI 11): the expert GEMM's weight-streaming tiles (16 or 32
 * rows × 64 columns, mma.sync, a 6-stage cp.async ring) on one "expert" of
 * m rows, for dense projections at decode batch sizes, where cuBLASLt's
 * kernels read these weights at 1–1.5 TB/s. n and k multiples of 8; a and w
 * 16-byte aligned. Each output is the same sum in the same order whatever
 * m is. work: mk_gemm_skinny_workspace bytes (0 and a null work when it
 * says 0). The CUDA backend runs its dense projections of 3–64 rows on
 * it (MKSERVE_SKINNY=0: cuBLASLt; docs/PERF.md, ninth pass). */
MK_API int32_t mk_gemm_skinny_bf16(uint64_t stream, uint64_t c, uint64_t a, uint64_t w, uint64_t bias,
                                   int64_t m, int64_t n, int64_t k, uint64_t work, uint64_t work_bytes);

/* The workspace (bytes) mk_gemm_skinny_bf16 needs for (m, n, k): 0 when it
 * runs as one launch; else partial sums of a split over k (enough CTAs for
 * two waves of the 64-column tiles, at least 256 columns of k a split, a
 * function of n and k only), summed in split order with the bias by a
 * second launch. */
MK_API int32_t mk_gemm_skinny_workspace(int64_t m, int64_t n, int64_t k, uint64_t* bytes);

/* Turns mk_moe_experts's decode-sized GEMV kernels on (1: two launches; 2:
 * one launch, ABI 13, that with mk_moe_route_experts also routes, E <= 256,
 * K <= 32, and always combines: out must be set; 3, ABI 21: as 1, with the
 * down kernel's rows of the chosen experts copied into shared memory
 * before its programmatic-launch wait where they fit, else as 1), off (0)
 * or auto (-1, ABI 28: the two launches of 1 for one token whose experts'
 * intermediate size is at least 8192, e.g. Mixtral-8x7B, else off),
 * process-wide. Until it is called: MK_MOE_GEMV=0, 1, 2 or 3, else auto. */
MK_API int32_t mk_moe_gemv(int32_t on);

/* The one-launch GEMV kernel's watchdog (ABI 13): after all earlier work,
 * copies its record into rec [4] = {set, CTA, arrivals seen, grid size} and
 * clears it; set 1 means a CTA waited at the grid barrier longer than 1 s
 * and left (that launch's output is not valid). */
MK_API int32_t mk_moe_decode_check(int32_t* rec);

/* mk_moe_localize rewrites n routed expert ids in place for a rank holding
 * experts [lo, hi): an id in the range becomes id - lo, any other -1 (which
 * mk_moe_experts skips: its row gets no work and adds nothing). counts ([e]
 * int64, or 0) += every id's expert before the rewrite: all ranks' experts,
 * so that one rank's counters see the whole world's routing. */
MK_API int32_t mk_moe_localize(uint64_t stream, uint64_t ids, int64_t n, int32_t lo, int32_t hi,
                               uint64_t counts, int32_t e);

/* Fills n bf16 values with a deterministic pseudo-random normal-ish
 * distribution (sum of uniforms) times scale, from seed (benchmarks). */
MK_API int32_t mk_moe_fill_bf16(uint64_t stream, uint64_t dst, int64_t n, uint64_t seed,
                                uint32_t scale_bits);

/* FP4 expert weights (ABI 25): MXFP4's values at 4.25 bits a value. A
 * matrix [N, K] (K a multiple of 64) is codes [N, K/2] bytes (E2M1 nibbles,
 * bit 3 the sign; each row in blocks of 64 values whose 32 bytes are
 * ordered for the tensor cores: moe_fp4.cuh, kernels.PackFP4) and scales
 * [N, K/32] bytes (E8M0, 1..240: group g of a row is scaled by
 * 2^(scales[g] - 127)). codes 16-byte, scales 2-byte aligned.
 *
 * mk_fp4_dequant_bf16 writes the bf16 values of such a matrix (exact) to
 * dst [N, K] (16-byte aligned). */
MK_API int32_t mk_fp4_dequant_bf16(uint64_t stream, uint64_t dst, uint64_t codes, uint64_t scales, int64_t n,
                                   int64_t k);

/* The paths mk_moe_experts_fp4 takes (ABI 26). GEMV: T at most 8 and
 * T*K at most 32, two GEMV kernels on the codes (f16
 * tensor-core products of the decoded codes and the rows scaled into f16
 * by a power of two each: exact products, fp32 sums). GEMM: the experts
 * average at most 16 rows (T*K <= 16*E), grouped GEMMs decoding each FP4
 * weight tile in shared memory. DEQUANT: beyond, the chosen experts
 * written in bf16 into the workspace, then mk_moe_experts's grouped
 * GEMMs. MK_FP4_PATH=gemv|gemm|dequant forces one (gemv only where it
 * is allowed; measurements). mk_moe_fp4_path reports the path for these
 * sizes. */
#define MK_FP4_PATH_GEMV 0
#define MK_FP4_PATH_GEMM 1
#define MK_FP4_PATH_DEQUANT 2
MK_API int32_t mk_moe_fp4_path(int64_t t, int32_t k, int32_t e, int32_t* path);

/* Bytes of workspace mk_moe_experts_fp4 needs for these sizes: on the GEMV
 * path the activations and the down kernel's parts; on the GEMM path
 * mk_moe_workspace's layout; on the dequantized path that plus a bf16
 * copy of every expert (E*3*H*I*2 bytes). */
MK_API int32_t mk_moe_workspace_fp4(int64_t t, int32_t k, int32_t e, int64_t h, int64_t i, uint64_t* bytes);

/* mk_moe_experts with FP4 expert weights: GateUp [E*2I, H] and Down [E*H,
 * I] each as codes and scales (above; H and I multiples of 64), the same
 * semantics otherwise (biases, activations, counts, ids < 0 skipped, out
 * fully written), by the path mk_moe_fp4_path reports. */
MK_API int32_t mk_moe_experts_fp4(uint64_t stream, uint64_t out, uint64_t x, uint64_t ids, uint64_t weights,
                                  int64_t t, int32_t k, int32_t e, int64_t h, int64_t i, uint64_t gu_codes,
                                  uint64_t gu_scales, uint64_t gate_up_bias, uint64_t dn_codes, uint64_t dn_scales,
                                  uint64_t down_bias, int32_t act_kind, uint32_t alpha_bits, uint32_t limit_bits,
                                  uint64_t counts, uint64_t ws, uint64_t ws_bytes);

#ifdef __cplusplus
}
#endif
#endif /* MK_MOE_H */
