// ce_probe.cu — can a device-to-device copy run while a kernel holds every
// SM? The question behind ring.cu's copy-engine hops (MK_RING_CE=1), whose
// slots timed out waiting for the first hop (fifty-third pass, call 1):
// ring_wg takes all of an SM's registers, so a copy that the driver runs as
// a kernel cannot start until the ring ends, and the ring waits for it.
//
//   nvcc -O3 -arch=sm_90a -o .dev/ce_probe scripts/ce_probe.cu -lcuda && .dev/ce_probe
//
// A spinning kernel (as many 1024-thread CTAs as fit an SM: every thread
// slot taken, every warp polling) waits, bounded by 2 s, for a flag that a
// second stream sets after a 64 MiB copy: first device to device with
// cudaMemcpyAsync, then with cuMemcpyBatchAsync and its "prefer overlap
// with compute" hint, then a host-to-device copy of the flag alone (from
// pinned memory: the copy engines' case). Each line says whether the
// kernel saw the flag before its bound and how long the copy took
// (events on the copy stream).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "probe_check.h"

__global__ void __launch_bounds__(1024) spin(volatile int* flag, int* seen, long long bound_ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    int f = 0;
    if (threadIdx.x % 32 == 0) f = *flag;
    f = __shfl_sync(0xffffffffu, f, 0);
    if (f != 0) {
      if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(seen, 1);
      return;
    }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if ((long long)(t - t0) > bound_ns) return;
  }
}

// run launches spin on every thread slot, then the copies of mode (0: D2D
// cudaMemcpyAsync, 1: cudaMemcpyBatchAsync with the overlap hint, 2: the
// flag alone host to device) on another stream, and prints what happened.
int run(const char* name, int mode, int sms, char* big_src, char* big_dst, int* flag, int* seen, const int* one_dev,
        const int* one_host, size_t bytes) {
  cudaStream_t ks, cs;
  CK(cudaStreamCreateWithFlags(&ks, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaMemset(flag, 0, 4));
  CK(cudaMemset(seen, 0, 4));
  CK(cudaDeviceSynchronize());
  spin<<<sms, 1024, 0, ks>>>(flag, seen, 2000000000ll);
  CK(cudaGetLastError());
  CK(cudaEventRecord(a, cs));
  if (mode == 0) {
    CK(cudaMemcpyAsync(big_dst, big_src, bytes, cudaMemcpyDeviceToDevice, cs));
    CK(cudaMemcpyAsync(flag, one_dev, 4, cudaMemcpyDeviceToDevice, cs));
  } else if (mode == 1) {
#if CUDART_VERSION >= 13000
    void* dsts[2] = {big_dst, flag};
    void* srcs[2] = {big_src, const_cast<int*>(one_dev)};
    size_t sizes[2] = {bytes, 4};
    cudaMemcpyAttributes at = {};
    at.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    at.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t idx = 0;
    CK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 1, &at, &idx, 1, cs));  // the big copy
    CK(cudaMemcpyBatchAsync(dsts + 1, srcs + 1, sizes + 1, 1, &at, &idx, 1, cs));  // then the flag
#else
    printf("cudaMemcpyBatchAsync needs CUDA 13 (this build: %d)\n", CUDART_VERSION);
    return 0;
#endif
  } else {
    CK(cudaMemcpyAsync(flag, one_host, 4, cudaMemcpyHostToDevice, cs));
  }
  CK(cudaEventRecord(b, cs));
  CK(cudaDeviceSynchronize());
  int s = 0;
  CK(cudaMemcpy(&s, seen, 4, cudaMemcpyDeviceToHost));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  printf("%-34s kernel saw the flag: %-3s copy stream %.3f ms%s\n", name, s > 0 ? "yes" : "no", ms,
         s > 0 ? "" : " (the copy waited for the kernel's 2 s bound)");
  CK(cudaStreamDestroy(ks));
  CK(cudaStreamDestroy(cs));
  return 0;
}

int main() {
  int dev = 0, sms = 0;
  CK(cudaSetDevice(dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, spin));
  int occ = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, spin, 1024, 0));
  printf("%d SMs; spin: %d registers a thread, %d CTA(s) an SM\n", sms, fa.numRegs, occ);
  const size_t bytes = 64u << 20;
  char *src, *dst;
  int *flag, *seen, *one_dev, *one_host;
  CK(cudaMalloc(&src, bytes));
  CK(cudaMalloc(&dst, bytes));
  CK(cudaMalloc(&flag, 4));
  CK(cudaMalloc(&seen, 4));
  CK(cudaMalloc(&one_dev, 4));
  CK(cudaHostAlloc(&one_host, 4, cudaHostAllocDefault));
  *one_host = 1;
  CK(cudaMemcpy(one_dev, one_host, 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(src, 1, bytes));
  // Alone first: the copy's own time.
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
  CK(cudaEventRecord(b));
  CK(cudaDeviceSynchronize());
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  printf("%-34s %.3f ms (%.0f GB/s read + write)\n", "64 MiB D2D copy alone", ms, 2.0 * bytes / ms / 1e6);
  if (run("D2D cudaMemcpyAsync", 0, sms * occ, src, dst, flag, seen, one_dev, one_host, bytes)) return 1;
  if (run("D2D cudaMemcpyBatchAsync overlap", 1, sms * occ, src, dst, flag, seen, one_dev, one_host, bytes)) return 1;
  if (run("H2D flag from pinned memory", 2, sms * occ, src, dst, flag, seen, one_dev, one_host, bytes)) return 1;
  return 0;
}
