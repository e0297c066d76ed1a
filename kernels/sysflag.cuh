// sysflag.cuh — flags between GPUs and processes: release/acquire at system
// scope (a peer may be another GPU, or another process's context on this
// one, for which .gpu scope orders nothing) and %globaltimer for watchdogs.
#pragma once

namespace mk {

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
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// epoch_reached compares wrapping epoch counters: true when v is at or past want.
__device__ __forceinline__ bool epoch_reached(int v, int want) { return (int)((unsigned)v - (unsigned)want) >= 0; }

}  // namespace mk
