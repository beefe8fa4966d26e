#pragma once
// A fault schedule: which failures to inject into a running `train`, on which rank, at which
// step, as data (a JSON file, `train --faults FILE`). The kinds follow the causes of Llama 3's
// 419 unexpected interruptions ("The Llama 3 Herd of Models", 2024, section 3.3.4, Table 5):
//
//   crash       the rank throws at the start of the step (a GPU that falls off the bus);
//               "permanent": true marks its node lost for good (no spare replaces it): under
//               `train --on-lost-node shrink` the run goes on with one data-parallel replica less;
//   hang        the rank stops answering without dying: it sleeps past the group timeout, so its
//               peers' next collective times out naming it (an NCCL watchdog timeout), unless a
//               heartbeat (--heartbeat-timeout, core/parallel/heartbeat.h) names it first; "phase"
//               places it: "step" (default) as the step begins (a data loader that stalls),
//               "after-step" once the step's compute returned, before its after-step work; both
//               outside any collective;
//   slow        the rank is `factor` times slower for `steps` steps (a thermally throttled GPU);
//   collective  the rank's first collective of the step fails mid-call (a link that drops);
//   sdc         silent data corruption: one bit of one of the rank's weights flips after the
//               step (HBM bit errors); element and bit drawn from the schedule's seed unless given.
//
//   {"seed": 7, "faults": [{"kind": "crash", "rank": 1, "step": 3},
//                          {"kind": "slow", "rank": 0, "step": 2, "factor": 3, "steps": 2},
//                          {"kind": "sdc", "rank": 2, "step": 4}]}
//
// Each fault fires once: the rank a supervisor restarts is a healthy replacement.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace llama4d {

enum class FaultKind : uint8_t { crash, hang, slow, collective, sdc };

std::string fault_kind_name(FaultKind kind);

struct Fault {
  FaultKind kind = FaultKind::crash;
  int rank = 0;
  int64_t step = 1;      // 1-based optimizer step, as in metrics.jsonl
  double factor = 1;     // slow: how many times slower
  int64_t steps = 1;     // slow: for how many steps from `step`
  int64_t element = -1;  // sdc: which element of the rank's weights (-1: drawn from the seed)
  int bit = -1;          // sdc: which bit of it (-1: drawn from the seed)
  bool after_step = false;  // hang: "phase": "after-step" (else "step")
  bool permanent = false;   // crash: the node is lost for good

  // "crash on rank 1 at step 3"
  std::string describe() const;
};

struct FaultSchedule {
  uint64_t seed = 0;
  std::vector<Fault> faults;

  bool empty() const { return faults.empty(); }
  // InputError naming `where` and the entry for anything unknown or malformed (a key twice, an
  // unknown kind or key, a rank or step that is not an integer, a slow factor <= 1).
  static FaultSchedule from_json(const nlohmann::json& j, const std::string& where);
  static FaultSchedule read(const std::string& path);
  nlohmann::json to_json() const;
  // InputError naming the fault whose rank is not one of the run's `ranks` or whose step is not
  // one of its steps [1, last_step].
  void check_fits(int ranks, int64_t last_step) const;
};

}  // namespace llama4d
