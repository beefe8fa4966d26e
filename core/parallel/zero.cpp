// ZeRO (stages 1, 2, 3 = FSDP) and HSDP, top to bottom.
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
//                                             it runs and freed right after
// Memory per rank, N params in fp32, dp ranks (activations aside):
//   DP 16N   ZeRO-1 8N + 8N/dp   ZeRO-2 4N + 12N/dp   ZeRO-3 16N/dp (+ the layers being gathered)
// Traffic per rank per step (S = 4N bytes, ring algorithms):
//   DP, ZeRO-1, ZeRO-2: 2 (dp-1)/dp S   (all-reduce, or reduce-scatter + all-gather)
//   ZeRO-3: 3 (dp-1)/dp S  (all-gather for forward, again for backward, reduce-scatter of grads);
//           2 (dp-1)/dp S when parameters stay gathered from forward to backward, which is what
//           Llama 3 did (its paper: no resharding after forward) — i.e. ZeRO-2-like memory
//           for the parameters in flight, NOT ZeRO-3's minimum. One of the seed documents
//           calls Llama 3's FSDP "ZeRO-3"; it is the reshard_after_forward=false variant.
// HSDP: shard inside a group (dp_shard, e.g. one node), replicate across groups (dp_replicate):
//   each unit's gradient is reduce-scattered inside the shard group, then the unit's piece of
//   the shard is all-reduced across replicas right behind it (as PyTorch FSDP2's HSDP), so the
//   cross-node traffic overlaps the backward of the units below. Every element is still summed
//   over dp_shard first, then over dp_replicate.
//
// Memory is allocated, not declared: the model holds its parameters and gradients per unit
// (Llama::Residency::per_unit) for the stages that shard them, so ZeRO-3 allocates a unit's
// full weights when it gathers them and frees them on release, and ZeRO-2/3 free a unit's full
// gradient once it is reduce-scattered. Shards, AdamW moments and receive buffers are Buffers
// on the same rank tracker.
//
// Exactness. Stages 2 and 3 reduce every micro-batch's gradients as soon as they exist (that
// is the point: the full gradient never has to be kept), so the sum runs micro-batch by
// micro-batch: acc = S_0, acc += S_1, ...  with S_m = (g_{0,m} + g_{1,m}) + ... in rank order.
// Stage 1 accumulates locally and reduces once at the last micro-batch, like DP. The equivalence harness makes
// its single device add in the same order, which is why the results are bitwise equal.
//
// --grad-reduce-in-bf16 (DataParallelConfig::bf16_grad_reduce): a unit's full gradient is rounded
// into a bf16 copy as its reduction starts, and that copy is what the reduce-scatter (and HSDP's
// all-reduce across replicas) moves and sums: half the bytes. Stages 2/3 free the f32 full
// gradient right then, since only the copy is read from there on. The received bf16 piece is
// widened into the f32 gradient shard: acc += S_m still adds in f32 (fp32 accumulation). Stage 1
// can no longer reduce in place (the types differ): it receives its pieces in a bf16 buffer and
// widens them into its full gradient buffer once per step.
#include <algorithm>
#include <cmath>
#include <deque>
#include <span>

#include "core/error.h"
#include "core/ops.h"
#include "core/optim/grad_clip.h"
#include "core/optim/segmented_norm.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/dp_common.h"
#include "core/parallel/shard_layout.h"

namespace llama4d {

template <class T>
class ZeroDataParallel final : public DataParallelStrategy<T> {
  using Residency = typename Llama<T>::Residency;

 public:
  ZeroDataParallel(Llama<T>& model, const DataParallelGroups& groups, const DataParallelConfig& cfg,
                   const AdamWConfig& adamw)
      : model_(model),
        data_(*groups.data),
        shard_(*groups.shard),
        replicate_(groups.replicate && groups.replicate->size() > 1 ? groups.replicate : nullptr),
        tensor_(groups.tensor),
        pipeline_(groups.pipeline && groups.pipeline->size() > 1 ? groups.pipeline : nullptr),
        tied_(groups.tied),
        cfg_(cfg),
        layout_(held_segments(model), shard_.size()),
        rank_(shard_.rank()),
        tracer_(shard_.trace(), model.num_layers()) {
    const size_t nseg = layout_.segments().size();
    const int64_t shard_n = layout_.shard_numel(rank_);
    MemoryTracker* mem = &model.memory();
    // What the model itself holds: whole parameters below stage 3, whole gradients at stage 1.
    model.set_residency(stage() == 3 ? Residency::per_unit : Residency::whole,
                        stage() >= 2 ? Residency::per_unit : Residency::whole);
    for (size_t s = 0; s < nseg; ++s) {
      const Piece p = layout_.piece(s, rank_);
      adamw_.push_back(p.numel() ? std::make_unique<AdamW<T>>(adamw, model.param_specs(), p.begin, p.end, mem) : nullptr);
    }
    if (stage() >= 2) grad_shard_ = Buffer<T>(mem, MemoryCategory::grads, shard_n, "gradient shard");
    if (cfg_.bf16_grad_reduce)
      wire_recv_ = Buffer<bf16>(mem, MemoryCategory::comm_buffers, shard_n, "reduce-scatter output (bf16)");
    else if (stage() >= 2)
      grad_recv_ = Buffer<T>(mem, MemoryCategory::comm_buffers, shard_n, "reduce-scatter output");
    wire_send_.resize(nseg);
    if (stage() == 3) param_shard_ = Buffer<T>(mem, MemoryCategory::params, shard_n, "parameter shard");
    gather_work_.resize(nseg);
    reduce_work_.resize(nseg);
    grads_freed_.assign(nseg, 0);
    accumulated_.assign(nseg, 0);
    replica_work_.resize(nseg);
  }

  void init_weights(uint64_t seed) override {
    if (stage() < 3) {
      model_.init_weights(seed);
      if (stage() == 1) model_.zero_grad();  // ZeRO-1 keeps a full gradient buffer from here on
      return;
    }
    for (size_t s = 0; s < layout_.segments().size(); ++s) {  // only this rank's pieces
      const Piece p = layout_.piece(s, rank_);
      Llama<T>::init_device_values(model_.param_specs(), seed, p.begin, p.end, param_shard_.data() + p.shard_offset);
    }
  }

  StepStats step(const std::vector<Batch>& micro_batches, double lr, T loss_scale, double grad_clip) override {
    // 1. Forward/backward per micro-batch. Stage 1 accumulates locally and reduces at the last
    //    micro-batch (like DP); stages 2/3 reduce-scatter every micro-batch and accumulate the
    //    received shard. Stage 3 gathers/frees parameters unit by unit through the hooks.
    model_.zero_grad();
    std::fill(accumulated_.begin(), accumulated_.end(), 0);
    LossSum local;
    {
      ScopedHooks<T> hooks(model_, this);
      local = this->passes().train(model_, micro_batches, loss_scale, *this);
    }
    if (keeps_params_for_step())
      for (size_t s = 0; s < layout_.segments().size(); ++s) release_params(s);
    // Tied embeddings across pipeline stages: this rank's reduced piece of the embedding's
    // gradient plus the other stage's (the two stages shard the segment alike).
    sum_tied_embedding_grads(tied_, reduced_grads(0), layout_.piece(0, rank_).numel(), cfg_.bf16_grad_reduce);
    const LossSum global = all_reduce_loss(pipeline_, all_reduce_loss(data_, local));

    // 2. Global gradient norm from what each rank holds, in the single-device order.
    const double sum_sq = sharded_sum_squares();
    const double coef = grad_clip > 0 ? clip_coefficient(sum_sq, grad_clip) : 1.0;

    // 3. Each rank updates only its pieces.
    for (size_t s = 0; s < layout_.segments().size(); ++s) {
      if (!adamw_[s]) continue;
      const Piece p = layout_.piece(s, rank_);
      T* g = reduced_grads(s);
      apply_grad_clip(g, p.numel(), coef);
      T* w = stage() == 3 ? param_shard_.data() + p.shard_offset : model_.params() + p.begin;
      adamw_[s]->step(w, g, lr);
    }
    ++steps_;

    // 4. Stages 1/2: everyone needs the full updated parameters for the next forward.
    if (stage() <= 2) all_gather_params_in_place();

    StepStats st;
    st.loss = global.mean();
    st.tokens = global.tokens;
    st.lr = lr;
    st.grad_norm = std::sqrt(sum_sq);
    return st;
  }

  LossSum evaluate(const Batch& b) override {
    sync_ = false;
    LossSum loss;
    {
      ScopedHooks<T> hooks(model_, this);
      loss = this->passes().evaluate(model_, b);
    }
    for (size_t s = 0; s < layout_.segments().size(); ++s)
      if (stage() == 3) release_params(s);
    return loss;
  }

  // ---- PassEvents: which backward passes reduce ---------------------------------------------
  void begin_backward_pass(int micro_batch, int count) override { sync_ = stage() >= 2 || micro_batch + 1 == count; }
  void end_backward_pass(int, int) override {
    if (sync_) finish_reductions();
  }

  // ---- UnitHooks: where FSDP happens -----------------------------------------------------
  void before_forward(int unit) override {
    if (stage() == 3) {
      ensure_gathered(unit);
      // Prefetch: the next unit's all-gather runs on the comm stream while this one computes.
      if (cfg_.prefetch && unit + 1 < model_.num_units() && model_.holds_unit(unit + 1)) start_gather(unit + 1);
    }
    tracer_.begin("forward", unit);
  }
  // Blocks are resharded after forward (unless kept, Llama 3's choice). The embedding and the
  // head stay gathered until their backward, as FSDP treats its root module: the head's
  // backward follows its forward at once, and a tied head needs the embedding's weights.
  void after_forward(int unit) override {
    tracer_.end();
    if (stage() == 3 && cfg_.reshard_after_forward && is_block(unit)) release_params(size_t(unit));
  }
  // Activation checkpointing reruns a unit's forward inside backward: it needs the weights.
  void before_recompute(int unit) override {
    if (stage() == 3) ensure_gathered(unit);
    tracer_.begin("recompute", unit);
  }
  void after_recompute(int) override { tracer_.end(); }
  void before_backward(int unit) override {
    free_finished_reductions();
    if (stage() == 3) {
      ensure_gathered(unit);
      if (cfg_.prefetch && unit > 0 && model_.holds_unit(unit - 1)) start_gather(unit - 1);
    }
    tracer_.begin("backward", unit);
  }
  // A split backward (zero-bubble pipelines): the input pass is the last to read a unit's
  // parameters (the weight pass reads only what it kept), so ZeRO-3 frees them here already;
  // the gradients become final in the weight pass.
  void after_backward_input(int unit) override {
    tracer_.end();
    if (stage() == 3 && !keeps_params_for_step())
      for (int si : model_.segments_final_after(unit)) release_params(size_t(si));
  }
  void before_backward_weight(int unit) override { tracer_.begin("backward-weight", unit); }
  void after_backward(int unit) override {
    tracer_.end();
    // Segment u's gradient is final once unit u ran backward: with tied embeddings the head
    // (a later unit) adds into segment 0 before the embedding does.
    if (sync_)
      for (int si : model_.segments_final_after(unit)) start_reduce(size_t(si));
    // Backward runs units last to first, so a unit's own segment has no reader left (the
    // embedding, which a tied head also reads, is the very last). In a pipeline that keeps
    // parameters, other micro-batches still need it: it stays until the step ends. A last
    // stage's copy of a tied embedding has no reader but its head.
    if (stage() == 3 && !keeps_params_for_step())
      for (int si : model_.segments_final_after(unit)) release_params(size_t(si));
    // Rate limit (as FSDP does): with more than kMaxReductionsInFlight units still being
    // reduced, wait for the oldest, so unreduced gradients never pile up beyond a few units.
    free_finished_reductions();
    while (in_flight_.size() > kMaxReductionsInFlight) {
      if (reduce_work_[in_flight_.front()]) reduction_done(in_flight_.front());
      in_flight_.pop_front();
    }
  }

  // ---- Full state, for verification and checkpoints -------------------------------------
  void gather_params(std::vector<T>& out) override {
    out.resize(size_t(model_.num_params()));
    if (stage() <= 2) {
      ops::copy(out.data(), model_.params(), model_.num_params());
      return;
    }
    gather_shards(out.data(), param_shard_.data(), "gather parameters");
  }
  void gather_grads(std::vector<T>& out) override {
    out.resize(size_t(model_.num_params()));
    if (stage() == 1) {  // the reduced pieces sit inside the full gradient buffer
      Buffer<T> own(&model_.memory(), MemoryCategory::comm_buffers, layout_.shard_numel(rank_), "gradient pieces");
      copy_pieces(own.data(), model_.grads());
      gather_shards(out.data(), own.data(), "gather gradients");
      return;
    }
    gather_shards(out.data(), grad_shard_.data(), "gather gradients");
  }
  void save_state(TrainingCheckpointWriter<T>& ckpt) override {
    // HSDP: every replica holds the same pieces; the first replica's shard group writes them.
    if (replicate_ && replicate_->rank() != 0) return;
    for (size_t s = 0; s < layout_.segments().size(); ++s) {
      const Piece p = layout_.piece(s, rank_);
      if (p.numel() == 0 || !counts_segment(model_, int(s))) continue;  // a tied copy: the first stage writes it
      // Below stage 3 every rank holds all weights; each still writes only its own pieces.
      ckpt.params(p.begin, p.end, stage() == 3 ? param_shard_.data() + p.shard_offset : model_.params() + p.begin);
      ckpt.exp_avg(p.begin, p.end, adamw_[s]->exp_avg().data());
      ckpt.exp_avg_sq(p.begin, p.end, adamw_[s]->exp_avg_sq().data());
    }
  }
  int64_t optimizer_steps() const override { return steps_; }
  bool weights_finite() const override {
    if (stage() == 3) return ops::all_finite(param_shard_.data(), param_shard_.size());
    return ops::all_finite(model_.params(), model_.num_params());  // every rank holds them whole
  }
  void load_state(const TrainingCheckpointReader<T>& ckpt) override {
    if (stage() == 3) {
      for (size_t s = 0; s < layout_.segments().size(); ++s) {
        const Piece p = layout_.piece(s, rank_);
        ckpt.params(p.begin, p.end, param_shard_.data() + p.shard_offset);
      }
    } else {
      ckpt.params(0, model_.num_params(), model_.params());
    }
    for (size_t s = 0; s < adamw_.size(); ++s)
      if (adamw_[s]) {
        const Piece p = layout_.piece(s, rank_);
        ckpt.exp_avg(p.begin, p.end, adamw_[s]->mutable_exp_avg());
        ckpt.exp_avg_sq(p.begin, p.end, adamw_[s]->mutable_exp_avg_sq());
        adamw_[s]->set_step_count(ckpt.optimizer_steps());
      }
    steps_ = ckpt.optimizer_steps();
  }

  RankMemory peak_memory() const override { return memory_peaks(model_.memory()); }
  std::string describe() const override {
    std::string s = cfg_.describe() + " over " + std::to_string(shard_.size()) + " shard ranks";
    if (replicate_) s += " x " + std::to_string(replicate_->size()) + " replicas (HSDP)";
    return s + cfg_.reduce_note();
  }

 private:
  int stage() const { return int(cfg_.stage); }
  // ZeRO-3 without resharding under pipeline parallelism (Llama 3's choice): a stage's
  // micro-batches interleave forward and backward, so releasing a unit after either would
  // gather it again for every micro-batch, 2m all-gathers per unit and step instead of one.
  bool keeps_params_for_step() const { return stage() == 3 && !cfg_.reshard_after_forward && pipeline_; }
  bool is_block(int unit) const { return unit != embedding_unit() && unit != head_unit(model_.num_layers()); }

  // Copies this rank's pieces of a full flat buffer into a shard buffer (pieces back to back).
  void copy_pieces(T* shard, const T* full) const {
    for (size_t s = 0; s < layout_.segments().size(); ++s) {
      const Piece p = layout_.piece(s, rank_);
      ops::copy(shard + p.shard_offset, full + p.begin, p.numel());
    }
  }

  // Full flat buffer from every rank's shard buffer, segment by segment (uneven pieces).
  void gather_shards(T* full, const T* shard, const char* label) {
    std::vector<std::shared_ptr<Work>> works;
    for (size_t s = 0; s < layout_.segments().size(); ++s) {
      if (layout_.segments()[s].numel() == 0) continue;  // a unit another pipeline stage holds
      AllGatherOptions o;
      o.async_op = true;
      o.label = label;
      works.push_back(shard_.all_gather_v(full + layout_.segments()[s].begin, shard + layout_.piece(s, rank_).shard_offset,
                                          layout_.piece_counts(s), dtype_of<T>(), o));
    }
    for (auto& w : works) w->wait();
  }

  // Stages 1/2 after the optimizer: every rank's updated pieces to every rank (in place).
  void all_gather_params_in_place() {
    std::vector<std::shared_ptr<Work>> works;
    for (size_t s = 0; s < layout_.segments().size(); ++s) {
      if (layout_.segments()[s].numel() == 0) continue;  // a unit another pipeline stage holds
      AllGatherOptions o;
      o.async_op = true;
      o.label = "updated parameters";
      T* seg = model_.params() + layout_.segments()[s].begin;
      works.push_back(shard_.all_gather_v(seg, model_.params() + layout_.piece(s, rank_).begin, layout_.piece_counts(s),
                                          dtype_of<T>(), o));
    }
    for (auto& w : works) w->wait();
  }

  // ---- ZeRO-3 parameter life cycle: allocate on gather, free on release ------------------
  void start_gather(int unit) {
    for (int si : model_.segments_used_by(unit)) {
      const size_t s = size_t(si);
      if (model_.unit_params(si)) continue;  // gathered, or its gather is in flight
      model_.allocate_unit_params(si, "gathered parameters of " + unit_name(si, model_.num_layers()));
      AllGatherOptions o;
      o.async_op = true;
      o.label = "params " + unit_name(si, model_.num_layers());
      gather_work_[s] = shard_.all_gather_v(model_.unit_params(si), param_shard_.data() + layout_.piece(s, rank_).shard_offset,
                                            layout_.piece_counts(s), dtype_of<T>(), o);
    }
  }
  void ensure_gathered(int unit) {
    start_gather(unit);
    for (int si : model_.segments_used_by(unit)) {
      const size_t s = size_t(si);
      if (gather_work_[s]) gather_work_[s]->wait();
      gather_work_[s].reset();
    }
  }
  void release_params(size_t s) {
    if (gather_work_[s]) gather_work_[s]->wait();  // a prefetch still writing into it
    gather_work_[s].reset();
    model_.free_unit_params(int(s));
  }

  // ---- Gradient reduction ----------------------------------------------------------------
  // This rank's summed gradient of its piece of segment s: inside the full gradient buffer for
  // ZeRO-1 (reduced in place), in the gradient shard for stages 2/3.
  T* reduced_grads(size_t s) {
    const Piece p = layout_.piece(s, rank_);
    return stage() == 1 ? model_.grads() + p.begin : grad_shard_.data() + p.shard_offset;
  }

  // Every stage reduce-scatters: a rank only needs the summed gradient of the pieces it updates.
  void start_reduce(size_t s) {
    const std::string unit = unit_name(layout_.segments()[s].unit, model_.num_layers());
    ReduceScatterOptions o;
    o.async_op = true;
    o.label = "grads " + unit;
    in_flight_.push_back(s);
    reduced_this_pass_.push_back(s);
    T* full = model_.unit_grads(int(s));
    if (!full) throw Error("ZeRO: unit " + std::to_string(s) + " produced no gradient to reduce");
    grads_freed_[s] = 0;
    const int64_t shard_offset = layout_.piece(s, rank_).shard_offset;
    if (cfg_.bf16_grad_reduce) {
      wire_send_[s] = bf16_wire(model_.memory(), full, layout_.segments()[s].numel(), "bf16 " + o.label);
      free_unit_grads_once(s);  // stages 2/3: the copy is all the reduction reads
      reduce_work_[s] = shard_.reduce_scatter_v(wire_recv_.data() + shard_offset, wire_send_[s].data(),
                                                layout_.piece_counts(s), DType::bf16, ReduceOp::sum, o);
    } else {
      T* out = stage() == 1 ? model_.grads() + layout_.piece(s, rank_).begin  // in place
                            : grad_recv_.data() + shard_offset;
      reduce_work_[s] = shard_.reduce_scatter_v(out, full, layout_.piece_counts(s), dtype_of<T>(), ReduceOp::sum, o);
    }
    if (replicate_) start_replica_reduce(s, unit);
  }

  // HSDP: this rank's piece of segment s, [piece numel] in the reduce-scatter output, summed in
  // place across the replicas. Queued now, right behind its reduce-scatter: the rank's comm
  // stream runs it as soon as the reduce-scatter landed (stream order, as FSDP2 orders its
  // all-reduce after its reduce-scatter). Queuing it when a poll first sees the reduce-scatter
  // done instead would order the two groups' collectives differently on different ranks, and
  // one FIFO stream per rank (as NCCL's) can then deadlock: A waits for B in the shard group
  // while B waits for C in its replica group, ... Every replica of a shard rank holds the same
  // pieces, so an empty one is skipped by the whole replica group alike.
  void start_replica_reduce(size_t s, const std::string& unit) {
    const Piece p = layout_.piece(s, rank_);
    if (p.numel() == 0) return;
    AllReduceOptions o;
    o.async_op = true;
    o.label = "grads across replicas " + unit;
    if (cfg_.bf16_grad_reduce)
      replica_work_[s] = replicate_->all_reduce(wire_recv_.data() + p.shard_offset, p.numel(), DType::bf16, ReduceOp::sum, o);
    else
      replica_work_[s] = replicate_->all_reduce(grad_recv_.data() + p.shard_offset, p.numel(), dtype_of<T>(), ReduceOp::sum, o);
  }

  // A reduction that finished frees its unit's full gradient right away (stages 2/3): that
  // is where ZeRO-2 saves memory, since later units' backward runs without it. Freeing follows
  // this laptop's threads (a poll), but the compute waits for a result only at fixed points
  // (the rate limit, the end of the backward), so the simulated clock never depends on timing.
  void free_unit_grads_once(size_t s) {
    if (stage() >= 2 && !grads_freed_[s]) model_.free_unit_grads(int(s));
    grads_freed_[s] = 1;
  }
  void reduction_done(size_t s) {
    reduce_work_[s]->wait();  // rethrows a failure, joins the simulated clocks
    reduce_work_[s].reset();
    free_unit_grads_once(s);
    wire_send_[s].reset();
  }
  void free_finished_reductions() {
    for (size_t s = 0; s < reduce_work_.size(); ++s)
      if (reduce_work_[s] && reduce_work_[s]->is_completed()) {
        reduce_work_[s]->collect();  // rethrows a failure; the clock waits later, at a fixed point
        free_unit_grads_once(s);
        wire_send_[s].reset();
      }
  }

  // After a reducing backward pass: wait for its reductions and (HSDP) the all-reduces across
  // replicas behind them, then add each reduced segment's received piece to the accumulated
  // gradient shard. Every micro-batch, like the reduce-scatters:
  // acc += (sum over replicas of (sum over dp_shard)), the order the equivalence harness replays.
  // Per segment: a pipeline rank with several model chunks reduces one chunk's units per pass.
  void finish_reductions() {
    for (size_t s = 0; s < reduce_work_.size(); ++s)
      if (reduce_work_[s]) reduction_done(s);
    in_flight_.clear();
    std::vector<size_t> reduced;
    reduced.swap(reduced_this_pass_);
    if (stage() == 1 && !cfg_.bf16_grad_reduce) return;  // reduced in place, once per step
    for (size_t s : reduced) {
      if (replica_work_[s]) {
        replica_work_[s]->wait();  // rethrows a failure (a peer's timeout at worst), joins the simulated clocks
        replica_work_[s].reset();
      }
      const Piece p = layout_.piece(s, rank_);
      T* acc = reduced_grads(s);  // stage 1: once per step, into the full gradient buffer
      if (cfg_.bf16_grad_reduce)
        ops::from_bf16(acc, wire_recv_.data() + p.shard_offset, p.numel(), accumulated_[s] != 0);
      else if (accumulated_[s])
        ops::accumulate(acc, grad_recv_.data() + p.shard_offset, p.numel());
      else
        ops::copy(acc, grad_recv_.data() + p.shard_offset, p.numel());
      accumulated_[s] = 1;
    }
  }

  // Chunk partials of this rank's gradient pieces, gathered from every shard rank and added
  // segment by segment, chunk by chunk: the single-device order, so the same bits.
  double sharded_sum_squares() {
    const auto& segs = layout_.segments();
    const int n = shard_.size();
    std::vector<int64_t> counts(size_t(n), 0);
    std::vector<double> mine;
    // A tied embedding's copy is counted by the first stage only.
    auto partials = [&](size_t s, int r) { return counts_segment(model_, int(s)) ? num_chunk_partials(layout_.piece(s, r).numel()) : 0; };
    for (size_t s = 0; s < segs.size(); ++s) {
      for (int r = 0; r < n; ++r) counts[size_t(r)] += partials(s, r);
      if (counts_segment(model_, int(s))) append_chunk_partials(mine, reduced_grads(s), layout_.piece(s, rank_).numel());
    }
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    std::vector<double> all(static_cast<size_t>(total));
    AllGatherOptions o;
    o.label = "grad-norm partials";
    shard_.all_gather_v(all.data(), mine.data(), counts, DType::f64, o)->wait();
    // `all` is rank-major; walk it segment-major.
    std::vector<int64_t> cursor(size_t(n), 0);
    for (int r = 1; r < n; ++r) cursor[size_t(r)] = cursor[size_t(r - 1)] + counts[size_t(r - 1)];
    std::vector<double> ordered;
    ordered.reserve(size_t(total));
    for (size_t s = 0; s < segs.size(); ++s)
      for (int r = 0; r < n; ++r) {
        const int64_t k = partials(s, r);
        ordered.insert(ordered.end(), all.begin() + cursor[size_t(r)], all.begin() + cursor[size_t(r)] + k);
        cursor[size_t(r)] += k;
      }
    const double slice_sum_sq = pipeline_sum_squares(pipeline_, model_, ordered);
    if (!tensor_) return slice_sum_sq;
    // Tensor parallelism: the replicas among this shard group's pieces, then the slices' sums.
    double replicas = 0;
    for (size_t s = 0; s < segs.size(); ++s) {
      const Piece p = layout_.piece(s, rank_);
      replicas += replica_sum_squares(model_.param_specs(), p.begin, p.end, reduced_grads(s));
    }
    AllReduceOptions r;
    r.label = "grad-norm replicas";
    shard_.all_reduce(&replicas, 1, DType::f64, ReduceOp::sum, r)->wait();
    return tensor_parallel_sum_squares(tensor_, slice_sum_sq,
                                       pipeline_sum(pipeline_, replicas, "grad-norm replicas (pipeline stages)"));
  }

  Llama<T>& model_;
  ProcessGroup& data_;
  ProcessGroup& shard_;
  ProcessGroup* replicate_;
  ProcessGroup* tensor_;
  ProcessGroup* pipeline_;  // null without pipeline parallelism
  ProcessGroup* tied_;      // pp with tied embeddings, first and last stage only
  DataParallelConfig cfg_;
  ShardLayout layout_;
  int rank_;
  UnitTracer tracer_;
  bool sync_ = false;
  int64_t steps_ = 0;
  std::vector<std::unique_ptr<AdamW<T>>> adamw_;  // one per segment piece (null when empty)
  Buffer<T> param_shard_, grad_shard_, grad_recv_;
  Buffer<bf16> wire_recv_;               // bf16 gradient reductions: the reduce-scatter's output
  std::vector<Buffer<bf16>> wire_send_;  // [segment] its bf16 full gradient while being reduced
  std::vector<std::shared_ptr<Work>> gather_work_, reduce_work_;
  std::vector<uint8_t> grads_freed_;  // [segment] its full gradient was freed by a poll
  std::vector<uint8_t> accumulated_;  // [segment] its gradient shard holds a micro-batch's sum this step
  std::vector<std::shared_ptr<Work>> replica_work_;  // HSDP: per segment, its all-reduce across replicas
  std::deque<size_t> in_flight_;  // segments with a reduce-scatter in flight, oldest first
  std::vector<size_t> reduced_this_pass_;  // segments reduce-scattered since the last finish_reductions
  static constexpr size_t kMaxReductionsInFlight = 2;
};

template <class T>
std::unique_ptr<DataParallelStrategy<T>> make_zero_data_parallel(Llama<T>& model, const DataParallelGroups& groups,
                                                                  const DataParallelConfig& config,
                                                                  const AdamWConfig& adamw) {
  if (config.stage == ZeroStage::none) throw Error("make_zero_data_parallel: stage none is plain DP");
  if (groups.replicate && groups.replicate->size() > 1 && config.stage < ZeroStage::zero2)
    throw InputError("HSDP needs gradient sharding: use --zero 2 or 3 with dp_shard x dp_replicate");
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
