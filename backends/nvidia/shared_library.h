#pragma once
// Opening one of NVIDIA's libraries with dlopen, as the CUDA backend opens cuBLASLt and cuDNN
// (backends/cuda/cublaslt_library.h, cudnn_library.h) and the NCCL backend opens libnccl
// (backends/nccl/nccl_library.h): the first of several candidate names that loads and exports
// what the caller needs. Host code only; no CUDA headers, so the tests compile it on any machine.
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace llama4d::nvidia {

struct OpenedLibrary {
  void* handle = nullptr;  // dlopen's; never closed (the resolved pointers live as long as the process)
  std::string path;        // the file the loader chose (from its link map), else the candidate's name
  std::string failures;    // handle null: "; <name>: <why>" for each candidate tried
};

// "major.minor.patch" of a version number in NVIDIA's MAJOR*10000 + MINOR*100 + PATCH form.
std::string version_text(size_t version);

// Tries `candidates` in order (empty names skipped). `missing_symbols(handle)` returns the
// comma-separated symbols the loaded library lacks ("" when it has them all); a library that
// lacks any is closed and the next candidate tried. When none qualifies, the handle is null and
// `failures` says why each did not: the caller words the error (a CUDA kernel library is bad
// input to --kernels fast, NCCL a communication failure).
OpenedLibrary try_open_first_library(const std::vector<std::string>& candidates,
                                     const std::function<std::string(void*)>& missing_symbols);

// As try_open_first_library, for the libraries --kernels fast needs: InputError "--kernels fast
// needs NVIDIA's <what>, and none of <names> could be used; <name>: <why>; ... (<remedy>)" when
// none qualifies.
OpenedLibrary open_first_library(const std::vector<std::string>& candidates,
                                 const std::function<std::string(void*)>& missing_symbols, const std::string& what,
                                 const std::string& remedy);

}  // namespace llama4d::nvidia
