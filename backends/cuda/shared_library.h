#pragma once
// Opening one of NVIDIA's libraries with dlopen, the way cuBLASLt (cublaslt_library.h) and cuDNN
// (cudnn_library.h) are opened: the first of several candidate names that loads and exports what
// the caller needs. Host code only; no CUDA headers, so the tests compile it on any machine.
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace llama4d::cuda {

struct OpenedLibrary {
  void* handle = nullptr;  // dlopen's; never closed (the resolved pointers live as long as the process)
  std::string path;        // the file the loader chose (from its link map), else the candidate's name
};

// "major.minor.patch" of a version number in NVIDIA's MAJOR*10000 + MINOR*100 + PATCH form.
std::string nvidia_version_text(size_t version);

// Tries `candidates` in order. `missing_symbols(handle)` returns the comma-separated symbols the
// loaded library lacks ("" when it has them all); a library that lacks any is closed and the next
// candidate tried. Throws InputError "--kernels fast needs NVIDIA's <what>, and none of <names>
// could be used; <name>: <why>; ... (<remedy>)" when none qualifies.
OpenedLibrary open_first_library(const std::vector<std::string>& candidates,
                                 const std::function<std::string(void*)>& missing_symbols, const std::string& what,
                                 const std::string& remedy);

}  // namespace llama4d::cuda
