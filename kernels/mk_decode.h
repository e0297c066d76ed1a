/* mk_decode.h — the part of the libmkernel C ABI for paged decode attention and the bf16 paged KV cache (decode.cu).
 * Included by mkernel.h; the rules of mkernel.h hold. */
#ifndef MK_DECODE_H
#define MK_DECODE_H
#include "mkernel.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif /* MK_DECODE_H */
