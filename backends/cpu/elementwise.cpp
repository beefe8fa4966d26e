// Residual add, gradient accumulation, scaling and the sum of squares for gradient clipping.
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_kernels.h"
#include "core/ops.h"

namespace llama4d::cpu {

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


template void add_forward<float>(float*, const float*, const float*, int64_t);
template void add_forward<double>(double*, const double*, const double*, int64_t);
template void accumulate<float>(float*, const float*, int64_t);
template void accumulate<double>(double*, const double*, int64_t);
template void scale<float>(float*, float, int64_t);
template void scale<double>(double*, double, int64_t);

}  // namespace llama4d::cpu
