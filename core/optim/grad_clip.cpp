#include "core/optim/grad_clip.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/ops.h"

namespace llama4d {

double combine_chunk_sums(const double* partials, int64_t count) {
  double s = 0.0;
  for (int64_t c = 0; c < count; ++c) s += partials[c];
  return s;
}

double clip_coefficient(double total_sum_sq, double max_norm) {
  if (!(max_norm > 0.0)) {
    throw InputError("grad clip: max_norm must be > 0, got " + std::to_string(max_norm));
  }
  if (std::isnan(total_sum_sq)) return total_sum_sq;
  if (total_sum_sq < 0.0) {
    throw InputError("grad clip: sum of squares is negative (" + std::to_string(total_sum_sq) +
                     ")");
  }
  const double coef = max_norm / (std::sqrt(total_sum_sq) + 1e-6);  // 1e-6 as in PyTorch
  return coef < 1.0 ? coef : 1.0;
}

template <class T>
void apply_grad_clip(T* g, int64_t n, double clip_coef) {
  // NaN fails `< 1` but must not be hidden: scaling by it makes the damage visible.
  if (!(clip_coef < 1.0) && !std::isnan(clip_coef)) return;
  ops::scale(g, static_cast<T>(clip_coef), n);
}

template void apply_grad_clip<float>(float*, int64_t, double);
template void apply_grad_clip<double>(double*, int64_t, double);

}  // namespace llama4d
