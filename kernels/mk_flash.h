/* mk_flash.h — the part of the libmkernel C ABI for flash attention for prefill (flash.cu).
 * Included by mkernel.h; the rules of mkernel.h hold. */
#ifndef MK_FLASH_H
#define MK_FLASH_H
#include "mkernel.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif /* MK_FLASH_H */
