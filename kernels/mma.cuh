// mma.cuh — internal to libmkernel: the m16n8k16 bf16 tensor-core MMA the
// mma.sync kernels share (flash, ring, grouped and fused MoE).
#pragma once

#include <cstdint>

namespace mk {

// mma16816: c += a·b, a 16×16 row-major, b 16×8 column-major, f32
// accumulators, the operands bf16 (F16 false) or f16 (the FP4 experts'
// decoded codes, moe_fp4.cuh); the fragments in the PTX ISA's layouts.
template <bool F16 = false>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (F16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace mk
