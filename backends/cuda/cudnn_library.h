#pragma once
// cuDNN, opened at run time with dlopen (as cublaslt_library.h opens cuBLASLt), for the CUDA
// backend's fast attention (cudnn_attention.cu, through NVIDIA's cuDNN frontend compiled with
// NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, which resolves every cuDNN call from the handle opened
// here): a CUDA build neither links cuDNN nor needs it installed, --kernels exact never touches
// it, and --kernels fast on a machine without it (or with one older than kMinCudnnVersion) stops
// with an InputError that names the library and what was tried (exit 2). Opening it needs no
// GPU: tests/cuda checks the refusals on any machine. No cuDNN header here.
#include <cstddef>
#include <string>
#include <vector>

namespace llama4d::cuda {

// cuDNN 9.6.0: the frontend this build pins (backends/cuda/cudnn_frontend_requirements.txt)
// gates parts of SDPA forward and backward (causal masks on sequence lengths not a multiple of
// 64, grouped heads with ragged layouts) on 9.5 and 9.6 in scaled_dot_product_flash_attention.h;
// below 9.6 a graph it would build here may be refused. cudnnGetVersion's encoding for cuDNN 9:
// major * 10000 + minor * 100 + patch.
inline constexpr size_t kMinCudnnVersion = 90600;
// The soname carries the major version: the frontend speaks cuDNN 9's graph API.
inline const std::vector<std::string> kCudnnCandidates = {"libcudnn.so.9"};

struct CudnnLibrary {
  std::string path;      // the file dlopen resolved
  size_t version = 0;    // cudnnGetVersion()
  void* handle = nullptr;  // dlopen's handle, which the frontend's dynamic loading reads symbols from
};

// InputError naming cuDNN, the file and both versions when `version` is below the minimum.
void check_cudnn_version(size_t version, const std::string& path);
// The first candidate that loads and exports the calls the frontend's SDPA graphs make first
// (cudnnGetVersion, cudnnCreate, cudnnSetStream, cudnnBackendCreateDescriptor), version-checked;
// the library stays loaded for the process's life. InputError naming cuDNN and each candidate's
// failure when none does.
CudnnLibrary open_cudnn(const std::vector<std::string>& candidates);

}  // namespace llama4d::cuda
