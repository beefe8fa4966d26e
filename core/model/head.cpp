#include "core/model/head.h"

#include <algorithm>

#include "core/ops.h"

namespace llama4d {

template <class T>
void HeadActivations<T>::resize(int64_t BT, int64_t C, int64_t V) {
  n.resize(size_t(BT * C)), rstd.resize(size_t(BT));
  logits.resize(size_t(BT * V)), losses.resize(size_t(BT));
  dlogits.resize(size_t(BT * V)), dn.resize(size_t(BT * C));
}

template <class T>
int64_t HeadActivations<T>::bytes() const {
  return int64_t((n.size() + rstd.size() + logits.size() + losses.size()) * sizeof(T));
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
  for (int64_t i = 0; i < BT; ++i)
    if (targets[i] >= 0) {
      sum.loss_sum += double(a.losses[size_t(i)]);
      ++sum.tokens;
    }
  return sum;
}

template <class T>
void head_backward(T* dx, T* dnorm_w, T* dlm_w, HeadActivations<T>& a, const T* x, const T* norm_w, const T* lm_w,
                   const int32_t* targets, T loss_scale, int64_t BT, int64_t C, int64_t V) {
  std::fill(a.dlogits.begin(), a.dlogits.end(), T(0));
  ops::cross_entropy_backward(a.dlogits.data(), a.logits.data(), targets, loss_scale, BT, V);
  std::fill(a.dn.begin(), a.dn.end(), T(0));
  ops::matmul_backward(a.dn.data(), dlm_w, a.dlogits.data(), a.n.data(), lm_w, BT, C, V);
  std::fill_n(dx, BT * C, T(0));
  ops::rmsnorm_backward(dx, dnorm_w, a.dn.data(), x, norm_w, a.rstd.data(), BT, C);
}

template struct HeadActivations<float>;
template struct HeadActivations<double>;
template LossSum head_forward<float>(HeadActivations<float>&, const float*, const float*, const float*,
                                     const int32_t*, int64_t, int64_t, int64_t, double);
template LossSum head_forward<double>(HeadActivations<double>&, const double*, const double*, const double*,
                                      const int32_t*, int64_t, int64_t, int64_t, double);
template void head_backward<float>(float*, float*, float*, HeadActivations<float>&, const float*, const float*,
                                   const float*, const int32_t*, float, int64_t, int64_t, int64_t);
template void head_backward<double>(double*, double*, double*, HeadActivations<double>&, const double*,
                                    const double*, const double*, const int32_t*, double, int64_t, int64_t, int64_t);

}  // namespace llama4d
