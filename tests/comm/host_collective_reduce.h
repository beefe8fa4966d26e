#pragma once
// ComputeBackend::collective_reduce (core/ops.h) computed on the host, for the logging backend
// of tests/ops/operand_log.h: the communication layer's reduce_sequence into the first output,
// copied to the others. reduce_sequence reads every input before it writes what they alias, and
// the copies come after, so any output may be any input, as the contract allows.
#include <cstdint>
#include <cstring>

#include "core/comm/reduce_kernels.h"

namespace llama4d::test {

inline void host_collective_reduce(void* const* outs, int n_outs, const void* const* inputs, int n, int64_t count,
                                   DType dtype, ReduceOp op, int group_size, bool step_rounding) {
  reduce_sequence(outs[0], inputs, n, count, dtype, op, group_size, step_rounding);
  for (int o = 1; o < n_outs; ++o) std::memmove(outs[o], outs[0], size_t(count) * dtype_size(dtype));
}

}  // namespace llama4d::test
