#pragma once
// The CUDA backend's kernels (the list every backend implements, backends/backend_kernels.inc);
// cuda_backend.cu puts kernel_table<T>() in the registry. Pointers are device memory (managed,
// device_memory.cu) except the host outputs core/ops.h names. Each .cu file instantiates float
// and double; the peak GEMM rate is measured in gemm.cu.
#include <cstdint>

#include "core/ops.h"

namespace llama4d::cuda {

#include "backends/backend_kernels.inc"

// ComputeBackend::collective_reduce (core/ops.h): the virtual process group's reductions between
// ranks sharing this GPU, on the GPU (collective_reduce.cu).
void collective_reduce(void* const* outs, int n_outs, const void* const* inputs, int n, int64_t count, DType dtype,
                       ReduceOp op, int group_size, bool step_rounding);

}  // namespace llama4d::cuda
