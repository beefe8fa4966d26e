#include "core/train/goodput.h"

#include <nlohmann/json.hpp>

namespace llama4d {

void GoodputLedger::attempt_started(double t, int64_t steps_done) {
  attempts_.push_back({t, -1, -1, -1, ""});
  unsaved_.clear();
  last_saved_ = std::max(last_saved_, steps_done);
}

void GoodputLedger::loop_started(double t) { attempts_.back().loop = t; }

void GoodputLedger::step_done(int64_t step, double seconds, double t) {
  unsaved_[step] = seconds;
  attempts_.back().last_progress = t;
}

void GoodputLedger::saved(int64_t step, double seconds, double t) {
  checkpoint_ += seconds;
  if (!attempts_.empty()) attempts_.back().last_progress = t;
  for (auto it = unsaved_.begin(); it != unsaved_.end() && it->first <= step;) {
    productive_ += it->second;
    it = unsaved_.erase(it);
  }
  last_saved_ = std::max(last_saved_, step);
}

void GoodputLedger::attempt_ended(double t, const std::string& cause, int64_t saved_through) {
  Attempt& a = attempts_.back();
  a.end = t;
  a.cause = cause;
  for (const auto& [step, seconds] : unsaved_) {
    const bool kept = cause.empty() || step <= saved_through;
    (kept ? productive_ : lost_) += seconds;
    lost_steps_ += kept ? 0 : 1;
  }
  last_saved_ = std::max(last_saved_, saved_through);
  unsaved_.clear();
}

void GoodputLedger::memory_copied(double seconds, double t) {
  memory_copy_ += seconds;
  if (!attempts_.empty()) attempts_.back().last_progress = t;
}

void GoodputLedger::recovered(bool from_memory) { ++(from_memory ? from_memory_ : from_disk_); }

nlohmann::json GoodputLedger::report() const {
  double wall = 0, startup = 0, restart = 0, detection = 0;
  nlohmann::json failures = nlohmann::json::array();
  for (size_t i = 0; i < attempts_.size(); ++i) {
    const Attempt& a = attempts_[i];
    const double end = a.end >= 0 ? a.end : a.start;
    wall = std::max(wall, end);
    const double ready = a.loop >= 0 ? a.loop : end;
    (i == 0 ? startup : restart) += ready - a.start;
    if (!a.cause.empty()) {
      detection += end - (a.last_progress >= 0 ? a.last_progress : ready);
      failures.push_back(a.cause);
    }
  }
  // A step's seconds include the copy taken after it (train_loop times the step and its
  // after_step together), so memory_copy_s is a part of productive and lost time, not beside them.
  const double other = wall - productive_ - lost_ - checkpoint_ - startup - restart - detection;
  return {{"wall_s", wall},
          {"productive_s", productive_},
          {"goodput", wall > 0 ? productive_ / wall : 0.0},
          {"lost_work_s", lost_},
          {"lost_steps", lost_steps_},
          {"checkpoint_s", checkpoint_},
          {"startup_s", startup},
          {"restart_s", restart},
          {"detection_s", detection},
          {"memory_copy_s", memory_copy_},
          {"other_s", other > 0 ? other : 0.0},
          {"restarts", attempts_.empty() ? 0 : int(attempts_.size()) - 1},
          {"recoveries", {{"from_memory", from_memory_}, {"from_disk", from_disk_}}},
          {"failures", failures}};
}

}  // namespace llama4d
