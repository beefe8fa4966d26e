#include "core/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/ops.h"

namespace llama4d {

namespace {

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
                int64_t end, MemoryTracker* memory)
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
  exp_avg_ = Buffer<T>(memory, MemoryCategory::optimizer, numel(), "AdamW exp_avg");
  exp_avg_sq_ = Buffer<T>(memory, MemoryCategory::optimizer, numel(), "AdamW exp_avg_sq");
  ops::fill(exp_avg_.data(), T(0), numel());
  ops::fill(exp_avg_sq_.data(), T(0), numel());
}

template <class T>
AdamW<T>::AdamW(const AdamWConfig& cfg, const std::vector<ParamSpec>& specs, MemoryTracker* memory)
    : AdamW(cfg, specs, 0, checked_total(specs), memory) {}

template <class T>
void AdamW<T>::step(T* params, const T* grads, double lr) {
  if (!(lr >= 0.0 && std::isfinite(lr))) {
    throw InputError("AdamW: learning rate must be finite and >= 0, got " + std::to_string(lr));
  }
  ++step_count_;  // PyTorch counts from 1: the first step's bias corrections use t = 1
  // Each element's update reads and writes only index i, so any split of the elements over
  // threads (or over ZeRO shards) produces bitwise the same numbers. The per-step scalars are
  // computed in double and rounded once to T (ops::adamw_step_scalars); no-decay segments
  // multiply by exactly 1, which leaves them bitwise unchanged.
  for (const Segment& seg : segments_) {
    const ops::AdamWStep<T> s = ops::adamw_step_scalars<T>(lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay,
                                                           step_count_, seg.decay);
    ops::adamw_update(params + seg.begin, exp_avg_.data() + seg.begin, exp_avg_sq_.data() + seg.begin,
                      grads + seg.begin, seg.end - seg.begin, s);
  }
}

template <class T>
void AdamW<T>::set_step_count(int64_t step_count) {
  if (step_count < 0) throw InputError("AdamW: saved step count is negative (" + std::to_string(step_count) + ")");
  step_count_ = step_count;
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
  ops::copy(exp_avg_.data(), exp_avg.data(), numel());
  ops::copy(exp_avg_sq_.data(), exp_avg_sq.data(), numel());
}

template class AdamW<float>;
template class AdamW<double>;

}  // namespace llama4d
