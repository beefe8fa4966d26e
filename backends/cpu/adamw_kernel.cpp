// The AdamW element update and its per-step scalars. Compiled with -ffp-contract=off and
// -fno-math-errno like core/optim (see CMakeLists.txt): no a*b+c is fused into an FMA, so the
// SIMD body, the scalar tail and core/optim's AdamW<T>::step all perform the same IEEE
// operations and agree bit for bit.
#include <cmath>
#include <string>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_kernels.h"
#include "core/error.h"
#include "core/ops.h"

namespace llama4d::ops {

// The same expressions, in the same order, as AdamW<T>::step: each scalar is computed in double
// and rounded to T once.
template <class T>
AdamWStep<T> adamw_step_scalars(double lr, double beta1, double beta2, double eps,
                                double weight_decay, int64_t t, bool decay) {
  if (t < 1) throw InputError("AdamW: step number must be >= 1, got " + std::to_string(t));
  const double td = static_cast<double>(t);
  const double bc1 = 1.0 - std::pow(beta1, td);
  const double bc2 = 1.0 - std::pow(beta2, td);
  AdamWStep<T> s;
  s.decay = decay ? static_cast<T>(1.0 - lr * weight_decay) : T(1);
  s.beta1 = static_cast<T>(beta1);
  s.one_minus_beta1 = static_cast<T>(1.0 - beta1);
  s.beta2 = static_cast<T>(beta2);
  s.one_minus_beta2 = static_cast<T>(1.0 - beta2);
  s.step_size = static_cast<T>(lr / bc1);
  s.bc2_sqrt = static_cast<T>(std::sqrt(bc2));
  s.eps = static_cast<T>(eps);
  return s;
}

// Host arithmetic, not a kernel: whichever backend runs the update, these are its scalars.
template AdamWStep<float> adamw_step_scalars<float>(double, double, double, double, double, int64_t, bool);
template AdamWStep<double> adamw_step_scalars<double>(double, double, double, double, double, int64_t, bool);

}  // namespace llama4d::ops

namespace llama4d::cpu {

using ops::AdamWStep;

// Kept out of line with restrict pointers so GCC vectorises it without runtime alias checks.
template <class T>
[[gnu::noinline]] static void adamw_range(T* __restrict w, T* __restrict m, T* __restrict v,
                                          const T* __restrict g, int64_t n, const AdamWStep<T> s) {
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i];
    T p = w[i] * s.decay;
    const T mi = s.beta1 * m[i] + s.one_minus_beta1 * gi;
    const T vi = s.beta2 * v[i] + s.one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const T denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    p = p - s.step_size * (mi / denom);
    w[i] = p;
  }
}

template <class T>
void adamw_update(T* w, T* m, T* v, const T* g, int64_t N, const AdamWStep<T>& s) {
  const AdamWStep<T> scalars = s;  // by value into the loop: no aliasing with the buffers
  parallel_chunks(N, [&](int64_t begin, int64_t end) {
    adamw_range(w + begin, m + begin, v + begin, g + begin, end - begin, scalars);
  });
}

template void adamw_update<float>(float*, float*, float*, const float*, int64_t,
                                  const AdamWStep<float>&);
template void adamw_update<double>(double*, double*, double*, const double*, int64_t,
                                   const AdamWStep<double>&);

}  // namespace llama4d::cpu
