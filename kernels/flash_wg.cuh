// flash_wg.cuh — what the wgmma flash attention kernels share (flash.cu's
// flash_wg, ring.cu's ring_wg): the shared-memory layout of a CTA of three
// warpgroups (one producer, two consumers of 64 query rows each), the
// producer's copies of a 128 × 128 bf16 tile, and the consumers' loop over
// key tiles (S = Q·Kᵀ and O += P·V as wgmma, the online softmax in
// registers). The kernels differ in where a tile's keys come from (the
// paged block table; the ring's chunks as they arrive) and in what they
// store at the end. Included inside no namespace (like attn_tile.cuh).
//
// Per tile the producer fills a K and a V stage of a kST-deep ring and
// arrives on their full barriers (cp.async arrivals, 128 a barrier, plus
// extra plain arrivals when the kernel publishes per-stage key bounds: see
// Keys); the consumers release a stage on its empty barrier (one arrival a
// consumer warpgroup) once P·V of it is done. A CTA that runs several
// query tiles one after another (ring_wg) carries its ring index gb across
// them, so the stages' phases stay consistent without re-initialising.
#pragma once

#include "attn_tile.cuh"
#include "wgmma.cuh"

namespace {
namespace fwg {

// kST = 3: a tile's stage goes back only once P·V of it is done (in the
// next tile's step), so 2 stages left the producer one tile behind
// (twenty-fifth pass: 307 against 407 TFLOP/s at 16k).
constexpr int kBM = 128, kBN = 128, kD = 128, kST = 3, kThreadsWG = 384;
constexpr uint32_t kHalf = 128 * 128;  // bytes of a 128-row tile's 64-column half
constexpr uint32_t kTile = 2 * kHalf;  // a 128 × 128 bf16 tile: two halves

// Geo is a CTA's geometry for head dims DQK / 128 (q and k rows of DQK
// values, v rows of 128; DQK 128, or 192 for MLA): tiles of 64-column
// blocks (128 rows × 128 B, swizzled), and as many stages as fit — three
// at 128 (224 KB with Q), two at 192 (208 KB: Q and a K tile are 48 KB).
// kSmem: alignment slack, Q, the K and V stages, then 128 bytes of
// barriers and 64 of per-stage key bounds and flags (SmemT).
template <int DQK>
struct Geo {
  static_assert(DQK == 128 || DQK == 192, "flash_wg takes head dims 128 or 192 (values 128)");
  static constexpr int kQB = DQK / 64;                // 64-column blocks of a q or k row
  static constexpr int kST = DQK == 128 ? 3 : 2;      // stages
  static constexpr uint32_t kTileQK = kQB * kHalf;    // a Q or K tile
  static constexpr uint32_t kTileV = 2 * kHalf;       // a V tile
  static constexpr size_t kSmem = 1024 + (size_t)kTileQK * (1 + kST) + (size_t)kTileV * kST + 128 + 64;
};
constexpr size_t kSmem = Geo<128>::kSmem;

// SmemT is a CTA's carved shared memory, every part an offset from one
// 1024-byte aligned base (so that no part holds a register of its own).
template <int DQK>
struct SmemT {
  using G = Geo<DQK>;
  unsigned char* base;
  __device__ __forceinline__ unsigned char* q() const { return base; }  // [kQB blocks][128 rows][128 B], swizzled
  __device__ __forceinline__ unsigned char* k() const { return base + G::kTileQK; }  // kST tiles like q
  __device__ __forceinline__ unsigned char* v() const {  // kST tiles of 2 blocks
    return base + (1 + G::kST) * G::kTileQK;
  }
  __device__ __forceinline__ uint64_t* bar() const {
    return reinterpret_cast<uint64_t*>(base + (1 + G::kST) * G::kTileQK + G::kST * G::kTileV);
  }
  __device__ __forceinline__ uint64_t* full_k(int st) const { return bar() + st; }
  __device__ __forceinline__ uint64_t* full_v(int st) const { return bar() + G::kST + st; }
  __device__ __forceinline__ uint64_t* empty(int st) const { return bar() + 2 * G::kST + st; }
  __device__ __forceinline__ uint64_t* q_full() const { return bar() + 3 * G::kST; }
  // keys: [kST][2], stage st's first key position and end (ring_wg).
  __device__ __forceinline__ int* keys() const { return reinterpret_cast<int*>(bar() + 16); }
  // flag: [4], the kernel's own CTA-wide words (ring_wg).
  __device__ __forceinline__ int* flag() const { return keys() + 2 * G::kST; }
};
using Smem = SmemT<128>;

template <int DQK = 128>
__device__ __forceinline__ SmemT<DQK> carve(unsigned char* raw) {
  return SmemT<DQK>{reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023))};
}

// init_barriers (thread 0; a __syncthreads must follow): the full barriers
// expect the producer's 128 cp.async arrivals a phase, K's `extra_k` plain
// ones more (ring_wg: the arrival that publishes the tile's key bounds).
template <int DQK>
__device__ __forceinline__ void init_barriers(const SmemT<DQK>& s, int extra_k) {
  for (int i = 0; i < Geo<DQK>::kST; i++) {
    mkwg::mbar_init(s.full_k(i), 128 + extra_k);
    mkwg::mbar_init(s.full_v(i), 128);
    mkwg::mbar_init(s.empty(i), 2);  // one arrival a consumer warpgroup
  }
  mkwg::mbar_init(s.q_full(), 128);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The N-major descriptor of V's k steps (imm-trans-b): LBO the stride
// between the two 64-column halves (N), SBO between 8-key groups (K)
// (twenty-fifth pass: the other way round fails every test).
__device__ __forceinline__ uint64_t desc_mn(uint32_t addr) { return mkwg::desc(addr, kHalf, 1024); }

// toff is the byte offset of 16-byte chunk c (0..15: columns 8c..8c+7) of
// row r in a 128 × 128 tile: half c / 8, chunk c % 8 swizzled by r % 8.
__device__ __forceinline__ uint32_t toff(int r, int c) {
  return (uint32_t)(c >> 3) * kHalf + (uint32_t)r * 128 + ((uint32_t)((c & 7) ^ (r & 7)) << 4);
}

// wgmma_rs: d += A·B, A (64 × 16 bf16) from registers a, B (16 × 128) from
// shared memory N-major (desc_mn).
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
#ifdef MK_WGMMA
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
#endif
}

// ---- producer (warpgroup 0; thread wl copies chunk wl % 16 of rows wl / 16 + 8 i) ----

// load_q copies the 128 query rows into s.q and arrives on q_full; row(r)
// is row r's first element or nullptr (zeros; dummy is a valid address).
template <class Row>
__device__ __forceinline__ void load_q(const Smem& s, int wl, const Row& row, const bf16* dummy) {
  const int c = wl % 16, r0 = wl / 16;
  unsigned char* d = s.q() + toff(r0, c);  // row r0 + 8 i is 8 i · 128 bytes on (same swizzle)
#pragma unroll 1  // (unrolled, ring_wg's slot loop kept 16 rows' offsets in spilled registers)
  for (int i = 0; i < 16; i++) {
    const bf16* src = row(r0 + 8 * i);
    cp_async16(d + i * 8 * 128, src != nullptr ? src + 8 * c : dummy, src != nullptr ? 16 : 0);
  }
  mkwg::cp_async_arrive(s.q_full());
}

// wait_empty waits (producer) until ring slot gg's stage is free again.
template <int DQK>
__device__ __forceinline__ void wait_empty(const SmemT<DQK>& s, int gg) {
  constexpr int ST = Geo<DQK>::kST;
  if (gg >= ST) mkwg::mbar_wait(s.empty(gg % ST), ((gg / ST) - 1) & 1);
}

// copy_k / copy_v copy this thread's 16 rows of a K / V tile into stage st:
// row[i] is tile row wl / 16 + 8 i's row in the source (stride elements from
// base, which points at the kv head's first element), or -1 for zeros. Each
// ends with the thread's cp.async arrival on the stage's full barrier.
__device__ __forceinline__ void copy_k(const Smem& s, int st, int wl, const bf16* base, int64_t stride,
                                       const int32_t (&row)[16]) {
  const int c = wl % 16, r0 = wl / 16;
  unsigned char* d = s.k() + st * kTile + toff(r0, c);  // row r0 + 8 i is 8 i · 128 bytes on (same swizzle)
  const bf16* b = base + 8 * c;
#pragma unroll
  for (int i = 0; i < 16; i++)
    cp_async16(d + i * 8 * 128, row[i] >= 0 ? b + (int64_t)row[i] * stride : base, row[i] >= 0 ? 16 : 0);
  mkwg::cp_async_arrive(s.full_k(st));
}
__device__ __forceinline__ void copy_v(const Smem& s, int st, int wl, const bf16* base, int64_t stride,
                                       const int32_t (&row)[16]) {
  const int c = wl % 16, r0 = wl / 16;
  unsigned char* d = s.v() + st * kTile + toff(r0, c);
  const bf16* b = base + 8 * c;
#pragma unroll
  for (int i = 0; i < 16; i++)
    cp_async16(d + i * 8 * 128, row[i] >= 0 ? b + (int64_t)row[i] * stride : base, row[i] >= 0 ? 16 : 0);
  mkwg::cp_async_arrive(s.full_v(st));
}

// tma_tile (producer thread 0, after the stage is free): K and V of a
// whole key tile into stage st by TMA — per 64-column block (Geo<DQK>::kQB
// of K, 2 of V), 8 boxes of 16 rows, each a group of 16 consecutive keys
// (one block of the pool when it is paged in multiples of 16, or 16
// contiguous rows) whose first row is grp(i), i = 0..7, from column kcol
// of km's rows and vcol of vm's; the boxes land in the same 128-byte
// swizzle as toff (destinations 2 KB apart keep its row phase), and
// complete the stage's full barriers by their bytes (this thread's
// arrivals carry the expected count).
// tile_map fills m with the map tma_tile reads (host): rows of stride bf16
// elements from ptr (a pool, a chunk buffer) in boxes of 16 rows × 64
// columns, as far as a 32-bit row index reaches (the block table or the
// chunk's bounds say which rows; none past them is read). False when the
// driver cannot make it.
inline bool tile_map(mkwg::TmaMap& m, const void* ptr, int64_t stride) {
  return mkwg::tma_map_bf16(m, ptr, (1ll << 31) - 1, stride, 16);
}

template <int DQK, class Grp>
__device__ __forceinline__ void tma_tile(const SmemT<DQK>& s, int st, const mkwg::TmaMap* km, const mkwg::TmaMap* vm,
                                         int kcol, int vcol, const Grp& grp) {
  using G = Geo<DQK>;
  mkwg::mbar_expect_tx(s.full_k(st), G::kTileQK);
#pragma unroll
  for (int i = 0; i < 8; i++) {
    unsigned char* d = s.k() + st * G::kTileQK + i * 16 * 128;
#pragma unroll
    for (int b = 0; b < G::kQB; b++) mkwg::tma_load_2d(d + b * kHalf, km, kcol + 64 * b, grp(i), s.full_k(st));
  }
  mkwg::mbar_expect_tx(s.full_v(st), G::kTileV);
#pragma unroll
  for (int i = 0; i < 8; i++) {
    unsigned char* d = s.v() + st * G::kTileV + i * 16 * 128;
    mkwg::tma_load_2d(d, vm, vcol, grp(i), s.full_v(st));
    mkwg::tma_load_2d(d + kHalf, vm, vcol + 64, grp(i), s.full_v(st));
  }
}

// ---- producer for head dims 192 / 128 (thread wl copies chunks wl % 8 +
// 8 j of rows wl / 8 + 16 i: 8 rows, one chunk in each 64-column block) ----

// copy_rows8 copies nb 64-column blocks of this thread's 8 rows into the
// tile at dst (a kQB-block Q or K tile, or a 2-block V tile): rows[i] is
// row wl / 8 + 16 i's first element or nullptr (zeros; dummy is a valid
// address), then arrives on bar.
template <int NB, class Row>
__device__ __forceinline__ void copy_rows8(unsigned char* dst, int wl, const Row& row, const bf16* dummy,
                                           uint64_t* bar) {
  const int c = wl % 8, r0 = wl / 8;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const bf16* src = row(i);
    const int r = r0 + 16 * i;
#pragma unroll
    for (int j = 0; j < NB; j++)
      cp_async16(dst + toff(r, c + 8 * j), src != nullptr ? src + 8 * (c + 8 * j) : dummy, src != nullptr ? 16 : 0);
  }
  mkwg::cp_async_arrive(bar);
}

// ---- consumers (warpgroups 1 and 2: 64 query rows each) ----

// Acc is a consumer thread's part of its warpgroup's 64 rows: rows ra and
// ra + 8 (ra = cw·64 + warp·16 + lane / 4), columns 8j + 2(lane % 4) + {0, 1}
// of O (unnormalised), the running max (raw scores) and partial sums.
struct Acc {
  float o[64];
  float ma, mb, la, lb;
};

// consume runs a warpgroup over key tiles g = 0 .. ntiles − 1 (ring slots
// gb + g) into a, after Q has landed (q_full's phase qph); posa is the
// position of the thread's row ra (row ra + 8 is posa + 8), causal and win
// (0: none; only with causal) the mask's kind; per tile S(g) and
// P·V(g − 1) issued together, tile g's softmax under P·V(g − 1), O
// rescaled once it is done (lazy: only by a warp where a factor is not 1)
// and the stage of g − 1 released. keys(g, st, kb, kend) gives tile g's
// first key position and the end of its keys (keys kb + j ≥ kend are
// masked); it may read stage st's bounds (s.keys()) once K(g) has landed.
// P alternates between two register arrays, two steps a turn: copying it
// between steps instead made ptxas serialise every wgmma of the kernel
// (C7513; 7–12 % slower, docs/PERF.md, twenty-eighth pass). PP: the two
// consumer warpgroups take turns issuing their steps (both must call with
// the same ntiles).
template <bool PP = false, int DQK, class Keys>
__device__ __forceinline__ void consume(const SmemT<DQK>& s, int gb, int ntiles, int qph, const Keys& keys, int posa,
                                        int causal, int win, float sl2, int cw, int wl, Acc& a, bool lazy = true) {
  constexpr int kST = Geo<DQK>::kST;                                          // (shadows the 128's)
  constexpr uint32_t kTileK = Geo<DQK>::kTileQK, kTileV = Geo<DQK>::kTileV;  // stage strides
  const int lane = wl % 32;
  const int cl = 2 * (lane % 4);
  const uint32_t q0 = mkwg::sm_addr(s.q()) + (uint32_t)cw * 64 * 128;
  const uint32_t k0 = mkwg::sm_addr(s.k()), v0 = mkwg::sm_addr(s.v());
#pragma unroll
  for (int i = 0; i < 64; i++) a.o[i] = 0.f;
  a.ma = -INFINITY;
  a.mb = -INFINITY;
  a.la = 0.f;
  a.lb = 0.f;
  if (ntiles == 0) return;

  // s_issue: S = Q·K(g) into sc, committed, not waited for.
  auto s_issue = [&](float(&sc)[64], int g) {
    const int st = (gb + g) % kST;
    mkwg::mbar_wait(s.full_k(st), ((gb + g) / kST) & 1);
    mkwg::fence_proxy_async();  // cp.async copies (generic proxy) before the wgmmas' reads (async proxy)
    mkwg::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < DQK / 16; kk++) {
      const uint32_t off = (uint32_t)(kk >> 2) * kHalf + (uint32_t)(kk & 3) * 32;
      mkwg::wgmma_n128(sc, mkwg::desc(q0 + off), mkwg::desc(k0 + st * kTileK + off), kk > 0);
    }
    mkwg::wgmma_commit();
  };
  // pv_issue: O += P(g)·V(g) from pc (P as bf16 pairs: the A fragments of
  // its 8 k steps), committed, not waited for.
  auto pv_issue = [&](int g, const uint32_t(&pc)[32]) {
    const int st = (gb + g) % kST;
    mkwg::mbar_wait(s.full_v(st), ((gb + g) / kST) & 1);
    mkwg::fence_proxy_async();
    mkwg::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 8; ks++) {
      const uint32_t pa[4] = {pc[4 * ks], pc[4 * ks + 1], pc[4 * ks + 2], pc[4 * ks + 3]};
      wgmma_rs(a.o, pa, desc_mn(v0 + st * kTileV + (uint32_t)ks * 16 * 128));
    }
    mkwg::wgmma_commit();
  };
  // softmax: masks tile g's scores sc, raises the running max, writes P to
  // pn and returns the factors (ca, cb) O must be scaled by before P·V(g)
  // adds to it; l is scaled by them here.
  auto softmax = [&](float(&sc)[64], int g, uint32_t(&pn)[32], float& ca, float& cb) {
    int kb, kend;
    keys(g, (gb + g) % kST, kb, kend);
    const int lim = kb + kBN - 1;
    const int pmin = posa - (wl / 32) * 16 - lane / 4;  // the warpgroup's first row
    if (lim >= kend || (causal && lim > pmin) || (win > 0 && kb <= pmin + 63 - win)) {
#pragma unroll
      for (int j = 0; j < 16; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int key = kb + 8 * j + cl + (e & 1);
          const int pos = (e & 2) ? posa + 8 : posa;
          if (key >= kend || (causal && key > pos) || (win > 0 && key <= pos - win)) sc[4 * j + e] = -INFINITY;
        }
      }
    }
    // The rows' max over this tile (4 lanes a row), in four independent
    // chains a row: one chain of 16 dependent FMNMX left the consumers
    // waiting on each one's latency (ncu: "wait" the largest stall).
    float ma4[4], mb4[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
      ma4[q] = fmaxf(sc[4 * q], sc[4 * q + 1]);
      mb4[q] = fmaxf(sc[4 * q + 2], sc[4 * q + 3]);
    }
#pragma unroll
    for (int j = 4; j < 16; j++) {
      ma4[j & 3] = fmaxf(ma4[j & 3], fmaxf(sc[4 * j], sc[4 * j + 1]));
      mb4[j & 3] = fmaxf(mb4[j & 3], fmaxf(sc[4 * j + 2], sc[4 * j + 3]));
    }
    float xa = fmaxf(fmaxf(ma4[0], ma4[1]), fmaxf(ma4[2], ma4[3]));
    float xb = fmaxf(fmaxf(mb4[0], mb4[1]), fmaxf(mb4[2], mb4[3]));
    xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
    xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
    xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
    xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
    const float na = fmaxf(a.ma, xa), nb = fmaxf(a.mb, xb);
    const float ra_ = na == -INFINITY ? 0.f : na * sl2, rb_ = nb == -INFINITY ? 0.f : nb * sl2;
    ca = a.ma == -INFINITY ? 0.f : ex2(a.ma * sl2 - ra_);
    cb = a.mb == -INFINITY ? 0.f : ex2(a.mb * sl2 - rb_);
    a.ma = na;
    a.mb = nb;
    // The tile's sums, four independent chains a row as for the max.
    float la4[4] = {0.f, 0.f, 0.f, 0.f}, lb4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 16; j++) {
      const float p0 = ex2(fmaf(sc[4 * j], sl2, -ra_)), p1 = ex2(fmaf(sc[4 * j + 1], sl2, -ra_));
      const float p2 = ex2(fmaf(sc[4 * j + 2], sl2, -rb_)), p3 = ex2(fmaf(sc[4 * j + 3], sl2, -rb_));
      la4[j & 3] += p0 + p1;
      lb4[j & 3] += p2 + p3;
      // k step j / 2: a0 (row a, columns 0-7 of its 16) and a1 (row b)
      // from group 2·ks, a2 / a3 from group 2·ks + 1.
      pn[(j >> 1) * 4 + (j & 1) * 2] = pack_bf16(p0, p1);
      pn[(j >> 1) * 4 + (j & 1) * 2 + 1] = pack_bf16(p2, p3);
    }
    a.la = fmaf(a.la, ca, (la4[0] + la4[1]) + (la4[2] + la4[3]));
    a.lb = fmaf(a.lb, cb, (lb4[0] + lb4[1]) + (lb4[2] + lb4[3]));
  };
  auto scale_o = [&](float ca, float cb) {
#pragma unroll
    for (int j = 0; j < 16; j++) {
      a.o[4 * j] *= ca;
      a.o[4 * j + 1] *= ca;
      a.o[4 * j + 2] *= cb;
      a.o[4 * j + 3] *= cb;
    }
  };
  auto release = [&](int g) {
    if (wl == 0) mkwg::mbar_arrive(s.empty((gb + g) % kST));
  };
  uint32_t pA[32], pB[32];  // P of a tile as bf16 pairs
  mkwg::mbar_wait(s.q_full(), qph);
  {  // tile 0: S, softmax (O is zero: no scaling)
    float sc[64];
    s_issue(sc, 0);
    mkwg::wgmma_wait0();
    float ca, cb;
    softmax(sc, 0, pA, ca, cb);
  }
  // step: tile g's S and P·V(g − 1) from pin issued together, then tile
  // g's softmax into pout under P·V(g − 1); O is scaled once P·V(g − 1) is
  // done (lazy: only in a warp where a row's maximum moved — a factor of
  // exactly 1, ex2(0), multiplies to the same bits), and the stage of tile
  // g − 1 goes back then.
  // PP: the two consumer warpgroups take turns issuing their
  // steps' wgmmas (named barrier 2 + cw is warpgroup cw's turn), so that
  // one's softmax runs under the other's GEMMs (FlashAttention-3's
  // ping-pong). Warpgroup 1 opens warpgroup 0's first turn and does not
  // pass on its own last one, so that each barrier gets as many arrivals
  // as waits within a call (ring_wg calls this once a slot).
  if constexpr (PP) {
    if (cw == 1 && ntiles > 1) asm volatile("bar.arrive 2, 256;\n" ::: "memory");
  }
  auto step = [&](int g, const uint32_t(&pin)[32], uint32_t(&pout)[32]) {
    float sc[64];
    if constexpr (PP) asm volatile("bar.sync %0, 256;\n" ::"r"(2 + cw) : "memory");
    s_issue(sc, g);
    pv_issue(g - 1, pin);
    if constexpr (PP) {
      if (cw == 0 || g < ntiles - 1) asm volatile("bar.arrive %0, 256;\n" ::"r"(3 - cw) : "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // S(g) done; P·V(g − 1) may run on
    float ca, cb;
    softmax(sc, g, pout, ca, cb);
    mkwg::wgmma_wait0();
    release(g - 1);
    if (!lazy || __any_sync(0xffffffffu, ca != 1.f || cb != 1.f)) scale_o(ca, cb);
  };
  // P alternates between pA and pB, two steps a turn. Copying pB to pA
  // after every step instead defines registers a wgmma reads inside a
  // pipeline stage, and ptxas then serialises every wgmma of the kernel
  // (C7513), each 64×128×16 waiting for the one before it: 222 / 395 / 452
  // TFLOP/s at 1k / 4k / 16k against this loop's 240 / 423 / 474–507.
  int g = 1;
  for (; g + 1 < ntiles; g += 2) {
    step(g, pA, pB);
    step(g + 1, pB, pA);
  }
  if (g < ntiles) {  // one step left: the last tile's P lands in pB
    step(g, pA, pB);
    pv_issue(ntiles - 1, pB);
  } else {
    pv_issue(ntiles - 1, pA);
  }
  mkwg::wgmma_wait0();
  release(ntiles - 1);
  // The rows' sums over their 4 lanes.
  a.la += __shfl_xor_sync(0xffffffffu, a.la, 1);
  a.la += __shfl_xor_sync(0xffffffffu, a.la, 2);
  a.lb += __shfl_xor_sync(0xffffffffu, a.lb, 1);
  a.lb += __shfl_xor_sync(0xffffffffu, a.lb, 2);
}

}  // namespace fwg
}  // namespace
