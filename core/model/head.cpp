#include "core/model/head.h"

#include "core/ops.h"

namespace llama4d {

template <class T>
void HeadActivations<T>::allocate(MemoryTracker* m, int64_t BT, int64_t C, int64_t V) {
  const auto act = MemoryCategory::activations;
  n = Buffer<T>(m, act, BT * C, "final norm"), rstd = Buffer<T>(m, act, BT, "final norm rstd");
  logits = Buffer<T>(m, act, BT * V, "logits"), losses = Buffer<T>(m, act, BT, "token losses");
}

template <class T>
void HeadActivations<T>::reset() {
  for (Buffer<T>* b : {&n, &rstd, &logits, &losses}) b->reset();
}

template <class T>
int64_t HeadActivations<T>::bytes() const {
  return n.bytes() + rstd.bytes() + logits.bytes() + losses.bytes();
}

template <class T>
LossSum head_forward(HeadActivations<T>& a, const T* x, const T* norm_w, const T* lm_w, const int32_t* targets,
                     int64_t BT, int64_t C, int64_t V, double eps) {
  ops::rmsnorm_forward(a.n.data(), a.rstd.data(), x, norm_w, BT, C, T(eps));
  ops::matmul_forward(a.logits.data(), a.n.data(), lm_w, BT, C, V);
  if (!targets) return {};
  ops::cross_entropy_forward(a.losses.data(), a.logits.data(), targets, BT, V);
  // Summed in double in row order: deterministic, and exact enough to compare runs bitwise.
  LossSum sum;
  ops::sum_losses(&sum.loss_sum, &sum.tokens, a.losses.data(), targets, BT);
  return sum;
}

template <class T>
void head_backward(T* dx, T* dnorm_w, T* dlm_w, const HeadActivations<T>& a, const T* x, const T* norm_w,
                   const T* lm_w, const int32_t* targets, T loss_scale, int64_t BT, int64_t C, int64_t V,
                   MemoryTracker* memory) {
  Buffer<T> dlogits(memory, MemoryCategory::scratch, BT * V, "backward dlogits");
  Buffer<T> dn(memory, MemoryCategory::scratch, BT * C, "backward dn (head)");
  ops::fill(dlogits.data(), T(0), BT * V);
  ops::cross_entropy_backward(dlogits.data(), a.logits.data(), targets, loss_scale, BT, V);
  ops::fill(dn.data(), T(0), BT * C);
  ops::matmul_backward(dn.data(), dlm_w, dlogits.data(), a.n.data(), lm_w, BT, C, V);
  ops::fill(dx, T(0), BT * C);
  ops::rmsnorm_backward(dx, dnorm_w, dn.data(), x, norm_w, a.rstd.data(), BT, C);
}

#define LLAMA4D_HEAD(T)                                                                                         \
  template struct HeadActivations<T>;                                                                           \
  template LossSum head_forward<T>(HeadActivations<T>&, const T*, const T*, const T*, const int32_t*, int64_t, \
                                   int64_t, int64_t, double);                                                   \
  template void head_backward<T>(T*, T*, T*, const HeadActivations<T>&, const T*, const T*, const T*,           \
                                 const int32_t*, T, int64_t, int64_t, int64_t, MemoryTracker*);
LLAMA4D_HEAD(float)
LLAMA4D_HEAD(double)
#undef LLAMA4D_HEAD

}  // namespace llama4d
