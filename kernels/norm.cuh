// norm.cuh — RMSNorm entry points shared between the kernel files.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common.cuh"

namespace mkf32 {

// CombineIn is a MoE layer's combine as the row added before an RMSNorm:
// row g adds Σ_k w[g·K+k]·y[slot_of[g·K+k]] (slots < 0 add nothing).
struct CombineIn {
  const void* y;           // [rows, H] expert outputs (f32, or bf16 when ybf), or null: no combine
  const int32_t* slot_of;  // [T·K]
  const float* w;          // [T·K] routing weights
  int K;
  bool ybf;
};

#ifdef __CUDACC__
// y4_at reads values 4c .. 4c + 3 of row `row` of the expert outputs y
// [rows, H] (H4 = H / 4 float4s a row): f32 rows, or bf16 rows (ybf: 8
// bytes, widened exactly).
__device__ __forceinline__ float4 y4_at(const void* y, int64_t row, int64_t H4, int64_t c, bool ybf) {
  if (!ybf) return reinterpret_cast<const float4*>(y)[row * H4 + c];
  return mk::bf16x4_to_f32(reinterpret_cast<const uint2*>(y)[row * H4 + c]);
}
#endif

// combine_add_rmsnorm launches, for T rows of H: sum = x + the combine cb,
// out = RMSNorm(sum)·w (float32 products, float64 sum of squares, as
// mk_add_rmsnorm_f32), ob = out rounded to bf16 when not null. False when
// the shape or alignment does not allow the register kernel (nothing ran).
bool combine_add_rmsnorm(cudaStream_t s, float* sum, float* out, __nv_bfloat16* ob, const float* x,
                         const CombineIn& cb, int64_t T, int64_t H, const float* w, float eps);

}  // namespace mkf32
