#pragma once
// The CUDA backend's kernels (the list every backend implements, backends/backend_kernels.inc);
// cuda_backend.cu puts kernel_table<T>() in the registry. Pointers are device memory (managed,
// device_memory.cu) except the host outputs core/ops.h names. Each .cu file instantiates float
// and double; the peak GEMM rate is measured in gemm.cu.
#include <cstdint>

#include "core/ops.h"

namespace llama4d::cuda {

#include "backends/backend_kernels.inc"

}  // namespace llama4d::cuda
