/* mk_layer.h — the part of the libmkernel C ABI for the persistent decode
 * layer (layer.cu): a whole pre-norm decoder layer of one decode token —
 * RMSNorm, q/k/v, q/k norms, RoPE, the KV-cache write, paged attention, o,
 * the residual add, RMSNorm, router, top-k, the experts and their combine —
 * in one launch of one CTA per SM. Included by mkernel.h; its rules hold. */
#ifndef MK_LAYER_H
#define MK_LAYER_H
#include "mkernel.h"
#ifdef __cplusplus
extern "C" {
#endif

/* One layer of one decode token (ABI 27). Shapes: hidden H, heads HQ,
 * kv_heads KV (HQ % KV == 0, HQ/KV <= 16), head_dim D (128), experts E
 * (<= 1024), top_k K (<= 16), inter I (the experts' intermediate size).
 * Rows of every weight fit the kernel's 8 KB copies: H*2, HQ*D*2 and I*2
 * bytes each at most 8192, H and I multiples of 8.
 *
 * Float32 activations: x [H] the residual in, out [H] the residual out
 * (x + attn + moe, the layer's sum before the next norm). in_norm, post_norm
 * [H] float32 RMSNorm weights. bf16 weights, row-major: wq [HQ*D, H],
 * wk / wv [KV*D, H], wo [H, HQ*D], gate [E, H] (the router), gate_up
 * [E, 2I, H] (per expert I gate rows then I up rows), down [E, H, I].
 * q_norm / k_norm [D] float32 per-head RMSNorm weights (0: none); rot_dim
 * the rotated dims (even, <= D; 0: none) with inv_freq [rot_dim/2] float32
 * and style an MK_ROPE_* value, attn_bits the rotation's scale (1.0f: none).
 * Router: softmax scoring; softmax_topk 1 takes the top k of the logits and
 * softmaxes them (Mixtral), else the top k of softmax(logits) (Qwen);
 * norm_topk renormalises the k weights; scaling_bits multiplies them (0 or
 * 1.0f: none). counts [E] int64 (0: none) gets one added per chosen expert.
 *
 * The paged bf16 cache (mk_decode.h's layout): pool_k / pool_v
 * [pool_rows, KV*D]; device int32 scalars pos (the token's position, the
 * last key it sees), table (its block table's offset into blocks), slot
 * (the pool row its key and value go to; < 0: not stored) and rope_pos (its
 * rotation's position): read by the kernel, so a captured graph replays
 * with new ones. scale_bits the attention scale.
 *
 * work: mk_layer_workspace bytes of scratch; sync: 256 int32 zeroed once
 * by the caller and left zeroed by every launch (the kernel's counters);
 * one launch at a time may use a sync buffer. */
typedef struct mk_layer {
  int32_t hidden, heads, kv_heads, head_dim, experts, top_k, inter, block_size;
  int32_t rot_dim, style, softmax_topk, norm_topk;
  uint32_t eps_bits, scale_bits, attn_bits, scaling_bits;
  uint64_t x, out, in_norm, post_norm;
  uint64_t wq, wk, wv, wo, q_norm, k_norm, inv_freq;
  uint64_t pool_k, pool_v, blocks, pos, table, slot, rope_pos;
  uint64_t gate, gate_up, down, counts;
  uint64_t work, sync;
} mk_layer;

/* The workspace bytes mk_layer_decode needs for these shapes on this GPU,
 * or 0 in *bytes with MK_ERR_ARG when the kernel does not take them. */
MK_API int32_t mk_layer_workspace(const mk_layer* l, uint64_t* bytes);

/* Runs the layer (see mk_layer). */
MK_API int32_t mk_layer_decode(uint64_t stream, const mk_layer* l);

#ifdef __cplusplus
}
#endif
#endif /* MK_LAYER_H */
