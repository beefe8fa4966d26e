#pragma once
// The analytical planner: for a model, a 4D plan, a batch and a cluster, what each GPU holds,
// what each mesh dimension moves and over which link, the pipeline bubble, the step time, MFU,
// tokens/s and the days a token budget takes. Formulas only (planner.cpp, memory.cpp,
// traffic.cpp); `llama4d plan` prints it and the tests hold it against the virtual cluster.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/comm/cluster.h"
#include "core/plan/memory.h"
#include "core/plan/step_shape.h"

namespace llama4d {

// The assumptions that turn FLOPs and bytes into seconds, all inputs (none hidden):
struct ClusterModel {
  ClusterSpec cluster;              // GPUs per node, NVLink / InfiniBand bandwidth and latency, HBM, peak
  double compute_efficiency = 0.6;  // fraction of peak the kernels reach on the step's FLOPs
  double dp_overlap = 0.9;          // fraction of the data-parallel traffic hidden behind compute
  // Tensor, context and pipeline traffic is counted as exposed: it sits on the critical path
  // of every layer (this engine does not overlap it; Llama 3 overlapped some of it).
};

struct DimensionTraffic {
  std::string dim;           // "tp", "cp", "pp", "dp" (the data group: cp x dp folds into dp's row)
  std::string group;         // the traffic log's name for the group, e.g. "cp+dp"
  int64_t bytes_per_rank = 0;  // sent by one rank per step (the group's bytes / its ranks)
  int64_t calls_per_rank = 0;
  std::string link;          // "nvlink" or "ib": the slowest link the group crosses
  double seconds = 0;        // bytes / bandwidth + calls x latency
  double exposed_seconds = 0;
};

struct PlanReport {
  StepShape shape;
  ClusterModel model;
  MemoryPrediction worst;      // the rank with the largest total
  bool fits = true;            // worst.total() <= HBM (or HBM unlimited)
  std::string overflow;        // when it does not fit: the largest category on that rank
  std::vector<DimensionTraffic> traffic;
  double flops_per_token = 0;  // model FLOPs (MFU's numerator), training
  double recompute_flops_per_token = 0;
  double compute_seconds = 0, bubble_fraction = 0, bubble_seconds = 0, comm_exposed_seconds = 0;
  double step_seconds = 0, mfu = 0, tokens_per_second = 0;
  double token_budget = 0, days_for_budget = 0;

  nlohmann::json to_json() const;
  std::string table() const;
};

// InputError when the plan does not fit the model (the same checks training makes).
PlanReport plan_step(const StepShape& shape, const ClusterModel& model, double token_budget = 0);

}  // namespace llama4d
