// cuBLASLt products for --kernels fast (see lt_gemm.cuh); every descriptor field comes from
// lt_gemm_plan.h's plan, which tests/ops/test_lt_gemm_plan.cpp checks on the CPU.
#include "backends/cuda/lt_gemm.cuh"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "backends/cuda/cublaslt_library.h"
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cudnn_attention.cuh"
#include "backends/cuda/lt_gemm_plan.h"
#include "core/error.h"

namespace llama4d::cuda {
namespace {

std::atomic<ops::KernelMode> mode{ops::KernelMode::exact};
std::once_flag opened;
CublasLtLibrary lt;  // written once under `opened`, read after

// 32 MiB: cuBLAS's recommended workspace on Hopper (cuBLAS documentation, cublasSetWorkspace).
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuBLASLt ") + what + " returned status " + std::to_string(int(s)));
}

cublasOperation_t op_of(LtOp op) { return op == LtOp::t ? CUBLAS_OP_T : CUBLAS_OP_N; }

// One virtual GPU's (one thread's) handle, workspace and cache of heuristic choices by plan.
struct ThreadState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::unordered_map<std::string, cublasLtMatmulAlgo_t> algos;
  ThreadState() {
    check_lt(lt.create(&handle), "cublasLtCreate");
    check(cudaMalloc(&workspace, kWorkspaceBytes), "cuBLASLt workspace");
  }
  ~ThreadState() {
    if (workspace) cudaFree(workspace);  // nothing to do about an error at thread exit
    if (handle) lt.destroy(handle);
  }
};
ThreadState& thread_state() {
  static thread_local ThreadState s;
  return s;
}

// The descriptors of one matmul, destroyed however the call ends.
struct Descriptors {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) lt.pref_destroy(pref);
    if (c) lt.layout_destroy(c);
    if (b) lt.layout_destroy(b);
    if (a) lt.layout_destroy(a);
    if (desc) lt.desc_destroy(desc);
  }
};

}  // namespace

void set_kernel_mode(ops::KernelMode m) {
  if (m == ops::KernelMode::fast) {
    std::call_once(opened, [] { lt = open_cublaslt(kCublasLtCandidates); });
    open_cudnn_attention();  // the fast attention's library (cudnn_attention.cuh)
  }
  mode.store(m);
}
ops::KernelMode kernel_mode() { return mode.load(); }

template <class T>
void lt_gemm(T* out, const Operands<T>& x, int64_t M, int64_t N, int64_t K, bool accumulate, bool bf16_values) {
  const LtGemmPlan p = plan_lt_gemm({x.a_rows, x.a_depth, x.b_depth, x.b_cols}, M, N, K, accumulate);
  constexpr bool f64 = std::is_same_v<T, double>;
  const cudaDataType data = f64 ? CUDA_R_64F : CUDA_R_32F;
  const cublasComputeType_t compute =
      f64 ? CUBLAS_COMPUTE_64F : (bf16_values ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F);
  ThreadState& s = thread_state();
  Descriptors d;
  check_lt(lt.desc_create(&d.desc, compute, data), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = op_of(p.a.op), op_b = op_of(p.b.op);
  check_lt(lt.desc_set(d.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "TRANSA");
  check_lt(lt.desc_set(d.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "TRANSB");
  check_lt(lt.layout_create(&d.a, data, uint64_t(p.a.rows), uint64_t(p.a.cols), p.a.ld), "layout A");
  check_lt(lt.layout_create(&d.b, data, uint64_t(p.b.rows), uint64_t(p.b.cols), p.b.ld), "layout B");
  check_lt(lt.layout_create(&d.c, data, uint64_t(p.c.rows), uint64_t(p.c.cols), p.c.ld), "layout C");
  // cuBLASLt's A and B: the product's operands swapped (lt_gemm_plan.h).
  const T* A = p.a_is_right ? x.b : x.a;
  const T* B = p.a_is_right ? x.a : x.b;

  const uint32_t alignment = std::min({lt_alignment(reinterpret_cast<uintptr_t>(A)),
                                       lt_alignment(reinterpret_cast<uintptr_t>(B)),
                                       lt_alignment(reinterpret_cast<uintptr_t>(out))});
  const std::string key = lt_plan_key(p, int(compute), alignment);
  auto it = s.algos.find(key);
  if (it == s.algos.end()) {
    check_lt(lt.pref_create(&d.pref), "cublasLtMatmulPreferenceCreate");
    const size_t workspace = kWorkspaceBytes;
    const uint32_t no_split_k = CUBLASLT_REDUCTION_SCHEME_NONE;
    check_lt(lt.pref_set(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)),
             "MAX_WORKSPACE_BYTES");
    check_lt(lt.pref_set(d.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_split_k, sizeof(no_split_k)),
             "REDUCTION_SCHEME_MASK");
    for (const auto which : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                             CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      check_lt(lt.pref_set(d.pref, which, &alignment, sizeof(alignment)), "MIN_ALIGNMENT");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    check_lt(lt.heuristic(s.handle, d.desc, d.a, d.b, d.c, d.c, d.pref, 1, &result, &found),
             "cublasLtMatmulAlgoGetHeuristic");
    if (found < 1) throw Error("cuBLASLt has no algorithm for the product " + key);
    it = s.algos.emplace(key, result.algo).first;
  }
  const T alpha = T(p.alpha), beta = T(p.beta);
  check_lt(lt.matmul(s.handle, d.desc, &alpha, A, d.a, B, d.b, &beta, out, d.c, out, d.c, &it->second, s.workspace,
                     kWorkspaceBytes, stream()),
           "cublasLtMatmul");
}

template void lt_gemm<float>(float*, const Operands<float>&, int64_t, int64_t, int64_t, bool, bool);
template void lt_gemm<double>(double*, const Operands<double>&, int64_t, int64_t, int64_t, bool, bool);

}  // namespace llama4d::cuda
