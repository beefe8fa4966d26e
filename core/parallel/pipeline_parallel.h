#pragma once
// Pipeline parallelism: the runtime that executes a schedule (pipeline_schedule.h) on one
// pipeline rank over the ProcessGroup's send/recv. See pipeline_parallel.cpp, top to bottom.
#include <memory>
#include <optional>
#include <vector>

#include "core/comm/process_group.h"
#include "core/parallel/passes.h"
#include "core/parallel/pipeline_layout.h"
#include "core/parallel/pipeline_schedule.h"

namespace llama4d {

// The forward and backward passes of a step as one pipeline rank's list of actions. Every rank
// of `pipeline` (group rank = pipeline rank) runs the same schedule kind on its own list; the
// model holds this rank's chunks (layout.rank_units).
template <class T>
class PipelineRunner final : public Passes<T> {
 public:
  PipelineRunner(ProcessGroup& pipeline, PipelineScheduleKind kind, const PipelineLayout& layout);

  LossSum train(Llama<T>& model, const std::vector<Batch>& micro_batches, T loss_scale, PassEvents& events) override;
  LossSum evaluate(Llama<T>& model, const Batch& batch) override;

  // The schedule for m micro-batches per step (built once; InputError naming the constraint).
  const PipelineSchedule& schedule(int micro_batches);
  ProcessGroup& group() const { return pp_; }
  // The most (micro-batch, chunk) pairs whose forward had run and whose backward (W for
  // zero-bubble) had not, during the last step.
  int peak_in_flight() const { return peak_in_flight_; }

 private:
  ProcessGroup& pp_;
  PipelineScheduleKind kind_;
  PipelineLayout layout_;
  std::optional<PipelineSchedule> schedule_;
  int peak_in_flight_ = 0;
};

// The same actions on this pipeline rank without a model: each compute action charges its cost
// (costs in microseconds of the simulated clock) and each transfer is an empty message, so
// the timeline is the schedule's own on uniform stages with free communication. What
// `llama4d schedule` draws, and what the bubble formulas are checked against.
void run_modelled_pipeline(ProcessGroup& pipeline, const PipelineSchedule& schedule, const StageCosts& costs_us);

extern template class PipelineRunner<float>;
extern template class PipelineRunner<double>;

}  // namespace llama4d
