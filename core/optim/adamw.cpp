#include "core/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace llama4d {

namespace {

// Below this many elements a parallel region costs more than the update itself.
constexpr int64_t kParallelMinElements = 1 << 15;

// Checks that `specs` tile [0, total) in order and returns total.
int64_t checked_total(const std::vector<ParamSpec>& specs) {
  int64_t next = 0;
  for (const ParamSpec& s : specs) {
    if (s.numel < 0) throw InputError("AdamW: parameter '" + s.name + "' has negative numel");
    if (s.offset != next) {
      throw InputError("AdamW: parameter '" + s.name + "' starts at flat offset " +
                       std::to_string(s.offset) + ", expected " + std::to_string(next) +
                       " (specs must tile the flat buffer in order)");
    }
    next += s.numel;
  }
  return next;
}

}  // namespace

void AdamWConfig::validate() const {
  // Written as !(ok) so NaN is rejected too.
  if (!(beta1 >= 0.0 && beta1 < 1.0)) {
    throw InputError("AdamW: beta1 must be in [0, 1), got " + std::to_string(beta1));
  }
  if (!(beta2 >= 0.0 && beta2 < 1.0)) {
    throw InputError("AdamW: beta2 must be in [0, 1), got " + std::to_string(beta2));
  }
  if (!(eps >= 0.0 && std::isfinite(eps))) {
    throw InputError("AdamW: eps must be finite and >= 0, got " + std::to_string(eps));
  }
  if (!(weight_decay >= 0.0 && std::isfinite(weight_decay))) {
    throw InputError("AdamW: weight_decay must be finite and >= 0, got " +
                     std::to_string(weight_decay));
  }
}

template <class T>
AdamW<T>::AdamW(const AdamWConfig& cfg, const std::vector<ParamSpec>& specs, int64_t begin,
                int64_t end)
    : cfg_(cfg), begin_(begin), end_(end) {
  cfg_.validate();
  const int64_t total = checked_total(specs);
  if (begin < 0 || end < begin || end > total) {
    throw InputError("AdamW: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                     ") is not inside the flat buffer [0, " + std::to_string(total) + ")");
  }
  // Intersect each tensor with [begin, end); merge neighbours with the same decay flag, so a
  // whole model is ~2 segments per layer and the hot loop never looks up a per-element mask.
  for (const ParamSpec& s : specs) {
    const int64_t lo = std::max(s.offset, begin), hi = std::min(s.offset + s.numel, end);
    if (lo >= hi) continue;
    if (!segments_.empty() && segments_.back().decay == s.weight_decay &&
        segments_.back().end == lo - begin) {
      segments_.back().end = hi - begin;
    } else {
      segments_.push_back(Segment{lo - begin, hi - begin, s.weight_decay});
    }
  }
  exp_avg_.assign(static_cast<size_t>(numel()), T(0));
  exp_avg_sq_.assign(static_cast<size_t>(numel()), T(0));
}

template <class T>
AdamW<T>::AdamW(const AdamWConfig& cfg, const std::vector<ParamSpec>& specs)
    : AdamW(cfg, specs, 0, checked_total(specs)) {}

template <class T>
void AdamW<T>::step(T* params, const T* grads, double lr) {
  if (!(lr >= 0.0 && std::isfinite(lr))) {
    throw InputError("AdamW: learning rate must be finite and >= 0, got " + std::to_string(lr));
  }
  ++step_count_;  // PyTorch counts from 1: the first step's bias corrections use t = 1
  const double t = static_cast<double>(step_count_);
  const double bc1 = 1.0 - std::pow(cfg_.beta1, t);
  const double bc2 = 1.0 - std::pow(cfg_.beta2, t);

  // Per-step scalars in double, rounded once to T; everything per element is T arithmetic.
  const T decay_on = static_cast<T>(1.0 - lr * cfg_.weight_decay);
  const T beta1 = static_cast<T>(cfg_.beta1), one_minus_beta1 = static_cast<T>(1.0 - cfg_.beta1);
  const T beta2 = static_cast<T>(cfg_.beta2), one_minus_beta2 = static_cast<T>(1.0 - cfg_.beta2);
  const T step_size = static_cast<T>(lr / bc1);
  const T bc2_sqrt = static_cast<T>(std::sqrt(bc2));
  const T eps = static_cast<T>(cfg_.eps);

  T* m = exp_avg_.data();
  T* v = exp_avg_sq_.data();
  const int64_t n = numel();
  (void)n;  // only read by the OpenMP clause

  // Each element's update reads and writes only index i, so any split of the elements over
  // threads (or over ZeRO shards) produces bitwise the same numbers. `nowait` is safe because
  // segments are disjoint.
#ifdef _OPENMP
#pragma omp parallel if (n >= kParallelMinElements)
#endif
  {
    for (const Segment& seg : segments_) {
      // No-decay elements multiply by exactly 1, which leaves them bitwise unchanged.
      const T decay = seg.decay ? decay_on : T(1);
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
      for (int64_t i = seg.begin; i < seg.end; ++i) {
        const T g = grads[i];
        T p = params[i] * decay;
        m[i] = beta1 * m[i] + one_minus_beta1 * g;
        v[i] = beta2 * v[i] + one_minus_beta2 * g * g;
        const T denom = std::sqrt(v[i]) / bc2_sqrt + eps;
        p = p - step_size * (m[i] / denom);
        params[i] = p;
      }
    }
  }
}

template <class T>
void AdamW<T>::load_state(int64_t step_count, std::span<const T> exp_avg,
                          std::span<const T> exp_avg_sq) {
  if (step_count < 0) {
    throw InputError("AdamW: saved step count is negative (" + std::to_string(step_count) + ")");
  }
  if (static_cast<int64_t>(exp_avg.size()) != numel() ||
      static_cast<int64_t>(exp_avg_sq.size()) != numel()) {
    throw InputError("AdamW: saved state has " + std::to_string(exp_avg.size()) + " / " +
                     std::to_string(exp_avg_sq.size()) + " elements, this optimizer holds " +
                     std::to_string(numel()));
  }
  step_count_ = step_count;
  exp_avg_.assign(exp_avg.begin(), exp_avg.end());
  exp_avg_sq_.assign(exp_avg_sq.begin(), exp_avg_sq.end());
}

template class AdamW<float>;
template class AdamW<double>;

}  // namespace llama4d
