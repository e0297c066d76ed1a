/* mk_moe.h — the part of the libmkernel C ABI for MoE routing and the tensor-core grouped GEMM of the experts (moe.cu).
 * Included by mkernel.h; the rules of mkernel.h hold. */
#ifndef MK_MOE_H
#define MK_MOE_H
#include "mkernel.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif /* MK_MOE_H */
