#include "core/parallel/straggler_detector.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/comm/traffic_labels.h"
#include "core/comm/blocked_time.h"
#include "core/error.h"

namespace llama4d {

namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void check_straggler_options(const StragglerOptions& o) {
  if (!std::isfinite(o.factor) || (o.factor != 0 && o.factor <= 1))
    throw InputError("--straggler-factor must be 0 (no detection) or > 1 (a rank slower than that many times the "
                     "median is flagged), got " + std::to_string(o.factor));
  if (!std::isfinite(o.margin_s) || o.margin_s < 0)
    throw InputError("--straggler-margin must be >= 0 seconds, got " + std::to_string(o.margin_s));
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<StragglerFlag> StragglerDetector::observe(int64_t step, const std::vector<double>& seconds) {
  std::vector<StragglerFlag> flags;
  if (o_.factor == 0 || seconds.size() < 2) return flags;
  const double med = median_of(seconds);
  for (size_t r = 0; r < seconds.size(); ++r) {
    const double t = seconds[r];
    if (t <= o_.factor * med || t - med < o_.margin_s) continue;
    flags.push_back({int(r), step, t, med});
    const double ratio = med > 0 ? t / med : INFINITY;
    auto it = std::find_if(episodes_.rbegin(), episodes_.rend(), [&](const StragglerEpisode& e) { return e.rank == int(r); });
    if (it != episodes_.rend() && it->last_step == step - 1) {
      it->last_step = step;
      it->worst_ratio = std::max(it->worst_ratio, ratio);
    } else {
      episodes_.push_back({int(r), step, step, ratio});
    }
  }
  return flags;
}

nlohmann::json StragglerDetector::to_json() const {
  nlohmann::json out = nlohmann::json::array();
  for (const StragglerEpisode& e : episodes_)
    out.push_back({{"rank", e.rank}, {"first_step", e.first_step}, {"last_step", e.last_step},
                   {"worst_ratio", std::isfinite(e.worst_ratio) ? nlohmann::json(e.worst_ratio) : nlohmann::json(nullptr)}});
  return out;
}

StepComputeClock::StepComputeClock() { restart(); }

double StepComputeClock::seconds() const {
  return (wall_seconds() - wall0_) - (blocked_seconds_on_this_thread() - blocked0_);
}

void StepComputeClock::restart() {
  wall0_ = wall_seconds();
  blocked0_ = blocked_seconds_on_this_thread();
}

std::vector<double> share_step_times(ProcessGroup& world, double seconds) {
  std::vector<double> all(size_t(world.size()));
  AllGatherOptions opts;
  opts.label = std::string(label::kStepComputeTimes);
  world.all_gather(all.data(), &seconds, 1, DType::f64, opts)->wait();
  return all;
}

}  // namespace llama4d
