/* mk_flash.h — the part of the libmkernel C ABI for flash attention for prefill (flash.cu).
 * Included by mkernel.h; the rules of mkernel.h hold. */
#ifndef MK_FLASH_H
#define MK_FLASH_H
#include "mkernel.h"
#ifdef __cplusplus
extern "C" {
#endif

/* FlashAttention-2 style forward over a varlen batch of `batch` sequences, one
 * launch (bf16 tensor cores, float32 accumulation and softmax).
 *
 * q [T, heads*head_dim] bf16 (RoPE applied); out [T, heads*v_head_dim], bf16
 * or float32 by out_dtype (MK_DTYPE_*). Sequence b owns query rows
 * q_start[b] .. q_start[b+1]-1 (int32 [batch+1], device), at positions
 * past[b] + i (int32 [batch], device); every sequence has at most max_q_len
 * rows (a row past that is not computed).
 *   causal = 1: row i of b attends keys j with max(0, p-window+1) <= j <= p,
 *               p = past[b]+i (window 0: from key 0);
 *   causal = 0: it attends keys 0 .. past[b]+len_b-1 (window must be 0).
 * Key/value j of sequence b is row r of pool_k [*, kv_heads*head_dim] and
 * pool_v [*, kv_heads*v_head_dim] (bf16):
 *   block_size > 0 (paged): r = blocks[table[b] + j/block_size]*block_size + j%block_size;
 *   block_size = 0 (contiguous): r = table[b] + j (table holds kv_start, int32 [batch]).
 * Query head h reads kv head h/(heads/kv_heads). scale_bits: the float32
 * softmax scale (> 0). sinks: float32 [heads] or 0; exp(sink_h - max) joins
 * each row's softmax denominator and contributes no value.
 * head_dim, v_head_dim in [1, 256]; the kernel pads them to 32, 64, 128, 192
 * or 256 in shared memory. Rows, positions and block ids are trusted. */
MK_API int32_t mk_flash_attn_bf16(uint64_t stream, uint64_t out, int32_t out_dtype, uint64_t q,
                                  uint64_t pool_k, uint64_t pool_v, uint64_t q_start, uint64_t past,
                                  uint64_t table, uint64_t blocks, int32_t block_size, int32_t batch,
                                  int32_t max_q_len, int32_t heads, int32_t kv_heads, int32_t head_dim,
                                  int32_t v_head_dim, uint32_t scale_bits, int32_t window,
                                  uint64_t sinks, int32_t causal);

#ifdef __cplusplus
}
#endif
#endif /* MK_FLASH_H */
