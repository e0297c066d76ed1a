/* mk_decode.h — the part of the libmkernel C ABI for paged decode attention and the bf16 paged KV cache (decode.cu).
 * Included by mkernel.h; the rules of mkernel.h hold. */
#ifndef MK_DECODE_H
#define MK_DECODE_H
#include "mkernel.h"
#ifdef __cplusplus
extern "C" {
#endif

/* The bf16 paged KV cache: pool_k [pool_rows, kw] and pool_v [pool_rows, vw]
 * bf16, row-major; a sequence's token j lives at pool row
 * blocks[table + j/block_size]*block_size + j%block_size, and kv head h's
 * slice of a row is columns h*head_dim .. (h+1)*head_dim-1 (kw = kv_heads*head_dim,
 * vw = kv_heads*v_head_dim). */

/* pool_k[slots[i], :kw] = bf16(k[i]); pool_v[slots[i], :vw] = bf16(v[i]) for
 * i < n (k [n, kw], v [n, vw] float32, slots [n] int32, round to nearest
 * even); rows with slots[i] < 0 are skipped. vw 0 (ABI 15): keys only, v and
 * pool_v unused (0 allowed) — a cache whose values live inside its keys. */
MK_API int32_t mk_kv_write_bf16(uint64_t stream, uint64_t pool_k, uint64_t pool_v, uint64_t k,
                                uint64_t v, uint64_t slots, int64_t n, int64_t kw, int64_t vw);

/* Selects mk_paged_attn_bf16's kernel (for tests and comparisons): 0 auto
 * (the default: the warp-split kernel for head dims 64/64, 128/128 and
 * 192/128, MLA's tensor-core kernel at 576/512, else tensor cores for groups
 * of more than 4 heads with v_head_dim <= 128, else CUDA cores), 1 CUDA
 * cores (float32 FMAs; at any head dims),
 * 2 tensor cores (mma.sync with q and P split into bf16 hi + lo;
 * v_head_dim <= 128), 3 warp-split (K and V loaded straight into mma
 * fragments, q and P bf16; other head dims get auto's other choice). */
MK_API int32_t mk_paged_attn_variant(int32_t variant);

/* Sets the depth of the tensor-core kernel's K/V tile ring (for tests and
 * comparisons): 0 (the default) picks it per head dims (the most tiles in
 * flight per SM), 2..4 force that many stages of 64 keys, or the deepest
 * below that fits in shared memory. Later mk_paged_attn_bf16 and
 * mk_paged_attn_workspace calls follow it. */
MK_API int32_t mk_paged_attn_stages(int32_t stages);

/* The workspace (bytes) mk_paged_attn_bf16 needs to split every row's keys
 * across CTAs for these shapes, when max_keys is the most keys any row
 * attends (0 when no split pays off). Depends on the device (SM count,
 * occupancy). */
MK_API int32_t mk_paged_attn_workspace(int64_t n, int32_t heads, int32_t kv_heads, int32_t head_dim,
                                       int32_t v_head_dim, int32_t max_keys, uint64_t* bytes);

/* Paged causal attention over the bf16 pool, the semantics of
 * mk_attention_f32: row b is q/out row rows[b] at position pos[b] and sees
 * keys j in [max(0, pos-window+1), pos] (window 0: from 0) through the block
 * table at blocks + table[b]. q [*, heads*head_dim] and out
 * [*, heads*v_head_dim] float32; GQA (heads % kv_heads == 0); sinks [heads]
 * float32 (0 for none) join the softmax denominator; head_dim and v_head_dim
 * multiples of 8 in [8, 768] and [8, 512] (past 256: the big-dims kernel of
 * MLA's absorbed shapes, whatever the variant); pools 16-byte aligned.
 * Float32 arithmetic.
 * max_keys: the most keys any row attends (a hint for splitting rows across
 * CTAs: a wrong value costs speed, not correctness; 0: never split). work:
 * workspace of work_size bytes (mk_paged_attn_workspace; a smaller one, or 0,
 * means fewer splits). out_bf16 (0 for none; ABI 11): every value written to
 * out is also written there rounded to bf16 (RN), [*, heads*v_head_dim].
 * pool_v 0 (ABI 15): each kv head's values are the first v_head_dim columns
 * of its keys in pool_k (v_head_dim <= head_dim; MLA's latent cache). */
MK_API int32_t mk_paged_attn_bf16(uint64_t stream, uint64_t out, uint64_t out_bf16, uint64_t q, uint64_t pool_k,
                                  uint64_t pool_v, uint64_t rows, uint64_t pos, uint64_t table,
                                  uint64_t blocks, int64_t n, int32_t heads, int32_t kv_heads,
                                  int32_t head_dim, int32_t v_head_dim, int32_t block_size,
                                  uint32_t scale_bits, int32_t window, uint64_t sinks, int32_t max_keys,
                                  uint64_t work, uint64_t work_size);

/* The new tokens of decode rows (ABI 20, mk_paged_decode_bf16), T token
 * rows: k [T, kv_heads*head_dim] and v [T, kv_heads*v_head_dim] float32 as
 * projected (before the norm and RoPE), slots [T] int32 the pool rows they
 * go to (< 0: not stored), q_norm / k_norm [head_dim] float32 the per-head
 * RMSNorm weights (0: no norm; eps as float bits), rope_pos [T] int32 the
 * rotation's positions, inv_freq [rot_dim/2] float32 its frequencies
 * (rot_dim 0: no rotation), style an MK_ROPE_* value, attn_bits the
 * rotation's scale (YaRN's attention factor; 1.0f for none). */
typedef struct mk_decode_new {
  uint64_t k, v, slots, q_norm, k_norm, rope_pos, inv_freq;
  int32_t rot_dim, style;
  uint32_t attn_bits, eps_bits;
} mk_decode_new;

/* 1 when mk_paged_decode_bf16 takes these shapes under the current
 * mk_paged_attn_variant (the warp-split kernel's head dims: 64/64, 128/128,
 * 192/128; rot_dim even and <= head_dim), else 0. */
MK_API int32_t mk_paged_decode_fits(int32_t heads, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim,
                                    int32_t rot_dim);

/* A decode step's attention with its new tokens, in one kernel (ABI 20):
 * mk_norm_rope_f32 (fast) of q and of the new keys, mk_kv_write_bf16 of
 * the new keys and values, then mk_paged_attn_bf16, with the same
 * arguments as that one except that q is the raw projection, and nw says
 * where the new tokens are. Every row b must be a decode row: its token is
 * row rows[b] of q, nw->k, nw->v, nw->slots and nw->rope_pos, and pos[b] is
 * that token's position, the last key the row sees (the pool's row for it,
 * slots[rows[b]], is written, not read). pool_v must be set, q, k and v
 * 16-byte aligned; mk_paged_decode_fits must say 1. The keys before each
 * row's new one and the step's metadata (rows, pos, table, blocks) may be
 * read before the previous kernel of the stream completes: that kernel must
 * not write them. */
MK_API int32_t mk_paged_decode_bf16(uint64_t stream, uint64_t out, uint64_t out_bf16, uint64_t q, uint64_t pool_k,
                                    uint64_t pool_v, uint64_t rows, uint64_t pos, uint64_t table, uint64_t blocks,
                                    int64_t n, int32_t heads, int32_t kv_heads, int32_t head_dim,
                                    int32_t v_head_dim, int32_t block_size, uint32_t scale_bits, int32_t window,
                                    uint64_t sinks, int32_t max_keys, uint64_t work, uint64_t work_size,
                                    const mk_decode_new* nw);

#ifdef __cplusplus
}
#endif
#endif /* MK_DECODE_H */
