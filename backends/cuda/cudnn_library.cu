// cuDNN opened with dlopen (see cudnn_library.h). Host code only.
#include "backends/cuda/cudnn_library.h"

#include <dlfcn.h>

#include "backends/nvidia/shared_library.h"
#include "core/error.h"

namespace llama4d::cuda {

void check_cudnn_version(size_t version, const std::string& path) {
  if (version < kMinCudnnVersion)
    throw InputError("--kernels fast needs cuDNN " + nvidia::version_text(kMinCudnnVersion) + " or newer; " + path +
                     " is cuDNN " + nvidia::version_text(version) + " (install a newer cuDNN 9, or use --kernels exact)");
}

CudnnLibrary open_cudnn(const std::vector<std::string>& candidates) {
  const auto missing_symbols = [](void* library) {
    std::string missing;
    for (const char* symbol : {"cudnnGetVersion", "cudnnCreate", "cudnnSetStream", "cudnnBackendCreateDescriptor"})
      if (dlsym(library, symbol) == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(symbol);
    return missing;
  };
  const nvidia::OpenedLibrary opened = nvidia::open_first_library(
      candidates, missing_symbols, "cuDNN",
      "install cuDNN 9 or add its directory to LD_LIBRARY_PATH, or use --kernels exact");
  CudnnLibrary dnn;
  dnn.path = opened.path;
  using GetVersion = size_t (*)();
  dnn.version = reinterpret_cast<GetVersion>(dlsym(opened.handle, "cudnnGetVersion"))();
  check_cudnn_version(dnn.version, dnn.path);
  dnn.handle = opened.handle;  // stays loaded: the frontend resolves its calls from it for the process's life
  return dnn;
}

}  // namespace llama4d::cuda
