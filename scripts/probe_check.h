// scripts/probe_check.h — CK(x), the standalone probes' CUDA runtime check
// (scripts/bulk_probe.cu, scripts/tile_stream_probe.cu,
// scripts/stream_probe.cu): on an error it
// prints the call, file and line and returns 1 from the enclosing function.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)
