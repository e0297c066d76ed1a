// moe_stream.cu — the decode regime of the grouped expert GEMMs (moe.cu).
//
// With a few rows per active expert the work is reading the active experts'
// weights once, so the kernel is built to stream them at HBM speed:
//
//   - "Swap AB": a weight tile of 16 rows is mma's M (m16n8k16) and the
//     expert's token rows are mma's N, 8 per n-tile. Weights go from global
//     memory straight into A fragments, 16 bytes per lane per load, never
//     through shared memory; token rows (reused by every CTA of the expert,
//     so L1/L2 hits) go into B fragments the same way.
//   - Within each 32-wide chunk of the reduction the lanes' 16-byte loads
//     are mapped to the fragments with the reduction index permuted: lane
//     (g = lane/4, c = lane%4) holds elements 8c..8c+7 of rows g and g+8;
//     elements 8c+{0,1} and 8c+{2,3} are the first mma's k = 2c and 2c+8
//     pairs, 8c+{4..7} the second mma's. A and B use the same map, and a
//     dot product does not depend on the order of its terms.
//   - A CTA owns kCols = 16 output columns (weight rows; gate and up rows
//     for GEMM1) of one active expert and all of that expert's rows, in
//     chunks of NT n-tiles. Its WARPS warps split the reduction; partial
//     sums meet in shared memory, where the epilogue (bias, SwiGLU or the
//     clamped gpt-oss form, bf16 out for GEMM1; f32 out for GEMM2) runs.
//   - The grid is (most experts that can be active) × column blocks, sized
//     from T, K and E only; CTAs past the align kernel's active count exit
//     at once (the same launch fits any routing, as CUDA graphs need).
//
// Rows are the align kernel's padded row list (8-row padding): GEMM1 reads
// token rows x[sorted[row] / topk], GEMM2 the activation rows in place.
#include <cstdint>

#include "common.cuh"
#include "moe_gemm.cuh"

namespace {

using bf16 = __nv_bfloat16;
using mkmoe::GemmArgs;
using mkmoe::mma16816;

constexpr int kCols = 16;         // output columns per CTA
constexpr int kPartStride = 20;   // floats per row of the partial sums (bank spread)

// cp_async16 copies 16 bytes global → shared, or zero-fills them (valid false).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ float swiglu(const GemmArgs& p, float g, float u) {
  if (p.act == MK_MOE_SWIGLU) return g / (1.0f + __expf(-g)) * u;
  const float lim = p.limit;
  if (g > lim) g = lim;
  if (u > lim) u = lim;
  else if (u < -lim) u = -lim;
  return (u + 1.0f) * (g / (1.0f + __expf(-p.alpha * g)));
}

// GU: GEMM1 (gate and up tiles, SwiGLU, bf16 out [rows, N]); else GEMM2
// (f32 out [rows, N]). NT: n-tiles (8 rows each) per chunk of rows; S:
// pipeline stages.
//
// Loads: every lane moves its own 16-byte pieces (its weight rows' and
// token rows' elements 8c..8c+7 of a 32-wide chunk) with cp.async into a
// ring of S stages in shared memory that only it reads back, so the
// pipeline needs no barrier: each thread waits for its own groups. With
// S-1 chunks in flight per warp and no registers held by loads in flight,
// an SM keeps 100+ KB of weight reads outstanding.
template <bool GU, int NT, int WARPS, int S>
__global__ void __launch_bounds__(WARPS * 32) moe_stream_kernel(const GemmArgs p) {
  constexpr int MT = GU ? 2 : 1;          // weight tiles per warp
  constexpr int ITEMS = 2 * MT + NT;      // 16-byte pieces per lane per stage
  extern __shared__ __align__(16) uint4 ring[];  // [WARPS][S][ITEMS][32 lanes]
  const int64_t N = p.N, Kd = p.Kd;
  const int ncb = (int)((N + kCols - 1) / kCols);
  const int ai = (int)(blockIdx.x / ncb), cb = (int)(blockIdx.x % ncb);
  if (ai >= p.active[0]) return;
  const int e = p.active[1 + ai];
  const int r0 = p.off[e], r1 = p.off[e + 1];  // the expert's padded rows
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, c = lane & 3;
  const int64_t j0 = (int64_t)cb * kCols;
  uint4* my = ring + (size_t)warp * S * ITEMS * 32 + lane;

  // This lane's weight rows j0+g and j0+g+8 of each tile (columns past N
  // read row N-1; their sums are dropped).
  const bf16* wrow[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int64_t j = min(j0 + g + 8 * h, N - 1);
      const int64_t r = GU ? (int64_t)e * 2 * N + (mt ? N : 0) + j : (int64_t)e * N + j;
      wrow[mt][h] = p.W + r * Kd + c * 8;
    }
  // This warp's share of the reduction, in whole 32-wide chunks.
  const int64_t chunks = (Kd + 31) / 32;
  const int64_t per = (chunks + WARPS - 1) / WARPS;
  const int64_t kc0 = min(chunks, warp * per), nk = min(chunks, kc0 + per) - kc0;

  __shared__ float part[WARPS][MT][NT * 8][kPartStride];

  for (int rc = r0; rc < r1; rc += NT * 8) {
    const bf16* xrow[NT];
    bool xok[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
      const int row = rc + nt * 8 + g;
      const int32_t asg = row < r1 ? p.sorted[row] : -1;
      xok[nt] = asg >= 0;
      const int64_t src = GU ? (int64_t)(xok[nt] ? asg / p.topk : 0) : (int64_t)(xok[nt] ? row : 0);
      xrow[nt] = p.A + src * Kd + c * 8;
    }
    // issue starts chunk i of this warp's range into stage i % S (an empty
    // group past the end, so that the wait count stays fixed).
    auto issue = [&](int64_t i) {
      if (i < nk) {
        uint4* st = my + (int)(i % S) * ITEMS * 32;
        const int64_t k = (kc0 + i) * 32;
        const bool in = k + c * 8 < Kd;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
          for (int h = 0; h < 2; h++) cp_async16(st + (mt * 2 + h) * 32, wrow[mt][h] + (in ? k : 0), in);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
          cp_async16(st + (2 * MT + nt) * 32, xrow[nt] + (in && xok[nt] ? k : 0), in && xok[nt]);
      }
      cp_async_commit();
    };
    float acc[NT][MT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int q = 0; q < 4; q++) acc[nt][mt][q] = 0.0f;

#pragma unroll
    for (int i = 0; i < S - 1; i++) issue(i);
    for (int64_t i = 0; i < nk; i++) {
      issue(i + S - 1);  // refills the stage read in the previous iteration
      cp_async_wait<S - 1>();
      const uint4* st = my + (int)(i % S) * ITEMS * 32;
      uint4 w[MT][2], x[NT];
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) w[mt][h] = st[(mt * 2 + h) * 32];
#pragma unroll
      for (int nt = 0; nt < NT; nt++) x[nt] = st[(2 * MT + nt) * 32];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        const uint32_t a0[4] = {w[mt][0].x, w[mt][1].x, w[mt][0].y, w[mt][1].y};
        const uint32_t a1[4] = {w[mt][0].z, w[mt][1].z, w[mt][0].w, w[mt][1].w};
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
          mma16816(acc[nt][mt], a0, x[nt].x, x[nt].y);
          mma16816(acc[nt][mt], a1, x[nt].z, x[nt].w);
        }
      }
    }
    cp_async_wait<0>();
    // C [16 weight rows, 8 token rows] per tile: lane holds rows g, g+8 and
    // token columns 2c, 2c+1. Stored transposed: part[.][.][token][col].
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
          for (int q = 0; q < 2; q++) part[warp][mt][nt * 8 + 2 * c + q][g + 8 * h] = acc[nt][mt][2 * h + q];
    __syncthreads();
    for (int i = threadIdx.x; i < NT * 8 * kCols; i += WARPS * 32) {
      const int n = i / kCols, jj = i % kCols;
      const int row = rc + n;
      const int64_t j = j0 + jj;
      if (row >= r1 || j >= N || p.sorted[row] < 0) continue;
      float s[MT];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        float v = 0.0f;
#pragma unroll
        for (int w2 = 0; w2 < WARPS; w2++) v += part[w2][mt][n][jj];
        s[mt] = v;
      }
      if (GU) {
        float gv = s[0], uv = s[MT - 1];
        if (p.bias) {
          gv += p.bias[(int64_t)e * 2 * N + j];
          uv += p.bias[(int64_t)e * 2 * N + N + j];
        }
        reinterpret_cast<bf16*>(p.out)[(int64_t)row * N + j] = __float2bfloat16_rn(swiglu(p, gv, uv));
      } else {
        float v = s[0];
        if (p.bias) v += p.bias[(int64_t)e * N + j];
        reinterpret_cast<float*>(p.out)[(int64_t)row * N + j] = v;
      }
    }
    __syncthreads();  // part is rewritten by the next chunk
  }
}

// stages picks the pipeline depth for a CTA ring of about 80 KB.
constexpr int stages(int items, int warps) {
  return 80 * 1024 / (warps * items * 512) < 3 ? 3 : 80 * 1024 / (warps * items * 512) > 8 ? 8 : 80 * 1024 / (warps * items * 512);
}

template <bool GU, int NT>
int launch(const GemmArgs& a, int64_t max_active, cudaStream_t s) {
  constexpr int WARPS = 4, MT = GU ? 2 : 1, ITEMS = 2 * MT + NT, S = stages(ITEMS, WARPS);
  auto kern = moe_stream_kernel<GU, NT, WARPS, S>;
  const size_t smem = (size_t)WARPS * S * ITEMS * 32 * 16;
  static bool attr = false;  // per instantiation; the library runs on one thread
  if (!attr) {
    MK_CUDA(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    attr = true;
  }
  const int64_t ncb = (a.N + kCols - 1) / kCols;
  const int64_t grid = max_active * ncb;
  MK_ARG(grid > 0 && grid < (1ll << 31), "moe_stream: %lld experts × %lld column blocks", (long long)max_active,
         (long long)ncb);
  kern<<<(unsigned)grid, WARPS * 32, smem, s>>>(a);
  MK_LAUNCHED(GU ? "moe_stream (gate/up)" : "moe_stream (down)");
  return MK_OK;
}

template <bool GU>
int launch_nt(const GemmArgs& a, int64_t max_active, double rows_hint, cudaStream_t s) {
  // Chunks of rows hold twice the expected rows (a busier expert than
  // average needs no second pass over its weights), up to 32.
  if (rows_hint <= 4) return launch<GU, 1>(a, max_active, s);
  if (rows_hint <= 8) return launch<GU, 2>(a, max_active, s);
  return launch<GU, 4>(a, max_active, s);
}

}  // namespace

namespace mkmoe {

int stream_gemm(const GemmArgs& a, bool gateup, int64_t max_active, double rows_hint, cudaStream_t s) {
  return gateup ? launch_nt<true>(a, max_active, rows_hint, s) : launch_nt<false>(a, max_active, rows_hint, s);
}

}  // namespace mkmoe
