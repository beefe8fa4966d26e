// ZeRO-1 and ZeRO-2 (and HSDP), top to bottom. ZeRO-3 (FSDP) extends this class: fsdp.cpp.
//
// Plain data parallelism keeps a full copy of everything on every rank. ZeRO (Rajbhandari et
// al. 2020) removes the redundancy step by step; the flat parameter buffer is cut into
// per-rank pieces (ShardLayout: every unit's segment — the embedding, each layer, the norm +
// head — split evenly across the shard group) and rank r keeps only its pieces of:
//   ZeRO-1  the AdamW moments                 grads accumulate locally, are reduce-scattered
//                                             once, each rank updates its pieces, then the
//                                             updated pieces are all-gathered
//   ZeRO-2  + the gradients                   grads reduce-scattered: each rank receives only
//                                             the sum of its own pieces
//   ZeRO-3  + the parameters (FSDP)           a layer's parameters are all-gathered just before
//                                             it runs and freed right after (fsdp.cpp)
// So a step is data parallelism's, with its all-reduce cut in two around a sharded AdamW:
//
//   1. forward and backward (step -> passes().train); as each unit's gradient is final,
//      after_backward starts its reduce-scatter (ShardedGradReducer, zero_reduce.h):
//      ZeRO-1 at the last micro-batch, ZeRO-2 at every one (and frees the unit's full gradient);
//   2. the tied embedding's copies, the global loss (dp_common.h);
//   3. the global gradient norm from the pieces (ShardedAdamW::grad_sum_squares), clip, and
//      AdamW on this rank's pieces only (ShardedAdamW::step, zero_optimizer.h);
//   4. after_update: an all-gather of every rank's updated pieces, so each holds the whole
//      weights again for the next forward.
//
// Memory per rank, N params in fp32, dp ranks (activations aside):
//   DP 16N   ZeRO-1 8N + 8N/dp   ZeRO-2 4N + 12N/dp   ZeRO-3 16N/dp (+ the layers being gathered)
// Traffic per rank per step (S = 4N bytes, ring algorithms):
//   DP, ZeRO-1, ZeRO-2: 2 (dp-1)/dp S   (all-reduce, or reduce-scatter + all-gather), ZeRO-2's
//                       reduce-scatter once per micro-batch: (M+1) (dp-1)/dp S with M of them
//                       per step, 2 (dp-1)/dp S with --reduce-once
//   ZeRO-3: 3 (dp-1)/dp S  (all-gather for forward, again for backward, reduce-scatter of grads);
//           2 (dp-1)/dp S when parameters stay gathered from forward to backward, which is what
//           Llama 3 did (its paper: no resharding after forward) — i.e. ZeRO-2-like memory
//           for the parameters in flight, NOT ZeRO-3's minimum. One of the source documents
//           this course is built on calls Llama 3's FSDP "ZeRO-3"; that is off because Llama 3
//           kept the gathered parameters: the reshard_after_forward=false variant.
// HSDP: shard inside a group (dp_shard, e.g. one node), replicate across groups (dp_replicate):
//   each unit's gradient is reduce-scattered inside the shard group, then the unit's piece of
//   the shard is all-reduced across replicas right behind it (as PyTorch FSDP2's HSDP), so the
//   cross-node traffic overlaps the backward of the units below. Every element is still summed
//   over dp_shard first, then over dp_replicate.
//
// Memory is allocated, not declared: the model holds its gradients per unit
// (Llama::Residency::per_unit) from ZeRO-2 on, so a unit's full gradient is freed once it is
// reduce-scattered. Shards, AdamW moments and receive buffers are Buffers on the same rank tracker.
//
// Exactness. Stages 2 and 3 reduce every micro-batch's gradients as soon as they exist (that
// is the point: the full gradient never has to be kept), so the sum runs micro-batch by
// micro-batch: acc = S_0, acc += S_1, ...  with S_m = (g_{0,m} + g_{1,m}) + ... in rank order.
// Stage 1 accumulates locally and reduces once at the last micro-batch, like DP, and so do
// stages 2 and 3 with --reduce-once (DataParallelConfig::reduce_once: M times fewer gradient
// bytes, for a full gradient of the rank's units held through the step: 4N bytes more at the
// peak, ZeRO-1's gradient memory on top of the shard). The
// equivalence harness makes its single device add in the same order, which is why the results
// are bitwise equal.
#include "core/parallel/zero.h"

#include "core/error.h"
#include "core/ops.h"
#include "core/optim/grad_clip.h"
#include "core/comm/traffic_labels.h"

namespace llama4d {

template <class T>
ZeroDataParallel<T>::ZeroDataParallel(Llama<T>& model, const DataParallelGroups& groups, const DataParallelConfig& cfg,
                                      const AdamWConfig& adamw)
    : model_(model),
      shard_(*groups.shard),
      replicate_(groups.replicate && groups.replicate->size() > 1 ? groups.replicate : nullptr),
      groups_(groups),
      cfg_(cfg),
      layout_(held_segments(model), shard_.size()),
      rank_(shard_.rank()),
      tracer_(shard_.trace(), model.num_layers()),
      optimizer_(model, layout_, rank_, adamw),
      reducer_(model, layout_, rank_, shard_, replicate_, cfg.stage >= ZeroStage::zero2, cfg.bf16_grad_reduce) {
  using Residency = typename Llama<T>::Residency;
  // What the model itself holds: whole parameters below stage 3, whole gradients at stage 1.
  model.set_residency(stage() == 3 ? Residency::per_unit : Residency::whole,
                      stage() >= 2 ? Residency::per_unit : Residency::whole);
}

template <class T>
void ZeroDataParallel<T>::init_weights(uint64_t seed) {
  model_.init_weights(seed);
  if (stage() == 1) model_.zero_grad();  // ZeRO-1 keeps a full gradient buffer from here on
}

template <class T>
StepStats ZeroDataParallel<T>::step(const std::vector<Batch>& micro_batches, double lr, T loss_scale, double grad_clip) {
  // 1. Forward/backward per micro-batch; the hooks reduce-scatter each unit as it is final.
  model_.zero_grad();
  reducer_.begin_step();
  LossSum local;
  {
    ScopedHooks<T> hooks(model_, this);
    local = this->passes().train(model_, micro_batches, loss_scale, *this);
  }
  params_done_passes(true);
  // 2. Tied embeddings across pipeline stages: this rank's reduced piece of the embedding's
  //    gradient plus the other stage's (the two stages shard the segment alike).
  sum_tied_embedding_grads(groups_.tied, reducer_.reduced(0), layout_.piece(0, rank_).numel(), cfg_.bf16_grad_reduce);
  const LossSum global = global_loss(groups_, local);
  // 3. Clip and step each of this rank's pieces.
  auto grads = [this](size_t s) { return reducer_.reduced(s); };
  const double sum_sq = optimizer_.grad_sum_squares(shard_, groups_, grads);
  optimizer_.step([this](size_t s) { return piece_weights(s); }, grads,
                  grad_clip > 0 ? clip_coefficient(sum_sq, grad_clip) : 1.0, lr);
  // 4. Everyone needs the whole updated parameters for the next forward (ZeRO-1/2).
  after_update();
  return step_stats(global, lr, sum_sq);
}

template <class T>
LossSum ZeroDataParallel<T>::evaluate(const Batch& b) {
  sync_ = false;
  LossSum loss;
  {
    ScopedHooks<T> hooks(model_, this);
    loss = this->passes().evaluate(model_, b);
  }
  params_done_passes(false);
  return loss;
}

template <class T>
T* ZeroDataParallel<T>::piece_weights(size_t s) {
  return model_.params() + layout_.piece(s, rank_).begin;
}

// Every rank's updated pieces to every rank, in place in the whole parameter buffer.
template <class T>
void ZeroDataParallel<T>::after_update() {
  std::vector<std::shared_ptr<Work>> works;
  for (size_t s = 0; s < layout_.segments().size(); ++s) {
    if (layout_.segments()[s].numel() == 0) continue;  // a unit another pipeline stage holds
    AllGatherOptions o{.async_op = true, .label = std::string(label::kUpdatedParameters)};
    T* seg = model_.params() + layout_.segments()[s].begin;
    works.push_back(shard_.all_gather_v(seg, model_.params() + layout_.piece(s, rank_).begin, layout_.piece_counts(s),
                                        dtype_of<T>(), o));
  }
  for (auto& w : works) w->wait();
}

// ---- PassEvents: which backward passes reduce ---------------------------------------------

// ZeRO-1 accumulates locally and reduces at the last micro-batch (like DP); ZeRO-2/3 reduce
// every micro-batch and accumulate the received shard, or with --reduce-once accumulate their
// full gradients locally (the units' buffers stay allocated) and reduce at the last, like ZeRO-1.
template <class T>
void ZeroDataParallel<T>::begin_backward_pass(int micro_batch, int count) {
  sync_ = (stage() >= 2 && !cfg_.reduce_once) || micro_batch + 1 == count;
}

template <class T>
void ZeroDataParallel<T>::end_backward_pass(int, int) {
  if (sync_) reducer_.finish_pass();
}

// ---- UnitHooks: the spans of the trace, the reductions, ZeRO-3's parameters -----------------

template <class T>
void ZeroDataParallel<T>::before_forward(int unit) {
  params_needed(unit, unit + 1);
  tracer_.begin("forward", unit);
}

template <class T>
void ZeroDataParallel<T>::after_forward(int unit) {
  tracer_.end();
  params_done_forward(unit);
}

// Activation checkpointing reruns a unit's forward inside backward: it needs the weights.
template <class T>
void ZeroDataParallel<T>::before_recompute(int unit) {
  params_needed(unit, -1);
  tracer_.begin("recompute", unit);
}

template <class T>
void ZeroDataParallel<T>::after_recompute(int) {
  tracer_.end();
}

template <class T>
void ZeroDataParallel<T>::before_backward(int unit) {
  reducer_.poll();
  params_needed(unit, unit - 1);
  tracer_.begin("backward", unit);
}

// A split backward (zero-bubble pipelines): the gradients become final in the weight pass.
template <class T>
void ZeroDataParallel<T>::after_backward_input(int unit) {
  tracer_.end();
  params_done_backward(unit);
}

template <class T>
void ZeroDataParallel<T>::before_backward_weight(int unit) {
  tracer_.begin("backward-weight", unit);
}

template <class T>
void ZeroDataParallel<T>::after_backward(int unit) {
  tracer_.end();
  // Segment u's gradient is final once unit u ran backward: with tied embeddings the head
  // (a later unit) adds into segment 0 before the embedding does.
  if (sync_)
    for (int si : model_.segments_final_after(unit)) reducer_.start(size_t(si));
  params_done_backward(unit);
  // Rate limit (as FSDP does): unreduced gradients never pile up beyond a few units.
  reducer_.throttle();
}

// ---- Full state, for verification and checkpoints -----------------------------------------

template <class T>
void ZeroDataParallel<T>::gather_shards(T* full, const T* shard, const char* label) {
  std::vector<std::shared_ptr<Work>> works;
  for (size_t s = 0; s < layout_.segments().size(); ++s) {
    if (layout_.segments()[s].numel() == 0) continue;  // a unit another pipeline stage holds
    AllGatherOptions o{.async_op = true, .label = label};
    works.push_back(shard_.all_gather_v(full + layout_.segments()[s].begin, shard + layout_.piece(s, rank_).shard_offset,
                                        layout_.piece_counts(s), dtype_of<T>(), o));
  }
  for (auto& w : works) w->wait();
}

template <class T>
void ZeroDataParallel<T>::gather_params(std::vector<T>& out) {
  out.resize(size_t(model_.num_params()));
  ops::copy(out.data(), model_.params(), model_.num_params());
}

template <class T>
void ZeroDataParallel<T>::gather_grads(std::vector<T>& out) {
  out.resize(size_t(model_.num_params()));
  if (stage() >= 2) return gather_shards(out.data(), reducer_.shard(), "gather gradients");
  // ZeRO-1: the reduced pieces sit inside the full gradient buffer.
  Buffer<T> own(&model_.memory(), MemoryCategory::comm_buffers, layout_.shard_numel(rank_), "gradient pieces");
  for (size_t s = 0; s < layout_.segments().size(); ++s) {
    const Piece p = layout_.piece(s, rank_);
    ops::copy(own.data() + p.shard_offset, model_.grads() + p.begin, p.numel());
  }
  gather_shards(out.data(), own.data(), "gather gradients");
}

// HSDP: every replica holds the same pieces; the first replica's shard group writes them. Below
// stage 3 every rank holds all weights; each still writes only its own pieces.
template <class T>
void ZeroDataParallel<T>::save_state(TrainingCheckpointWriter<T>& ckpt) {
  if (replicate_ && replicate_->rank() != 0) return;
  optimizer_.save(ckpt, [this](size_t s) { return piece_weights(s); });
}

template <class T>
bool ZeroDataParallel<T>::weights_finite() const {
  return ops::all_finite(model_.params(), model_.num_params());  // every rank holds them whole
}

template <class T>
void ZeroDataParallel<T>::load_state(const TrainingCheckpointReader<T>& ckpt) {
  ckpt.params(0, model_.num_params(), model_.params());
  optimizer_.load(ckpt);
}

template <class T>
std::string ZeroDataParallel<T>::describe() const {
  std::string s = cfg_.describe() + " over " + std::to_string(shard_.size()) + " shard ranks";
  if (replicate_) s += " x " + std::to_string(replicate_->size()) + " replicas (HSDP)";
  return s + cfg_.reduce_note();
}

template class ZeroDataParallel<float>;
template class ZeroDataParallel<double>;

template <class T>
std::unique_ptr<DataParallelStrategy<T>> make_zero_data_parallel(Llama<T>& model, const DataParallelGroups& groups,
                                                                  const DataParallelConfig& config,
                                                                  const AdamWConfig& adamw) {
  if (config.stage == ZeroStage::none) throw Error("make_zero_data_parallel: stage none is plain DP");
  if (groups.replicate && groups.replicate->size() > 1 && config.stage < ZeroStage::zero2)
    throw InputError("HSDP needs gradient sharding: use --zero 2 or 3 with dp_shard x dp_replicate");
  if (config.stage == ZeroStage::zero3) return make_fully_sharded_data_parallel(model, groups, config, adamw);
  return std::make_unique<ZeroDataParallel<T>>(model, groups, config, adamw);
}

template std::unique_ptr<DataParallelStrategy<float>> make_zero_data_parallel<float>(Llama<float>&,
                                                                                    const DataParallelGroups&,
                                                                                    const DataParallelConfig&,
                                                                                    const AdamWConfig&);
template std::unique_ptr<DataParallelStrategy<double>> make_zero_data_parallel<double>(Llama<double>&,
                                                                                      const DataParallelGroups&,
                                                                                      const DataParallelConfig&,
                                                                                      const AdamWConfig&);

}  // namespace llama4d
