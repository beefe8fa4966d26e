// The pieces of a vocabulary-parallel cross-entropy (see core/ops.h): per-token statistics of
// one rank's slice of the logits, combined across ranks by the caller's all-reduces.
#include <cmath>
#include <string>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_kernels.h"
#include "core/error.h"
#include "core/ops.h"

namespace llama4d::cpu {

template <class T>
void vocab_slice_max_and_target(T* row_max, T* target_logit, const T* logits, const int32_t* targets, int64_t BT,
                                int64_t V, int64_t vocab_begin) {
  if (V < 1) throw Error("vocab_slice_max_and_target: empty vocabulary slice");
  cpu::parallel_for(BT, BT * V >= (1 << 14), [&](int64_t r) {
    const T* row = logits + r * V;
    row_max[r] = cpu::reduce_max(row, V);
    const int64_t t = int64_t(targets[r]) - vocab_begin;
    target_logit[r] = targets[r] >= 0 && t >= 0 && t < V ? row[t] : T(0);
  });
}

template <class T>
void vocab_slice_sum_exp(T* sum_exp, const T* logits, const T* row_max, int64_t BT, int64_t V) {
  cpu::parallel_for(BT, BT * V >= (1 << 14),
                    [&](int64_t r) { sum_exp[r] = cpu::sum_exp_shifted(logits + r * V, V, row_max[r]); });
}

template <class T>
void cross_entropy_from_stats(T* losses, T* lse, const T* row_max, const T* sum_exp, const T* target_logit,
                              const int32_t* targets, int64_t BT) {
  for (int64_t r = 0; r < BT; ++r) {
    lse[r] = row_max[r] + std::log(sum_exp[r]);
    losses[r] = targets[r] < 0 ? T(0) : lse[r] - target_logit[r];
  }
}

template <class T>
void cross_entropy_backward_slice(T* dlogits, const T* logits, const T* lse, const int32_t* targets, T scale,
                                  int64_t BT, int64_t V, int64_t vocab_begin) {
  cpu::parallel_for(BT, BT * V >= (1 << 14), [&](int64_t r) {
    if (targets[r] < 0) return;
    T* drow = dlogits + r * V;
    cpu::add_scaled_exp_shifted(drow, logits + r * V, V, lse[r], scale);
    const int64_t t = int64_t(targets[r]) - vocab_begin;
    if (t >= 0 && t < V) drow[t] -= scale;
  });
}

#define LLAMA4D_VOCAB_PARALLEL(T)                                                                                   \
  template void vocab_slice_max_and_target<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t, int64_t);       \
  template void vocab_slice_sum_exp<T>(T*, const T*, const T*, int64_t, int64_t);                                  \
  template void cross_entropy_from_stats<T>(T*, T*, const T*, const T*, const T*, const int32_t*, int64_t);        \
  template void cross_entropy_backward_slice<T>(T*, const T*, const T*, const int32_t*, T, int64_t, int64_t, int64_t);
LLAMA4D_VOCAB_PARALLEL(float)
LLAMA4D_VOCAB_PARALLEL(double)
#undef LLAMA4D_VOCAB_PARALLEL

}  // namespace llama4d::cpu
