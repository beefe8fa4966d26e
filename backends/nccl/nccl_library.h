#pragma once
// NCCL, loaded when a program first asks for it rather than linked: libnccl is a 200 MiB
// library only multi-GPU runs need, and a binary linked against it would not start on a machine
// without it (even for --device cpu). The table holds the entry points the backend calls, with
// NCCL's own signatures (nccl.h is the contract).
#include <nccl.h>

#include <string>

namespace llama4d::nccl_detail {

struct NcclLibrary {
  int version = 0;  // NCCL_VERSION_CODE of the loaded library, e.g. 22809 for 2.28.9
  std::string path;  // what dlopen found
  decltype(&::ncclGetVersion) GetVersion = nullptr;
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&::ncclCommFinalize) CommFinalize = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclGetLastError) GetLastError = nullptr;
  decltype(&::ncclSend) Send = nullptr;
  decltype(&::ncclRecv) Recv = nullptr;
  decltype(&::ncclGroupStart) GroupStart = nullptr;
  decltype(&::ncclGroupEnd) GroupEnd = nullptr;
};

// The library, loaded on the first call: libnccl.so.2 from the loader's search path
// (LD_LIBRARY_PATH, the system), else the one this build was configured with. CommError naming
// what was tried when neither loads, or when the version is older than 2.19 (non-blocking
// communicators, which the timeouts need).
const NcclLibrary& nccl();

// "ncclCommInitRankConfig: unhandled system error (<NCCL's last error>)"; r must not be
// ncclSuccess or ncclInProgress.
std::string nccl_error_text(ncclResult_t r, const char* what);

}  // namespace llama4d::nccl_detail
