// cuBLASLt opened with dlopen (see cublaslt_library.h). Host code only.
#include "backends/cuda/cublaslt_library.h"

#include <dlfcn.h>
#include <link.h>

#include <type_traits>

#include "core/error.h"

namespace llama4d::cuda {

std::string cublaslt_version_text(size_t version) {
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

void check_cublaslt_version(size_t version, const std::string& path) {
  if (version < kMinCublasLtVersion)
    throw InputError("--kernels fast needs cuBLASLt " + cublaslt_version_text(kMinCublasLtVersion) +
                     " or newer; " + path + " is cuBLASLt " + cublaslt_version_text(version) +
                     " (install a newer CUDA toolkit's libcublasLt, or use --kernels exact)");
}

CublasLtLibrary open_cublaslt(const std::vector<std::string>& candidates) {
  std::string tried;
  for (const std::string& name : candidates) {
    void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* why = dlerror();
      tried += "; " + name + ": " + (why ? why : "not found");
      continue;
    }
    CublasLtLibrary lt;
    lt.path = name;
    const link_map* map = nullptr;
    if (dlinfo(library, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && map->l_name[0])
      lt.path = map->l_name;
    std::string missing;
    auto resolve = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(library, symbol));
      if (fn == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(symbol);
    };
    decltype(&cublasLtGetVersion) get_version = nullptr;
    resolve(get_version, "cublasLtGetVersion");
    resolve(lt.create, "cublasLtCreate");
    resolve(lt.destroy, "cublasLtDestroy");
    resolve(lt.desc_create, "cublasLtMatmulDescCreate");
    resolve(lt.desc_destroy, "cublasLtMatmulDescDestroy");
    resolve(lt.desc_set, "cublasLtMatmulDescSetAttribute");
    resolve(lt.layout_create, "cublasLtMatrixLayoutCreate");
    resolve(lt.layout_destroy, "cublasLtMatrixLayoutDestroy");
    resolve(lt.pref_create, "cublasLtMatmulPreferenceCreate");
    resolve(lt.pref_destroy, "cublasLtMatmulPreferenceDestroy");
    resolve(lt.pref_set, "cublasLtMatmulPreferenceSetAttribute");
    resolve(lt.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    resolve(lt.matmul, "cublasLtMatmul");
    if (!missing.empty()) {
      tried += "; " + lt.path + " lacks " + missing;
      dlclose(library);
      continue;
    }
    lt.version = get_version();
    check_cublaslt_version(lt.version, lt.path);
    return lt;  // the library stays loaded: the pointers above live as long as the process
  }
  std::string names;
  for (const std::string& n : candidates) names += (names.empty() ? "" : ", ") + n;
  if (names.empty()) names = "(no candidates)";
  throw InputError("--kernels fast needs NVIDIA's cuBLASLt, and none of " + names + " could be used" + tried +
                   " (install the CUDA toolkit's libcublasLt or add its directory to LD_LIBRARY_PATH, or use "
                   "--kernels exact)");
}

}  // namespace llama4d::cuda
