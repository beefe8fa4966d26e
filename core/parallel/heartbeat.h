#pragma once
// Heartbeats: how a supervisor finds a rank that stops outside any collective (a hung kernel, a
// data loader that never returns), before the next collective's timeout would. The group
// watchdog (a collective that does not finish within --timeout) only fires once the silent
// rank's peers reach a collective and wait their full timeout there; a heartbeat names the
// rank as soon as it has been silent for its own, shorter, timeout, and says what it was last
// doing. PyTorch's elastic agent and Llama 3's job monitor do the same with per-process
// heartbeats ("The Llama 3 Herd of Models", 2024, section 3.3.4).
//
// Each rank beats at two points of every step (train_parallel): `step` as it begins step N
// (its batch drawn, forward, backward, the optimizer), `after_step` once step N returned (the
// replica checks, straggler times, in-memory copies), and `ready` once it is built and about to
// train. A monitor thread looks every timeout / 8. A rank is silent when its last beat is older
// than the timeout and another rank got further (a later step, or the same step's later phase):
// the ranks waiting in a collective for the silent one beat no more either, but they are ahead
// of it. Ranks equal in progress and all silent are waiting on each other (a slow collective, a
// long checkpoint save): that is the group watchdog's to judge, not the heartbeat's. A rank that
// never beat yet (still building its model) is not judged; a rank done with the loop is exempt.
//
// On the first silent rank the monitor calls `on_silent(rank, diagnosis)` once: the supervisor
// stops the rank (an injected hang, FaultInjector::release), as an agent kills a hung process.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace llama4d {

enum class BeatPhase : uint8_t { ready, step, after_step };

class HeartbeatMonitor {
 public:
  using OnSilent = std::function<void(int rank, const std::string& diagnosis)>;
  // `timeout_s` > 0. Starts the monitor thread; the destructor stops it.
  HeartbeatMonitor(int ranks, double timeout_s, OnSilent on_silent);
  ~HeartbeatMonitor();
  HeartbeatMonitor(const HeartbeatMonitor&) = delete;
  HeartbeatMonitor& operator=(const HeartbeatMonitor&) = delete;

  // Rank `rank` is at `phase` of step `step` (ready: `step` is the steps it has done).
  void beat(int rank, int64_t step, BeatPhase phase);
  // The rank finished its loop: it beats no more, and is not silent.
  void done(int rank);
  // What the monitor found ("" while nothing): "heartbeat: rank 1 silent for 0.51 s ...".
  std::string diagnosis() const;

  // "step 3's batch, forward and backward" and the like, for a beat.
  static std::string describe(int64_t step, BeatPhase phase);

 private:
  struct Beat {
    bool seen = false, done = false;
    int64_t step = 0;
    BeatPhase phase = BeatPhase::ready;
    std::chrono::steady_clock::time_point at;
    // Progress order: ready after N steps = step N's after-step work < step N+1.
    int64_t order() const { return 2 * step + (phase == BeatPhase::step ? 0 : 1); }
  };
  void watch();

  const std::chrono::duration<double> timeout_;
  OnSilent on_silent_;
  mutable std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::vector<Beat> beats_;
  std::string diagnosis_;
  std::thread thread_;
};

}  // namespace llama4d
