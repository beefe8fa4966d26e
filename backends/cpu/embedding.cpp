// Token embedding lookup and its scatter-add backward, for the whole table and for the slice of
// rows one rank holds under vocabulary parallelism.
#include <cstring>
#include <limits>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_kernels.h"
#include "core/ops.h"

namespace llama4d::cpu {

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t BT, int64_t C) {
  cpu::parallel_for(BT, BT * C >= (1 << 15), [&](int64_t r) {
    std::memcpy(out + r * C, wte + static_cast<int64_t>(tokens[r]) * C, sizeof(T) * C);
  });
}

// Rows sharing a token must be added in row order for reproducible bits, so threads split the
// C columns instead of the rows: each thread owns a column slice of every dwte row (16 columns,
// one 64-byte line of floats: C = 288 gives 18 slices).
template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int64_t BT, int64_t C) {
  embedding_backward_rows(dwte, dout, tokens, BT, C, 0, std::numeric_limits<int64_t>::max());
}

// Out-of-range rows are written as zeros, not skipped: the forward overwrites its output, and
// the all-reduce over the ranks then adds exactly one nonzero per row, which is exact.
template <class T>
void embedding_forward_rows(T* out, const int32_t* tokens, const T* wte_rows, int64_t BT, int64_t C,
                            int64_t row_begin, int64_t rows) {
  cpu::parallel_for(BT, BT * C >= (1 << 15), [&](int64_t r) {
    const int64_t local = static_cast<int64_t>(tokens[r]) - row_begin;
    if (local >= 0 && local < rows)
      std::memcpy(out + r * C, wte_rows + local * C, sizeof(T) * C);
    else
      std::memset(out + r * C, 0, sizeof(T) * C);
  });
}

// As embedding_backward (column slices, rows in order), skipping rows another rank owns.
template <class T>
void embedding_backward_rows(T* dwte_rows, const T* dout, const int32_t* tokens, int64_t BT,
                             int64_t C, int64_t row_begin, int64_t rows) {
  constexpr int64_t kCols = 16;
  const int64_t blocks = (C + kCols - 1) / kCols;
  cpu::parallel_for(blocks, BT * C >= (1 << 15), [&](int64_t blk) {
    const int64_t c0 = blk * kCols, c1 = std::min(C, c0 + kCols);
    for (int64_t r = 0; r < BT; ++r) {
      const int64_t local = static_cast<int64_t>(tokens[r]) - row_begin;
      if (local < 0 || local >= rows) continue;
      T* dst = dwte_rows + local * C;
      const T* src = dout + r * C;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  });
}

template void embedding_forward<float>(float*, const int32_t*, const float*, int64_t, int64_t);
template void embedding_forward<double>(double*, const int32_t*, const double*, int64_t, int64_t);
template void embedding_backward<float>(float*, const float*, const int32_t*, int64_t, int64_t);
template void embedding_backward<double>(double*, const double*, const int32_t*, int64_t, int64_t);

template void embedding_forward_rows<float>(float*, const int32_t*, const float*, int64_t, int64_t,
                                           int64_t, int64_t);
template void embedding_forward_rows<double>(double*, const int32_t*, const double*, int64_t,
                                            int64_t, int64_t, int64_t);
template void embedding_backward_rows<float>(float*, const float*, const int32_t*, int64_t, int64_t,
                                            int64_t, int64_t);
template void embedding_backward_rows<double>(double*, const double*, const int32_t*, int64_t,
                                             int64_t, int64_t, int64_t);

}  // namespace llama4d::cpu
