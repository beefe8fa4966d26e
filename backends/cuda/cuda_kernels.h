#pragma once
// The CUDA backend's kernels (the list every backend implements, backends/backend_kernels.inc);
// cuda_backend.cu puts kernel_table<T>() in the registry. Pointers are device memory (managed,
// device_memory.cu) except the host outputs core/ops.h names. Each .cu file instantiates float
// and double; the peak GEMM rate is measured in gemm.cu.
#include <cstdint>

#include "core/ops.h"

namespace llama4d::cuda {

#include "backends/backend_kernels.inc"

// Calls of the products (matmul_forward, matmul_backward) and of attention (forward, backward)
// by the units they ran on, since the process started. bf16 operands go to the tensor cores on a
// GPU that has bf16 ones (sm_80 and later; attention also needs the shared memory its head
// dimension takes), everything else to CUDA cores. Both give right answers, so tests read these
// to see which ran. With --kernels fast every product goes to cuBLASLt instead, and every
// attention call cuDNN can express (cudnn_sdpa_plan.h's sdpa_refusal) to cuDNN (`library`).
struct UnitCalls {
  int64_t tensor_cores = 0, cuda_cores = 0;
  int64_t library = 0;  // cuBLASLt or cuDNN (--kernels fast; lt_gemm.cu, cudnn_attention.cu)
};
UnitCalls gemm_unit_calls();
UnitCalls attention_unit_calls();

// ComputeBackend::collective_reduce (core/ops.h): the virtual process group's reductions between
// ranks sharing this GPU, on the GPU (collective_reduce.cu).
void collective_reduce(void* const* outs, int n_outs, const void* const* inputs, int n, int64_t count, DType dtype,
                       ReduceOp op, int group_size, bool step_rounding);

}  // namespace llama4d::cuda
