// ZeRO-3 (FSDP: fully sharded data parallelism), top to bottom.
//
// ZeRO-2 (zero.cpp) shards the gradients and the AdamW moments; every rank still holds the
// whole weights. ZeRO-3 shards those too: rank r keeps only its pieces of every unit's weights
// (a parameter shard of N/dp elements), and a unit's whole weights exist on the rank only while
// it runs. Everything else is ZeRO-2's: the reduce-scatter of each unit's gradient as it is
// final, the sharded AdamW, which now updates the parameter shard itself, so there is no
// all-gather after the step. What this file adds is the parameters' life cycle:
//
//   params_needed        before a unit's forward, recompute or backward: its weights are
//                        all-gathered from every rank's pieces (ensure_gathered), and the next
//                        unit's gather is started behind it (start_gather: a prefetch, on the
//                        comm stream while this unit computes)
//   params_done_forward  after a block's forward: its weights are freed (reshard after forward,
//                        FSDP's default). The embedding and the head stay gathered until their
//                        backward, as FSDP treats its root module: the head's backward follows
//                        its forward at once, and a tied head needs the embedding's weights.
//   params_done_backward after a unit's backward: nothing reads them any more, freed
//   params_done_passes   kept parameters freed at the end of the step; an evaluate frees all
//
// --keep-params (reshard_after_forward = false, Llama 3's choice: "we do not reshard after
// forward"): a block's weights stay from its forward to its backward, one all-gather per unit
// and micro-batch instead of two; under pipelining they stay for the whole step
// (keeps_params_for_step), since a stage's micro-batches interleave forward and backward.
//
// Memory is allocated, not declared: the model holds its parameters per unit
// (Llama::Residency::per_unit), so a gather allocates the unit's whole weights and a release
// frees them; the peak is the parameter shard plus the units gathered at once.
// Traffic per rank per step (S = 4N bytes, ring): 3 (dp-1)/dp S, an all-gather for the forward,
// another for the backward and the gradients' reduce-scatter; 2 (dp-1)/dp S with --keep-params.
#include "core/error.h"
#include "core/model/initialization.h"
#include "core/ops.h"
#include "core/parallel/zero.h"
#include "core/comm/traffic_labels.h"

namespace llama4d {

template <class T>
class FullyShardedDataParallel final : public ZeroDataParallel<T> {
  using Zero = ZeroDataParallel<T>;

 public:
  FullyShardedDataParallel(Llama<T>& model, const DataParallelGroups& groups, const DataParallelConfig& cfg,
                           const AdamWConfig& adamw)
      : Zero(model, groups, cfg, adamw),
        param_shard_(&model.memory(), MemoryCategory::params, this->layout_.shard_numel(this->rank_), "parameter shard") {
    gather_work_.resize(this->layout_.segments().size());
  }

  // Each rank computes only its pieces: the values one device would have there.
  void init_weights(uint64_t seed) override {
    for (size_t s = 0; s < this->layout_.segments().size(); ++s) {
      const Piece p = this->layout_.piece(s, this->rank_);
      init_param_device_values(this->model_.param_specs(), seed, p.begin, p.end, piece_weights(s));
    }
  }

  void gather_params(std::vector<T>& out) override {
    out.resize(size_t(this->model_.num_params()));
    this->gather_shards(out.data(), param_shard_.data(), "gather parameters");
  }
  bool weights_finite() const override { return ops::all_finite(param_shard_.data(), param_shard_.size()); }
  void load_state(const TrainingCheckpointReader<T>& ckpt) override {
    for (size_t s = 0; s < this->layout_.segments().size(); ++s) {
      const Piece p = this->layout_.piece(s, this->rank_);
      ckpt.params(p.begin, p.end, piece_weights(s));
    }
    this->optimizer_.load(ckpt);
  }

 private:
  const DataParallelConfig& cfg() const { return this->cfg_; }
  Llama<T>& model() { return this->model_; }

  // ---- Where the parameters are needed and freed --------------------------------------------
  void params_needed(int unit, int next) override {
    ensure_gathered(unit);
    if (cfg().prefetch && next >= 0 && next < model().num_units() && model().holds_unit(next)) start_gather(next);
  }
  void params_done_forward(int unit) override {
    if (cfg().reshard_after_forward && is_block(unit)) release(size_t(unit));
  }
  // A split backward (zero-bubble pipelines): the input pass is the last to read a unit's
  // parameters (the weight pass reads only what it kept), so they are freed after it already.
  // Backward runs units last to first, so a unit's own segment has no reader left (the
  // embedding, which a tied head also reads, is the very last); a last stage's copy of a tied
  // embedding has no reader but its head.
  void params_done_backward(int unit) override {
    if (keeps_params_for_step()) return;
    for (int si : model().segments_final_after(unit)) release(size_t(si));
  }
  void params_done_passes(bool training) override {
    if (!training || keeps_params_for_step())
      for (size_t s = 0; s < this->layout_.segments().size(); ++s) release(s);
  }
  T* piece_weights(size_t s) override { return param_shard_.data() + this->layout_.piece(s, this->rank_).shard_offset; }
  void after_update() override {}  // AdamW updated the shard itself: nothing to gather

  // ZeRO-3 without resharding under pipeline parallelism (Llama 3's choice): a stage's
  // micro-batches interleave forward and backward, so releasing a unit after either would
  // gather it again for every micro-batch, 2m all-gathers per unit and step instead of one.
  bool keeps_params_for_step() const {
    return !this->cfg_.reshard_after_forward && this->groups_.pipeline && this->groups_.pipeline->size() > 1;
  }
  bool is_block(int unit) { return unit != embedding_unit() && unit != head_unit(model().num_layers()); }

  // ---- A unit's parameters: allocate on gather, free on release -------------------------------
  void start_gather(int unit) {
    for (int si : model().segments_used_by(unit)) {
      const size_t s = size_t(si);
      if (model().unit_params(si)) continue;  // gathered, or its gather is in flight
      model().allocate_unit_params(si, "gathered parameters of " + unit_name(si, model().num_layers()));
      AllGatherOptions o{.async_op = true, .label = label::params(unit_name(si, model().num_layers()))};
      gather_work_[s] = this->shard_.all_gather_v(model().unit_params(si), piece_weights(s),
                                                  this->layout_.piece_counts(s), dtype_of<T>(), o);
    }
  }
  void ensure_gathered(int unit) {
    start_gather(unit);
    for (int si : model().segments_used_by(unit)) {
      const size_t s = size_t(si);
      if (gather_work_[s]) gather_work_[s]->wait();
      gather_work_[s].reset();
    }
  }
  void release(size_t s) {
    if (gather_work_[s]) gather_work_[s]->wait();  // a prefetch still writing into it
    gather_work_[s].reset();
    model().free_unit_params(int(s));
  }

  Buffer<T> param_shard_;  // this rank's pieces of every unit's weights, back to back
  std::vector<std::shared_ptr<Work>> gather_work_;  // [segment] a gather in flight
};

template <class T>
std::unique_ptr<DataParallelStrategy<T>> make_fully_sharded_data_parallel(Llama<T>& model,
                                                                           const DataParallelGroups& groups,
                                                                           const DataParallelConfig& config,
                                                                           const AdamWConfig& adamw) {
  return std::make_unique<FullyShardedDataParallel<T>>(model, groups, config, adamw);
}

template std::unique_ptr<DataParallelStrategy<float>> make_fully_sharded_data_parallel<float>(
    Llama<float>&, const DataParallelGroups&, const DataParallelConfig&, const AdamWConfig&);
template std::unique_ptr<DataParallelStrategy<double>> make_fully_sharded_data_parallel<double>(
    Llama<double>&, const DataParallelGroups&, const DataParallelConfig&, const AdamWConfig&);

}  // namespace llama4d
