// cuDNN opened with dlopen (see cudnn_library.h). Host code only.
#include "backends/cuda/cudnn_library.h"

#include <dlfcn.h>
#include <link.h>

#include "core/error.h"

namespace llama4d::cuda {

std::string cudnn_version_text(size_t version) {
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

void check_cudnn_version(size_t version, const std::string& path) {
  if (version < kMinCudnnVersion)
    throw InputError("--kernels fast needs cuDNN " + cudnn_version_text(kMinCudnnVersion) + " or newer; " + path +
                     " is cuDNN " + cudnn_version_text(version) + " (install a newer cuDNN 9, or use --kernels exact)");
}

CudnnLibrary open_cudnn(const std::vector<std::string>& candidates) {
  std::string tried;
  for (const std::string& name : candidates) {
    void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* why = dlerror();
      tried += "; " + name + ": " + (why ? why : "not found");
      continue;
    }
    CudnnLibrary dnn;
    dnn.path = name;
    const link_map* map = nullptr;
    if (dlinfo(library, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && map->l_name[0])
      dnn.path = map->l_name;
    std::string missing;
    for (const char* symbol : {"cudnnGetVersion", "cudnnCreate", "cudnnSetStream", "cudnnBackendCreateDescriptor"})
      if (dlsym(library, symbol) == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(symbol);
    if (!missing.empty()) {
      tried += "; " + dnn.path + " lacks " + missing;
      dlclose(library);
      continue;
    }
    using GetVersion = size_t (*)();
    dnn.version = reinterpret_cast<GetVersion>(dlsym(library, "cudnnGetVersion"))();
    check_cudnn_version(dnn.version, dnn.path);
    dnn.handle = library;  // stays loaded: the frontend resolves its calls from it for the process's life
    return dnn;
  }
  std::string names;
  for (const std::string& n : candidates) names += (names.empty() ? "" : ", ") + n;
  if (names.empty()) names = "(no candidates)";
  throw InputError("--kernels fast needs NVIDIA's cuDNN, and none of " + names + " could be used" + tried +
                   " (install cuDNN 9 or add its directory to LD_LIBRARY_PATH, or use --kernels exact)");
}

}  // namespace llama4d::cuda
