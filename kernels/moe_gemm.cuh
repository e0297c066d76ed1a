// moe_gemm.cuh — internal to libmkernel: the arguments of the grouped expert
// GEMMs shared by moe.cu (mma.sync) and moe_wgmma.cu (sm_90a wgmma).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

#include "mk_moe.h"
#include "mma.cuh"

namespace mkmoe {

using bf16 = __nv_bfloat16;

struct GemmArgs {
  const bf16* A;               // GEMM1: x [T, Kd]; GEMM2: act [rows, Kd]
  const bf16* W;               // GEMM1: GateUp [E*2N, Kd]; GEMM2: Down [E*N, Kd]
  const float* bias;           // GEMM1: [E, 2N]; GEMM2: [E, N]; or null
  const int32_t* sorted;       // [rows]: assignment of each row, -1 for padding
  const int32_t* tile_expert;  // [tiles]
  const int32_t* num_tiles;    // [1]
  void* out;                   // GEMM1: act bf16 [rows, N]; GEMM2: y f32 [rows, N]
  int64_t Kd;                  // reduction length (H or I), multiple of 8
  int64_t N;                   // GEMM1: I (gate columns); GEMM2: H
  int topk;
  int act;
  float alpha, limit;
  int mt, nt;   // row tiles (upper bound) and column tiles of the grid
  int group_m;  // rasterisation: blocks of group_m row tiles × all column tiles run together
  int early_b;  // GEMM2 of moe.cu: issue the first weight stages before the PDL wait (MK_MOE_EARLY_B=0: after)
  // > 0 (GEMM2 of moe.cu only): a dense GEMM of dense_rows rows (mk_gemm_skinny_bf16): one expert (0),
  // row r of A is row r, rows from dense_rows on are padding; sorted, tile_expert and num_tiles unused.
  int dense_rows;
  // Dense mode, ksplit > 1: the CTAs of split s (blockIdx.x / (mt·nt)) sum the k tiles [s·ktc, (s+1)·ktc)
  // and write their partial sums, bias left out, to part [ksplit, dense_rows, N] f32 instead of out.
  int ksplit, ktc;
  float* part;
};

using mk::mma16816;

// activation is the expert's gated activation of gate g and up u (biases
// added): silu(g)·u, or gpt-oss's clamped form (MK_MOE_SWIGLU_CLAMPED).
__device__ __forceinline__ float activation(float g, float u, int act, float alpha, float limit) {
  if (act == MK_MOE_SWIGLU) return g / (1.0f + __expf(-g)) * u;
  if (g > limit) g = limit;
  if (u > limit) u = limit;
  else if (u < -limit) u = -limit;
  return (u + 1.0f) * (g / (1.0f + __expf(-alpha * g)));
}


// wgmma_gemm launches the sm_90a wgmma grouped GEMM (128×256 CTA tiles) when
// moe_wgmma.cu is linked in (a weak symbol otherwise null); it returns
// MK_OK, or an mk status when the launch fails, or -1 when the kernel is
// not available for this device (then the mma.sync kernel runs).
int wgmma_gemm(const GemmArgs& a, bool gateup, int64_t tiles, int64_t ntiles, cudaStream_t s)
    __attribute__((weak));

}  // namespace mkmoe
