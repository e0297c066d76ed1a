// flash.cu — FlashAttention-2 style prefill attention on bf16 tensor cores
// (mk_flash_attn_bf16, see mk_flash.h).
//
// One thread block (4 warps) owns BM = 64*MT query rows of one sequence:
// rph consecutive query positions of hpb query heads that share a kv head
// (hpb = 4, 2 or 1 by the GQA ratio, rph = BM/hpb), so each K/V tile it
// loads serves hpb heads. It walks the key/value tiles (BN = 64 keys) that
// the causal/window mask leaves, loading them with cp.async into a 2-stage
// shared-memory ring (tile it+1 lands while tile it is computed; one barrier
// per tile; XOR-swizzled 16-byte chunks, so that ldmatrix reads are free of
// bank conflicts), and per tile
//   S = Q·Kᵀ   mma.sync m16n8k16 bf16 → f32, Q and K through ldmatrix;
//   online softmax in registers: exp2 of S·(scale·log2 e) − running max,
//              the max raised lazily so most tiles skip rescaling O;
//   O += P·V   P re-packed from the S accumulators as the A operand, V
//              through ldmatrix.trans.
// Each warp owns 16*MT rows; with MT = 2 every K/V fragment read from shared
// memory feeds two MMAs. Only tiles that cross the diagonal, the window's
// start or the end of the keys apply a mask; tiles wholly outside are never
// loaded. Blocks are issued heaviest (last) query tile first. 128-row
// tiles (MT = 2) when they fill two blocks per multiprocessor, else 64.
//
// Head dims are padded to 32, 64, 128, 192 or 256 in shared memory with
// zeros (zero Q/K columns add nothing to S, zero V columns are not stored).
#include <cmath>

#include "attn_tile.cuh"
#include "wgmma.cuh"

namespace {

struct Params {
  void* out;
  const bf16* q;
  const bf16* k;
  const bf16* v;
  const int* q_start;
  const int* past;
  const int* table;
  const int* blocks;
  const float* sinks;
  int64_t q_stride, k_stride, v_stride, o_stride;  // elements per row
  int block_size, heads, group, hd, vhd, window, causal, out_f32, vec, ovec;
  int hpb, rph_log2;  // query heads per block (one GQA group's), log2 of rows per head
  float scale_log2;
};

template <int D, int DV, int MT>
__global__ void __launch_bounds__(kThreads, 2) flash_fwd(const Params p) {
  using C = Cfg<D, DV, MT>;
  constexpr int BM = C::BM, NO = DV / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw);
  bf16* sk = sq + C::QE;              // kStages K tiles
  bf16* sv = sk + kStages * C::KE;    // kStages V tiles

  // The block's BM rows are hpb query heads of one kv head × rph positions:
  // row r is head h0 + r/rph at query row i0 + r%rph, so one K/V tile
  // feeds hpb heads (less L2 traffic under GQA).
  const int rph = 1 << p.rph_log2;
  const int h0 = blockIdx.x * p.hpb, b = blockIdx.y;
  const int tile = gridDim.z - 1 - blockIdx.z;  // heaviest (last) tiles first
  const int qs = p.q_start[b];
  const int L = p.q_start[b + 1] - qs;
  const int i0 = tile * rph;
  if (i0 >= L) return;
  const int P = p.past[b];
  const int nk = P + L;
  const int kvh = h0 / p.group;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int iend = min(i0 + rph, L);  // query rows i0..iend-1 are real

  const int kmax = p.causal ? P + iend - 1 : nk - 1;
  const int kmin = (p.causal && p.window > 0) ? max(0, P + i0 - p.window + 1) : 0;
  const int n_lo = kmin / kBN, n_hi = kmax / kBN;
  const int ntiles = n_hi - n_lo + 1;
  const bool vec = p.vec != 0;
  const int tb = p.table[b];

  // Q rows: BM rows over kThreads threads.
  {
    constexpr int TPR = kThreads / BM;
    const int row = tid / TPR, sub = tid % TPR;
    const int qi = i0 + (row & (rph - 1)), qh = h0 + (row >> p.rph_log2);
    const bf16* src = qi < L ? p.q + (int64_t)(qs + qi) * p.q_stride + (int64_t)qh * p.hd : nullptr;
    load_row<C::WQ>(sq, row, src, p.hd, sub, TPR, vec, p.q);
    cp_async_commit();
  }

  // K/V rows: 2 threads per key row, one block-table lookup each.
  constexpr int KTPR = kThreads / kBN;
  const int lrow = tid / KTPR, lsub = tid % KTPR;
  auto load_kv = [&](int n, int stage) {
    const int j = n * kBN + lrow;
    const bf16* ks = nullptr;
    const bf16* vs = nullptr;
    if (j < nk) {
      int64_t r;
      if (p.block_size > 0)
        r = (int64_t)p.blocks[tb + j / p.block_size] * p.block_size + j % p.block_size;
      else
        r = (int64_t)tb + j;
      ks = p.k + r * p.k_stride + (int64_t)kvh * p.hd;
      vs = p.v + r * p.v_stride + (int64_t)kvh * p.vhd;
    }
    load_row<C::WQ>(sk + stage * C::KE, lrow, ks, p.hd, lsub, KTPR, vec, p.k);
    load_row<C::WV>(sv + stage * C::VE, lrow, vs, p.vhd, lsub, KTPR, vec, p.v);
  };
  load_kv(n_lo, 0);
  cp_async_commit();

  float o[MT][NO][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int nt = 0; nt < NO; ++nt) o[mi][nt][0] = o[mi][nt][1] = o[mi][nt][2] = o[mi][nt][3] = 0.f;
    m[mi][0] = m[mi][1] = -INFINITY;
    l[mi][0] = l[mi][1] = 0.f;
  }
  const float sl2 = p.scale_log2;
  const int g = lane / 4, t4 = lane % 4;
  const int wrow = warp * 16 * MT;  // the warp's first row in the tile
  const TileAddr<D, DV, MT> ad(sq, sk, sv, wrow, lane);
  const TileRows tr{P + i0, P + iend, nk, rph};

  for (int it = 0; it < ntiles; ++it) {
    // Tile it has landed and every warp is done with tile it-1, whose stage
    // now takes tile it+1 (in flight while tile it is computed).
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < ntiles) load_kv(n_lo + it + 1, (it + 1) % kStages);
    cp_async_commit();
    const uint32_t koff = 2 * (it % kStages) * C::KE, voff = 2 * (it % kStages) * C::VE;
    attend_tile<D, DV, MT>(o, m, l, ad, koff, voff, (n_lo + it) * kBN, tr, p.causal, p.window, wrow, sl2);
  }
  cp_async_wait<0>();

  // Normalise (sinks join the denominator) and store.
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float ll = l[mi][hh];
      ll += __shfl_xor_sync(0xffffffffu, ll, 1);
      ll += __shfl_xor_sync(0xffffffffu, ll, 2);
      const int row = wrow + mi * 16 + g + hh * 8;
      const int h = h0 + (row >> p.rph_log2), i = i0 + (row & (rph - 1));
      float f = 1.f;
      if (p.sinks != nullptr) {
        const float sink2 = p.sinks[h] * kLog2e;
        const float mm = fmaxf(m[mi][hh], sink2);
        f = ex2(m[mi][hh] - mm);
        ll = ll * f + ex2(sink2 - mm);
      }
      const float inv = ll > 0.f ? f / ll : 0.f;
      if (i >= L) continue;
      const int64_t base = (int64_t)(qs + i) * p.o_stride + (int64_t)h * p.vhd;
#pragma unroll
      for (int nt = 0; nt < NO; ++nt) {
        const int col = nt * 8 + 2 * t4;
        if (col >= p.vhd) continue;
        const float v0 = o[mi][nt][2 * hh] * inv, v1 = o[mi][nt][2 * hh + 1] * inv;
        if (p.out_f32) {
          float* dst = static_cast<float*>(p.out) + base + col;
          if (p.ovec)
            *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
          else {
            dst[0] = v0;
            if (col + 1 < p.vhd) dst[1] = v1;
          }
        } else {
          bf16* dst = static_cast<bf16*>(p.out) + base + col;
          if (p.ovec)
            *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
          else {
            dst[0] = __float2bfloat16_rn(v0);
            if (col + 1 < p.vhd) dst[1] = __float2bfloat16_rn(v1);
          }
        }
      }
    }
  }
}

template <int D, int DV, int MT>
int launch(const Params& p, int batch, int max_q_len, cudaStream_t st) {
  using C = Cfg<D, DV, MT>;
  static bool attr_set = false;  // the library runs on its one owning thread
  if (!attr_set) {
    MK_CUDA(cudaFuncSetAttribute(flash_fwd<D, DV, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::smem));
    attr_set = true;
  }
  const int rph = C::BM / p.hpb;
  const int tiles = (max_q_len + rph - 1) / rph;
  MK_ARG(tiles <= 65535, "mk_flash_attn_bf16: max_q_len=%d needs %d query tiles of %d rows, more than 65535",
         max_q_len, tiles, rph);
  Params q = p;
  q.rph_log2 = __builtin_ctz(rph);
  dim3 grid(p.heads / p.hpb, batch, tiles);
  flash_fwd<D, DV, MT><<<grid, kThreads, C::smem, st>>>(q);
  MK_LAUNCHED("flash_fwd");
  return MK_OK;
}

// ---------------------------------------------------------------- wgmma path
//
// flash_wg (sm_90a; the default, MK_FLASH_WG=0 turns it off): the forward pass for
// head dims 128/128 without a window or sinks, FlashAttention-3 style. A
// CTA of three warpgroups owns 128 query rows of one head: warpgroup 0
// copies Q once and then, tile after tile, 128 keys of K and V (cp.async
// through the block table, zeros past the keys) into a 3-stage ring of
// 128B-swizzled shared memory; warpgroups 1 and 2 own 64 rows each and per
// tile run S = Q·Kᵀ as wgmma from shared memory (K-major, 8 k steps of 16),
// the online softmax in registers, and O += P·V as wgmma with P from
// registers (the S accumulators re-packed to bf16 in place: the m64 D
// fragment of 16 columns is the A fragment of one k step) and V from
// shared memory read N-major (imm-trans-b: V's rows are keys, so no
// transpose is copied). Per-stage full barriers for K and V (the S wgmmas
// start while V lands) and an empty barrier the consumers release after
// the P·V wgmmas (a 3-stage ring: 224 KB of shared memory with Q). Each
// consumer issues S(t) and P·V(t − 1) together and runs tile t's softmax
// while P·V(t − 1) is in flight (O is rescaled once it is done). H200,
// causal, 32 / 8 heads: 212 / 351 / 407 TFLOP/s at 1k / 4k / 16k against
// the mma.sync kernel's 157 / 294 / 332 (docs/PERF.md, twenty-fifth pass;
// FlashAttention-3's ping-pong of the two consumers measured 5–6 % slower
// and is not used).
namespace fwg {

// kST = 3: a tile's stage goes back only once P·V of it is done (in the
// next tile's step), so 2 stages left the producer one tile behind
// (twenty-fifth pass: 307 against 407 TFLOP/s at 16k).
constexpr int kBM = 128, kBN = 128, kST = 3, kThreadsWG = 384;
constexpr uint32_t kHalf = 128 * 128;  // bytes of a 128-row tile's 64-column half
// tile_bytes is a 128-row tile of head dim D (64 or 128): D / 64 halves.
__host__ __device__ constexpr uint32_t tile_bytes(int D) { return (uint32_t)(D / 64) * kHalf; }
// smem_bytes: alignment slack, Q, kST K and V tiles, barriers, a tile's pool rows.
__host__ __device__ constexpr size_t smem_bytes(int D) { return 1024 + (size_t)tile_bytes(D) * (1 + 2 * kST) + 128 + kBN * 4; }

// The N-major descriptor of V's k steps (imm-trans-b): LBO the stride
// between the two 64-column halves (N), SBO between 8-key groups (K)
// (twenty-fifth pass: the other way round fails every test).
__device__ __forceinline__ uint64_t desc_mn(uint32_t addr) { return mkwg::desc(addr, kHalf, 1024); }

// toff is the byte offset of 16-byte chunk c (0..15: columns 8c..8c+7) of
// row r in a 128 × 128 tile: half c / 8, chunk c % 8 swizzled by r % 8.
__device__ __forceinline__ uint32_t toff(int r, int c) {
  return (uint32_t)(c >> 3) * kHalf + (uint32_t)r * 128 + ((uint32_t)((c & 7) ^ (r & 7)) << 4);
}


// wgmma_rs: d += A·B, A (64 × 16 bf16) from registers a, B (16 × N) from
// shared memory N-major (desc_mn); N = 128 (d[64]) or 64 (d[32]).
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
#ifdef MK_WGMMA
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
#endif
}
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
#ifdef MK_WGMMA
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
#endif
}

// V2 (MK_FLASH_WG=2; written after the twenty-fifth pass's device time,
// not yet run on a GPU): the producer looks a tile's pool rows up once
// into shared memory and keeps to 40 registers, so the consumers get 232
// (224 spilled with the two P arrays); P alternates between two register
// arrays, because copying one into the other put register moves between
// the wgmmas of a step and ptxas serialised them (warning C7513 on the
// shipped version). V2 also takes head dims 64/64, sliding windows and
// sinks (gpt-oss): tiles before a CTA's window are skipped, keys before a
// row's window masked, and exp(sink − max) joins each row's denominator.
// D is the head dim (and value head dim): 128, or 64 with V2.
template <int D, bool V2>
__global__ void __launch_bounds__(kThreadsWG, 1) flash_wg(const Params p) {
  static_assert(D == 128 || (D == 64 && V2), "flash_wg: head dims 128, or 64 with V2");
  constexpr uint32_t kTile = tile_bytes(D);
  constexpr int CPR = D / 8;      // 16-byte chunks a row
  constexpr int RP = 128 / CPR;   // rows a producer pass covers (8 or 16)
  constexpr int NP = kBN / RP;    // passes a tile (16 or 8)
  constexpr int KS = D / 16;      // k steps of S = Q·Kᵀ
  constexpr int NO = D / 2;       // O accumulators a thread
  extern __shared__ unsigned char fwg_raw[];
  unsigned char* base =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(fwg_raw) + 1023) & ~uintptr_t(1023));
  unsigned char* sQ = base;                    // [D / 64 halves][128 rows][128 B]
  unsigned char* sK = sQ + kTile;              // kST tiles
  unsigned char* sV = sK + kST * kTile;        // kST tiles
  uint64_t* fullK = reinterpret_cast<uint64_t*>(sV + kST * kTile);
  uint64_t* fullV = fullK + kST;
  uint64_t* empty = fullV + kST;
  uint64_t* qfull = empty + kST;
  int32_t* prow = reinterpret_cast<int32_t*>(reinterpret_cast<unsigned char*>(fullK) + 128);  // [kBN]

  const int h = blockIdx.x, b = blockIdx.y;
  const int tile = gridDim.z - 1 - blockIdx.z;  // heaviest (last) tiles first
  const int qs = p.q_start[b];
  const int L = p.q_start[b + 1] - qs;
  const int i0 = tile * kBM;
  if (i0 >= L) return;
  const int P = p.past[b];
  const int nk = P + L;
  const int kvh = h / p.group;
  const int iend = min(i0 + kBM, L);
  const int kmax = p.causal ? P + iend - 1 : nk - 1;
  // The window (V2, causal): the CTA's first row sees keys from P + i0 −
  // window + 1, so the tiles before that one are never loaded.
  const int win = V2 && p.causal ? p.window : 0;
  const int kmin = win > 0 ? max(0, P + i0 - win + 1) : 0;
  const int t0 = kmin / kBN;               // first key tile
  const int ntiles = kmax / kBN + 1 - t0;  // tiles t0 .. t0 + ntiles − 1; g = t − t0 counts them
  const int tb = p.table[b];

  const int tid = threadIdx.x, wg = tid / 128, wl = tid % 128;
  if (tid == 0) {
    for (int s = 0; s < kST; s++) {
      mkwg::mbar_init(&fullK[s], 128);  // the producer's 128 cp.async arrivals
      mkwg::mbar_init(&fullV[s], 128);
      mkwg::mbar_init(&empty[s], 2);    // one arrival a consumer warpgroup
    }
    mkwg::mbar_init(qfull, 128);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {  // producer: thread wl copies chunk wl % CPR of rows wl / CPR + RP i
    if constexpr (V2 && D == 128)
      mkwg::setmaxnreg_dec<40>();
    else
      mkwg::setmaxnreg_dec<56>();
    const int c = wl % CPR, r0 = wl / CPR;
    for (int i = 0; i < NP; i++) {
      const int r = r0 + RP * i, qi = i0 + r;
      const bool v = qi < iend;
      const bf16* src = v ? p.q + (int64_t)(qs + qi) * p.q_stride + (int64_t)h * D + 8 * c : p.q;
      cp_async16(sQ + toff(r, c), src, v ? 16 : 0);
    }
    mkwg::cp_async_arrive(qfull);
    const bf16* kp = p.k + (int64_t)kvh * D + 8 * c;
    const bf16* vp = p.v + (int64_t)kvh * D + 8 * c;
    // lookup is key j's pool row, or -1 outside [kmin, kmax].
    const auto lookup = [&](int j) -> int32_t {
      return j > kmax || (V2 && j < kmin) ? -1
             : p.block_size > 0 ? p.blocks[tb + j / p.block_size] * p.block_size + j % p.block_size
                                : tb + j;
    };
    for (int g = 0; g < ntiles; g++) {
      const int st = g % kST, t = t0 + g;
      if (g >= kST) mkwg::mbar_wait(&empty[st], ((g / kST) - 1) & 1);
      unsigned char* k = sK + st * kTile + toff(r0, c);  // row r0 + RP i is RP i · 128 bytes on (same swizzle)
      unsigned char* vv = sV + st * kTile + toff(r0, c);
      if constexpr (V2) {
        // A tile's pool rows looked up once, a row a thread, into prow
        // (named barrier 1 is the producer warpgroup's own); each copy
        // reads its row from there.
        asm volatile("bar.sync 1, 128;\n" ::: "memory");  // every producer thread is done with prow
        prow[wl] = lookup(t * kBN + wl);
        asm volatile("bar.sync 1, 128;\n" ::: "memory");
#pragma unroll 4
        for (int i = 0; i < NP; i++) {
          const int32_t row = prow[r0 + RP * i];
          cp_async16(k + i * RP * 128, row >= 0 ? kp + (int64_t)row * p.k_stride : p.k, row >= 0 ? 16 : 0);
        }
        mkwg::cp_async_arrive(&fullK[st]);
#pragma unroll 4
        for (int i = 0; i < NP; i++) {
          const int32_t row = prow[r0 + RP * i];
          cp_async16(vv + i * RP * 128, row >= 0 ? vp + (int64_t)row * p.v_stride : p.v, row >= 0 ? 16 : 0);
        }
      } else {
        int32_t row[NP];  // this thread's keys' pool rows (56 registers)
#pragma unroll
        for (int i = 0; i < NP; i++) row[i] = lookup(t * kBN + r0 + RP * i);
#pragma unroll
        for (int i = 0; i < NP; i++)
          cp_async16(k + i * RP * 128, row[i] >= 0 ? kp + (int64_t)row[i] * p.k_stride : p.k, row[i] >= 0 ? 16 : 0);
        mkwg::cp_async_arrive(&fullK[st]);
#pragma unroll
        for (int i = 0; i < NP; i++)
          cp_async16(vv + i * RP * 128, row[i] >= 0 ? vp + (int64_t)row[i] * p.v_stride : p.v, row[i] >= 0 ? 16 : 0);
      }
      mkwg::cp_async_arrive(&fullV[st]);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  if constexpr (V2 && D == 128)  // 40 / 232: the consumers' two P arrays and 64 O values
    mkwg::setmaxnreg_inc<232>();
  else
    mkwg::setmaxnreg_inc<224>();
  const int cw = wg - 1, warp = wl / 32, lane = tid % 32;
  // This thread's rows (of the CTA's 128): ra and ra + 8; its columns of
  // each 8-column group j: 8j + 2(lane % 4) + {0, 1}.
  const int ra = cw * 64 + warp * 16 + lane / 4;
  const int posa = P + i0 + ra, posb = posa + 8;
  const int cl = 2 * (lane % 4);
  const uint32_t q0 = mkwg::sm_addr(sQ) + (uint32_t)cw * 64 * 128;
  const uint32_t k0 = mkwg::sm_addr(sK), v0 = mkwg::sm_addr(sV);
  const float sl2 = p.scale_log2;

  float o[NO];
#pragma unroll
  for (int i = 0; i < NO; i++) o[i] = 0.f;
  float ma = -INFINITY, mb = -INFINITY, la = 0.f, lb = 0.f;  // running max (raw scores) and partial sums

  // s_issue: S = Q·K(g) into s, committed, not waited for (after K(g)'s
  // full barrier).
  auto s_issue = [&](float(&s)[64], int g) {
    const int st = g % kST;
    mkwg::mbar_wait(&fullK[st], (g / kST) & 1);
    mkwg::fence_proxy_async();  // cp.async copies (generic proxy) before the wgmmas' reads (async proxy)
    mkwg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
      const uint32_t off = (uint32_t)(kk >> 2) * kHalf + (uint32_t)(kk & 3) * 32;
      mkwg::wgmma_n128(s, mkwg::desc(q0 + off), mkwg::desc(k0 + st * kTile + off), kk > 0);
    }
    mkwg::wgmma_commit();
  };
  // pv_issue: O += P(g)·V(g) from pc (P as bf16 pairs: the A fragments of
  // its 8 k steps), committed, not waited for.
  auto pv_issue = [&](int g, const uint32_t(&pc)[32]) {
    const int st = g % kST;
    mkwg::mbar_wait(&fullV[st], (g / kST) & 1);
    mkwg::fence_proxy_async();
    mkwg::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 8; ks++) {
      const uint32_t a[4] = {pc[4 * ks], pc[4 * ks + 1], pc[4 * ks + 2], pc[4 * ks + 3]};
      wgmma_rs(o, a, desc_mn(v0 + st * kTile + (uint32_t)ks * 16 * 128));
    }
    mkwg::wgmma_commit();
  };
  // softmax: masks tile g's scores s, raises the running max, writes P to
  // pn and returns the factors (ca, cb) O must be scaled by before P·V(g)
  // adds to it; l is scaled by them here.
  auto softmax = [&](float(&s)[64], int g, uint32_t(&pn)[32], float& ca, float& cb) {
    const int kb = (t0 + g) * kBN;
    const int lim = kb + kBN - 1;
    const int pmin = P + i0 + cw * 64;  // the warpgroup's first row position
    if (lim > kmax || (p.causal && lim > pmin) || (win > 0 && kb <= pmin + 63 - win)) {
#pragma unroll
      for (int j = 0; j < 16; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int key = kb + 8 * j + cl + (e & 1);
          const int pos = (e & 2) ? posb : posa;
          if (key >= nk || (p.causal && key > pos) || (win > 0 && key <= pos - win)) s[4 * j + e] = -INFINITY;
        }
      }
    }
    float xa = -INFINITY, xb = -INFINITY;  // the rows' max over this tile (4 lanes a row)
#pragma unroll
    for (int j = 0; j < 16; j++) {
      xa = fmaxf(xa, fmaxf(s[4 * j], s[4 * j + 1]));
      xb = fmaxf(xb, fmaxf(s[4 * j + 2], s[4 * j + 3]));
    }
    xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
    xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
    xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
    xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
    const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
    const float ra_ = na == -INFINITY ? 0.f : na * sl2, rb_ = nb == -INFINITY ? 0.f : nb * sl2;
    ca = ma == -INFINITY ? 0.f : ex2(ma * sl2 - ra_);
    cb = mb == -INFINITY ? 0.f : ex2(mb * sl2 - rb_);
    ma = na;
    mb = nb;
    la *= ca;
    lb *= cb;
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const float p0 = ex2(fmaf(s[4 * j], sl2, -ra_)), p1 = ex2(fmaf(s[4 * j + 1], sl2, -ra_));
      const float p2 = ex2(fmaf(s[4 * j + 2], sl2, -rb_)), p3 = ex2(fmaf(s[4 * j + 3], sl2, -rb_));
      la += p0 + p1;
      lb += p2 + p3;
      // k step j / 2: a0 (row a, columns 0-7 of its 16) and a1 (row b)
      // from group 2·ks, a2 / a3 from group 2·ks + 1.
      pn[(j >> 1) * 4 + (j & 1) * 2] = pack_bf16(p0, p1);
      pn[(j >> 1) * 4 + (j & 1) * 2 + 1] = pack_bf16(p2, p3);
    }
  };
  auto scale_o = [&](float ca, float cb) {
#pragma unroll
    for (int j = 0; j < NO / 4; j++) {
      o[4 * j] *= ca;
      o[4 * j + 1] *= ca;
      o[4 * j + 2] *= cb;
      o[4 * j + 3] *= cb;
    }
  };
  // Tile g: S(g) and P·V(g − 1) issued together, then tile g's softmax
  // into pn under P·V(g − 1); O is scaled once P·V(g − 1) is done; the
  // stage of tile g − 1 goes back then.
  auto step = [&](int g, const uint32_t(&pc)[32], uint32_t(&pn)[32]) {
    float s[64];
    s_issue(s, g);
    pv_issue(g - 1, pc);
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // S(g) done; P·V(g − 1) may run on
    float ca, cb;
    softmax(s, g, pn, ca, cb);
    mkwg::wgmma_wait0();
    if (wl == 0) mkwg::mbar_arrive(&empty[(g - 1) % kST]);
    scale_o(ca, cb);
  };
  uint32_t pA[32], pB[32];  // P of a tile as bf16 pairs
  mkwg::mbar_wait(qfull, 0);
  {  // tile 0: S, softmax (O is zero: no scaling)
    float s[64];
    s_issue(s, 0);
    mkwg::wgmma_wait0();
    float ca, cb;
    softmax(s, 0, pA, ca, cb);
  }
  if constexpr (V2) {  // P alternates between pA and pB: no copy between the wgmmas
    int g = 1;
    for (; g + 1 < ntiles; g += 2) {
      step(g, pA, pB);
      step(g + 1, pB, pA);
    }
    if (g < ntiles) {
      step(g, pA, pB);
      pv_issue(ntiles - 1, pB);
    } else {
      pv_issue(ntiles - 1, pA);
    }
  } else {  // tile g's P into pB, then copied to pA for the next step
    for (int g = 1; g < ntiles; g++) {
      step(g, pA, pB);
#pragma unroll
      for (int i = 0; i < 32; i++) pA[i] = pB[i];
    }
    pv_issue(ntiles - 1, pA);
  }
  mkwg::wgmma_wait0();
  if (wl == 0) mkwg::mbar_arrive(&empty[(ntiles - 1) % kST]);

  // O / l, rows ra and ra + 8 of the CTA's (stored where they are real);
  // a sink (V2) joins the denominator as exp(sink − max).
  la += __shfl_xor_sync(0xffffffffu, la, 1);
  la += __shfl_xor_sync(0xffffffffu, la, 2);
  lb += __shfl_xor_sync(0xffffffffu, lb, 1);
  lb += __shfl_xor_sync(0xffffffffu, lb, 2);
  float fa = 1.f, fb = 1.f;  // O's factor when the sink exceeds the row's max
  if (V2 && p.sinks != nullptr) {
    const float sk = p.sinks[h] * kLog2e;
    const auto join = [&](float m, float& l, float& f) {
      const float r = m == -INFINITY ? -INFINITY : m * sl2;
      if (sk > r) {  // the sink is the max: rescale the keys' sum and O to it
        f = r == -INFINITY ? 0.f : ex2(r - sk);
        l = l * f + 1.f;
      } else {
        l += ex2(sk - r);
      }
    };
    join(ma, la, fa);
    join(mb, lb, fb);
  }
  const float ia = fa / la, ib = fb / lb;
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int qi = i0 + ra + 8 * hh;
    if (qi >= iend) continue;
    const float inv = hh ? ib : ia;
    const int64_t obase = (int64_t)(qs + qi) * p.o_stride + (int64_t)h * D;
#pragma unroll
    for (int j = 0; j < NO / 4; j++) {
      const int col = 8 * j + cl;
      const float x0 = o[4 * j + 2 * hh] * inv, x1 = o[4 * j + 2 * hh + 1] * inv;
      if (p.out_f32)
        *reinterpret_cast<float2*>(static_cast<float*>(p.out) + obase + col) = make_float2(x0, x1);
      else
        *reinterpret_cast<__nv_bfloat162*>(static_cast<bf16*>(p.out) + obase + col) = __floats2bfloat162_rn(x0, x1);
    }
  }
}

// mode is MK_FLASH_WG (read once): 0 the mma.sync kernel everywhere, 1
// (the default) flash_wg<128, false> where it applies, 2 flash_wg<D, true>
// (not yet run on a GPU).
int mode() {
  static const int m = mk::env_is("MK_FLASH_WG", '0') ? 0 : mk::env_is("MK_FLASH_WG", '2') ? 2 : 1;
  return m;
}
bool on() { return mode() != 0; }
bool v2() { return mode() == 2; }

// fits reports whether flash_wg takes a call: 16-byte rows (p.vec,
// p.ovec) and head dims 128/128 without a window or sinks; with V2 also
// 64/64, windows and sinks.
bool fits(const Params& p, int head_dim, int v_head_dim) {
  if (!p.vec || !p.ovec || head_dim != v_head_dim) return false;
  if (v2()) return head_dim == 128 || head_dim == 64;
  return head_dim == 128 && p.window == 0 && p.sinks == nullptr;
}

template <int D, bool V2>
int launch_d(const Params& p, dim3 grid, cudaStream_t st) {
  static bool attr_set = false;  // per instantiation; the library runs on its one owning thread
  if (!attr_set) {
    MK_CUDA(cudaFuncSetAttribute(flash_wg<D, V2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes(D)));
    attr_set = true;
  }
  flash_wg<D, V2><<<grid, kThreadsWG, smem_bytes(D), st>>>(p);
  MK_LAUNCHED("flash_wg");
  return MK_OK;
}

int launch(const Params& p, int head_dim, int batch, int max_q_len, cudaStream_t st) {
  const int tiles = (max_q_len + kBM - 1) / kBM;
  MK_ARG(tiles <= 65535, "mk_flash_attn_bf16: max_q_len=%d needs %d query tiles of %d rows, more than 65535",
         max_q_len, tiles, kBM);
  const dim3 grid(p.heads, batch, tiles);
  if (!v2()) return launch_d<128, false>(p, grid, st);
  return head_dim == 64 ? launch_d<64, true>(p, grid, st) : launch_d<128, true>(p, grid, st);
}

}  // namespace fwg

int pad_dim(int d) {
  if (d <= 32) return 32;
  if (d <= 64) return 64;
  if (d <= 128) return 128;
  if (d <= 192) return 192;
  return 256;
}

using mk::sm_count;

}  // namespace

extern "C" MK_API int32_t mk_flash_attn_bf16(uint64_t stream, uint64_t out, int32_t out_dtype, uint64_t q,
                                             uint64_t pool_k, uint64_t pool_v, uint64_t q_start, uint64_t past,
                                             uint64_t table, uint64_t blocks, int32_t block_size, int32_t batch,
                                             int32_t max_q_len, int32_t heads, int32_t kv_heads, int32_t head_dim,
                                             int32_t v_head_dim, uint32_t scale_bits, int32_t window,
                                             uint64_t sinks, int32_t causal) {
  MK_THREAD("mk_flash_attn_bf16");
  const float scale = mk::float_from_bits(scale_bits);
  MK_ARG(out && q && pool_k && pool_v && q_start && past && table,
         "mk_flash_attn_bf16: out, q, pool_k, pool_v, q_start, past and table must be non-null");
  MK_ARG(out_dtype == MK_DTYPE_BF16 || out_dtype == MK_DTYPE_F32, "mk_flash_attn_bf16: out_dtype %d is not bf16 or f32",
         out_dtype);
  MK_ARG(batch >= 1 && batch <= 65535, "mk_flash_attn_bf16: batch=%d must be in [1, 65535]", batch);
  MK_ARG(max_q_len >= 1, "mk_flash_attn_bf16: max_q_len=%d must be >= 1", max_q_len);
  MK_ARG(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0,
         "mk_flash_attn_bf16: heads=%d must be a positive multiple of kv_heads=%d", heads, kv_heads);
  MK_ARG(heads <= 65535, "mk_flash_attn_bf16: heads=%d > 65535", heads);
  MK_ARG(head_dim >= 1 && head_dim <= 256 && v_head_dim >= 1 && v_head_dim <= 256,
         "mk_flash_attn_bf16: head_dim=%d and v_head_dim=%d must be in [1, 256]", head_dim, v_head_dim);
  MK_ARG(block_size >= 0, "mk_flash_attn_bf16: block_size=%d must be >= 0 (0: contiguous)", block_size);
  MK_ARG(block_size == 0 || blocks != 0, "mk_flash_attn_bf16: paged (block_size=%d) needs a blocks table", block_size);
  MK_ARG(std::isfinite(scale) && scale > 0, "mk_flash_attn_bf16: scale %g must be finite and > 0", (double)scale);
  MK_ARG(window >= 0, "mk_flash_attn_bf16: window=%d must be >= 0", window);
  MK_ARG(causal == 0 || causal == 1, "mk_flash_attn_bf16: causal=%d must be 0 or 1", causal);
  MK_ARG(causal == 1 || window == 0, "mk_flash_attn_bf16: a window (%d) needs causal=1", window);

  Params p{};
  p.out = reinterpret_cast<void*>(out);
  p.q = mk::dev<const bf16>(q);
  p.k = mk::dev<const bf16>(pool_k);
  p.v = mk::dev<const bf16>(pool_v);
  p.q_start = mk::dev<const int>(q_start);
  p.past = mk::dev<const int>(past);
  p.table = mk::dev<const int>(table);
  p.blocks = mk::dev<const int>(blocks);
  p.sinks = mk::dev<const float>(sinks);
  p.q_stride = (int64_t)heads * head_dim;
  p.k_stride = (int64_t)kv_heads * head_dim;
  p.v_stride = (int64_t)kv_heads * v_head_dim;
  p.o_stride = (int64_t)heads * v_head_dim;
  p.block_size = block_size;
  p.heads = heads;
  p.group = heads / kv_heads;
  p.hpb = p.group % 4 == 0 ? 4 : p.group % 2 == 0 ? 2 : 1;
  p.hd = head_dim;
  p.vhd = v_head_dim;
  p.window = window;
  p.causal = causal;
  p.out_f32 = out_dtype == MK_DTYPE_F32;
  p.vec = head_dim % 8 == 0 && v_head_dim % 8 == 0 && q % 16 == 0 && pool_k % 16 == 0 && pool_v % 16 == 0;
  p.ovec = v_head_dim % 2 == 0 && out % (p.out_f32 ? 8 : 4) == 0;
  p.scale_log2 = scale * 1.4426950408889634f;

  cudaStream_t st = mk::as_stream(stream);
  if (fwg::on() && fwg::fits(p, head_dim, v_head_dim)) return fwg::launch(p, head_dim, batch, max_q_len, st);
  int d = pad_dim(head_dim), dv = pad_dim(v_head_dim);
  if (d == 192 && dv <= 128) dv = 128;
  else if (d != dv) d = dv = d > dv ? d : dv;
  // 128-row tiles unless that leaves fewer than two blocks per multiprocessor.
  const int64_t blocks128 = (int64_t)(heads / p.hpb) * batch * ((max_q_len + 128 / p.hpb - 1) / (128 / p.hpb));
  const bool big = blocks128 >= 2 * sm_count();
  switch (d * 1000 + dv) {
    case 32032: return big ? launch<32, 32, 2>(p, batch, max_q_len, st) : launch<32, 32, 1>(p, batch, max_q_len, st);
    case 64064: return big ? launch<64, 64, 2>(p, batch, max_q_len, st) : launch<64, 64, 1>(p, batch, max_q_len, st);
    case 128128:
      return big ? launch<128, 128, 2>(p, batch, max_q_len, st) : launch<128, 128, 1>(p, batch, max_q_len, st);
    case 192128: return launch<192, 128, 1>(p, batch, max_q_len, st);
    case 192192: return launch<192, 192, 1>(p, batch, max_q_len, st);
    case 256256: return launch<256, 256, 1>(p, batch, max_q_len, st);
  }
  return mk::fail(MK_ERR_ARG, "mk_flash_attn_bf16: no kernel for head dims %d/%d", head_dim, v_head_dim);
}
