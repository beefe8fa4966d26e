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

void GoodputLedger::keep_through(int64_t step) {
  for (auto it = unsaved_.begin(); it != unsaved_.end() && it->first <= step;) {
    productive_ += it->second;
    it = unsaved_.erase(it);
  }
  last_saved_ = std::max(last_saved_, step);
}

void GoodputLedger::saved(int64_t step, double seconds, double t) {
  checkpoint_ += seconds;
  checkpoints_.push_back({step, false, seconds, 0, 0, -1});
  if (!attempts_.empty()) attempts_.back().last_progress = t;
  keep_through(step);
}

void GoodputLedger::snapshot_taken(int64_t step, double wait_seconds, double snapshot_seconds, double t) {
  checkpoint_ += wait_seconds + snapshot_seconds;
  checkpoints_.push_back({step, true, wait_seconds + snapshot_seconds, wait_seconds, snapshot_seconds, -1});
  if (!attempts_.empty()) attempts_.back().last_progress = t;
}

void GoodputLedger::write_committed(int64_t step, double write_seconds) {
  for (auto it = checkpoints_.rbegin(); it != checkpoints_.rend(); ++it)
    if (it->async && it->step == step && it->write < 0) {
      it->write = write_seconds;
      break;
    }
  keep_through(step);
}

void GoodputLedger::attempt_ended(double t, const std::string& cause, int64_t saved_through,
                                  int64_t every_rank_reached) {
  Attempt& a = attempts_.back();
  a.end = t;
  a.cause = cause;
  for (const auto& [step, seconds] : unsaved_) {
    const bool kept = cause.empty() || step <= saved_through;
    (kept ? productive_ : lost_) += seconds;
    lost_steps_ += kept || every_rank_reached >= 0 ? 0 : 1;
  }
  // Counted from the restored step: the steps every rank had finished that the next attempt
  // trains again, whatever the lead rank had seen when the failure reached it.
  if (!cause.empty() && every_rank_reached >= 0) lost_steps_ += std::max<int64_t>(0, every_rank_reached - saved_through);
  last_saved_ = std::max(last_saved_, saved_through);
  unsaved_.clear();
}

void GoodputLedger::memory_copied(double seconds, double t) {
  memory_copy_ += seconds;
  if (!attempts_.empty()) attempts_.back().last_progress = t;
}

void GoodputLedger::recovered(bool from_memory) { ++(from_memory ? from_memory_ : from_disk_); }

namespace {
nlohmann::json seconds_or_null(double s) { return s < 0 ? nlohmann::json(nullptr) : nlohmann::json(s); }
}  // namespace

nlohmann::json GoodputLedger::checkpoint_rows() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const Checkpoint& c : checkpoints_) {
    nlohmann::json row = {{"step", c.step}, {"async", c.async}, {"stall_s", c.stall}};
    if (c.async) row["wait_s"] = c.wait, row["snapshot_s"] = c.snapshot, row["write_s"] = seconds_or_null(c.write);
    rows.push_back(row);
  }
  return rows;
}

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
          {"failures", failures},
          {"checkpoints", checkpoint_rows()}};
}

}  // namespace llama4d
