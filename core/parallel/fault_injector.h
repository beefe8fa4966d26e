#pragma once
// Fires a FaultSchedule's faults in a running job (core/parallel/fault_schedule.h). One injector
// serves every rank of a run (thread-safe: virtual GPUs are threads) and outlives a supervisor's
// restarts, so a fault that fired does not fire again in the restarted run: the replaced rank is
// healthy. The training loop calls it at three points of each rank's step:
//
//   before_step(rank, step)        crash: throws InjectedFault; hang: sleeps `hang_for`, then
//                                  throws (its peers have timed out naming it by then), or
//                                  sooner when release(rank) stops it (a heartbeat named it);
//                                  collective: arms a failure of the rank's next collective;
//   on_collective(rank, op, seq)   the virtual cluster's fault hook: an armed rank throws there,
//                                  mid-call, after every member arrived;
//   after_step(rank, step, s, w)   hang with "phase": "after-step": as above;
//                                  slow: sleeps (factor - 1) x the step's `s` seconds;
//                                  sdc: flips one bit of the rank's weights `w`.
#include <chrono>
#include <condition_variable>
#include <string>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "core/comm/comm_types.h"
#include "core/error.h"
#include "core/parallel/fault_schedule.h"

namespace llama4d {

// What an injected crash, hang or link failure throws on its rank.
class InjectedFault : public Error {
 public:
  using Error::Error;
};

// The element and bit an sdc fault flips in weights of `count` elements of `bits` bits each:
// the fault's own when given (InputError naming it when the rank's weights have no such element
// or bit), else drawn from the schedule's seed and the fault's place in the schedule
// (splitmix64), so a schedule flips the same bit every run.
struct BitFlip {
  int64_t element = 0;
  int bit = 0;
};
BitFlip sdc_target(const Fault& f, uint64_t seed, size_t index, int64_t count, int bits);

class FaultInjector {
 public:
  FaultInjector(FaultSchedule schedule, std::chrono::milliseconds hang_for);

  void before_step(int rank, int64_t step);
  void on_collective(int rank, CommOp op, int64_t seq);
  // `weights`: the rank's weights as bytes, elements of `element_bytes` (4: f32, 8: f64).
  void after_step(int rank, int64_t step, double step_seconds, std::span<std::byte> weights, int element_bytes);

  // Stops the injected hang `rank` is in (none: nothing to do): it throws with `why` (the
  // heartbeat's diagnosis) first, as a supervisor kills a hung process.
  void release(int rank, const std::string& why);

  // The faults that fired so far, in firing order.
  std::vector<Fault> fired() const;
  const FaultSchedule& schedule() const { return schedule_; }

 private:
  // The unfired fault of `kind` for (rank, step), marked fired; -1 if none.
  int take(FaultKind kind, int rank, int64_t step, bool after_step = false);
  [[noreturn]] void hang(int rank, size_t fault);

  FaultSchedule schedule_;
  std::chrono::milliseconds hang_for_;
  mutable std::mutex mu_;
  std::vector<bool> fired_;
  std::vector<size_t> order_;      // indices of fired faults, in firing order
  std::vector<int64_t> armed_;     // per rank: the step whose next collective fails (0: none)
  std::vector<std::string> released_;  // per rank: why its hang was stopped ("": not stopped)
  std::vector<bool> hanging_;          // per rank: in an injected hang now
  std::condition_variable release_cv_;
};

}  // namespace llama4d
