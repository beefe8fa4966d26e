#pragma once
// What every data-parallel strategy's step shares, so each strategy's step reads
// "reduce -> clip -> AdamW":
//   after its own reduction over the data-parallel ranks,
//     sum_tied_embedding_grads   the tied embedding's two copies (pipeline: first + last stage)
//     global_loss                the step's loss over the data ranks, then the pipeline stages
//     global_grad_sum_squares    the gradient norm over the pipeline stages and tensor slices
//     step_stats                 what the step reports
// and the helpers under them, and the units' spans on the trace.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/comm/trace.h"
#include "core/model/bf16_parking.h"
#include "core/model/head.h"
#include "core/model/llama.h"
#include "core/optim/segmented_norm.h"
#include "core/parallel/data_parallel.h"
#include "core/tensor/buffer.h"
#include "core/tensor/dtype.h"

namespace llama4d {

// The step's loss: summed over the data group (every data and context rank), then the pipeline.
LossSum global_loss(const DataParallelGroups& groups, const LossSum& local);

// (loss_sum, tokens) summed over `group` in rank order, in fp64: every rank gets the same bits,
// equal to a single device adding the ranks' sums in that order.
LossSum all_reduce_loss(ProcessGroup& group, const LossSum& local);
// The same over the pipeline group, where only the last stage has a loss (the others add
// zeros, exactly); `local` itself without one.
LossSum all_reduce_loss(ProcessGroup* pipeline, const LossSum& local);

// The squared gradient norm of the whole model from a data-parallel strategy's sum over this
// rank's slice: with tensor parallelism, minus the replicas another tensor-parallel rank
// counts (`replicas`), summed over the tensor-parallel group; unchanged without one.
double tensor_parallel_sum_squares(ProcessGroup* tensor, double slice_sum_sq, double replicas);

// Whether this rank counts segment u (in the gradient norm, in checkpoints): it holds it, and
// not as the tied head's copy of the embedding, which the first stage counts.
template <class T>
bool counts_segment(const Llama<T>& model, int u) {
  return model.holds_unit(u) && !(u == embedding_unit() && model.holds_embedding_copy());
}

// The segments of this rank's model, one per unit (empty for the units a pipeline rank does
// not hold), for DP buckets and ZeRO shards.
template <class T>
std::vector<Segment> held_segments(const Llama<T>& model) {
  std::vector<Segment> out;
  for (int u = 0; u < model.num_units(); ++u) out.push_back({model.unit_range(u).begin, model.unit_range(u).end, u});
  return out;
}

// Expert parallelism: the flat range of unit u's segment that holds this rank's experts (an MoE
// block's segment ends with them: core/model/params.h), empty (at the segment's end) for other
// units and when the rank holds every expert.
template <class T>
ParamRange held_experts_range(const Llama<T>& model, int u) {
  const ParamRange unit = model.unit_range(u);
  ParamRange r{unit.end, unit.end};
  if (model.expert_shard().all()) return r;
  for (const ParamSpec& p : model.param_specs())
    if (p.expert >= 0 && p.offset >= unit.begin && p.offset < unit.end) r.begin = std::min(r.begin, p.offset);
  return r;
}

// Expert parallelism: the squared norm of this rank's experts' gradients (g[r.begin, r.end) for
// each range, each range's chunk partials combined in order), summed over the ep group, whose
// ranks hold the other experts. The dense weights are counted apart, once (every ep rank holds
// the same ones). 0 without the group.
double expert_parallel_sum_squares(ProcessGroup* ep, const std::vector<double>& expert_partials);

// The sum of squares of the gradient of every unit of the model's slice, in the single-device
// order (core/optim/segmented_norm.h), from `partials`: this rank's chunk partials of the
// segments it holds, in segment order. Without pipeline parallelism they are all of them.
// With it each rank writes its partials where the whole list has them and zeros elsewhere; a
// sum over the pipeline group adds every partial to zeros only (exact), so every rank
// combines the same list a single device would, and the norm keeps its bits.
double pipeline_sum_squares(ProcessGroup* pipeline, const std::vector<int64_t>& partials_per_unit,
                            const std::vector<uint8_t>& held, const std::vector<double>& partials);
template <class T>
double pipeline_sum_squares(ProcessGroup* pipeline, const Llama<T>& model, const std::vector<double>& partials) {
  std::vector<int64_t> counts;
  std::vector<uint8_t> held;
  for (int u = 0; u < model.num_units(); ++u) {
    counts.push_back(num_chunk_partials(model.segment_numel(u)));
    held.push_back(counts_segment(model, u) ? 1 : 0);
  }
  return pipeline_sum_squares(pipeline, counts, held, partials);
}

// bf16 gradient reduction (DataParallelConfig::bf16_grad_reduce): g[n] rounded to bf16 into a
// new buffer, the one a collective then moves and sums. Charged to `memory` as a comm buffer.
template <class T>
Buffer<bf16> bf16_wire(MemoryTracker& memory, const T* g, int64_t n, const std::string& what) {
  return bf16_copy(&memory, MemoryCategory::comm_buffers, g, n, what);
}

// Pipeline parallelism with tied embeddings: g[n], this rank's part of the embedding's gradient
// (already reduced over the data-parallel ranks), summed in place with the other stage's part
// over `tied` (first stage + last stage), in bf16 when the gradients are reduced in bf16;
// nothing without the group.
template <class T>
void sum_tied_embedding_grads(ProcessGroup* tied, T* g, int64_t n, bool bf16_grad_reduce) {
  if (!tied || n == 0) return;
  AllReduceOptions o{.label = "tied embedding grads (first + last stage)"};
  if (!bf16_grad_reduce) {
    tied->all_reduce(g, n, dtype_of<T>(), ReduceOp::sum, o)->wait();
    return;
  }
  Buffer<bf16> wire = bf16_wire(tied->memory(), g, n, "tied embedding grads (bf16)");
  tied->all_reduce(wire.data(), n, DType::bf16, ReduceOp::sum, o)->wait();
  ops::from_bf16(g, wire.data(), n, false);
}

// A double summed over the pipeline group (a quantity each stage has for its own units); `v`
// itself without one.
double pipeline_sum(ProcessGroup* pipeline, double v, const char* label);

// The squared gradient norm of the whole model, from this rank's slice once its gradients are
// reduced over the data-parallel ranks: `partials` are the chunk partials of the slice's counted
// segments in the single-device order (all of them on one rank; gathered over the shard group
// under ZeRO), summed over the pipeline stages; with tensor parallelism, minus the slice's
// replicas (`slice_replicas()`, called only then: values another tensor-parallel rank counts),
// summed over the pipeline stages and the tensor-parallel ranks.
template <class T>
double global_grad_sum_squares(const DataParallelGroups& groups, const Llama<T>& model,
                               const std::vector<double>& partials, const std::function<double()>& slice_replicas) {
  ProcessGroup* pipeline = groups.pipeline && groups.pipeline->size() > 1 ? groups.pipeline : nullptr;
  const double slice_sum_sq = pipeline_sum_squares(pipeline, model, partials);
  if (!groups.tensor) return slice_sum_sq;
  return tensor_parallel_sum_squares(groups.tensor, slice_sum_sq,
                                     pipeline_sum(pipeline, slice_replicas(), "grad-norm replicas (pipeline stages)"));
}

// What the step reports: the global mean loss, its tokens, the pre-clip norm.
inline StepStats step_stats(const LossSum& global, double lr, double grad_sum_squares) {
  StepStats st;
  st.loss = global.mean();
  st.tokens = global.tokens;
  st.lr = lr;
  st.grad_norm = std::sqrt(grad_sum_squares);
  return st;
}

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
