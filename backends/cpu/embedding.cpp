// Token embedding lookup and its scatter-add backward.
#include <cstring>

#include "backends/cpu/cpu_common.h"
#include "core/ops.h"

namespace llama4d::ops {

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t BT, int64_t C) {
  cpu::parallel_for(BT, BT * C >= (1 << 15), [&](int64_t r) {
    std::memcpy(out + r * C, wte + static_cast<int64_t>(tokens[r]) * C, sizeof(T) * C);
  });
}

// Rows sharing a token must be added in row order for reproducible bits, so threads split the
// C columns instead of the rows: each thread owns a column slice of every dwte row.
template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int64_t BT, int64_t C) {
  constexpr int64_t kCols = 64;
  const int64_t blocks = (C + kCols - 1) / kCols;
  cpu::parallel_for(blocks, BT * C >= (1 << 15), [&](int64_t blk) {
    const int64_t c0 = blk * kCols, c1 = std::min(C, c0 + kCols);
    for (int64_t r = 0; r < BT; ++r) {
      T* dst = dwte + static_cast<int64_t>(tokens[r]) * C;
      const T* src = dout + r * C;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  });
}

template void embedding_forward<float>(float*, const int32_t*, const float*, int64_t, int64_t);
template void embedding_forward<double>(double*, const int32_t*, const double*, int64_t, int64_t);
template void embedding_backward<float>(float*, const float*, const int32_t*, int64_t, int64_t);
template void embedding_backward<double>(double*, const double*, const int32_t*, int64_t, int64_t);

}  // namespace llama4d::ops
