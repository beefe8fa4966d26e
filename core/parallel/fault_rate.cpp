#include "core/parallel/fault_rate.h"

#include <cmath>

#include "core/data/batch_sampler.h"  // splitmix64
#include "core/error.h"

namespace llama4d {

namespace {

// "The Llama 3 Herd of Models" (2024), Table 5: root causes of the 419 unexpected interruptions
// of 54 days of pre-training; the kind each is injected as (fault_rate.h says why).
constexpr FailureCause kLlama3Causes[] = {
    {"faulty GPU", 148, FaultKind::crash},
    {"GPU HBM3 memory", 72, FaultKind::crash},
    {"software bug", 54, FaultKind::crash},
    {"network switch/cable", 35, FaultKind::collective},
    {"host maintenance", 32, FaultKind::crash},
    {"GPU SRAM memory", 19, FaultKind::crash},
    {"GPU system processor", 17, FaultKind::hang},
    {"NIC", 7, FaultKind::collective},
    {"NCCL watchdog timeout", 7, FaultKind::hang},
    {"silent data corruption", 6, FaultKind::sdc},
    {"GPU thermal interface + sensor", 6, FaultKind::slow},
    {"SSD", 3, FaultKind::crash},
    {"power supply", 3, FaultKind::crash},
    {"server chassis", 2, FaultKind::crash},
    {"IO expansion board", 2, FaultKind::crash},
    {"dependency", 2, FaultKind::crash},
    {"CPU", 2, FaultKind::crash},
    {"system memory", 2, FaultKind::crash},
};

// A uniform draw in [0, 1) from the top 53 bits of a hash.
double unit_draw(uint64_t h) { return double(h >> 11) * 0x1.0p-53; }

}  // namespace

std::span<const FailureCause> llama3_failure_causes() { return kLlama3Causes; }

DrawnSchedule draw_fault_schedule(double per_rank_step, uint64_t seed, int ranks, int64_t last_step,
                                  bool sdc_possible) {
  if (!(per_rank_step > 0) || !(per_rank_step <= 1))
    throw InputError("--fault-rate is the probability that a rank fails at a step: it must be in (0, 1], got " +
                     std::to_string(per_rank_step));
  int total = 0;
  for (const FailureCause& c : kLlama3Causes) total += c.count;
  DrawnSchedule out;
  out.schedule.seed = seed;
  const uint64_t key = splitmix64(seed ^ 0x6661756c74726174ull);  // "faultrat": apart from other uses of the seed
  for (int64_t step = 1; step <= last_step; ++step)
    for (int rank = 0; rank < ranks; ++rank) {
      // One draw per (step, rank), whatever the order they are visited in.
      const uint64_t h = splitmix64(key ^ splitmix64((uint64_t(step) << 24) ^ uint64_t(rank)));
      if (unit_draw(h) >= per_rank_step) continue;
      const double at = unit_draw(splitmix64(h)) * total;
      const FailureCause* cause = &kLlama3Causes[0];
      double below = 0;
      for (const FailureCause& c : kLlama3Causes) {
        cause = &c;
        below += c.count;
        if (at < below) break;
      }
      if (cause->kind == FaultKind::sdc && !sdc_possible) {
        ++out.dropped_sdc;
        continue;
      }
      Fault f;
      f.kind = cause->kind;
      f.rank = rank;
      f.step = step;
      if (f.kind == FaultKind::slow) f.factor = 2, f.steps = 1;
      out.schedule.faults.push_back(f);
      out.drawn.push_back({f, cause});
    }
  return out;
}

}  // namespace llama4d
