// runtime.cu — errors, device selection, memory, streams and events.
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "sysflag.cuh"

namespace mk {

namespace {
thread_local char t_err[2048];
}

int fail(int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t_err, sizeof t_err, fmt, ap);
  va_end(ap);
  return code;
}

State& state() {
  static State s;
  return s;
}

// device_attr is attribute a of the current device, cached in *memo (the
// library runs on one device), or fallback while the device cannot be asked.
static int device_attr(cudaDeviceAttr a, int* memo, int fallback) {
  if (*memo == 0) {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, a, dev) != cudaSuccess || v <= 0) {
      cudaGetLastError();
      return fallback;
    }
    *memo = v;
  }
  return *memo;
}

int sm_count() {
  static int n = 0;
  return device_attr(cudaDevAttrMultiProcessorCount, &n, 132);  // an H200's, until the device answers
}

size_t smem_optin() {
  static int bytes = 0;
  return (size_t)device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, &bytes, 48 * 1024);  // what every CTA may use
}

bool pdl_on() {
  static const bool on = [] {
    const char* v = getenv("MK_PDL");
    return !(v && v[0] == '0');
  }();
  return on;
}

int res_rows() {
  static const int n = [] {
    const char* v = getenv("MK_GEMV_SMEM_ROWS");
    const int r = v ? atoi(v) : 4;
    return r >= 1 && r <= 4 ? r : 4;
  }();
  return n;
}

namespace {
thread_local bool t_bound = false;  // the device is current on this thread
}

int check_thread(const char* fn) {
  State& s = state();
  if (!s.ready) return fail(MK_ERR_NOT_INIT, "%s: mk_init has not run", fn);
  if (s.owner == std::this_thread::get_id()) return MK_OK;
  if (!s.any_thread.load(std::memory_order_acquire))
    return fail(MK_ERR_NOT_INIT,
                "%s: called from a thread other than the one that ran mk_init "
                "(one OS thread owns the GPU; see mk_set_any_thread)",
                fn);
  if (!t_bound) {
    cudaError_t e = cudaSetDevice(s.device);
    if (e != cudaSuccess)
      return fail(MK_ERR_CUDA, "%s: cudaSetDevice(%d) on a new thread: %s", fn, s.device,
                  cudaGetErrorString(e));
    t_bound = true;
  }
  return MK_OK;
}

}  // namespace mk

namespace {

// stamp_kernel writes the GPU's clock (ns) to buf[idx] once the kernel
// before it in the stream has finished (mk_stamp, kernel stamps).
__global__ void stamp_kernel(unsigned long long* buf, int idx) {
  mk::pdl_begin();
  if (threadIdx.x == 0) buf[idx] = mk::globaltimer();
}

// Kernel stamps (mk_kstamp_begin): the buffer, its capacity, and the kernel
// each stamp follows (nullptr: the start), on the library's one thread.
unsigned long long* g_kstamp_buf = nullptr;
int g_kstamp_cap = 0;
std::vector<const void*> g_kstamp_fn;

// stamp_on queues stamp_kernel(buf, idx) on s, programmatic as mk::launch
// (not through it: that would stamp the stamp).
cudaError_t stamp_on(cudaStream_t s, unsigned long long* buf, int idx) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(32);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = (s != nullptr && mk::pdl_on()) ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, stamp_kernel, buf, idx);
}

}  // namespace

namespace mk {

bool kstamps_on = false;

void kstamp_after(const void* kern, cudaStream_t s) {
  if (g_kstamp_buf == nullptr || (int)g_kstamp_fn.size() >= g_kstamp_cap) return;
  const int idx = (int)g_kstamp_fn.size();
  if (stamp_on(s, g_kstamp_buf, idx) == cudaSuccess) g_kstamp_fn.push_back(kern);
}

}  // namespace mk

extern "C" {

int32_t mk_abi_version(void) { return MK_ABI_VERSION; }

int32_t mk_set_any_thread(int32_t on) {
  MK_THREAD("mk_set_any_thread");
  MK_ARG(on == 0 || on == 1, "mk_set_any_thread: on=%d, want 0 or 1", on);
  mk::state().any_thread.store(on == 1, std::memory_order_release);
  return MK_OK;
}

const char* mk_last_error(void) { return mk::t_err; }

int64_t mk_abi_layout(int32_t struct_id, int32_t field_id) {
  if (struct_id != MK_STRUCT_DEVICE_INFO) return -1;
  switch (field_id) {
    case MK_FIELD_SIZE: return sizeof(mk_device_info_t);
    case MK_DI_NAME: return offsetof(mk_device_info_t, name);
    case MK_DI_DEVICE: return offsetof(mk_device_info_t, device);
    case MK_DI_SM_COUNT: return offsetof(mk_device_info_t, sm_count);
    case MK_DI_CC_MAJOR: return offsetof(mk_device_info_t, cc_major);
    case MK_DI_CC_MINOR: return offsetof(mk_device_info_t, cc_minor);
    case MK_DI_TOTAL_MEM: return offsetof(mk_device_info_t, total_mem);
    case MK_DI_FREE_MEM: return offsetof(mk_device_info_t, free_mem);
    case MK_DI_L2_BYTES: return offsetof(mk_device_info_t, l2_bytes);
    case MK_DI_SMEM_OPTIN: return offsetof(mk_device_info_t, smem_per_block_optin);
    case MK_DI_DRIVER_VERSION: return offsetof(mk_device_info_t, driver_version);
    case MK_DI_RUNTIME_VERSION: return offsetof(mk_device_info_t, runtime_version);
  }
  return -1;
}

int32_t mk_device_count(int32_t* count) {
  MK_ARG(count != nullptr, "mk_device_count: count is NULL");
  *count = 0;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return mk::fail(MK_ERR_NO_DEVICE, "cudaGetDeviceCount: %s (%s): no usable NVIDIA driver or CUDA device",
                    cudaGetErrorString(e), cudaGetErrorName(e));
  }
  if (n == 0) return mk::fail(MK_ERR_NO_DEVICE, "cudaGetDeviceCount: no CUDA device");
  *count = n;
  return MK_OK;
}

int32_t mk_init(int32_t device) {
  mk::State& s = mk::state();
  if (s.ready) {
    if (s.owner != std::this_thread::get_id())
      return mk::fail(MK_ERR_ARG, "mk_init: already initialised on another thread");
    if (s.device != device)
      return mk::fail(MK_ERR_ARG, "mk_init: already initialised on device %d, asked for %d",
                      s.device, device);
    return MK_OK;
  }
  int32_t n = 0;
  int32_t rc = mk_device_count(&n);
  if (rc != MK_OK) return rc;
  MK_ARG(device >= 0 && device < n, "mk_init: device %d out of range (%d devices)", device, n);
  MK_CUDA(cudaSetDevice(device));
  MK_CUDA(cudaFree(nullptr));  // creates the primary context now, not at the first op
  if (s.work == nullptr) MK_CUDA(cudaStreamCreate(&s.work));  // blocking: ordered with sync copies
  s.device = device;
  s.owner = std::this_thread::get_id();
  s.ready = true;
  rc = mk::gemm_init();
  if (rc != MK_OK) s.ready = false;
  return rc;
}

int32_t mk_device_info(mk_device_info_t* info) {
  MK_THREAD("mk_device_info");
  MK_ARG(info != nullptr, "mk_device_info: info is NULL");
  memset(info, 0, sizeof *info);
  int d = mk::state().device;
  cudaDeviceProp p;
  MK_CUDA(cudaGetDeviceProperties(&p, d));
  snprintf(info->name, sizeof info->name, "%s", p.name);
  info->device = d;
  info->sm_count = p.multiProcessorCount;
  info->cc_major = p.major;
  info->cc_minor = p.minor;
  size_t free_b = 0, total_b = 0;
  MK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  info->total_mem = total_b;
  info->free_mem = free_b;
  info->l2_bytes = (uint64_t)p.l2CacheSize;
  info->smem_per_block_optin = (uint64_t)p.sharedMemPerBlockOptin;
  int v = 0;
  MK_CUDA(cudaDriverGetVersion(&v));
  info->driver_version = v;
  MK_CUDA(cudaRuntimeGetVersion(&v));
  info->runtime_version = v;
  return MK_OK;
}

int32_t mk_device_sync(void) {
  MK_THREAD("mk_device_sync");
  MK_CUDA(cudaDeviceSynchronize());
  return MK_OK;
}

int32_t mk_malloc(uint64_t bytes, uint64_t* dptr) {
  MK_THREAD("mk_malloc");
  MK_ARG(dptr != nullptr, "mk_malloc: dptr is NULL");
  *dptr = 0;
  MK_ARG(bytes > 0, "mk_malloc: zero bytes");
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // an out-of-memory is not sticky; clear it
    return mk::fail(MK_ERR_CUDA, "cudaMalloc(%llu bytes): %s (%s)", (unsigned long long)bytes,
                    cudaGetErrorString(e), cudaGetErrorName(e));
  }
  *dptr = reinterpret_cast<uint64_t>(p);
  return MK_OK;
}

int32_t mk_free(uint64_t dptr) {
  MK_THREAD("mk_free");
  MK_CUDA(cudaFree(mk::dev<void>(dptr)));
  return MK_OK;
}

int32_t mk_memcpy_h2d(uint64_t dst, const void* src, uint64_t bytes) {
  MK_THREAD("mk_memcpy_h2d");
  MK_CUDA(cudaMemcpy(mk::dev<void>(dst), src, bytes, cudaMemcpyHostToDevice));
  return MK_OK;
}

int32_t mk_memcpy_d2h(void* dst, uint64_t src, uint64_t bytes) {
  MK_THREAD("mk_memcpy_d2h");
  MK_CUDA(cudaMemcpy(dst, mk::dev<void>(src), bytes, cudaMemcpyDeviceToHost));
  return MK_OK;
}

int32_t mk_memcpy_d2d(uint64_t dst, uint64_t src, uint64_t bytes) {
  MK_THREAD("mk_memcpy_d2d");
  MK_CUDA(cudaMemcpy(mk::dev<void>(dst), mk::dev<void>(src), bytes, cudaMemcpyDeviceToDevice));
  return MK_OK;
}

int32_t mk_memcpy_h2d_async(uint64_t dst, const void* src, uint64_t bytes, uint64_t stream) {
  MK_THREAD("mk_memcpy_h2d_async");
  MK_CUDA(cudaMemcpyAsync(mk::dev<void>(dst), src, bytes, cudaMemcpyHostToDevice,
                          mk::as_stream(stream)));
  return MK_OK;
}

int32_t mk_memcpy_d2h_async(void* dst, uint64_t src, uint64_t bytes, uint64_t stream) {
  MK_THREAD("mk_memcpy_d2h_async");
  MK_CUDA(cudaMemcpyAsync(dst, mk::dev<void>(src), bytes, cudaMemcpyDeviceToHost,
                          mk::as_stream(stream)));
  return MK_OK;
}

int32_t mk_memcpy_d2d_async(uint64_t dst, uint64_t src, uint64_t bytes, uint64_t stream) {
  MK_THREAD("mk_memcpy_d2d_async");
  MK_CUDA(cudaMemcpyAsync(mk::dev<void>(dst), mk::dev<void>(src), bytes,
                          cudaMemcpyDeviceToDevice, mk::as_stream(stream)));
  return MK_OK;
}

int32_t mk_host_alloc_pinned(uint64_t bytes, void** hptr) {
  MK_THREAD("mk_host_alloc_pinned");
  MK_ARG(hptr != nullptr, "mk_host_alloc_pinned: hptr is NULL");
  *hptr = nullptr;
  MK_ARG(bytes > 0, "mk_host_alloc_pinned: zero bytes");
  MK_CUDA(cudaHostAlloc(hptr, bytes, cudaHostAllocDefault));
  return MK_OK;
}

int32_t mk_host_free_pinned(void* hptr) {
  MK_THREAD("mk_host_free_pinned");
  MK_CUDA(cudaFreeHost(hptr));
  return MK_OK;
}

int32_t mk_stream_create(uint64_t* stream) {
  MK_THREAD("mk_stream_create");
  MK_ARG(stream != nullptr, "mk_stream_create: stream is NULL");
  cudaStream_t s = nullptr;
  MK_CUDA(cudaStreamCreate(&s));  // blocking: ordered with the synchronous copies
  *stream = reinterpret_cast<uint64_t>(s);
  return MK_OK;
}

int32_t mk_stream_destroy(uint64_t stream) {
  MK_THREAD("mk_stream_destroy");
  MK_ARG(stream != 0, "mk_stream_destroy: the default stream cannot be destroyed");
  MK_CUDA(cudaStreamDestroy(mk::as_stream(stream)));
  return MK_OK;
}

int32_t mk_stream_sync(uint64_t stream) {
  MK_THREAD("mk_stream_sync");
  MK_CUDA(cudaStreamSynchronize(mk::as_stream(stream)));
  return MK_OK;
}

int32_t mk_event_create(uint64_t* event) {
  MK_THREAD("mk_event_create");
  MK_ARG(event != nullptr, "mk_event_create: event is NULL");
  cudaEvent_t e = nullptr;
  MK_CUDA(cudaEventCreate(&e));
  *event = reinterpret_cast<uint64_t>(e);
  return MK_OK;
}

int32_t mk_event_destroy(uint64_t event) {
  MK_THREAD("mk_event_destroy");
  MK_ARG(event != 0, "mk_event_destroy: NULL event");
  MK_CUDA(cudaEventDestroy(mk::as_event(event)));
  return MK_OK;
}

int32_t mk_event_record(uint64_t event, uint64_t stream) {
  MK_THREAD("mk_event_record");
  MK_ARG(event != 0, "mk_event_record: NULL event");
  MK_CUDA(cudaEventRecord(mk::as_event(event), mk::as_stream(stream)));
  return MK_OK;
}

int32_t mk_event_sync(uint64_t event) {
  MK_THREAD("mk_event_sync");
  MK_ARG(event != 0, "mk_event_sync: NULL event");
  MK_CUDA(cudaEventSynchronize(mk::as_event(event)));
  return MK_OK;
}

int32_t mk_event_query(uint64_t event, int32_t* done) {
  MK_THREAD("mk_event_query");
  MK_ARG(event != 0 && done != nullptr, "mk_event_query: NULL argument");
  const cudaError_t e = cudaEventQuery(mk::as_event(event));
  if (e == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: clear it
    *done = 0;
    return MK_OK;
  }
  MK_CUDA(e);
  *done = 1;
  return MK_OK;
}

int32_t mk_event_elapsed(uint64_t start, uint64_t end, uint32_t* ms_bits) {
  MK_THREAD("mk_event_elapsed");
  MK_ARG(start != 0 && end != 0 && ms_bits != nullptr, "mk_event_elapsed: NULL argument");
  float ms = 0;
  MK_CUDA(cudaEventElapsedTime(&ms, mk::as_event(start), mk::as_event(end)));
  memcpy(ms_bits, &ms, sizeof ms);
  return MK_OK;
}

int32_t mk_graph_begin(void) {
  MK_THREAD("mk_graph_begin");
  MK_CUDA(cudaStreamBeginCapture(mk::state().work, cudaStreamCaptureModeRelaxed));
  mk::state().capturing.store(true);
  return MK_OK;
}

int32_t mk_graph_end(uint64_t* exec, uint64_t* nodes) {
  MK_THREAD("mk_graph_end");
  MK_ARG(exec != nullptr && nodes != nullptr, "mk_graph_end: NULL argument");
  *exec = 0;
  *nodes = 0;
  cudaGraph_t g = nullptr;
  mk::state().capturing.store(false);
  cudaError_t e = cudaStreamEndCapture(mk::state().work, &g);
  if (e != cudaSuccess) {
    cudaGetLastError();  // a capture error is not sticky; the next capture starts clean
    if (g != nullptr) cudaGraphDestroy(g);
    return mk::fail(MK_ERR_CUDA, "cudaStreamEndCapture: %s (%s): the captured work was invalid",
                    cudaGetErrorString(e), cudaGetErrorName(e));
  }
  size_t n = 0;
  e = cudaGraphGetNodes(g, nullptr, &n);
  cudaGraphExec_t x = nullptr;
  if (e == cudaSuccess) e = cudaGraphInstantiateWithFlags(&x, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return mk::fail(MK_ERR_CUDA, "cudaGraphInstantiateWithFlags: %s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
  }
  *exec = reinterpret_cast<uint64_t>(x);
  *nodes = n;
  return MK_OK;
}

int32_t mk_graph_abort(void) {
  MK_THREAD("mk_graph_abort");
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  MK_CUDA(cudaStreamIsCapturing(mk::state().work, &st));
  mk::state().capturing.store(false);
  if (st == cudaStreamCaptureStatusNone) return MK_OK;
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(mk::state().work, &g);
  cudaGetLastError();
  if (g != nullptr) cudaGraphDestroy(g);
  return MK_OK;
}

int32_t mk_graph_launch(uint64_t exec) {
  MK_THREAD("mk_graph_launch");
  MK_ARG(exec != 0, "mk_graph_launch: NULL graph");
  MK_CUDA(cudaGraphLaunch(reinterpret_cast<cudaGraphExec_t>(exec), mk::state().work));
  return MK_OK;
}

int32_t mk_graph_mark(uint64_t event) {
  MK_THREAD("mk_graph_mark");
  MK_ARG(event != 0, "mk_graph_mark: NULL event");
  MK_ARG(mk::state().capturing.load(), "mk_graph_mark: no capture is active");
  MK_CUDA(cudaEventRecordWithFlags(mk::as_event(event), mk::state().work, cudaEventRecordExternal));
  return MK_OK;
}

int32_t mk_stamp(uint64_t buf, int32_t idx) {
  MK_THREAD("mk_stamp");
  MK_ARG(buf != 0 && buf % 8 == 0 && idx >= 0, "mk_stamp: bad buffer %#llx or index %d", (unsigned long long)buf, idx);
  MK_CUDA(stamp_on(mk::as_stream(0), reinterpret_cast<unsigned long long*>(buf), (int)idx));
  return MK_OK;
}

int32_t mk_kstamp_begin(uint64_t buf, int32_t cap) {
  MK_THREAD("mk_kstamp_begin");
  MK_ARG(buf % 8 == 0 && (buf == 0 || cap >= 1), "mk_kstamp_begin: bad buffer %#llx or capacity %d",
         (unsigned long long)buf, cap);
  g_kstamp_fn.clear();
  g_kstamp_buf = reinterpret_cast<unsigned long long*>(buf);
  g_kstamp_cap = buf ? cap : 0;
  mk::kstamps_on = buf != 0;
  if (buf == 0) return MK_OK;
  MK_CUDA(stamp_on(mk::as_stream(0), g_kstamp_buf, 0));  // the start
  g_kstamp_fn.push_back(nullptr);
  return MK_OK;
}

int32_t mk_kstamp_count(void) { return (int32_t)g_kstamp_fn.size(); }

int32_t mk_kstamp_name(int32_t i, char* out, int32_t cap) {
  MK_ARG(out != nullptr && cap >= 1 && i >= 0 && i < (int32_t)g_kstamp_fn.size(),
         "mk_kstamp_name: index %d of %d stamps, or no room", i, (int)g_kstamp_fn.size());
  const char* name = "start";
  if (g_kstamp_fn[i] != nullptr) {
#if CUDART_VERSION >= 12030
    if (cudaFuncGetName(&name, g_kstamp_fn[i]) != cudaSuccess) {
      cudaGetLastError();
      name = "?";
    }
#else
    name = "?";
#endif
  }
  snprintf(out, (size_t)cap, "%s", name);
  return MK_OK;
}

int32_t mk_graph_destroy(uint64_t exec) {
  MK_THREAD("mk_graph_destroy");
  MK_ARG(exec != 0, "mk_graph_destroy: NULL graph");
  MK_CUDA(cudaGraphExecDestroy(reinterpret_cast<cudaGraphExec_t>(exec)));
  return MK_OK;
}

static_assert(sizeof(cudaIpcMemHandle_t) == MK_IPC_HANDLE_BYTES, "IPC handle size");

int32_t mk_ipc_get_handle(uint64_t dptr, void* handle) {
  MK_THREAD("mk_ipc_get_handle");
  MK_ARG(dptr != 0 && handle != nullptr, "mk_ipc_get_handle: NULL argument");
  cudaIpcMemHandle_t h;
  MK_CUDA(cudaIpcGetMemHandle(&h, mk::dev<void>(dptr)));
  memcpy(handle, &h, sizeof h);
  return MK_OK;
}

int32_t mk_ipc_open(const void* handle, uint64_t* dptr) {
  MK_THREAD("mk_ipc_open");
  MK_ARG(handle != nullptr && dptr != nullptr, "mk_ipc_open: NULL argument");
  *dptr = 0;
  cudaIpcMemHandle_t h;
  memcpy(&h, handle, sizeof h);
  void* p = nullptr;
  cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return mk::fail(MK_ERR_CUDA, "cudaIpcOpenMemHandle: %s (%s) (a handle from this process, or from a device this one cannot reach?)",
                    cudaGetErrorString(e), cudaGetErrorName(e));
  }
  *dptr = reinterpret_cast<uint64_t>(p);
  return MK_OK;
}

int32_t mk_ipc_close(uint64_t dptr) {
  MK_THREAD("mk_ipc_close");
  MK_ARG(dptr != 0, "mk_ipc_close: NULL pointer");
  MK_CUDA(cudaIpcCloseMemHandle(mk::dev<void>(dptr)));
  return MK_OK;
}

}  // extern "C"
