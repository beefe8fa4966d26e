#include "backends/nccl/nccl_library.h"

#include <dlfcn.h>

#include <mutex>

#include "core/error.h"

namespace llama4d::nccl_detail {

namespace {

// 2.19: ncclConfig_t with blocking = 0 and ncclCommGetAsyncError polling, on which every
// bounded wait of this backend rests (NCCL release notes).
constexpr int kMinVersion = 21900;

template <class F>
void bind(void* handle, F& fn, const char* name, const std::string& path) {
  fn = reinterpret_cast<F>(dlsym(handle, name));
  if (!fn) throw CommError("nccl: " + path + " has no " + name + " (too old an NCCL?)");
}

NcclLibrary load() {
  NcclLibrary lib;
  std::string tried;
  void* handle = nullptr;
  for (const std::string& candidate : {std::string("libnccl.so.2"), std::string(LLAMA4D_NCCL_LIBRARY)}) {
    if (candidate.empty()) continue;
    handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) {
      lib.path = candidate;
      break;
    }
    tried += (tried.empty() ? "" : "; ") + std::string(dlerror());
  }
  if (!handle)
    throw CommError("nccl: cannot load libnccl.so.2 (" + tried +
                    "); install NCCL or put its lib directory on LD_LIBRARY_PATH");
  bind(handle, lib.GetVersion, "ncclGetVersion", lib.path);
  bind(handle, lib.GetUniqueId, "ncclGetUniqueId", lib.path);
  bind(handle, lib.CommInitRankConfig, "ncclCommInitRankConfig", lib.path);
  bind(handle, lib.CommFinalize, "ncclCommFinalize", lib.path);
  bind(handle, lib.CommDestroy, "ncclCommDestroy", lib.path);
  bind(handle, lib.CommAbort, "ncclCommAbort", lib.path);
  bind(handle, lib.CommGetAsyncError, "ncclCommGetAsyncError", lib.path);
  bind(handle, lib.GetErrorString, "ncclGetErrorString", lib.path);
  bind(handle, lib.GetLastError, "ncclGetLastError", lib.path);
  bind(handle, lib.Send, "ncclSend", lib.path);
  bind(handle, lib.Recv, "ncclRecv", lib.path);
  bind(handle, lib.GroupStart, "ncclGroupStart", lib.path);
  bind(handle, lib.GroupEnd, "ncclGroupEnd", lib.path);
  if (lib.GetVersion(&lib.version) != ncclSuccess) throw CommError("nccl: ncclGetVersion failed in " + lib.path);
  if (lib.version < kMinVersion)
    throw CommError("nccl: " + lib.path + " is NCCL " + std::to_string(lib.version) + "; the backend needs 2.19 or newer");
  return lib;  // the handle stays open for the life of the process
}

}  // namespace

const NcclLibrary& nccl() {
  static std::once_flag once;
  static NcclLibrary lib;
  static std::string failure;
  std::call_once(once, [] {
    try {
      lib = load();
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw CommError(failure);
  return lib;
}

std::string nccl_error_text(ncclResult_t r, const char* what) {
  const NcclLibrary& lib = nccl();
  std::string text = std::string(what) + ": " + lib.GetErrorString(r);
  const char* last = lib.GetLastError(nullptr);
  if (last && *last) text += " (" + std::string(last) + ")";
  return text;
}

}  // namespace llama4d::nccl_detail
