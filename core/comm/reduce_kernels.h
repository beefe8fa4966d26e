#pragma once
// Element-wise reductions shared by every backend, so the virtual and MPI backends produce the
// same bits for the same algorithm. Floats add in IEEE order as written; bf16 accumulates in
// fp32; integers wrap around (two's complement) instead of overflowing.
#include <cstdint>
#include <vector>

#include "core/comm/comm_types.h"
#include "core/tensor/dtype.h"

namespace llama4d {

// out[count] = (((inputs[0] op inputs[1]) op inputs[2]) ... op inputs[n-1]), element-wise, left
// to right. `step_rounding`: bf16 partial results are rounded to bf16 after every step (a ring,
// where partial sums travel as bf16); otherwise bf16 accumulates in fp32 and rounds once.
// op == avg: the sum, divided by group_size at the end. `out` may alias any input.
void reduce_sequence(void* out, const void* const* inputs, int n, int64_t count, DType dtype, ReduceOp op,
                     int group_size, bool step_rounding);

// The members whose contributions the owner of chunk `me` adds, in order: ordered = rank order
// 0, 1, ..., n-1; ring = me+1, ..., n-1, 0, ..., me (NCCL's ring: chunk me's partial sum starts
// at rank me+1 and ends at me).
std::vector<int> reduction_order(int n, int me, ReduceAlgo algo);

// acc[count] = acc op x: one hop of a ring (avg adds; finish_average divides at the end). Gives
// the same bits as reduce_sequence with step rounding, because a op b == b op a exactly.
void reduce_step(void* acc, const void* x, int64_t count, DType dtype, ReduceOp op);

// buf[count] /= group_size (the last step of a stepwise avg).
void finish_average(void* buf, int64_t count, DType dtype, int group_size);

}  // namespace llama4d
