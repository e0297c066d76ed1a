// wgmma.cuh — internal to libmkernel: the sm_90a pieces the wgmma kernels
// share (moe_wgmma.cu's grouped expert GEMM and moe_fused.cu's warp-
// specialised compute role): warpgroup MMA on 128-byte-swizzled shared
// memory descriptors, mbarriers, TMA tile loads, register reallocation, and
// the host's TMA map encoding (cuTensorMapEncodeTiled through dlsym: no
// driver API headers or link dependency).
//
// Shared-memory layout the descriptors assume: K-major tiles of 64 bf16
// (128 bytes) a row, 16-byte chunk c of row r at chunk c ^ (r & 7), in
// 1024-byte-aligned 8-row atoms: the hardware's 128B swizzle, which is also
// what a TMA box of 64 columns with SWIZZLE_128B writes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdint>

namespace mkwg {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MK_WGMMA 1
#endif

// desc is the wgmma shared-memory descriptor of a tile at smem address
// addr (1024-aligned atom base + k offset), 128B swizzle. K-major (the
// default): LBO unused, SBO 1024 (8 rows × 128 bytes). N-major (an
// imm-trans-b operand): lbo the bytes between 64-column groups (N), sbo
// between 8-row groups (K).
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo = 16, uint32_t sbo = 1024) {
  uint64_t d = 0;
  d |= (uint64_t)((addr & 0x3FFFF) >> 4);
  d |= (uint64_t)((lbo >> 4) & 0x3FFF) << 16;
  d |= (uint64_t)((sbo >> 4) & 0x3FFF) << 32;
  d |= (uint64_t)1 << 62;  // 128-byte swizzle
  return d;
}

// wgmma_n128: d += A·Bᵀ for a 64 × 128 block, k 16, both operands in shared
// memory (K-major descriptors a, b); acc 0: d = A·Bᵀ.
__device__ __forceinline__ void wgmma_n128(float (&d)[64], uint64_t a, uint64_t b, int acc = 1) {
#ifdef MK_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(acc));
#endif
}

// wgmma_n256: [d0 | d1] += A·Bᵀ for a 64 × 256 block, k 16, both operands in
// shared memory (K-major descriptors a, b: b's 256 rows contiguous, 8-row
// atoms 1024 bytes apart); acc 0: d = A·Bᵀ. d0 holds columns [0, 128), d1
// [128, 256): the m64n256 accumulator fragment is the two m64n128 fragments
// one after the other (register 4c + q: column chunk c of 8), so this is
// wgmma_n128 on b and on b's row 128 in one instruction, reading A from
// shared memory once instead of twice.
__device__ __forceinline__ void wgmma_n256(float (&d0)[64], float (&d1)[64], uint64_t a, uint64_t b, int acc = 1) {
#ifdef MK_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d0[0]), "+f"(d0[1]), "+f"(d0[2]), "+f"(d0[3]), "+f"(d0[4]), "+f"(d0[5]), "+f"(d0[6]), "+f"(d0[7]), "+f"(d0[8]), "+f"(d0[9]), "+f"(d0[10]), "+f"(d0[11]), "+f"(d0[12]), "+f"(d0[13]), "+f"(d0[14]), "+f"(d0[15]), "+f"(d0[16]), "+f"(d0[17]), "+f"(d0[18]), "+f"(d0[19]), "+f"(d0[20]), "+f"(d0[21]), "+f"(d0[22]), "+f"(d0[23]), "+f"(d0[24]), "+f"(d0[25]), "+f"(d0[26]), "+f"(d0[27]), "+f"(d0[28]), "+f"(d0[29]), "+f"(d0[30]), "+f"(d0[31]), "+f"(d0[32]), "+f"(d0[33]), "+f"(d0[34]), "+f"(d0[35]), "+f"(d0[36]), "+f"(d0[37]), "+f"(d0[38]), "+f"(d0[39]), "+f"(d0[40]), "+f"(d0[41]), "+f"(d0[42]), "+f"(d0[43]), "+f"(d0[44]), "+f"(d0[45]), "+f"(d0[46]), "+f"(d0[47]), "+f"(d0[48]), "+f"(d0[49]), "+f"(d0[50]), "+f"(d0[51]), "+f"(d0[52]), "+f"(d0[53]), "+f"(d0[54]), "+f"(d0[55]), "+f"(d0[56]), "+f"(d0[57]), "+f"(d0[58]), "+f"(d0[59]), "+f"(d0[60]), "+f"(d0[61]), "+f"(d0[62]), "+f"(d0[63]),
        "+f"(d1[0]), "+f"(d1[1]), "+f"(d1[2]), "+f"(d1[3]), "+f"(d1[4]), "+f"(d1[5]), "+f"(d1[6]), "+f"(d1[7]), "+f"(d1[8]), "+f"(d1[9]), "+f"(d1[10]), "+f"(d1[11]), "+f"(d1[12]), "+f"(d1[13]), "+f"(d1[14]), "+f"(d1[15]), "+f"(d1[16]), "+f"(d1[17]), "+f"(d1[18]), "+f"(d1[19]), "+f"(d1[20]), "+f"(d1[21]), "+f"(d1[22]), "+f"(d1[23]), "+f"(d1[24]), "+f"(d1[25]), "+f"(d1[26]), "+f"(d1[27]), "+f"(d1[28]), "+f"(d1[29]), "+f"(d1[30]), "+f"(d1[31]), "+f"(d1[32]), "+f"(d1[33]), "+f"(d1[34]), "+f"(d1[35]), "+f"(d1[36]), "+f"(d1[37]), "+f"(d1[38]), "+f"(d1[39]), "+f"(d1[40]), "+f"(d1[41]), "+f"(d1[42]), "+f"(d1[43]), "+f"(d1[44]), "+f"(d1[45]), "+f"(d1[46]), "+f"(d1[47]), "+f"(d1[48]), "+f"(d1[49]), "+f"(d1[50]), "+f"(d1[51]), "+f"(d1[52]), "+f"(d1[53]), "+f"(d1[54]), "+f"(d1[55]), "+f"(d1[56]), "+f"(d1[57]), "+f"(d1[58]), "+f"(d1[59]), "+f"(d1[60]), "+f"(d1[61]), "+f"(d1[62]), "+f"(d1[63])
      : "l"(a), "l"(b), "r"(acc));
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef MK_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef MK_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait0() {
#ifdef MK_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait1() {
#ifdef MK_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void fence_proxy_async() {
#ifdef MK_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

__device__ __forceinline__ uint32_t sm_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
// mbar_bytes is the shared memory of n mbarriers in a row, rounded up to
// 128 bytes so that what follows them stays aligned for bulk copies.
__host__ __device__ constexpr int64_t mbar_bytes(int64_t n) { return (n * 8 + 127) / 128 * 128; }
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(sm_addr(b)), "r"(count) : "memory");
}
// mbar_try is one try_wait: true once the phase with this parity completed.
__device__ __forceinline__ bool mbar_try(uint64_t* b, unsigned parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(sm_addr(b)), "r"(parity)
      : "memory");
  return done != 0;
}
// mbar_wait returns once the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
  while (!mbar_try(b, parity)) {
  }
}
// MbarWait waits without a bound (the grouped kernel's waits).
struct MbarWait {
  __device__ __forceinline__ bool operator()(uint64_t* b, unsigned parity) const {
    mbar_wait(b, parity);
    return true;
  }
};
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sm_addr(b)) : "memory");
}
// MbarRelease gives a stage back to this CTA's producer (ws_consume's
// default).
struct MbarRelease {
  __device__ __forceinline__ void operator()(uint64_t* b) const { mbar_arrive(b); }
};
// cp_async_arrive: b's pending count drops by one when every cp.async this
// thread issued so far has landed (the count includes this arrival: noinc).
__device__ __forceinline__ void cp_async_arrive(uint64_t* b) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(sm_addr(b)) : "memory");
}
// TmaMap is CUtensorMap's 128 opaque bytes (made by cuTensorMapEncodeTiled,
// reached through dlsym: no driver API headers or link dependency).
struct alignas(64) TmaMap {
  uint64_t w[16];
};
__device__ __forceinline__ void tma_prefetch(const TmaMap* m) {
#ifdef MK_WGMMA
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(m)) : "memory");
#endif
}
// mbar_expect_tx arrives on b and adds bytes to its phase's transaction count.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(sm_addr(b)), "r"(bytes) : "memory");
}
// bulk_g2s copies bytes (a multiple of 16, both addresses 16-byte aligned)
// from global memory to this CTA's shared memory (cp.async.bulk, TMA's 1-D
// form), completing them on b.
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   sm_addr(dst)),
               "l"(src), "r"(bytes), "r"(sm_addr(b))
               : "memory");
}
// bulk_s2g copies bytes (a multiple of 16, both addresses 16-byte aligned)
// from this CTA's shared memory to global memory (cp.async.bulk, bulk-group
// completion: bulk_commit, then bulk_wait_read / bulk_wait_all).
__device__ __forceinline__ void bulk_s2g(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(sm_addr(src)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// bulk_wait_read returns once every committed bulk group has read its
// shared memory (the buffers may be written again).
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// bulk_wait_all returns once every committed bulk group has completed.
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// tma_load_2d copies the box at (column x, row y) of m's tensor into dst
// (1024-byte aligned, 128B-swizzled as m says), completing bytes on b.
__device__ __forceinline__ void tma_load_2d(void* dst, const TmaMap* m, int x, int y, uint64_t* b) {
#ifdef MK_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          sm_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(m)), "r"(x), "r"(y), "r"(sm_addr(b))
      : "memory");
#endif
}

// tma_store_2d copies src (1024-byte aligned, laid out as m's box with
// its swizzle) to the box at (column x, row y) of m's tensor; elements past
// the tensor are not written. Bulk-group completion (bulk_commit, then
// bulk_wait_read / bulk_wait_all); the writers of src fence_proxy_async
// before it is issued.
__device__ __forceinline__ void tma_store_2d(const TmaMap* m, const void* src, int x, int y) {
#ifdef MK_WGMMA
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(m)),
               "r"(x), "r"(y), "r"(sm_addr(src))
               : "memory");
#endif
}

// Two-CTA clusters (the grouped GEMM's paired tiles, MK_MOE_PAIR):
// cluster_ctarank is this CTA's rank in its cluster; cluster_sync a barrier
// of every thread of the cluster (release / acquire; not .aligned, so
// divergent warps may call it, but every thread of both CTAs must);
// mbar_arrive_peer arrives on the barrier at b's offset in CTA cta's shared
// memory; tma_load_2d_mc is tma_load_2d into dst's offset of every CTA in
// mask, completing bytes on each one's barrier at b's offset.
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r = 0;
#ifdef MK_WGMMA
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
#endif
  return r;
}
__device__ __forceinline__ void cluster_sync() {
#ifdef MK_WGMMA
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive_peer(uint64_t* b, uint32_t cta) {
#ifdef MK_WGMMA
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(sm_addr(b)), "r"(cta));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(r) : "memory");
#endif
}
__device__ __forceinline__ void tma_load_2d_mc(void* dst, const TmaMap* m, int x, int y, uint64_t* b, uint16_t mask) {
#ifdef MK_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(sm_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(m)), "r"(x), "r"(y), "r"(sm_addr(b)), "h"(mask)
      : "memory");
#endif
}

template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifdef MK_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifdef MK_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// fence_proxy_async_global orders this thread's view of global memory
// (generic proxy: data another CTA stored and released, acquired here)
// before its later TMA reads of it (async proxy).
__device__ __forceinline__ void fence_proxy_async_global() {
#ifdef MK_WGMMA
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}

// wgmma_k64_n256 issues one 64-wide k step of a warpgroup's 64 × 256 block
// as one committed wgmma group: acc0 += A·B[0, 128)ᵀ and acc1 += A·B[128,
// 256)ᵀ, a the shared-memory address of the warpgroup's 64 A rows and b of
// the stage's 256 B rows (64 bf16 a row, the swizzled layout above; a k
// step of 16 is 32 bytes).
//
// One m64n256k16 a 16 of k (wgmma_n256): the A rows are read from shared
// memory once per 256 columns. Built with -DMK_WG_N128=1 it issues two
// m64n128k16 instead, A read twice (the form before the forty-fourth pass,
// kept for same-call A/Bs; the same products and sums either way).
__device__ __forceinline__ void wgmma_k64_n256(float (&acc0)[64], float (&acc1)[64], uint32_t a, uint32_t b) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
#if defined(MK_WG_N128) && MK_WG_N128
    wgmma_n128(acc0, desc(a + kk * 32), desc(b + kk * 32));
    wgmma_n128(acc1, desc(a + kk * 32), desc(b + 128 * 128 + kk * 32));
#else
    wgmma_n256(acc0, acc1, desc(a + kk * 32), desc(b + kk * 32));
#endif
  }
  wgmma_commit();
}

// wgmma_k64_n128 is wgmma_k64_n256's half: acc += A·B[0, 128)ᵀ, b the
// address of the warpgroup's 128 B rows.
__device__ __forceinline__ void wgmma_k64_n128(float (&acc)[64], uint32_t a, uint32_t b) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; kk++) wgmma_n128(acc, desc(a + kk * 32), desc(b + kk * 32));
  wgmma_commit();
}

// ws_consume is a consumer warpgroup's k loop over an ST-stage ring filled
// by a producer: KT steps of wgmma_k64_n256 from stage g % ST (phase
// (g / ST) & 1 of full[]; g counts the CTA's k steps and is advanced), the
// A rows at a_off within each stage of stage_a bytes from sA0, the B rows
// at each stage of stage_b bytes from sB0. One wgmma group stays in
// flight; a stage goes back on empty[] (one arrival a warpgroup, by thread
// wl 0 of it) once its wgmmas are done, the last one after all are. The
// accumulators start at zero. wait(b, parity) waits for a full stage
// (MbarWait: without a bound); when it gives up, the loop stops once the
// wgmmas in flight are done and returns false (the accumulators and the
// ring's position are then unusable: the caller abandons its work).
// release(b) gives a stage back (MbarRelease: to this CTA's producer).
// HALF: a 64 × 128 block (wgmma_k64_n128 into acc0; acc1 untouched) of the
// 128 B rows at b_off within each stage.
// skip_bar >= 0: this warpgroup's 64 rows are all padding (a tile's last
// rows). Its thread wl 0 keeps the ring's pace — waits for each stage and
// gives it straight back — and no wgmma is issued, so the other warpgroup
// has the tensor cores to itself; the accumulators stay zero. The
// warpgroup then meets at named barrier skip_bar (128 threads), so none of
// its threads waits on a stage before thread 0 has seen the stage's last
// phase (a wait two phases ahead would read as done).
template <int ST, class Wait = MbarWait, class Release = MbarRelease, bool HALF = false>
__device__ __forceinline__ bool ws_consume(float (&acc0)[64], float (&acc1)[64], uint32_t sA0, uint32_t sB0,
                                           uint32_t stage_a, uint32_t stage_b, uint32_t a_off, uint64_t* full,
                                           uint64_t* empty, int wl, int KT, int& g, Wait wait = Wait(),
                                           Release release = Release(), uint32_t b_off = 0, int skip_bar = -1) {
#pragma unroll
  for (int i = 0; i < 64; i++) {
    acc0[i] = 0.0f;
    if (!HALF) acc1[i] = 0.0f;
  }
  if (skip_bar >= 0) {
    uint32_t ok = 1;
    if (wl == 0) {
      for (int kt = 0; kt < KT; kt++) {
        const int st = (g + kt) % ST;
        if (!wait(&full[st], ((g + kt) / ST) & 1)) {
          ok = 0;
          break;
        }
        release(&empty[st]);
      }
    }
    g += KT;
    uint32_t all;
    asm volatile(
        "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.and.pred q, %2, 128, p;\n selp.u32 %0, 1, 0, q;\n}\n"
        : "=r"(all)
        : "r"(ok), "r"(skip_bar)
        : "memory");
    return all != 0;
  }
  for (int kt = 0; kt < KT; kt++, g++) {
    const int st = g % ST;
    if (!wait(&full[st], (g / ST) & 1)) {
      wgmma_wait0();
      return false;
    }
    fence_proxy_async();  // copies by cp.async (generic proxy) before the wgmmas' reads (async proxy)
    if (HALF)
      wgmma_k64_n128(acc0, sA0 + st * stage_a + a_off, sB0 + st * stage_b + b_off);
    else
      wgmma_k64_n256(acc0, acc1, sA0 + st * stage_a + a_off, sB0 + st * stage_b);
    wgmma_wait1();  // k step g-1's wgmmas are done: its stage goes back
    if (kt > 0 && wl == 0) release(&empty[(g - 1) % ST]);
  }
  wgmma_wait0();
  if (wl == 0) release(&empty[(g - 1) % ST]);  // the last stage (the producer may be on the next task)
  return true;
}

// cuTensorMapEncodeTiled, found in the driver library the runtime loaded
// (null when it is not there: the single-role kernel runs).
using EncodeTiled = int (*)(TmaMap*, int, uint32_t, void*, const uint64_t*, const uint64_t*, const uint32_t*,
                            const uint32_t*, int, int, int, int);
inline EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    return h ? reinterpret_cast<EncodeTiled>(dlsym(h, "cuTensorMapEncodeTiled")) : nullptr;
  }();
  return fn;
}

// tma_map_bf16 fills m with the TMA map of a [rows, cols] row-major bf16
// matrix read in boxes of 64 columns × box_rows rows with the 128-byte
// swizzle above; elements past the matrix read as zeros. False when the
// driver cannot make it (no libcuda, a misaligned pointer or stride, too
// many rows).
inline bool tma_map_bf16(TmaMap& m, const void* ptr, int64_t rows, int64_t cols, uint32_t box_rows) {
  const EncodeTiled f = encode_tiled();
  if (f == nullptr || rows <= 0 || rows >= (1ll << 31) || reinterpret_cast<uintptr_t>(ptr) % 16 != 0 ||
      (cols * 2) % 16 != 0)
    return false;
  const uint64_t dims[2] = {(uint64_t)cols, (uint64_t)rows}, strides[1] = {(uint64_t)cols * 2};
  const uint32_t box[2] = {64, box_rows}, elem[2] = {1, 1};
  // CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9, INTERLEAVE_NONE = 0, SWIZZLE_128B = 3, L2_PROMOTION_L2_256B = 3,
  // FLOAT_OOB_FILL_NONE = 0 (out-of-bounds elements read as zeros).
  return f(&m, 9, 2, const_cast<void*>(ptr), dims, strides, box, elem, 0, 3, 3, 0) == 0;
}

}  // namespace mkwg
