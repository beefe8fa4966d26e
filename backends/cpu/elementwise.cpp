// Residual add, gradient accumulation, scaling and the sum of squares for gradient clipping.
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "core/ops.h"

namespace llama4d::ops {

template <class T>
void add_forward(T* out, const T* a, const T* b, int64_t N) {
  cpu::parallel_chunks(N, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
  });
}

template <class T>
void accumulate(T* y, const T* x, int64_t N) {
  cpu::parallel_chunks(N, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] += x[i];
  });
}

template <class T>
void scale(T* x, T a, int64_t N) {
  cpu::parallel_chunks(N, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] *= a;
  });
}

// Partial sums over fixed chunks of kElementChunk elements (lane pattern inside each), added
// in chunk order: the result depends on N only, never on the thread count.
template <class T>
double sum_squares(const T* x, int64_t N) {
  const int64_t chunks = (N + cpu::kElementChunk - 1) / cpu::kElementChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
  cpu::parallel_for(chunks, chunks > 1, [&](int64_t c) {
    const int64_t begin = c * cpu::kElementChunk;
    const int64_t end = std::min(N, begin + cpu::kElementChunk);
    constexpr int kLanes = 8;
    double acc[kLanes] = {};
    int64_t i = begin;
    for (; i + kLanes <= end; i += kLanes)
      for (int l = 0; l < kLanes; ++l) {
        const double v = static_cast<double>(x[i + l]);
        acc[l] += v * v;
      }
    for (int l = 0; i + l < end; ++l) {
      const double v = static_cast<double>(x[i + l]);
      acc[l] += v * v;
    }
    double s = 0;
    for (int l = 0; l < kLanes; ++l) s += acc[l];
    partial[static_cast<size_t>(c)] = s;
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

template void add_forward<float>(float*, const float*, const float*, int64_t);
template void add_forward<double>(double*, const double*, const double*, int64_t);
template void accumulate<float>(float*, const float*, int64_t);
template void accumulate<double>(double*, const double*, int64_t);
template void scale<float>(float*, float, int64_t);
template void scale<double>(double*, double, int64_t);
template double sum_squares<float>(const float*, int64_t);
template double sum_squares<double>(const double*, int64_t);

}  // namespace llama4d::ops
