#pragma once
// Straggler detection from per-rank step times. A straggler (a rank k times slower than its
// peers: a throttled GPU, a bad host) fails nothing: every collective waits for it, so the whole
// job runs at its pace. Llama 3's operators found such hosts from per-rank timings and removed
// them (The Llama 3 Herd of Models, 2024, section 3.3.4); here rank 0 names them and the run
// goes on.
//
// Each rank measures its compute time for a step: wall time since it left the previous check
// minus its time in communication (core/comm/blocked_time.h). Plain step time would not
// do: every collective lines the ranks up, so the ranks waiting for a slow one finish the step
// when it does and show the same step time; only the time not spent waiting tells the slow
// rank (which never waits) from the ones waiting for it. After each step the ranks share it in
// one all-gather of one double per rank (label::kStepComputeTimes), and the detector flags a
// rank whose time exceeds factor x the median and the median by at least `margin_s` (so the
// noise of a busy machine on fast steps flags nobody).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/comm/process_group.h"

namespace llama4d {

struct StragglerOptions {
  double factor = 1.5;     // 0: off; else > 1
  double margin_s = 0.05;  // the least excess over the median that flags, seconds; >= 0
};

// InputError naming --straggler-factor / --straggler-margin when out of range.
void check_straggler_options(const StragglerOptions& o);

// One rank's time flagged at one step.
struct StragglerFlag {
  int rank = 0;
  int64_t step = 0;
  double seconds = 0, median = 0;
};

// A rank's run of consecutive flagged steps.
struct StragglerEpisode {
  int rank = 0;
  int64_t first_step = 0, last_step = 0;
  double worst_ratio = 0;  // its largest time / median
};

// The median of `v` (mean of the middle two for an even count); v not empty.
double median_of(std::vector<double> v);

class StragglerDetector {
 public:
  explicit StragglerDetector(StragglerOptions o) : o_(o) {}
  // The ranks `seconds` (one per rank) flags at `step`; records them into episodes.
  std::vector<StragglerFlag> observe(int64_t step, const std::vector<double>& seconds);
  const std::vector<StragglerEpisode>& episodes() const { return episodes_; }
  // [{"rank", "first_step", "last_step", "worst_ratio"}, ...] in the order first flagged.
  nlohmann::json to_json() const;

 private:
  StragglerOptions o_;
  std::vector<StragglerEpisode> episodes_;
};

// One rank's clock for its compute time per step (see above). Construct on the rank's thread.
class StepComputeClock {
 public:
  StepComputeClock();
  // Seconds not blocked on communication since construction or the last restart().
  double seconds() const;
  void restart();

 private:
  double wall0_ = 0, blocked0_ = 0;
};

// Collective over `world`: every rank's `seconds`, in rank order.
std::vector<double> share_step_times(ProcessGroup& world, double seconds);

}  // namespace llama4d
