// Token embedding lookup and its scatter-add backward on the GPU, for the whole table and for the
// slice of rows one rank holds under vocabulary parallelism (backends/cpu/embedding.cpp).
//
// The forward copies: one thread per output element in a grid-stride loop. The backward adds
// rows sharing a token, which must happen in row order for reproducible bits, so threads split
// the C columns, never the rows: thread c walks t = 0 .. BT-1 and adds dout[t, c] into its
// column of the token's row. No two threads touch the same element (no atomics), and
// neighbouring threads write neighbouring columns of a row (coalesced). The results are the
// CPU's bits: a copy, and the same additions in the same order.
//
// Token ids are not validated, as on the CPU (ops.h requires ids in [0, V) for the whole-table
// forward); the backward and the row variants skip ids outside their range. A negative id, an
// out-of-bounds read on the CPU, gives a zero row here rather than a fault.
#include <limits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace llama4d::cuda {
namespace {

// out[BT, C] row i = wte_rows[tokens[i] - row_begin] when that is in [0, rows), zeros otherwise.
// The whole-table forward is row_begin = 0, rows = the maximum: every (valid) id is in range.
// Zeros are written, not skipped: the forward overwrites, and the all-reduce over the ranks then
// adds exactly one nonzero per row.
template <class T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte_rows, int64_t n, int64_t C,
                                         int64_t row_begin, int64_t rows) {
  for (int64_t i = first_index(); i < n; i += index_stride()) {
    const int64_t r = i / C, c = i % C;
    const int64_t local = static_cast<int64_t>(tokens[r]) - row_begin;
    out[i] = local >= 0 && local < rows ? wte_rows[local * C + c] : T(0);
  }
}

// dwte_rows[rows, C] += dout[BT, C] rows scattered by token, skipping ids outside
// [row_begin, row_begin + rows): thread c owns column c of every table row (see the header).
template <class T>
__global__ void embedding_backward_kernel(T* dwte_rows, const T* dout, const int32_t* tokens, int64_t BT, int64_t C,
                                          int64_t row_begin, int64_t rows) {
  for (int64_t c = first_index(); c < C; c += index_stride()) {
    for (int64_t r = 0; r < BT; ++r) {
      const int64_t local = static_cast<int64_t>(tokens[r]) - row_begin;
      if (local < 0 || local >= rows) continue;
      dwte_rows[local * C + c] += dout[r * C + c];
    }
  }
}

}  // namespace

template <class T>
void embedding_forward_rows(T* out, const int32_t* tokens, const T* wte_rows, int64_t BT, int64_t C,
                            int64_t row_begin, int64_t rows) {
  const int64_t n = BT * C;
  if (n <= 0) return;
  embedding_forward_kernel<<<grid_for(n), kThreads, 0, stream()>>>(out, tokens, wte_rows, n, C, row_begin, rows);
  finish_op("embedding_forward_rows");
}

template <class T>
void embedding_backward_rows(T* dwte_rows, const T* dout, const int32_t* tokens, int64_t BT, int64_t C,
                             int64_t row_begin, int64_t rows) {
  if (BT <= 0 || C <= 0) return;
  embedding_backward_kernel<<<grid_for(C), kThreads, 0, stream()>>>(dwte_rows, dout, tokens, BT, C, row_begin, rows);
  finish_op("embedding_backward_rows");
}

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t BT, int64_t C) {
  const int64_t n = BT * C;
  if (n <= 0) return;
  embedding_forward_kernel<<<grid_for(n), kThreads, 0, stream()>>>(out, tokens, wte, n, C, 0,
                                                                   std::numeric_limits<int64_t>::max());
  finish_op("embedding_forward");
}

// As the CPU: the whole table is the row range [0, max), so ids < 0 are skipped.
template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int64_t BT, int64_t C) {
  if (BT <= 0 || C <= 0) return;
  embedding_backward_kernel<<<grid_for(C), kThreads, 0, stream()>>>(dwte, dout, tokens, BT, C, 0,
                                                                    std::numeric_limits<int64_t>::max());
  finish_op("embedding_backward");
}

#define LLAMA4D_INSTANTIATE(T)                                                                                    \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t);                             \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t);                            \
  template void embedding_forward_rows<T>(T*, const int32_t*, const T*, int64_t, int64_t, int64_t, int64_t);      \
  template void embedding_backward_rows<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t);
LLAMA4D_INSTANTIATE(float)
LLAMA4D_INSTANTIATE(double)
#undef LLAMA4D_INSTANTIATE

}  // namespace llama4d::cuda
