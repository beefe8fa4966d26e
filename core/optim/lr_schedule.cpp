#include "core/optim/lr_schedule.h"

#include <cmath>
#include <numbers>
#include <string>

#include "core/error.h"

namespace llama4d {

void LrSchedule::validate() const {
  // Written as !(ok) so NaN is rejected too.
  if (!(max_lr >= 0.0 && std::isfinite(max_lr))) {
    throw InputError("lr schedule: max_lr must be finite and >= 0, got " + std::to_string(max_lr));
  }
  if (!(min_lr >= 0.0 && std::isfinite(min_lr))) {
    throw InputError("lr schedule: min_lr must be finite and >= 0, got " + std::to_string(min_lr));
  }
  if (min_lr > max_lr) {
    throw InputError("lr schedule: min_lr (" + std::to_string(min_lr) + ") exceeds max_lr (" +
                     std::to_string(max_lr) + ")");
  }
  if (warmup_steps < 0) {
    throw InputError("lr schedule: warmup_steps must be >= 0, got " + std::to_string(warmup_steps));
  }
  if (total_steps < warmup_steps) {
    throw InputError("lr schedule: total_steps (" + std::to_string(total_steps) +
                     ") is smaller than warmup_steps (" + std::to_string(warmup_steps) + ")");
  }
  if (!(warmup_start_fraction >= 0.0 && warmup_start_fraction <= 1.0)) {
    throw InputError("lr schedule: warmup_start_fraction must be in [0, 1], got " +
                     std::to_string(warmup_start_fraction));
  }
}

double lr_at_step(const LrSchedule& sch, int64_t step) {
  sch.validate();
  if (step < 0) throw InputError("lr schedule: step must be >= 0, got " + std::to_string(step));
  const double s = static_cast<double>(step);
  if (step < sch.warmup_steps) {
    const double f0 = sch.warmup_start_fraction;
    return sch.max_lr * (f0 + (1.0 - f0) * s / static_cast<double>(sch.warmup_steps));
  }
  if (step >= sch.total_steps) return sch.min_lr;
  // Written as max - (...) so the first post-warm-up step is exactly max_lr (1 - cos 0 = 0).
  const double progress = (s - static_cast<double>(sch.warmup_steps)) /
                          static_cast<double>(sch.total_steps - sch.warmup_steps);
  return sch.max_lr -
         (sch.max_lr - sch.min_lr) * 0.5 * (1.0 - std::cos(std::numbers::pi * progress));
}

double LrSegment::at(int64_t k, int64_t n) const {
  const double f = shape == Shape::linear ? double(k) / double(n) : (1 - std::cos(std::numbers::pi * double(k) / double(n))) / 2;
  return from + (to - from) * f;
}

}  // namespace llama4d
