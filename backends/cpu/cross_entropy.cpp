// Softmax + cross-entropy over the vocabulary, fused so the probabilities are never stored.
#include <cmath>
#include <string>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_kernels.h"
#include "core/error.h"
#include "core/ops.h"

namespace llama4d::cpu {

// Checked before any thread starts: an exception cannot leave an OpenMP region.
static void check_targets(const int32_t* targets, int64_t BT, int64_t V) {
  for (int64_t r = 0; r < BT; ++r)
    if (targets[r] >= V)
      throw InputError("cross-entropy target " + std::to_string(targets[r]) +
                       " is outside the vocabulary of " + std::to_string(V));
}

// log(sum_j exp(row[j])) with the max subtracted first so exp never overflows.
template <class T>
static T row_logsumexp(const T* row, int64_t V) {
  const T m = cpu::reduce_max(row, V);
  return m + std::log(cpu::sum_exp_shifted(row, V, m));
}

template <class T>
void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int64_t BT,
                           int64_t V) {
  check_targets(targets, BT, V);
  cpu::parallel_for(BT, BT * V >= (1 << 14), [&](int64_t r) {
    const int32_t t = targets[r];
    if (t < 0) {
      losses[r] = T(0);
      return;
    }
    const T* row = logits + r * V;
    losses[r] = row_logsumexp(row, V) - row[t];
  });
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, T scale,
                            int64_t BT, int64_t V) {
  check_targets(targets, BT, V);
  cpu::parallel_for(BT, BT * V >= (1 << 14), [&](int64_t r) {
    const int32_t t = targets[r];
    if (t < 0) return;
    const T* row = logits + r * V;
    T* drow = dlogits + r * V;
    cpu::add_scaled_exp_shifted(drow, row, V, row_logsumexp(row, V), scale);
    drow[t] -= scale;
  });
}

template void cross_entropy_forward<float>(float*, const float*, const int32_t*, int64_t, int64_t);
template void cross_entropy_forward<double>(double*, const double*, const int32_t*, int64_t,
                                            int64_t);
template void cross_entropy_backward<float>(float*, const float*, const int32_t*, float, int64_t,
                                            int64_t);
template void cross_entropy_backward<double>(double*, const double*, const int32_t*, double,
                                             int64_t, int64_t);

}  // namespace llama4d::cpu
