#include "core/optim/grad_clip.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"

namespace llama4d {

namespace {
// Below this many elements a parallel region costs more than the loop.
constexpr int64_t kParallelMinElements = 1 << 15;
}  // namespace

template <class T>
void chunk_sum_squares(double* partials, const T* g, int64_t n) {
  const int64_t chunks = num_sum_squares_chunks(n);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
#endif
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kSumSquaresChunk;
    const int64_t hi = lo + kSumSquaresChunk < n ? lo + kSumSquaresChunk : n;
    // Independent lanes break the add-latency chain (and let the compiler use SIMD) without
    // making the order depend on anything but the index.
    double lane[kSumSquaresLanes] = {};
    int64_t i = lo;
    for (; i + kSumSquaresLanes <= hi; i += kSumSquaresLanes) {
      for (int64_t j = 0; j < kSumSquaresLanes; ++j) {
        const double x = static_cast<double>(g[i + j]);
        lane[j] += x * x;
      }
    }
    for (int64_t j = 0; i < hi; ++i, ++j) {
      const double x = static_cast<double>(g[i]);
      lane[j] += x * x;
    }
    double s = 0.0;
    for (int64_t j = 0; j < kSumSquaresLanes; ++j) s += lane[j];
    partials[c] = s;
  }
}

double combine_chunk_sums(const double* partials, int64_t count) {
  double s = 0.0;
  for (int64_t c = 0; c < count; ++c) s += partials[c];
  return s;
}

template <class T>
double local_grad_sum_squares(const T* g, int64_t n) {
  if (n < 0) throw InputError("grad clip: negative element count " + std::to_string(n));
  std::vector<double> partials(static_cast<size_t>(num_sum_squares_chunks(n)));
  chunk_sum_squares(partials.data(), g, n);
  return combine_chunk_sums(partials.data(), static_cast<int64_t>(partials.size()));
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
  const T c = static_cast<T>(clip_coef);
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (n >= kParallelMinElements)
#endif
  for (int64_t i = 0; i < n; ++i) g[i] *= c;
}

template <class T>
double clip_grad_norm(T* g, int64_t n, double max_norm) {
  const double sum_sq = local_grad_sum_squares(g, n);
  apply_grad_clip(g, n, clip_coefficient(sum_sq, max_norm));
  return std::sqrt(sum_sq);
}

template void chunk_sum_squares<float>(double*, const float*, int64_t);
template void chunk_sum_squares<double>(double*, const double*, int64_t);
template double local_grad_sum_squares<float>(const float*, int64_t);
template double local_grad_sum_squares<double>(const double*, int64_t);
template void apply_grad_clip<float>(float*, int64_t, double);
template void apply_grad_clip<double>(double*, int64_t, double);
template double clip_grad_norm<float>(float*, int64_t, double);
template double clip_grad_norm<double>(double*, int64_t, double);

}  // namespace llama4d
