#include "backends/nccl/nccl_library.h"

#include <dlfcn.h>

#include <mutex>

#include "backends/nvidia/shared_library.h"
#include "core/error.h"

namespace llama4d::nccl_detail {

namespace {

// 2.19: ncclConfig_t with blocking = 0 and ncclCommGetAsyncError polling, on which every
// bounded wait of this backend rests (NCCL release notes).
constexpr int kMinVersion = 21900;

// Every entry point the table holds (nccl_library.h), so that a library lacking one is passed
// over for the next candidate.
constexpr const char* kSymbols[] = {
    "ncclGetVersion",   "ncclGetUniqueId",     "ncclCommInitRankConfig", "ncclCommFinalize", "ncclCommDestroy",
    "ncclCommAbort",    "ncclCommGetAsyncError", "ncclGetErrorString",   "ncclGetLastError", "ncclSend",
    "ncclRecv",         "ncclGroupStart",      "ncclGroupEnd"};

std::string missing_symbols(void* handle) {
  std::string missing;
  for (const char* name : kSymbols)
    if (dlsym(handle, name) == nullptr) missing += (missing.empty() ? "" : ", ") + std::string(name);
  return missing;
}

template <class F>
void bind(void* handle, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(handle, name));  // present: missing_symbols checked every name
}

NcclLibrary load() {
  // libnccl.so.2 from the loader's search path (LD_LIBRARY_PATH, the system), else the file this
  // build was configured with.
  const nvidia::OpenedLibrary opened =
      nvidia::try_open_first_library({"libnccl.so.2", LLAMA4D_NCCL_LIBRARY}, missing_symbols);
  if (opened.handle == nullptr)
    throw CommError("nccl: cannot load libnccl.so.2 (" + opened.failures.substr(opened.failures.empty() ? 0 : 2) +
                    "); install NCCL 2.19 or newer, or put its lib directory on LD_LIBRARY_PATH");
  NcclLibrary lib;
  lib.path = opened.path;
  void* handle = opened.handle;
  bind(handle, lib.GetVersion, "ncclGetVersion");
  bind(handle, lib.GetUniqueId, "ncclGetUniqueId");
  bind(handle, lib.CommInitRankConfig, "ncclCommInitRankConfig");
  bind(handle, lib.CommFinalize, "ncclCommFinalize");
  bind(handle, lib.CommDestroy, "ncclCommDestroy");
  bind(handle, lib.CommAbort, "ncclCommAbort");
  bind(handle, lib.CommGetAsyncError, "ncclCommGetAsyncError");
  bind(handle, lib.GetErrorString, "ncclGetErrorString");
  bind(handle, lib.GetLastError, "ncclGetLastError");
  bind(handle, lib.Send, "ncclSend");
  bind(handle, lib.Recv, "ncclRecv");
  bind(handle, lib.GroupStart, "ncclGroupStart");
  bind(handle, lib.GroupEnd, "ncclGroupEnd");
  if (lib.GetVersion(&lib.version) != ncclSuccess) throw CommError("nccl: ncclGetVersion failed in " + lib.path);
  if (lib.version < kMinVersion)
    throw CommError("nccl: " + lib.path + " is NCCL " + std::to_string(lib.version) + "; the backend needs 2.19 or newer");
  return lib;  // the library stays open for the life of the process
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
