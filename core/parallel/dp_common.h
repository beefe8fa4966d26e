#pragma once
// Small pieces every data-parallel strategy shares: summing losses across ranks and timing
// units for the trace.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/comm/process_group.h"
#include "core/comm/trace.h"
#include "core/model/head.h"
#include "core/parallel/data_parallel.h"

namespace llama4d {

// (loss_sum, tokens) summed over `group` in rank order, in fp64: every rank gets the same bits,
// equal to a single device adding the ranks' sums in that order.
LossSum all_reduce_loss(ProcessGroup& group, const LossSum& local);

// The squared gradient norm of the whole model from a data-parallel strategy's sum over this
// rank's slice: with tensor parallelism, minus the replicas another tensor-parallel rank
// counts (`replicas`), summed over the tensor-parallel group; unchanged without one.
double tensor_parallel_sum_squares(ProcessGroup* tensor, double slice_sum_sq, double replicas);


// Records one compute span per unit and pass on the rank's trace ("forward layer 3", "backward
// head"), so the Chrome trace shows gradient reductions overlapping the backward of earlier
// units. Spans nest: a unit's recompute (activation checkpointing) runs inside its backward.
class UnitTracer {
 public:
  UnitTracer(RankTrace& trace, int num_layers) : trace_(trace), num_layers_(num_layers) {}
  void begin(const char* phase, int unit) { trace_.begin_span(std::string(phase) + " " + unit_name(unit, num_layers_)); }
  void end() { trace_.end_span(); }

 private:
  RankTrace& trace_;
  int num_layers_;
};

}  // namespace llama4d
