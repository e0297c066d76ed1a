/* mk_sample.h — the part of the libmkernel C ABI for sampling on the device
 * (sample.cu). Included by mkernel.h; the rules of mkernel.h hold.
 *
 * mk_sample_f32 picks one token per row of logits [rows, vocab] (float32)
 * with the semantics of the engine's host sampler (engine/sampler.go):
 * penalties, greedy at temperature 0, else softmax(w / T) restricted by
 * top-k, min-p and top-p, and the token where the cumulative kept mass (in
 * descending probability order, ties lower id first) first exceeds
 * U · (kept mass); log-probabilities are log-softmax of the raw logits.
 *
 * meta (int32 words, device memory) holds rows headers of
 * MK_SAMPLE_META_WORDS words, then the token lists they point at:
 *   [0] temperature (float bits; 0: greedy)   [1] top_k (0: off)
 *   [2] top_p (float bits; >= 1: off)         [3] min_p (float bits; 0: off)
 *   [4] repetition penalty (float bits)       [5] presence penalty (float bits)
 *   [6] frequency penalty (float bits)        [7] n_seen  [8] seen offset (words into meta)
 *   [9] n_out  [10] out offset: n_out ids, then n_out counts
 *   [11] top_logprobs (0..MK_SAMPLE_MAX_TOP)  [12], [13] U (double bits, low word first)
 *   [14], [15] zero.
 * Token ids must be in [0, vocab); Seen and the output ids must each be
 * distinct (a repeated output id is penalised once, by one of its counts).
 *
 * out (int32 words) gets MK_SAMPLE_RESULT_WORDS words per row:
 *   [0] token  [1] its log-probability (float bits)  [2] n = alternatives returned
 *   [3 .. 3+20) their ids, most likely first (-1 past n)
 *   [23 .. 23+20) their log-probabilities (float bits; NaN past n).
 *
 * scratch: rows*vocab floats for the penalised logits (only the penalised
 * positions are written), or 0 when no row has a penalty in effect.
 * The logits are not modified. */
#ifndef MK_SAMPLE_H
#define MK_SAMPLE_H
#include "mkernel.h"
#ifdef __cplusplus
extern "C" {
#endif

#define MK_SAMPLE_META_WORDS 16
#define MK_SAMPLE_RESULT_WORDS 44
#define MK_SAMPLE_MAX_TOP 20

MK_API int32_t mk_sample_f32(uint64_t stream, uint64_t out, uint64_t logits, uint64_t meta,
                             int64_t meta_words, uint64_t scratch, int64_t rows, int64_t vocab);

/* mk_sample_greedy_f32 is mk_sample_f32 for rows that are all greedy
 * (temperature 0) without penalties or top log-probs: each row's reduction
 * split over CTAs (two launches). out gets words [0, 3) of each row's
 * result. work: mk_sample_greedy_work(rows, vocab) bytes of device memory;
 * rows at most 65535. */
MK_API int32_t mk_sample_greedy_f32(uint64_t stream, uint64_t out, uint64_t logits, uint64_t work, int64_t rows,
                                    int64_t vocab);
MK_API int64_t mk_sample_greedy_work(int64_t rows, int64_t vocab);

/* mk_sample_draw_f32 is mk_sample_f32 for rows without penalties or top
 * log-probs that are greedy, draw over the whole vocabulary in id order (no
 * top-k, top-p or min-p), or have a top-k of at most kmax (with any top-p
 * and min-p): each row's passes split over CTAs (three launches, four with
 * kmax > 0; a top-k row keeps each chunk's kmax most likely tokens and
 * draws among the row's k best of them). kmax is the largest top-k of the
 * call (0: no top-k rows), at most mk_sample_draw_kmax(vocab); a row whose
 * top-k exceeds it gets token -2. With cuts nonzero the call may also hold
 * rows with top-p or min-p but no top-k (kmax > 0: the candidates a chunk
 * keeps for them): where min-p or top-p cuts the row's kmax best tokens
 * the row is answered from them, else a fifth launch runs mk_sample_f32's
 * kernel on it. meta as for mk_sample_f32 (only the headers are read,
 * unless that fifth launch runs). out gets words [0, 3) of each row's
 * result. work: mk_sample_draw_work(rows, vocab, kmax) bytes. */
MK_API int32_t mk_sample_draw_f32(uint64_t stream, uint64_t out, uint64_t logits, uint64_t meta, int64_t meta_words,
                                  uint64_t work, int64_t rows, int64_t vocab, int64_t kmax, int32_t cuts);
MK_API int64_t mk_sample_draw_work(int64_t rows, int64_t vocab, int64_t kmax);
MK_API int32_t mk_sample_draw_kmax(int64_t vocab);

/* mk_logits_process_f32 changes the logits of some rows of logits [rows,
 * vocab] in place before sampling (constrained decoding, logit_bias): each
 * listed row gets its bias added, then every token outside its mask set to
 * -inf. proc (int32 words, device memory) holds nproc headers of 4 words,
 * then the data they point at:
 *   [0] row  [1] mask offset (words into proc; -1: no mask)
 *   [2] bias offset: n_bias ids, then n_bias values (float bits)  [3] n_bias
 * A mask is ceil(vocab/32) words, token t at bit t%32 of word t/32; bias
 * ids are distinct and in [0, vocab). One launch. */
MK_API int32_t mk_logits_process_f32(uint64_t stream, uint64_t logits, uint64_t proc, int64_t proc_words, int64_t nproc,
                                     int64_t rows, int64_t vocab);

#ifdef __cplusplus
}
#endif
#endif /* MK_SAMPLE_H */
