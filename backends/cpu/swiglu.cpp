// SwiGLU gate (Shazeer 2020): out = silu(gate) * up, silu(g) = g * sigmoid(g).
#include <cmath>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_kernels.h"
#include "core/ops.h"

namespace llama4d::cpu {

// sigmoid(g) from e = exp(-|g|) <= 1, which never overflows for large |g|.
template <class T>
static inline T sigmoid(T g) {
  const T e = cpu::exp_det(-std::abs(g));
  const T inv = T(1) / (T(1) + e);
  return g >= T(0) ? inv : e * inv;
}

template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t N) {
  cpu::parallel_chunks(N, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
  });
}

// d silu(g)/dg = sig + g * sig * (1 - sig)
template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t N) {
  cpu::parallel_chunks(N, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T g = gate[i];
      const T sig = sigmoid(g);
      const T silu = g * sig;
      dgate[i] = dout[i] * up[i] * (sig + silu * (T(1) - sig));
      dup[i] = dout[i] * silu;
    }
  });
}

template void swiglu_forward<float>(float*, const float*, const float*, int64_t);
template void swiglu_forward<double>(double*, const double*, const double*, int64_t);
template void swiglu_backward<float>(float*, float*, const float*, const float*, const float*,
                                     int64_t);
template void swiglu_backward<double>(double*, double*, const double*, const double*, const double*,
                                      int64_t);

}  // namespace llama4d::cpu
