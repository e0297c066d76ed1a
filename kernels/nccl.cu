// nccl.cu — NCCL, loaded at run time with dlopen (mk_nccl.h).
//
// libmkernel never links against NCCL (it must load where NCCL is absent),
// and no nccl.h is needed to build it: the few NCCL types and prototypes used
// here are declared below, with the values of NCCL's public nccl.h.
#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "common.cuh"

namespace {

// ---- the NCCL declarations this file needs (values as in nccl.h) ----

typedef struct ncclComm* ncclComm_t;
typedef struct {
  char internal[MK_NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is NCCL_UNIQUE_ID_BYTES");

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7
} ncclResult_t;
typedef enum { ncclUint8 = 1, ncclFloat32 = 7 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;

// Nccl is the table of bound functions; optional ones may be null.
struct Nccl {
  void* handle = nullptr;
  std::string path;
  ncclResult_t (*GetVersion)(int*) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*CommCount)(const ncclComm_t, int*) = nullptr;
  ncclResult_t (*CommUserRank)(const ncclComm_t, int*) = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*GroupStart)(void) = nullptr;
  ncclResult_t (*GroupEnd)(void) = nullptr;
  // Optional: ncclGetLastError (2.13), ncclCommFinalize (2.14).
  const char* (*GetLastError)(ncclComm_t) = nullptr;
  ncclResult_t (*CommFinalize)(ncclComm_t) = nullptr;
};

std::mutex g_open_mu;
std::atomic<const Nccl*> g_nccl{nullptr};  // published once mk_nccl_open succeeded

// loaded returns the table, or null after recording MK_ERR_NO_NCCL for fn.
const Nccl* loaded(const char* fn) {
  const Nccl* n = g_nccl.load(std::memory_order_acquire);
  if (n == nullptr) mk::fail(MK_ERR_NO_NCCL, "%s: NCCL is not loaded (mk_nccl_open has not succeeded)", fn);
  return n;
}

template <typename F>
bool bind(void* h, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(h, name));
  return *fn != nullptr;
}

// nccl_fail records an NCCL failure of call: the result's text, NCCL's last
// error text and, with a communicator, its asynchronous error state.
int nccl_fail(const Nccl* n, const char* call, ncclResult_t r, ncclComm_t comm) {
  const char* what = n->GetErrorString ? n->GetErrorString(r) : "?";
  const char* last = n->GetLastError ? n->GetLastError(comm) : nullptr;
  char async[160] = "";
  if (comm != nullptr && n->CommGetAsyncError != nullptr) {
    ncclResult_t a = ncclSuccess;
    if (n->CommGetAsyncError(comm, &a) == ncclSuccess)
      snprintf(async, sizeof async, "; communicator state: %s (%d)",
               a == ncclSuccess ? "no asynchronous error" : n->GetErrorString(a), (int)a);
  }
  return mk::fail(MK_ERR_NCCL, "%s: %s (ncclResult_t %d)%s%s%s", call, what, (int)r,
                  last && *last ? "; NCCL: " : "", last && *last ? last : "", async);
}

inline ncclComm_t as_comm(uint64_t c) { return reinterpret_cast<ncclComm_t>(c); }

}  // namespace

// MK_NCCL runs an NCCL call and returns MK_ERR_NCCL with its text on failure.
#define MK_NCCL(n, comm, call)                                    \
  do {                                                            \
    ncclResult_t mk_r_ = (call);                                  \
    if (mk_r_ != ncclSuccess) return nccl_fail(n, #call, mk_r_, comm); \
  } while (0)

extern "C" {

int32_t mk_nccl_open(const char* path) {
  MK_ARG(path != nullptr && *path != 0, "mk_nccl_open: empty path");
  std::lock_guard<std::mutex> lock(g_open_mu);
  if (const Nccl* n = g_nccl.load(std::memory_order_acquire)) {
    MK_ARG(n->path == path, "mk_nccl_open: NCCL is already loaded from %s, not %s", n->path.c_str(), path);
    return MK_OK;
  }
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // before NCCL reads its environment (see mk_nccl.h)
  dlerror();
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    return mk::fail(MK_ERR_NO_NCCL, "mk_nccl_open: dlopen(%s): %s", path, e ? e : "unknown error");
  }
  Nccl* n = new Nccl;
  n->handle = h;
  n->path = path;
  const char* missing = nullptr;
#define MK_BIND(field, sym) \
  if (missing == nullptr && !bind(h, sym, &n->field)) missing = sym
  MK_BIND(GetVersion, "ncclGetVersion");
  MK_BIND(GetUniqueId, "ncclGetUniqueId");
  MK_BIND(CommInitRank, "ncclCommInitRank");
  MK_BIND(CommDestroy, "ncclCommDestroy");
  MK_BIND(CommAbort, "ncclCommAbort");
  MK_BIND(CommGetAsyncError, "ncclCommGetAsyncError");
  MK_BIND(CommCount, "ncclCommCount");
  MK_BIND(CommUserRank, "ncclCommUserRank");
  MK_BIND(GetErrorString, "ncclGetErrorString");
  MK_BIND(AllReduce, "ncclAllReduce");
  MK_BIND(AllGather, "ncclAllGather");
  MK_BIND(Send, "ncclSend");
  MK_BIND(Recv, "ncclRecv");
  MK_BIND(GroupStart, "ncclGroupStart");
  MK_BIND(GroupEnd, "ncclGroupEnd");
#undef MK_BIND
  if (missing != nullptr) {
    dlclose(h);
    delete n;
    return mk::fail(MK_ERR_NO_NCCL, "mk_nccl_open: %s has no symbol %s (NCCL 2.7 or later needed)", path,
                    missing);
  }
  bind(h, "ncclGetLastError", &n->GetLastError);
  bind(h, "ncclCommFinalize", &n->CommFinalize);
  int v = 0;
  ncclResult_t r = n->GetVersion(&v);
  if (r != ncclSuccess || v < 2700) {
    dlclose(h);
    delete n;
    return mk::fail(MK_ERR_NO_NCCL, "mk_nccl_open: %s: ncclGetVersion gave %d (result %d); NCCL 2.7 or later needed",
                    path, v, (int)r);
  }
  g_nccl.store(n, std::memory_order_release);  // never freed: NCCL stays loaded for the process
  return MK_OK;
}

int32_t mk_nccl_version(int32_t* version) {
  MK_ARG(version != nullptr, "mk_nccl_version: version is NULL");
  *version = 0;
  const Nccl* n = loaded("mk_nccl_version");
  if (n == nullptr) return MK_ERR_NO_NCCL;
  int v = 0;
  MK_NCCL(n, nullptr, n->GetVersion(&v));
  *version = v;
  return MK_OK;
}

int32_t mk_nccl_unique_id(uint8_t* id) {
  MK_ARG(id != nullptr, "mk_nccl_unique_id: id is NULL");
  const Nccl* n = loaded("mk_nccl_unique_id");
  if (n == nullptr) return MK_ERR_NO_NCCL;
  ncclUniqueId u;
  memset(&u, 0, sizeof u);
  MK_NCCL(n, nullptr, n->GetUniqueId(&u));
  memcpy(id, &u, sizeof u);
  return MK_OK;
}

int32_t mk_nccl_comm_init(int32_t rank, int32_t size, const uint8_t* id, uint64_t* comm) {
  MK_ARG(comm != nullptr && id != nullptr, "mk_nccl_comm_init: NULL argument");
  *comm = 0;
  MK_THREAD("mk_nccl_comm_init");
  MK_ARG(size >= 1 && rank >= 0 && rank < size, "mk_nccl_comm_init: rank %d of %d", rank, size);
  const Nccl* n = loaded("mk_nccl_comm_init");
  if (n == nullptr) return MK_ERR_NO_NCCL;
  // NVLink multicast stays off on these machines unless the user asked
  // otherwise; NCCL reads the variable during init.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  ncclUniqueId u;
  memcpy(&u, id, sizeof u);
  ncclComm_t c = nullptr;
  ncclResult_t r = n->CommInitRank(&c, size, u, rank);
  if (r != ncclSuccess) {
    int rc = nccl_fail(n, "ncclCommInitRank", r, nullptr);
    if (c != nullptr) n->CommAbort(c);
    return rc;
  }
  *comm = reinterpret_cast<uint64_t>(c);
  return MK_OK;
}

int32_t mk_nccl_comm_check(uint64_t comm) {
  MK_ARG(comm != 0, "mk_nccl_comm_check: NULL communicator");
  const Nccl* n = loaded("mk_nccl_comm_check");
  if (n == nullptr) return MK_ERR_NO_NCCL;
  ncclResult_t a = ncclSuccess;
  MK_NCCL(n, as_comm(comm), n->CommGetAsyncError(as_comm(comm), &a));
  if (a != ncclSuccess && a != ncclInProgress) return nccl_fail(n, "ncclCommGetAsyncError", a, as_comm(comm));
  return MK_OK;
}

int32_t mk_nccl_comm_destroy(uint64_t comm) {
  MK_ARG(comm != 0, "mk_nccl_comm_destroy: NULL communicator");
  MK_THREAD("mk_nccl_comm_destroy");
  const Nccl* n = loaded("mk_nccl_comm_destroy");
  if (n == nullptr) return MK_ERR_NO_NCCL;
  if (n->CommFinalize != nullptr) {
    ncclResult_t r = n->CommFinalize(as_comm(comm));
    if (r != ncclSuccess) {
      int rc = nccl_fail(n, "ncclCommFinalize", r, as_comm(comm));
      n->CommAbort(as_comm(comm));  // the handle is gone either way
      return rc;
    }
  }
  MK_NCCL(n, nullptr, n->CommDestroy(as_comm(comm)));
  return MK_OK;
}

int32_t mk_nccl_comm_abort(uint64_t comm) {
  MK_ARG(comm != 0, "mk_nccl_comm_abort: NULL communicator");
  MK_THREAD("mk_nccl_comm_abort");
  const Nccl* n = loaded("mk_nccl_comm_abort");
  if (n == nullptr) return MK_ERR_NO_NCCL;
  MK_NCCL(n, nullptr, n->CommAbort(as_comm(comm)));
  return MK_OK;
}

int32_t mk_nccl_all_reduce_f32_sum(uint64_t comm, uint64_t send, uint64_t recv, uint64_t count,
                                   uint64_t stream) {
  MK_THREAD("mk_nccl_all_reduce_f32_sum");
  MK_ARG(comm != 0, "mk_nccl_all_reduce_f32_sum: NULL communicator");
  MK_ARG(count == 0 || (send != 0 && recv != 0), "mk_nccl_all_reduce_f32_sum: NULL buffer");
  const Nccl* n = loaded("mk_nccl_all_reduce_f32_sum");
  if (n == nullptr) return MK_ERR_NO_NCCL;
  if (count == 0) return MK_OK;
  MK_NCCL(n, as_comm(comm),
          n->AllReduce(mk::dev<const void>(send), mk::dev<void>(recv), count, ncclFloat32, ncclSum,
                       as_comm(comm), mk::as_stream(stream)));
  return MK_OK;
}

int32_t mk_nccl_all_gather(uint64_t comm, uint64_t send, uint64_t recv, uint64_t bytes, uint64_t stream) {
  MK_THREAD("mk_nccl_all_gather");
  MK_ARG(comm != 0, "mk_nccl_all_gather: NULL communicator");
  MK_ARG(bytes == 0 || (send != 0 && recv != 0), "mk_nccl_all_gather: NULL buffer");
  const Nccl* n = loaded("mk_nccl_all_gather");
  if (n == nullptr) return MK_ERR_NO_NCCL;
  if (bytes == 0) return MK_OK;
  MK_NCCL(n, as_comm(comm),
          n->AllGather(mk::dev<const void>(send), mk::dev<void>(recv), bytes, ncclUint8, as_comm(comm),
                       mk::as_stream(stream)));
  return MK_OK;
}

int32_t mk_nccl_all_to_all_v(uint64_t comm, uint64_t send, const int64_t* send_counts,
                             const int64_t* send_offsets, uint64_t recv, const int64_t* recv_counts,
                             const int64_t* recv_offsets, int64_t elem_bytes, uint64_t stream) {
  MK_THREAD("mk_nccl_all_to_all_v");
  MK_ARG(comm != 0, "mk_nccl_all_to_all_v: NULL communicator");
  MK_ARG(send_counts && send_offsets && recv_counts && recv_offsets, "mk_nccl_all_to_all_v: NULL count array");
  MK_ARG(elem_bytes > 0, "mk_nccl_all_to_all_v: elem_bytes %lld", (long long)elem_bytes);
  const Nccl* n = loaded("mk_nccl_all_to_all_v");
  if (n == nullptr) return MK_ERR_NO_NCCL;
  ncclComm_t c = as_comm(comm);
  int size = 0, me = 0;
  MK_NCCL(n, c, n->CommCount(c, &size));
  MK_NCCL(n, c, n->CommUserRank(c, &me));
  const int64_t lim = INT64_MAX / elem_bytes;
  for (int p = 0; p < size; p++) {
    MK_ARG(send_counts[p] >= 0 && send_offsets[p] >= 0 && send_counts[p] <= lim - send_offsets[p],
           "mk_nccl_all_to_all_v: send count %lld at offset %lld for rank %d", (long long)send_counts[p],
           (long long)send_offsets[p], p);
    MK_ARG(recv_counts[p] >= 0 && recv_offsets[p] >= 0 && recv_counts[p] <= lim - recv_offsets[p],
           "mk_nccl_all_to_all_v: recv count %lld at offset %lld for rank %d", (long long)recv_counts[p],
           (long long)recv_offsets[p], p);
    MK_ARG(send_counts[p] == 0 || send != 0, "mk_nccl_all_to_all_v: NULL send buffer");
    MK_ARG(recv_counts[p] == 0 || recv != 0, "mk_nccl_all_to_all_v: NULL recv buffer");
  }
  MK_ARG(send_counts[me] == recv_counts[me], "mk_nccl_all_to_all_v: rank %d sends itself %lld elements, receives %lld",
         me, (long long)send_counts[me], (long long)recv_counts[me]);
  cudaStream_t s = mk::as_stream(stream);
  const uint64_t eb = (uint64_t)elem_bytes;
  if (send_counts[me] > 0)
    MK_CUDA(cudaMemcpyAsync(mk::dev<char>(recv) + recv_offsets[me] * eb, mk::dev<const char>(send) + send_offsets[me] * eb,
                            send_counts[me] * eb, cudaMemcpyDeviceToDevice, s));
  MK_NCCL(n, c, n->GroupStart());
  ncclResult_t first = ncclSuccess;
  const char* first_call = nullptr;
  for (int k = 1; k < size && first == ncclSuccess; k++) {
    // Peers in a ring order from this rank; any order works inside a group.
    int to = (me + k) % size, from = (me - k + size) % size;
    if (send_counts[to] > 0) {
      first = n->Send(mk::dev<const char>(send) + send_offsets[to] * eb, send_counts[to] * eb, ncclUint8, to, c, s);
      first_call = "ncclSend";
    }
    if (first == ncclSuccess && recv_counts[from] > 0) {
      first = n->Recv(mk::dev<char>(recv) + recv_offsets[from] * eb, recv_counts[from] * eb, ncclUint8, from, c, s);
      first_call = "ncclRecv";
    }
  }
  ncclResult_t end = n->GroupEnd();  // closes the group whatever happened inside it
  if (first != ncclSuccess) return nccl_fail(n, first_call, first, c);
  if (end != ncclSuccess) return nccl_fail(n, "ncclGroupEnd", end, c);
  return MK_OK;
}

}  // extern "C"
