// cuBLASLt opened with dlopen (see cublaslt_library.h). Host code only.
#include "backends/cuda/cublaslt_library.h"

#include <dlfcn.h>

#include <type_traits>

#include "backends/nvidia/shared_library.h"
#include "core/error.h"

namespace llama4d::cuda {

void check_cublaslt_version(size_t version, const std::string& path) {
  if (version < kMinCublasLtVersion)
    throw InputError("--kernels fast needs cuBLASLt " + nvidia::version_text(kMinCublasLtVersion) +
                     " or newer; " + path + " is cuBLASLt " + nvidia::version_text(version) +
                     " (install a newer CUDA toolkit's libcublasLt, or use --kernels exact)");
}

CublasLtLibrary open_cublaslt(const std::vector<std::string>& candidates) {
  CublasLtLibrary lt;
  decltype(&cublasLtGetVersion) get_version = nullptr;
  // Resolves every call into `lt` (a candidate that lacks one is closed, and the next one's
  // resolution overwrites them all).
  const auto missing_symbols = [&](void* library) {
    std::string missing;
    auto resolve = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(library, symbol));
      if (fn == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(symbol);
    };
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
    return missing;
  };
  lt.path = nvidia::open_first_library(candidates, missing_symbols, "cuBLASLt",
                               "install the CUDA toolkit's libcublasLt or add its directory to LD_LIBRARY_PATH, or "
                               "use --kernels exact")
                .path;
  lt.version = get_version();
  check_cublaslt_version(lt.version, lt.path);
  return lt;  // the library stays loaded: the pointers above live as long as the process
}

}  // namespace llama4d::cuda
