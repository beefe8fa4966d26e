#pragma once
// cuBLASLt, opened at run time with dlopen (as bench/reference_cublas.cu opens cuBLAS), for the
// CUDA backend's fast products (lt_gemm.cu): a CUDA build neither links it nor needs it installed,
// --kernels exact never touches it, and --kernels fast on a machine without it (or with one older
// than kMinCublasLtVersion) stops with an InputError that names the library and what was tried
// (exit 2), not a crash in the first product. Opening it needs no GPU: tests/cuda checks the
// refusals on any machine.
#include <cublasLt.h>

#include <cstddef>
#include <string>
#include <vector>

namespace llama4d::cuda {

// cuBLAS 12.0 (CUDA 12.0): the first release whose heuristics and kernels cover sm_90, the
// architecture this build targets. cublasLtGetVersion's encoding: major * 10000 + minor * 100 + patch.
inline constexpr size_t kMinCublasLtVersion = 120000;
// Newest first; the soname carries the major version.
inline const std::vector<std::string> kCublasLtCandidates = {"libcublasLt.so.13", "libcublasLt.so.12"};

// The calls lt_gemm.cu makes, resolved from the loaded file.
struct CublasLtLibrary {
  std::string path;     // the file dlopen resolved
  size_t version = 0;   // cublasLtGetVersion()
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

// InputError naming cuBLASLt, the file and both versions when `version` is below the minimum.
void check_cublaslt_version(size_t version, const std::string& path);
// The first candidate that loads and exports every call above, version-checked; the library stays
// loaded for the process's life. InputError naming cuBLASLt and each candidate's failure (dlopen's
// message, or the call it lacks) when none does.
CublasLtLibrary open_cublaslt(const std::vector<std::string>& candidates);

}  // namespace llama4d::cuda
