#pragma once
// Bytes one training step moves, per communication group, from formulas (see traffic.cpp).
#include <cstdint>
#include <map>
#include <string>

#include "core/plan/step_shape.h"

namespace llama4d {

// Per group, keyed by the name the traffic log gives the group ("tp", "cp", "pp", "dp",
// "cp+dp", "dp_shard", "dp_replicate", "world", ...): bytes sent by ALL ranks of ALL instances of
// that group during one optimizer step (forward, backward, gradient reduction, clipping, update),
// and the number of calls, as the log's summary counts them: a collective once per group instance,
// a send once, a receive never. Elements move at the shape's precision: activations (tp, cp, pp),
// parameters (ZeRO's gathers) and gradients (the data group's reductions) each at their own width;
// the data group's gradient reductions (and the tied embedding's sum) at 2 bytes when the plan
// reduces gradients in bf16 (ParallelPlan::bf16_grad_reduce).
struct GroupTraffic {
  int64_t bytes_sent = 0;
  int64_t calls = 0;
};
std::map<std::string, GroupTraffic> predict_step_traffic(const StepShape& s);

}  // namespace llama4d
