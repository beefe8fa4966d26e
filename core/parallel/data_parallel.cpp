// Data parallelism (DDP), top to bottom.
//
// Every rank holds the whole model, its gradients and its optimizer state, and trains on its
// own rows of the global batch. After backward the ranks all-reduce (sum) their gradients, so
// every rank holds the gradient of the GLOBAL mean loss (each micro-batch's loss was scaled by
// 1 / global tokens, so a sum, not an average, is right) and takes the same AdamW step.
//
// Memory per rank (N parameters, fp32):  params 4N + grads 4N + AdamW moments 8N = 16N bytes,
// the same as one device: DP buys throughput, not memory. (All of it allocated on the rank's
// tracker by the model and the optimizer; with --grad-reduce-in-bf16, + 2N of bf16 bucket copies
// from the last backward to the end of the step.)
// Traffic per rank per step: one ring all-reduce of the gradients, 2 (dp-1)/dp * 4N bytes
// (2N instead of 4N with --grad-reduce-in-bf16: each bucket is rounded into a bf16 copy, which is
// what moves and is summed, and the sum is widened back into the f32 gradients).
//
// Expert parallelism (ep in the mesh, expert_parallel.cpp): each rank holds only its experts, so
// an MoE block's bucket is two all-reduces, the attention and router over every data rank
// (dp_cp) and the experts over the data ranks holding the same ones (DataParallelGroups::experts);
// the gradient norm counts the dense part once and sums the experts' over the ep group.
//
// Two things make it fast on real hardware, and both are here:
//   - gradient accumulation without communication ("no_sync"): micro-batches before the last
//     only accumulate locally; only the last micro-batch's backward communicates;
//   - overlap: gradients are reduced in buckets, one per model unit (the embedding, a layer,
//     the head). A bucket is all-reduced asynchronously the moment its layer's backward
//     finishes, while the earlier layers are still computing. The trace shows the overlap.
#include <algorithm>
#include <cmath>

#include "core/ops.h"
#include "core/optim/grad_clip.h"
#include "core/optim/segmented_norm.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/dp_common.h"
#include "core/comm/traffic_labels.h"

namespace llama4d {

template <class T>
class DistributedDataParallel final : public DataParallelStrategy<T> {
 public:
  DistributedDataParallel(Llama<T>& model, const DataParallelGroups& groups, const DataParallelConfig& cfg,
                          const AdamWConfig& adamw)
      : model_(model),
        cfg_(cfg),
        dp_cp_(*groups.dp_cp),
        groups_(groups),
        segments_(held_segments(model)),
        adamw_(adamw, model.param_specs(), 0, model.num_params(), &model.memory()),
        tracer_(dp_cp_.trace(), model.num_layers()) {
    // Expert parallelism: each unit's held experts (the end of an MoE block's segment).
    for (const Segment& sg : segments_) experts_.push_back(held_experts_range(model, sg.unit));
    if (groups.experts && cfg.bf16_grad_reduce)
      throw InputError("--grad-reduce-in-bf16 with expert parallelism is not supported");
  }

  void init_weights(uint64_t seed) override {
    model_.init_weights(seed);
    model_.zero_grad();  // the replicated gradient buffer lives from here on, as on one device
  }

  StepStats step(const std::vector<Batch>& micro_batches, double lr, T loss_scale, double grad_clip) override {
    // 1. Forward and backward over this rank's micro-batches, accumulating gradients locally;
    //    only the last backward launches the bucket all-reduces (through after_backward).
    model_.zero_grad();
    LossSum local;
    {
      ScopedHooks<T> hooks(model_, this);
      local = this->passes().train(model_, micro_batches, loss_scale, *this);
    }

    // 2. Wait for the buckets still in flight: now every rank holds the summed gradient.
    for (auto& w : pending_) w->wait();
    pending_.clear();
    for (auto& [s, wire] : wires_) ops::from_bf16(model_.grads() + s.begin, wire.data(), s.numel(), false);
    wires_.clear();
    sum_tied_embedding_grads(groups_.tied, model_.unit_grads(embedding_unit()), segments_[0].numel(),
                             cfg_.bf16_grad_reduce);
    const LossSum global = global_loss(groups_, local);

    // 3. Clip and step, identically on every rank (same gradients, same order of operations).
    //    Under expert parallelism the dense weights' partials (every ep rank's same values) and
    //    this rank's experts' (summed over the ep group) are taken apart.
    T* g = model_.grads();
    std::vector<double> partials, expert_partials;
    for (const Segment& s : segments_) {
      if (!counts_segment(model_, s.unit)) continue;
      const ParamRange e = experts_[size_t(s.unit)];
      append_chunk_partials(partials, g + s.begin, e.begin - s.begin);
      append_chunk_partials(expert_partials, g + e.begin, e.end - e.begin);
    }
    const double sum_sq =
        global_grad_sum_squares(groups_, model_, partials,
                                [&] { return replica_sum_squares(model_.param_specs(), 0, model_.num_params(), g); }) +
        expert_parallel_sum_squares(groups_.expert_parallel, expert_partials);
    if (grad_clip > 0) apply_grad_clip(g, model_.num_params(), clip_coefficient(sum_sq, grad_clip));
    adamw_.step(model_.params(), g, lr);
    return step_stats(global, lr, sum_sq);
  }

  LossSum evaluate(const Batch& b) override { return this->passes().evaluate(model_, b); }

  // PassEvents: no_sync for every micro-batch but the last.
  void begin_backward_pass(int micro_batch, int count) override { sync_ = micro_batch + 1 == count; }
  void end_backward_pass(int, int) override {}

  // UnitHooks: time each unit for the trace; launch a bucket as soon as its grads are final.
  void before_forward(int unit) override { tracer_.begin("forward", unit); }
  void after_forward(int) override { tracer_.end(); }
  void before_recompute(int unit) override { tracer_.begin("recompute", unit); }
  void after_recompute(int) override { tracer_.end(); }
  void before_backward(int unit) override { tracer_.begin("backward", unit); }
  // A split backward (zero-bubble pipelines): its weight pass is where the gradients become final.
  void after_backward_input(int) override { tracer_.end(); }
  void before_backward_weight(int unit) override { tracer_.begin("backward-weight", unit); }
  void after_backward(int unit) override {
    tracer_.end();
    if (!sync_) return;  // no_sync: an earlier micro-batch, gradients keep accumulating locally
    // Unit u's segment is final now (a tied head adds into segment 0 before the embedding runs;
    // on a last stage with the embedding's copy, the head finishes that copy too).
    for (int u : model_.segments_final_after(unit)) {
      const Segment& s = segments_[size_t(u)];
      AllReduceOptions o{.async_op = true, .label = label::grad_bucket(unit_name(u, model_.num_layers()))};
      const ParamRange e = experts_[size_t(u)];
      if (groups_.experts && e.begin < e.end) {
        // Expert parallelism: the router and attention over every data rank, this rank's experts
        // over the data ranks holding the same experts.
        T* g = model_.grads();
        pending_.push_back(dp_cp_.all_reduce(g + s.begin, e.begin - s.begin, dtype_of<T>(), ReduceOp::sum, o));
        AllReduceOptions x{.async_op = true, .label = label::grad_bucket(unit_name(u, model_.num_layers()) + " experts")};
        pending_.push_back(groups_.experts->all_reduce(g + e.begin, e.end - e.begin, dtype_of<T>(), ReduceOp::sum, x));
        continue;
      }
      if (!cfg_.bf16_grad_reduce) {
        pending_.push_back(dp_cp_.all_reduce(model_.grads() + s.begin, s.numel(), dtype_of<T>(), ReduceOp::sum, o));
        continue;
      }
      Buffer<bf16> wire = bf16_wire(model_.memory(), model_.grads() + s.begin, s.numel(), "bf16 " + o.label);
      pending_.push_back(dp_cp_.all_reduce(wire.data(), s.numel(), DType::bf16, ReduceOp::sum, o));
      wires_.emplace_back(s, std::move(wire));
    }
  }

  void gather_params(std::vector<T>& out) override {
    out.resize(size_t(model_.num_params()));
    ops::copy(out.data(), model_.params(), model_.num_params());
  }
  void gather_grads(std::vector<T>& out) override {
    out.resize(size_t(model_.num_params()));
    ops::copy(out.data(), model_.grads(), model_.num_params());
  }
  void save_state(TrainingCheckpointWriter<T>& ckpt) override {
    // Every replica holds everything: replica d writes elements [n*d/dp, n*(d+1)/dp), so the
    // ranks share the writing.
    // The tied head's copy of the embedding is the first stage's to write.
    if (groups_.experts) return save_expert_parallel_state(ckpt);
    const int64_t n = model_.num_params(), dp = dp_cp_.size(), d = dp_cp_.rank();
    const int64_t copy_end = counts_segment(model_, embedding_unit()) ? 0 : segments_[0].end;  // the copy leads the buffer
    const int64_t b = std::max(copy_end, n * d / dp), e = std::max(b, n * (d + 1) / dp);
    ckpt.params(b, e, model_.params() + b);
    ckpt.exp_avg(b, e, adamw_.exp_avg().data() + b);
    ckpt.exp_avg_sq(b, e, adamw_.exp_avg_sq().data() + b);
  }
  int64_t optimizer_steps() const override { return adamw_.step_count(); }
  bool weights_finite() const override { return ops::all_finite(model_.params(), model_.num_params()); }
  void load_state(const TrainingCheckpointReader<T>& ckpt) override {
    const int64_t n = model_.num_params();
    ckpt.params(0, n, model_.params());
    ckpt.exp_avg(0, n, adamw_.mutable_exp_avg());
    ckpt.exp_avg_sq(0, n, adamw_.mutable_exp_avg_sq());
    adamw_.set_step_count(ckpt.optimizer_steps());
  }

  RankMemory peak_memory() const override { return memory_peaks(model_.memory()); }

  // Expert parallelism: each dense tensor shared out over every data rank, each expert's over
  // the data ranks holding it (the others hold other experts), so every element is written once.
  void save_expert_parallel_state(TrainingCheckpointWriter<T>& ckpt) {
    for (const ParamSpec& p : model_.param_specs()) {
      ProcessGroup& share = p.expert >= 0 ? *groups_.experts : dp_cp_;
      const int64_t n = share.size(), r = share.rank();
      const int64_t b = p.offset + p.numel * r / n, e = p.offset + p.numel * (r + 1) / n;
      if (b == e) continue;
      ckpt.params(b, e, model_.params() + b);
      ckpt.exp_avg(b, e, adamw_.exp_avg().data() + b);
      ckpt.exp_avg_sq(b, e, adamw_.exp_avg_sq().data() + b);
    }
  }
  std::string describe() const override {
    return "DP over " + std::to_string(dp_cp_.size()) + " ranks" + cfg_.reduce_note();
  }

 private:
  Llama<T>& model_;
  DataParallelConfig cfg_;  // the stage is none; what matters here is bf16_grad_reduce
  ProcessGroup& dp_cp_;
  DataParallelGroups groups_;
  std::vector<Segment> segments_;
  std::vector<ParamRange> experts_;  // [unit] this rank's experts in the segment (empty without ep)
  AdamW<T> adamw_;
  UnitTracer tracer_;
  bool sync_ = false;
  std::vector<std::shared_ptr<Work>> pending_;
  std::vector<std::pair<Segment, Buffer<bf16>>> wires_;  // bf16 buckets in flight, with their segment
};

template <class T>
std::unique_ptr<DataParallelStrategy<T>> make_distributed_data_parallel(Llama<T>& model, const DataParallelGroups& groups,
                                                                         const DataParallelConfig& config,
                                                                         const AdamWConfig& adamw) {
  return std::make_unique<DistributedDataParallel<T>>(model, groups, config, adamw);
}

template std::unique_ptr<DataParallelStrategy<float>> make_distributed_data_parallel<float>(Llama<float>&,
                                                                                           const DataParallelGroups&,
                                                                                           const DataParallelConfig&,
                                                                                           const AdamWConfig&);
template std::unique_ptr<DataParallelStrategy<double>> make_distributed_data_parallel<double>(Llama<double>&,
                                                                                             const DataParallelGroups&,
                                                                                             const DataParallelConfig&,
                                                                                             const AdamWConfig&);

}  // namespace llama4d
