// allreduce.cu — dst = Σ_s src_s over expert-parallel ranks that are
// separate processes (one per GPU, or several on one GPU), one launch per
// rank, peers' workspaces mapped through CUDA IPC (mk_allreduce.h).
//
// A rank's workspace: the control block (MK_AR_CTL_BYTES: the error record,
// its epoch counter, two arrival counters, ready[R] and done[R] flags that
// peers write), then its data (cap floats). One call of rank me at epoch e
// (its counter + 1, read by every CTA at the start):
//   1. every CTA waits until done[s] >= e-1 for every peer s (they have read
//      my data of the previous call), then copies its part of src into my data;
//   2. the last CTA to finish copying writes ready[me] = e into every rank's
//      workspace (fence + st.release.sys);
//   3. every CTA waits until ready[s] >= e for every s, then sums its part of
//      the R data blocks in rank order into dst (the same bits on every rank);
//   4. the last CTA to finish summing writes done[me] = e into every rank's
//      workspace and sets my counter to e.
// No host state changes between calls, so a captured graph replays it. All
// CTAs of a launch must be resident together: the spinning CTAs would
// otherwise keep the last copier from running.

#include "common.cuh"
#include "sysflag.cuh"

namespace {

// Control-block words (int32).
constexpr int kEpoch = 16;   // this rank's completed calls
constexpr int kArrive = 17;  // CTAs past step 1 in this launch
constexpr int kLeave = 18;   // CTAs past step 3
constexpr int kReady = 32;   // [R]: ready[s]
constexpr int kDone = 64;    // [R]: done[s]
static_assert(kDone + MK_AR_MAX_RANKS <= MK_AR_CTL_BYTES / 4, "control block");
static_assert(MK_AR_ERR_WORDS <= kEpoch, "error record");

struct Params {
  int* ws[MK_AR_MAX_RANKS];  // every rank's workspace (control block first)
  const float* src;
  float* dst;
  long long n;
  long long cap;
  long long timeout_ns;
  int ranks, me;
};

__device__ __forceinline__ float* data_of(int* ws) {
  return reinterpret_cast<float*>(reinterpret_cast<char*>(ws) + MK_AR_CTL_BYTES);
}

// wait_flags: threads 0..R-1 of the block each spin until flags[t] reaches
// want (skipping t == skip) or the error record is set; returns false (on
// every thread) when the call must stop.
__device__ bool wait_flags(const Params& p, int base, int want, int skip, int phase) {
  __shared__ int stop;
  int* ctl = p.ws[p.me];
  if (threadIdx.x == 0) stop = 0;
  __syncthreads();
  const int s = threadIdx.x;
  if (s < p.ranks && s != skip) {
    const unsigned long long t0 = mk::globaltimer();
    for (unsigned it = 0;; ++it) {
      const int v = mk::ld_acquire_sys(ctl + base + s);
      if (mk::epoch_reached(v, want)) break;
      if (mk::ld_relaxed_sys(ctl) != 0) {
        stop = 1;
        break;
      }
      if ((it & 15) == 15 && (long long)(mk::globaltimer() - t0) > p.timeout_ns) {
        if (atomicCAS(ctl, 0, 1) == 0) {
          ctl[MK_AR_ERR_RANK] = p.me;
          ctl[MK_AR_ERR_PHASE] = phase;
          ctl[MK_AR_ERR_PEER] = s;
          ctl[MK_AR_ERR_SEEN] = v;
          ctl[MK_AR_ERR_WANT] = want;
          __threadfence_system();
        }
        stop = 1;
        break;
      }
      __nanosleep(100);
    }
  }
  __syncthreads();
  return stop == 0;
}

// last_cta: after a block-wide barrier, thread 0 counts the CTA in ctl[word];
// true on thread 0 of the last CTA (which resets the counter).
__device__ bool last_cta(int* ctl, int word) {
  __syncthreads();
  if (threadIdx.x != 0) return false;
  __threadfence_system();
  const int old = atomicAdd(ctl + word, 1);
  if (old != (int)gridDim.x - 1) return false;
  ctl[word] = 0;
  __threadfence_system();
  return true;
}

__global__ void __launch_bounds__(512) allreduce_kernel(const Params p) {
  int* ctl = p.ws[p.me];
  const int e = *reinterpret_cast<volatile int*>(ctl + kEpoch) + 1;
  const long long n4 = p.n / 4, stride = (long long)gridDim.x * blockDim.x;
  const long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;

  // 1. peers have read my previous data: copy src into my workspace.
  if (!wait_flags(p, kDone, e - 1, p.me, 0)) return;
  float* mine = data_of(ctl);
  for (long long i = i0; i < n4; i += stride)
    reinterpret_cast<float4*>(mine)[i] = reinterpret_cast<const float4*>(p.src)[i];
  for (long long i = n4 * 4 + i0; i < p.n; i += stride) mine[i] = p.src[i];
  // 2. the last copier publishes it.
  if (last_cta(ctl, kArrive))
    for (int s = 0; s < p.ranks; ++s) mk::st_release_sys(p.ws[s] + kReady + p.me, e);

  // 3. every rank's data: sum in rank order.
  if (!wait_flags(p, kReady, e, -1, 1)) return;
  for (long long i = i0; i < n4; i += stride) {
    float4 a = __ldcg(reinterpret_cast<const float4*>(data_of(p.ws[0])) + i);
    for (int s = 1; s < p.ranks; ++s) {
      const float4 b = __ldcg(reinterpret_cast<const float4*>(data_of(p.ws[s])) + i);
      a.x += b.x;
      a.y += b.y;
      a.z += b.z;
      a.w += b.w;
    }
    reinterpret_cast<float4*>(p.dst)[i] = a;
  }
  for (long long i = n4 * 4 + i0; i < p.n; i += stride) {
    float a = __ldcg(data_of(p.ws[0]) + i);
    for (int s = 1; s < p.ranks; ++s) a += __ldcg(data_of(p.ws[s]) + i);
    p.dst[i] = a;
  }
  // 4. the last reader releases every rank's data and ends the epoch.
  if (last_cta(ctl, kLeave)) {
    for (int s = 0; s < p.ranks; ++s) mk::st_release_sys(p.ws[s] + kDone + p.me, e);
    *reinterpret_cast<volatile int*>(ctl + kEpoch) = e;
  }
}

int64_t ws_bytes(int64_t n) { return MK_AR_CTL_BYTES + (n * 4 + 255) / 256 * 256; }

}  // namespace

extern "C" {

int32_t mk_allreduce_workspace(int64_t n, int64_t* bytes) {
  MK_ARG(n >= 0 && bytes, "mk_allreduce_workspace: n=%lld, bytes=%p", (long long)n, (void*)bytes);
  *bytes = ws_bytes(n);
  return MK_OK;
}

int32_t mk_allreduce_f32_rank(uint64_t stream, int32_t ranks, int32_t me, const uint64_t* ws, uint64_t src,
                              uint64_t dst, int64_t n, int64_t cap, int32_t ctas, int64_t timeout_ns) {
  MK_THREAD("mk_allreduce_f32_rank");
  MK_ARG(ranks >= 1 && ranks <= MK_AR_MAX_RANKS && me >= 0 && me < ranks,
         "mk_allreduce_f32_rank: rank %d of %d (1..%d ranks)", me, ranks, MK_AR_MAX_RANKS);
  MK_ARG(ws && n >= 0 && n <= cap && timeout_ns > 0 && ctas >= 0,
         "mk_allreduce_f32_rank: ws=%p n=%lld cap=%lld timeout_ns=%lld ctas=%d", (const void*)ws, (long long)n,
         (long long)cap, (long long)timeout_ns, ctas);
  MK_ARG(n == 0 || (src && dst), "mk_allreduce_f32_rank: null src or dst");
  MK_ARG(src % 16 == 0 && dst % 16 == 0, "mk_allreduce_f32_rank: src and dst must be 16-byte aligned");
  Params p{};
  for (int s = 0; s < ranks; ++s) {
    MK_ARG(ws[s] && ws[s] % 256 == 0, "mk_allreduce_f32_rank: workspace %d is null or not 256-byte aligned", s);
    p.ws[s] = mk::dev<int>(ws[s]);
  }
  p.src = mk::dev<const float>(src);
  p.dst = mk::dev<float>(dst);
  p.n = n;
  p.cap = cap;
  p.timeout_ns = timeout_ns;
  p.ranks = ranks;
  p.me = me;
  int sms = 0;
  MK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, mk::state().device));
  int grid = ctas > 0 ? ctas : (int)std::min<int64_t>(sms, std::max<int64_t>(1, (n / 4 + 2047) / 2048));
  // Even with n == 0 the flags advance: every rank keeps the same epochs.
  allreduce_kernel<<<grid, 512, 0, mk::as_stream(stream)>>>(p);
  MK_LAUNCHED("allreduce");
  return MK_OK;
}

int32_t mk_allreduce_check(uint64_t ws, int32_t* rec) {
  MK_THREAD("mk_allreduce_check");
  MK_ARG(ws && rec, "mk_allreduce_check: null ws or rec");
  MK_CUDA(cudaMemcpy(rec, mk::dev<int32_t>(ws), MK_AR_ERR_WORDS * sizeof(int32_t), cudaMemcpyDeviceToHost));
  return MK_OK;
}

}  // extern "C"
