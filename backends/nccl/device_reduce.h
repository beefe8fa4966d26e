#pragma once
// The reduction of a collective, on the GPU: what core/comm/reduce_kernels.h's reduce_sequence
// computes on the host, element for element the same bits, for communication backends whose
// buffers live in device memory (backends/nccl). Declared without CUDA headers' device parts so
// plain C++ files can call it.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/comm/comm_types.h"
#include "core/tensor/dtype.h"

namespace llama4d::nccl_detail {

// out[count] = ((in_0 op in_1) op in_2) ... op in_{n-1}, element-wise, where in_j is the block
// of `count` elements at inputs + j * stride elements (the contributions in the order they are
// added). avg divides the sum by group_size at the end; bf16 accumulates in fp32 and rounds once,
// or after every step with step_rounding (a ring's partial sums travel as bf16). `out` may be
// in_0. Queued on `stream`; InputError for f16 (it only moves).
void reduce_sequence_on_device(void* out, const void* inputs, int64_t stride, int n, int64_t count, DType dtype,
                               ReduceOp op, int group_size, bool step_rounding, cudaStream_t stream);

// Loads the kernels above now. With CUDA's lazy loading a kernel's first launch loads its
// module, which may wait for the whole device: behind a transfer that waits for a peer, that
// wait would have no deadline. A communication backend calls this before its first transfer.
void load_reduce_kernels();

}  // namespace llama4d::nccl_detail
