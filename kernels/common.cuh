// common.cuh — internal helpers shared by the libmkernel translation units:
// the per-thread error text, call-checking macros and the library state.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdlib>
#include <atomic>
#include <thread>
#include <utility>

#include "mkernel.h"

namespace mk {

// fail records a printf-style message as the calling thread's last error
// and returns code.
int fail(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// State is the library's one device context; it belongs to the thread that
// ran mk_init.
struct State {
  bool ready = false;
  int device = -1;
  std::thread::id owner;
  // any_thread (mk_set_any_thread) accepts calls from other threads too,
  // binding the device to each on its first call; the caller serialises.
  std::atomic<bool> any_thread{false};
  // work is the stream handle 0 means while a graph is being captured, and
  // the stream graphs launch on (mk_init makes it; see mkernel.h).
  cudaStream_t work = nullptr;
  std::atomic<bool> capturing{false};
};
State& state();

// sm_count is the current device's multiprocessors (132 while it cannot be
// asked).
int sm_count();

// smem_optin is how much shared memory one CTA may opt into on the current
// device (48 KB while it cannot be asked).
size_t smem_optin();

// gemm_init creates the cuBLASLt/cuBLAS handles and workspace (gemm.cu).
int gemm_init();

// check_thread returns MK_OK when mk_init ran on the calling thread.
int check_thread(const char* fn);

// as_stream maps a stream handle to its stream; 0 is the legacy default
// stream, or the work stream while a graph is being captured.
inline cudaStream_t as_stream(uint64_t s) {
  if (s) return reinterpret_cast<cudaStream_t>(s);
  return state().capturing.load(std::memory_order_relaxed) ? state().work : nullptr;
}
inline cudaEvent_t as_event(uint64_t e) { return reinterpret_cast<cudaEvent_t>(e); }
template <typename T>
inline T* dev(uint64_t p) { return reinterpret_cast<T*>(p); }

// env_is: the environment variable name is set and its value starts with
// c (the library's switches, '1' to opt in, '0' to opt out; a caller reads
// it once, into a function-local static).
inline bool env_is(const char* name, char c) {
  const char* v = getenv(name);
  return v != nullptr && v[0] == c;
}

// env_force reads a switch that overrides a size rule: 1 or 0 when name is
// set to a value starting with '1' or '0', else -1 (the rule decides). A
// caller reads it once, into a function-local static.
inline int env_force(const char* name) {
  return env_is(name, '1') ? 1 : env_is(name, '0') ? 0 : -1;
}

// pack_bf16x2 rounds lo and hi to bf16 (RN) and packs them, lo in the low
// half (the element at the lower address).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// float_from_bits reinterprets an IEEE-754 bit pattern.
inline float float_from_bits(uint32_t b) {
  float f;
  static_assert(sizeof f == sizeof b, "float is 32 bits");
  __builtin_memcpy(&f, &b, sizeof f);
  return f;
}

// ---- programmatic dependent launch (sm_90) ----
//
// A kernel launched with mk::launch on a real stream (the graph capture's
// work stream) may start while the kernel before it in the stream is still
// running: its CTAs are scheduled as soon as every CTA of the previous
// kernel has passed pdl_begin (or exited), and they wait in pdl_begin until
// that kernel has completed and its memory is visible. A decode step is a
// chain of hundreds of kernels of a few µs each; this hides the launch and
// the CTAs' scheduling of each behind the one before. Every kernel launched
// through mk::launch must call pdl_begin() before it touches global memory
// (reads of the previous kernel's output, and writes a previous kernel may
// still read). MK_PDL=0 turns the attribute off (comparisons).

// pdl_begin waits for the previous kernel of the stream (a no-op without a
// programmatic dependency), then lets the next kernel's CTAs launch.
// (Launching them before the wait, so that a chain of one-wave kernels
// starts several links ahead, made Qwen3-8l's batch-1 step 6 % slower:
// docs/PERF.md, twenty-first pass.)
__device__ __forceinline__ void pdl_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// pdl_begin_early lets the next kernel's CTAs launch first, then waits
// for the previous kernel: for a short one-wave kernel whose successor
// issues constant loads before its own wait (a GEMV's weights), so that
// they stream under this kernel's predecessor too. Correct like
// pdl_begin: the successor's griddepcontrol.wait still waits for this
// kernel to complete. (Done by every kernel, it made Qwen3-8l's batch-1
// step 6 % slower: docs/PERF.md, twenty-first pass.)
__device__ __forceinline__ void pdl_begin_early() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// warp_sum is the sum of v over the 32 lanes of a full warp, in every lane.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ld_stream reads 16 bytes that this kernel reads only once (weights, a KV
// cache): through the non-coherent path, not kept in L1. The memory must not
// change while the kernel runs.
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// pdl_wait only waits for the previous kernel: for kernels of many waves,
// whose dependents, launched early by launch_dependents, would sit in
// pdl_begin on SM slots this kernel's later CTAs need (the dependents then
// launch when this kernel's CTAs have all exited).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// block_take takes the next index of an atomic work queue (*q) for the
// whole block: thread 0 adds one, every thread gets the old value (through
// *sh, the block's shared slot). Two barriers: the value is in *sh for all,
// and *sh is free again when it returns.
__device__ __forceinline__ int block_take(int* q, int* sh) {
  if (threadIdx.x == 0) *sh = atomicAdd(q, 1);
  __syncthreads();
  const int v = *sh;
  __syncthreads();
  return v;
}

// pdl_on reports whether mk::launch sets the programmatic attribute.
bool pdl_on();

// res_rows is the most rows of A for which the GEMVs take their
// weight-resident kernel and the kernels before them (the paged merge, the
// add + norm) launch them before they wait: MK_GEMV_SMEM_ROWS (1–4, read
// once), default 4 (measured: docs/PERF.md, twenty-fourth pass: 4 against
// 2 rows at batch 3 ×0.988–0.990 on Qwen3, Mixtral and DeepSeek-V3).
int res_rows();

// kstamps_on is set while mk_kstamp_begin's kernel stamps are on;
// kstamp_after then queues a clock stamp after kern's launch on s (runtime.cu).
extern bool kstamps_on;
void kstamp_after(const void* kern, cudaStream_t s);

// launch runs kern<<<grid, block, smem, s>>>(args...) with the programmatic
// stream serialization attribute when pdl_on() and s is not the legacy
// default stream; kern must call pdl_begin() first.
template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kern)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = (s != nullptr && pdl_on()) ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kern, std::forward<Args>(args)...);
  if (kstamps_on && e == cudaSuccess) kstamp_after(reinterpret_cast<const void*>(kern), s);
  return e;
}

#ifdef __CUDACC__
// bf16x4_to_f32 widens four bf16 values (the first in the low half of
// u.x), exactly.
__device__ __forceinline__ float4 bf16x4_to_f32(uint2 u) {
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                     __uint_as_float(u.y & 0xffff0000u));
}
#endif

}  // namespace mk

// MK_CUDA returns MK_ERR_CUDA from the enclosing function when call fails,
// naming the call, the error and the place.
#define MK_CUDA(call)                                                                    \
  do {                                                                                   \
    cudaError_t mk_e_ = (call);                                                          \
    if (mk_e_ != cudaSuccess)                                                            \
      return mk::fail(MK_ERR_CUDA, "%s: %s (%s) at %s:%d", #call, cudaGetErrorString(mk_e_), \
                      cudaGetErrorName(mk_e_), __FILE__, __LINE__);                      \
  } while (0)

// MK_LAUNCHED checks for a launch error after a <<<>>> launch of kernel `name`.
#define MK_LAUNCHED(name)                                                                \
  do {                                                                                   \
    cudaError_t mk_e_ = cudaGetLastError();                                              \
    if (mk_e_ != cudaSuccess)                                                            \
      return mk::fail(MK_ERR_CUDA, "launch of %s: %s (%s) at %s:%d", name,               \
                      cudaGetErrorString(mk_e_), cudaGetErrorName(mk_e_), __FILE__, __LINE__); \
  } while (0)

// MK_THREAD returns early unless mk_init ran on this thread.
#define MK_THREAD(fn)                         \
  do {                                        \
    int mk_rc_ = mk::check_thread(fn);        \
    if (mk_rc_ != MK_OK) return mk_rc_;       \
  } while (0)

// MK_ARG returns MK_ERR_ARG with a message when cond is false.
#define MK_ARG(cond, ...)                                        \
  do {                                                           \
    if (!(cond)) return mk::fail(MK_ERR_ARG, __VA_ARGS__);       \
  } while (0)
