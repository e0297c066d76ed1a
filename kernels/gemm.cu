// gemm.cu — C [M,N] (+)= A [M,K] · B [N,K]ᵀ through cuBLASLt: bf16 operands
// (mk_gemm_bf16) or float32 operands in full FP32 (mk_gemm_f32: compute type
// CUBLAS_COMPUTE_32F, never the TF32 fast path), float32 accumulation.
//
// Row-major C = A·Bᵀ is column-major Cᵀ [N,M] = B·Aᵀ. Row-major B [N,K] read
// column-major is a K×N matrix with ld K, so op(B) = T gives N×K; row-major
// A [M,K] read column-major is K×M with ld K and op(A) = N. cuBLAS is then
// asked for the "TN" product m=N, n=M, k=K with its first operand B and its
// second A, writing column-major N×M with ld N, which is row-major C [M,N].
#include <cublasLt.h>
#include <cublas_v2.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "common.cuh"

namespace {

const char* lt_status(cublasStatus_t s) { return cublasGetStatusName(s); }

#define MK_BLAS(call)                                                                   \
  do {                                                                                  \
    cublasStatus_t mk_s_ = (call);                                                      \
    if (mk_s_ != CUBLAS_STATUS_SUCCESS)                                                 \
      return mk::fail(MK_ERR_CUBLAS, "%s: %s (%d) at %s:%d", #call, lt_status(mk_s_),   \
                      (int)mk_s_, __FILE__, __LINE__);                                  \
  } while (0)

constexpr size_t kWorkspaceBytes = 64ull << 20;

// Plan is one shape's cuBLASLt descriptors and chosen algorithm; fallback
// marks shapes for which cuBLASLt offered none.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo;
  bool fallback = false;
};

// Key: m, n, k, A/B dtype, C dtype, and the pointer alignments the algorithm
// was chosen for. beta (accumulate) does not change the plan.
using Key = std::tuple<int64_t, int64_t, int64_t, int32_t, int32_t, uint32_t, uint32_t, uint32_t>;

struct Gemm {
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  void* ws = nullptr;
  std::mutex mu;
  std::map<Key, Plan> plans;
  uint64_t lt_calls = 0, fallback_calls = 0;
};

Gemm& gemm() {
  static Gemm g;
  return g;
}

// align_of is the largest power of two (≤ 256) dividing p.
uint32_t align_of(uint64_t p) {
  uint32_t a = 256;
  while (a > 1 && (p % a) != 0) a >>= 1;
  return a;
}

// log_plan prints a new plan's key and the algorithm cuBLASLt's heuristic
// chose (id, tile, split-K, stages) to stderr when MKSERVE_GEMM_LOG is set:
// two processes' logs show whether they run the same GEMM kernels.
void log_plan(const Key& key, const cublasLtMatmulAlgo_t& algo) {
  static const bool on = getenv("MKSERVE_GEMM_LOG") != nullptr;
  if (!on) return;
  auto [m, n, k, ab_dtype, c_dtype, al_a, al_b, al_c] = key;
  int id = -1;
  uint32_t tile = 0, stages = 0, splitk = 0, swizzle = 0;
  size_t w = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof swizzle, &w);
  fprintf(stderr, "mk_gemm plan m=%lld n=%lld k=%lld ab=%d c=%d align=%u/%u/%u: algo=%d tile=%u stages=%u splitk=%u swizzle=%u\n",
          (long long)m, (long long)n, (long long)k, ab_dtype, c_dtype, al_a, al_b, al_c, id, tile, stages,
          splitk, swizzle);
}

int make_plan(const Key& key, Plan* plan) {
  Gemm& g = gemm();
  auto [m, n, k, ab_dtype, c_dtype, al_a, al_b, al_c] = key;
  cudaDataType_t ct = c_dtype == MK_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
  cudaDataType_t abt = ab_dtype == MK_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
  MK_BLAS(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  MK_BLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  MK_BLAS(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  // cuBLAS's first operand is our B (K×N column-major, ld K), its second our A.
  MK_BLAS(cublasLtMatrixLayoutCreate(&plan->la, abt, k, n, k));
  MK_BLAS(cublasLtMatrixLayoutCreate(&plan->lb, abt, k, m, k));
  MK_BLAS(cublasLtMatrixLayoutCreate(&plan->lc, ct, n, m, n));
  cublasLtMatmulPreference_t pref = nullptr;
  MK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspaceBytes;
  // Operand roles are cuBLAS's: its A is our B.
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                              &al_b, sizeof al_b);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                              &al_a, sizeof al_a);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                              &al_c, sizeof al_c);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                              &al_c, sizeof al_c);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cublasLtMatmulPreferenceDestroy(pref);
    return mk::fail(MK_ERR_CUBLAS, "cublasLtMatmulPreferenceSetAttribute: %s", lt_status(st));
  }
  cublasLtMatmulHeuristicResult_t res;
  memset(&res, 0, sizeof res);
  int found = 0;
  st = cublasLtMatmulAlgoGetHeuristic(g.lt, plan->op, plan->la, plan->lb, plan->lc, plan->lc,
                                      pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) {
    plan->fallback = true;
    return MK_OK;
  }
  MK_BLAS(st);
  plan->algo = res.algo;
  log_plan(key, plan->algo);
  return MK_OK;
}

}  // namespace

namespace mk {

int gemm_init() {
  Gemm& g = gemm();
  if (g.lt == nullptr) MK_BLAS(cublasLtCreate(&g.lt));
  if (g.blas == nullptr) MK_BLAS(cublasCreate(&g.blas));
  if (g.ws == nullptr) MK_CUDA(cudaMalloc(&g.ws, kWorkspaceBytes));
  MK_BLAS(cublasSetWorkspace(g.blas, g.ws, kWorkspaceBytes));
  return MK_OK;
}

}  // namespace mk

namespace {

// run_gemm is mk_gemm_bf16 / mk_gemm_f32: C (+)= A·Bᵀ with operands of
// ab_dtype, C of c_dtype; beta = 1 when accumulate.
int run_gemm(const char* fn, uint64_t stream, uint64_t a, uint64_t b, uint64_t c,
             int32_t ab_dtype, int32_t c_dtype, int64_t m, int64_t n, int64_t k,
             int32_t accumulate) {
  MK_THREAD(fn);
  MK_ARG(m > 0 && n > 0 && k > 0, "%s: bad shape M=%lld N=%lld K=%lld", fn, (long long)m,
         (long long)n, (long long)k);
  MK_ARG(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX,
         "%s: shape M=%lld N=%lld K=%lld exceeds int32", fn, (long long)m, (long long)n,
         (long long)k);
  MK_ARG(c_dtype == MK_DTYPE_BF16 || c_dtype == MK_DTYPE_F32, "%s: bad C dtype %d", fn, c_dtype);
  MK_ARG(accumulate == 0 || accumulate == 1, "%s: accumulate=%d, want 0 or 1", fn, accumulate);
  MK_ARG(a != 0 && b != 0 && c != 0, "%s: NULL operand", fn);
  Gemm& g = gemm();
  std::lock_guard<std::mutex> lock(g.mu);
  Key key{m, n, k, ab_dtype, c_dtype, align_of(a), align_of(b), align_of(c)};
  auto it = g.plans.find(key);
  if (it == g.plans.end()) {
    Plan p;
    int rc = make_plan(key, &p);
    if (rc != MK_OK) return rc;
    it = g.plans.emplace(key, p).first;
  }
  Plan& p = it->second;
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  cudaStream_t s = mk::as_stream(stream);
  if (!p.fallback) {
    cublasStatus_t st = cublasLtMatmul(g.lt, p.op, &alpha, mk::dev<void>(b), p.la,
                                       mk::dev<void>(a), p.lb, &beta, mk::dev<void>(c), p.lc,
                                       mk::dev<void>(c), p.lc, &p.algo, g.ws, kWorkspaceBytes, s);
    if (st == CUBLAS_STATUS_SUCCESS) {
      g.lt_calls++;
      return MK_OK;
    }
    // An algorithm the heuristic offered but that refuses this problem:
    // remember the shape for the fallback. Any other status is an error.
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) MK_BLAS(st);
    p.fallback = true;
  }
  cudaDataType_t ct = c_dtype == MK_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
  cudaDataType_t abt = ab_dtype == MK_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
  MK_BLAS(cublasSetStream(g.blas, s));
  // The handle keeps cuBLAS's default math mode, so CUBLAS_COMPUTE_32F is
  // full FP32 for float32 operands (no TF32).
  MK_BLAS(cublasGemmEx(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha,
                       mk::dev<void>(b), abt, (int)k, mk::dev<void>(a), abt, (int)k, &beta,
                       mk::dev<void>(c), ct, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  g.fallback_calls++;
  return MK_OK;
}

}  // namespace

extern "C" {

int32_t mk_gemm_bf16(uint64_t stream, uint64_t a, uint64_t b, uint64_t c, int32_t c_dtype,
                     int64_t m, int64_t n, int64_t k, int32_t accumulate) {
  return run_gemm("mk_gemm_bf16", stream, a, b, c, MK_DTYPE_BF16, c_dtype, m, n, k, accumulate);
}

int32_t mk_gemm_f32(uint64_t stream, uint64_t a, uint64_t b, uint64_t c, int64_t m, int64_t n,
                    int64_t k, int32_t accumulate) {
  return run_gemm("mk_gemm_f32", stream, a, b, c, MK_DTYPE_F32, MK_DTYPE_F32, m, n, k, accumulate);
}

int32_t mk_gemm_heads(uint64_t stream, uint64_t a, uint64_t b, uint64_t c, int32_t ab_dtype, int64_t m, int64_t n,
                      int64_t k, int64_t heads, int32_t accumulate) {
  const char* fn = "mk_gemm_heads";
  MK_THREAD(fn);
  MK_ARG(m > 0 && n > 0 && k > 0 && heads > 0, "%s: bad shape M=%lld N=%lld K=%lld heads=%lld", fn, (long long)m,
         (long long)n, (long long)k, (long long)heads);
  MK_ARG(m <= INT32_MAX && heads * n <= INT32_MAX && heads * k <= INT32_MAX && heads <= INT32_MAX,
         "%s: shape M=%lld N=%lld K=%lld heads=%lld exceeds int32", fn, (long long)m, (long long)n, (long long)k,
         (long long)heads);
  MK_ARG(ab_dtype == MK_DTYPE_BF16 || ab_dtype == MK_DTYPE_F32, "%s: bad operand dtype %d", fn, ab_dtype);
  MK_ARG(accumulate == 0 || accumulate == 1, "%s: accumulate=%d, want 0 or 1", fn, accumulate);
  MK_ARG(a != 0 && b != 0 && c != 0, "%s: NULL operand", fn);
  Gemm& g = gemm();
  std::lock_guard<std::mutex> lock(g.mu);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const cudaDataType_t abt = ab_dtype == MK_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
  MK_BLAS(cublasSetStream(g.blas, mk::as_stream(stream)));
  // Row-major C_h = A_h·B_hᵀ is column-major C_hᵀ [n, m] = B_h (column-major
  // [k, n], transposed) · A_hᵀ (column-major [k, m]); head h's A starts k
  // values further along the rows (row stride heads·k), its B n·k values
  // further, its C n values further along the rows (row stride heads·n).
  MK_BLAS(cublasGemmStridedBatchedEx(g.blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha,
                                     mk::dev<void>(b), abt, (int)k, (long long)n * k, mk::dev<void>(a), abt,
                                     (int)(heads * k), (long long)k, &beta, mk::dev<void>(c), CUDA_R_32F,
                                     (int)(heads * n), (long long)n, (int)heads, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
  g.fallback_calls++;
  return MK_OK;
}

int32_t mk_gemm_stats(uint64_t* lt_calls, uint64_t* fallback_calls) {
  MK_ARG(lt_calls != nullptr && fallback_calls != nullptr, "mk_gemm_stats: NULL argument");
  Gemm& g = gemm();
  std::lock_guard<std::mutex> lock(g.mu);
  *lt_calls = g.lt_calls;
  *fallback_calls = g.fallback_calls;
  return MK_OK;
}

}  // extern "C"
