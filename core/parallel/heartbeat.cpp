// Heartbeats of the ranks of a run (core/parallel/heartbeat.h).
#include "core/parallel/heartbeat.h"

#include <cstdio>

namespace llama4d {

HeartbeatMonitor::HeartbeatMonitor(int ranks, double timeout_s, OnSilent on_silent)
    : timeout_(timeout_s), on_silent_(std::move(on_silent)), beats_(size_t(ranks)) {
  thread_ = std::thread([this] { watch(); });
}

HeartbeatMonitor::~HeartbeatMonitor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
}

void HeartbeatMonitor::beat(int rank, int64_t step, BeatPhase phase) {
  std::lock_guard<std::mutex> lock(mu_);
  Beat& b = beats_.at(size_t(rank));
  b.seen = true, b.step = step, b.phase = phase, b.at = std::chrono::steady_clock::now();
}

void HeartbeatMonitor::done(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  beats_.at(size_t(rank)).done = true;
}

std::string HeartbeatMonitor::diagnosis() const {
  std::lock_guard<std::mutex> lock(mu_);
  return diagnosis_;
}

std::string HeartbeatMonitor::describe(int64_t step, BeatPhase phase) {
  const std::string n = std::to_string(step);
  switch (phase) {
    case BeatPhase::ready: return "ready to train after " + n + " steps";
    case BeatPhase::step: return "step " + n + " (phase step: its batch, forward, backward, optimizer)";
    case BeatPhase::after_step: return "step " + n + " (phase after-step: its checks and copies)";
  }
  return "?";
}

void HeartbeatMonitor::watch() {
  const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout_ / 8);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_cv_.wait_for(lock, period, [&] { return stop_; })) {
    if (!diagnosis_.empty()) continue;
    const auto now = std::chrono::steady_clock::now();
    int silent = -1, ahead = -1;
    for (size_t r = 0; r < beats_.size(); ++r) {
      const Beat& b = beats_[r];
      if (!b.seen) continue;
      if (ahead < 0 || b.order() > beats_[size_t(ahead)].order()) ahead = int(r);
      if (b.done || now - b.at <= timeout_) continue;
      if (silent < 0 || b.order() < beats_[size_t(silent)].order()) silent = int(r);
    }
    if (silent < 0 || beats_[size_t(silent)].order() >= beats_[size_t(ahead)].order()) continue;
    const Beat& s = beats_[size_t(silent)];
    const Beat& a = beats_[size_t(ahead)];
    char buf[96];
    std::snprintf(buf, sizeof buf, " silent for %.2f s (--heartbeat-timeout %g s)",
                  std::chrono::duration<double>(now - s.at).count(), timeout_.count());
    diagnosis_ = "heartbeat: rank " + std::to_string(silent) + buf + "; its last beat: " + describe(s.step, s.phase) +
                 ", while rank " + std::to_string(ahead) + " reached " + describe(a.step, a.phase);
    const std::string d = diagnosis_;
    lock.unlock();
    on_silent_(silent, d);
    lock.lock();
  }
}

}  // namespace llama4d
