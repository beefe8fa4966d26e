#pragma once
// The CPU backend's kernels (the list every backend implements, backends/backend_kernels.inc);
// cpu_backend.cpp puts kernel_table<T>() in the registry. Each kernel file instantiates float
// and double; memory is in device_memory.cpp, the peak GEMM rate in gemm_peak.cpp.
#include <cstdint>

#include "core/ops.h"

namespace llama4d::cpu {

#include "backends/backend_kernels.inc"

}  // namespace llama4d::cpu
