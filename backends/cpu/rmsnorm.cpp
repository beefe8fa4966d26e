// RMSNorm (Zhang & Sennrich 2019), as Llama uses it: no mean subtraction, no bias.
#include <cmath>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_kernels.h"
#include "core/ops.h"

namespace llama4d::cpu {

// Rows of at least this many elements in total are worth forking threads for.
static constexpr int64_t kParallelNormElements = 1 << 14;

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int64_t BT, int64_t C, T eps) {
  cpu::parallel_for(BT, BT * C >= kParallelNormElements, [&](int64_t r) {
    const T* x = inp + r * C;
    T* y = out + r * C;
    const T ms = cpu::reduce_dot(x, x, C) / static_cast<T>(C);
    const T s = T(1) / std::sqrt(ms + eps);
    rstd[r] = s;
    for (int64_t c = 0; c < C; ++c) y[c] = x[c] * s * weight[c];
  });
}

// With s = rstd and g = dout * weight:
//   dinp    = s * g - s^3 / C * x * sum(g * x)
//   dweight = sum over rows of dout * x * s
template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int64_t BT, int64_t C) {
  const bool parallel = BT * C >= kParallelNormElements;
  // The two gradients read only dout, inp, rstd (and weight for dinp), never each other: either
  // may be skipped, and the other keeps its bits (the split backward of zero-bubble schedules).
  if (dinp) cpu::parallel_for(BT, parallel, [&](int64_t r) {
    const T* x = inp + r * C;
    const T* dy = dout + r * C;
    T* dx = dinp + r * C;
    const T s = rstd[r];
    // sum(dout * weight * x), in the fixed lane pattern of cpu::reduce_dot
    cpu::Vec64<T> acc = {}, vy = {}, vw = {}, vx = {};
    for (int64_t c = 0; c < C; c += cpu::kLanes<T>) {
      cpu::load_lanes(vy, dy + c, C - c, T(0));
      cpu::load_lanes(vw, weight + c, C - c, T(0));
      cpu::load_lanes(vx, x + c, C - c, T(0));
      acc += vy * vw * vx;
    }
    const T gx = cpu::sum_lanes<T>(acc);
    const T k = s * s * s * gx / static_cast<T>(C);
    for (int64_t c = 0; c < C; ++c) dx[c] += s * dy[c] * weight[c] - k * x[c];
  });
  // dweight sums over rows: split by column blocks so each column is summed by one thread in
  // row order (no atomics, same bits for any thread count). Blocks of one 64-byte line of
  // floats: C = 288 gives 18 of them, enough for 16 threads.
  if (!dweight) return;
  constexpr int64_t kCols = 16;
  const int64_t blocks = (C + kCols - 1) / kCols;
  cpu::parallel_for(blocks, parallel, [&](int64_t blk) {
    const int64_t c0 = blk * kCols, c1 = std::min(C, c0 + kCols);
    T acc[kCols] = {};
    for (int64_t r = 0; r < BT; ++r) {
      const T* x = inp + r * C;
      const T* dy = dout + r * C;
      const T s = rstd[r];
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += dy[c] * x[c] * s;
    }
    for (int64_t c = c0; c < c1; ++c) dweight[c] += acc[c - c0];
  });
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int64_t, int64_t,
                                     float);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int64_t,
                                      int64_t, double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*,
                                      const float*, int64_t, int64_t);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*,
                                       const double*, const double*, int64_t, int64_t);

}  // namespace llama4d::cpu
