// norm.cuh — RMSNorm entry points shared between the kernel files.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace mkf32 {

// CombineIn is a MoE layer's combine as the row added before an RMSNorm:
// row g adds Σ_k w[g·K+k]·y[slot_of[g·K+k]] (slots < 0 add nothing).
struct CombineIn {
  const float* y;          // [rows, H] expert outputs, or null: no combine
  const int32_t* slot_of;  // [T·K]
  const float* w;          // [T·K] routing weights
  int K;
};

// combine_add_rmsnorm launches, for T rows of H: sum = x + the combine cb,
// out = RMSNorm(sum)·w (float32 products, float64 sum of squares, as
// mk_add_rmsnorm_f32), ob = out rounded to bf16 when not null. False when
// the shape or alignment does not allow the register kernel (nothing ran).
bool combine_add_rmsnorm(cudaStream_t s, float* sum, float* out, __nv_bfloat16* ob, const float* x,
                         const CombineIn& cb, int64_t T, int64_t H, const float* w, float eps);

}  // namespace mkf32
