// sysflag.cuh — flags between CTAs, GPUs and processes: loads, stores and
// reductions with acquire/release semantics at GPU scope (CTAs of one
// launch, or launches on one GPU) and at system scope (a peer that is
// another GPU, or another process's context on this one, for which .gpu
// scope orders nothing), and %globaltimer for the watchdogs.
#pragma once

namespace mk {

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int ld_relaxed(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(int* p, int v) {
  asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_release_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int atom_acq_rel_add(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ int ld_acquire_sys(const int* p) {
  int v;
  asm volatile("ld.acquire.sys.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int ld_relaxed_sys(const int* p) {
  int v;
  asm volatile("ld.relaxed.sys.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(int* p, int v) {
  asm volatile("st.release.sys.global.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_release_add_sys(int* p, int v) {
  asm volatile("red.release.sys.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// epoch_reached compares wrapping epoch counters: true when v is at or past want.
__device__ __forceinline__ bool epoch_reached(int v, int want) { return (int)((unsigned)v - (unsigned)want) >= 0; }

// poll_geq is the persistent kernels' bounded wait (one thread): it spins
// until *flag >= want (an acquire load, at system scope where sys) and
// returns true, or returns false once the error word *err is set (another
// CTA gave up) or timeout_ns has passed, calling timed_out(seen) first in
// the latter case (the caller's error record). The record and the clock
// are read every 16th poll only: a load after the acquire waits for it,
// so reading them on every poll made each poll two round trips to L2 and
// a wait's detection that much later on the critical path. SleepNs
// between polls.
template <unsigned SleepNs, class TimedOut>
__device__ __forceinline__ bool poll_geq(const int* flag, int want, bool sys, const int* err, long long timeout_ns,
                                         TimedOut&& timed_out) {
  const unsigned long long t0 = globaltimer();
  for (unsigned it = 0;; ++it) {
    const int v = sys ? ld_acquire_sys(flag) : ld_acquire(flag);
    if (v >= want) return true;
    if ((it & 15) == 15) {
      if (ld_relaxed(err) != 0) return false;
      if ((long long)(globaltimer() - t0) > timeout_ns) {
        timed_out(v);
        return false;
      }
    }
    __nanosleep(SleepNs);
  }
}

}  // namespace mk
