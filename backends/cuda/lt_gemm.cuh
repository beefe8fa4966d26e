#pragma once
// The CUDA backend's fast products (--kernels fast): cuBLASLt runs what gemm.cu's exact kernel
// would, from the plan lt_gemm_plan.h makes (tested on the CPU), in fp32 containers: bf16 values
// (GemmOperands::bf16) with CUBLAS_COMPUTE_32F_FAST_16BF, which rounds the inputs to bf16 (exact:
// they hold bf16 values) and accumulates in fp32; fp32 values with CUBLAS_COMPUTE_32F (no TF32);
// fp64 with CUBLAS_COMPUTE_64F.
//
// Repeatable run to run on one GPU and library version because each calling thread (one virtual
// GPU, whose stream is cudaStreamPerThread) has its own handle and workspace, the algorithm for a
// plan is the heuristic's first choice, asked once and cached per thread, and the preference
// allows no split-K reduction (CUBLASLT_REDUCTION_SCHEME_NONE), so no partial sums race.
#include <cstdint>

#include "backends/cuda/gemm.cuh"
#include "core/ops.h"

namespace llama4d::cuda {

// ComputeBackend::set_kernel_mode and kernel_mode. Fast opens cuBLASLt (cublaslt_library.h) and
// cuDNN (cudnn_attention.cuh) the first time: InputError naming the one that cannot be used here.
void set_kernel_mode(ops::KernelMode mode);
ops::KernelMode kernel_mode();

// Queues out[M, N] (row-major) = or += A[M, K] B[K, N] through cuBLASLt (gemm.cu checks M, N, K > 0
// and waits). bf16_values: the operands hold bf16 values (GemmOperands::bf16).
template <class T>
void lt_gemm(T* out, const Operands<T>& x, int64_t M, int64_t N, int64_t K, bool accumulate, bool bf16_values);

}  // namespace llama4d::cuda
