#include "core/parallel/parallel_trainer.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>

#include "core/comm/rank_failure.h"
#include "core/error.h"
#include "core/io/atomic_dir.h"
#include "core/ops.h"
#include "core/parallel/dp_common.h"
#include "core/train/checkpoint_state.h"

namespace llama4d {

int64_t rank_micro_batch_rows(const TrainOptions& opt, int dp) {
  if (opt.batch_size % dp != 0)
    throw InputError("--batch-size " + std::to_string(opt.batch_size) + " is not divisible by the " +
                     std::to_string(dp) + " data-parallel ranks");
  const int64_t rows = opt.batch_size / dp;
  const int64_t mb = opt.micro_batch_size > 0 ? opt.micro_batch_size : rows;
  if (rows % mb != 0)
    throw InputError("each data-parallel rank gets " + std::to_string(rows) + " rows, not divisible by --micro-batch-size " +
                     std::to_string(mb) + " (0: all of a rank's rows)");
  return mb;
}

int64_t rank_micro_batch_count(const TrainOptions& opt, int dp) {
  return opt.batch_size / dp / rank_micro_batch_rows(opt, dp);
}

namespace {

// A data rank's share of the step's global batch, rows [data_rank·rows, (data_rank+1)·rows) with
// rows = batch/dp, as micro-batches of mb rows; sample(lo, hi) draws global rows [lo, hi).
template <class Sample>
std::vector<Batch> rank_rows_as_micro_batches(const TrainOptions& opt, int data_rank, int dp, Sample sample) {
  const int64_t mb = rank_micro_batch_rows(opt, dp), rows = opt.batch_size / dp, first = data_rank * rows;
  std::vector<Batch> out;
  for (int64_t r = first; r < first + rows; r += mb) {
    out.push_back(sample(r, r + mb));
    if (opt.doc_mask) mark_documents(out.back(), opt.doc_separator);
  }
  return out;
}

}  // namespace

std::vector<Batch> data_rank_micro_batches(TokenSpan train, const TrainOptions& opt, int64_t step, int data_rank,
                                           int dp) {
  return rank_rows_as_micro_batches(opt, data_rank, dp, [&](int64_t lo, int64_t hi) {
    return sample_rows(train, opt.seq_len, opt.seed, step, lo, hi);
  });
}

namespace {

void check_mix_rows(const DataMix& mix, int64_t seq_len) {
  if (mix.seq_len() != seq_len)
    throw InputError("the data mix draws rows of " + std::to_string(mix.seq_len()) +
                     " tokens, and the run's sequence length (--seq-len, or its recipe stage's seq_len) is " +
                     std::to_string(seq_len));
}

}  // namespace

std::vector<Batch> data_rank_micro_batches(const DataMix& mix, const TrainOptions& opt, int64_t step, int data_rank,
                                           int dp) {
  check_mix_rows(mix, opt.seq_len);
  return rank_rows_as_micro_batches(opt, data_rank, dp,
                                    [&](int64_t lo, int64_t hi) { return mix.sample_rows(opt.seed, step, lo, hi); });
}

template <class T>
void ParallelTrainer<T>::set_data_mix(const DataMix* mix) {
  if (mix) check_mix_rows(*mix, opt_.seq_len);
  mix_ = mix;
}

template <class T>
void ParallelTrainer<T>::continue_with(const TrainOptions& next) {
  // The checks of the constructor and of read_share, for the options a resume would bring. The
  // strategy, groups, model slices and pipeline layout depend on the plan alone, and the AdamW
  // hyperparameters and precision are among what check_resumable holds equal.
  next.validate();
  check_resumable(opt_, steps_done_, next);
  plan_.check_model(model_.config(), int(rank_micro_batch_count(next, plan_.dp())));
  plan_.check_sequence(next.seq_len);
  LrSchedule schedule{.max_lr = next.lr, .min_lr = next.min_lr,
                      .warmup_steps = std::min(next.warmup_steps, next.steps), .total_steps = next.steps};
  schedule.validate();
  opt_ = next;
  schedule_ = schedule;
  mix_ = nullptr;
}

template <class T>
ParallelTrainer<T>::ParallelTrainer(ProcessGroup& world, Llama<T>& model, const TextDataset& data,
                                    const TrainOptions& options, const ParallelPlan& plan)
    : world_(world), model_(model), data_(data), opt_(options), plan_(plan) {
  opt_.validate();
  plan_.validate();
  plan_.check_precision(opt_.bf16_compute);
  model_.set_bf16_compute(opt_.bf16_compute);
  if (world.size() != plan_.world_size())
    throw InputError("mesh " + plan_.describe_mesh() + " needs " + std::to_string(plan_.world_size()) +
                     " ranks, the world has " + std::to_string(world.size()));
  plan_.check_model(model.config(), int(rank_micro_batch_count(opt_, plan_.dp())));  // validates the split too
  plan_.check_sequence(opt_.seq_len);
  schedule_ = LrSchedule{.max_lr = opt_.lr, .min_lr = opt_.min_lr,
                         .warmup_steps = std::min(opt_.warmup_steps, opt_.steps), .total_steps = opt_.steps};
  schedule_.validate();
  // A mesh without a data-parallel dim (tp only) gets dp=1, so the data group always exists.
  std::vector<MeshDim> dims = plan_.mesh;
  std::vector<std::string> data_dims = plan_.data_dims();
  const bool ep = plan_.size("ep") > 1;
  // Expert parallelism: the data ranks holding the same experts are the data dims without ep.
  std::vector<std::string> expert_data_dims;
  for (const std::string& d : data_dims)
    if (d != "ep") expert_data_dims.push_back(d);
  if (expert_data_dims.empty()) {
    dims.push_back({"dp", 1});
    data_dims.push_back("dp");
    expert_data_dims = {"dp"};
  }
  mesh_ = std::make_unique<DeviceMesh>(world, dims);
  model.set_checkpointing(plan_.ac);

  // Tensor parallelism: this rank's model holds the slice its tp coordinate names, and runs
  // with the group's communication at the model's communication points.
  const TpLayout expected = plan_.tp_layout(model.config(), world.rank());
  const TpLayout& held = model.tp_layout();
  if (held.tp != expected.tp || held.rank != expected.rank)
    throw Error("ParallelTrainer: the model holds " + (held.sliced() ? held.describe() : "the whole model") +
                ", the plan gives this rank " + (expected.sliced() ? expected.describe() : "the whole model"));
  DataParallelGroups groups;
  // Pure data parallelism: the data group is the world itself (messages say "rank 3", not
  // "rank 3 of 'dp' (world rank 3)").
  dp_group_ = plan_.dp() == world.size() ? &world : &mesh_->group(data_dims);
  // Context parallelism: the cp ranks of a data rank hold the same weights and see different
  // tokens of the same rows, so gradients are summed (and ZeRO shards) over cp x dp, as
  // torchtitan folds cp into FSDP's mesh.
  const int cp = plan_.size("cp");
  if (cp > 1) data_dims.insert(data_dims.begin(), "cp");
  groups.dp_cp = cp > 1 ? (plan_.dp() * cp == world.size() ? &world : &mesh_->group(data_dims)) : dp_group_;
  groups.shard = plan_.hsdp() ? (cp > 1 ? &mesh_->group({"cp", "dp_shard"}) : &mesh_->group("dp_shard")) : groups.dp_cp;
  groups.replicate = plan_.hsdp() ? &mesh_->group("dp_replicate") : nullptr;
  // Expert parallelism: this rank's model holds its ep coordinate's experts, and its MoE layers
  // exchange rows over the ep group. The dense weights are summed over every data rank (dp_cp),
  // the experts' over the data ranks holding the same ones.
  const ExpertShard experts = plan_.expert_shard(model.config(), world.rank());
  if (model.expert_shard().first != experts.first || model.expert_shard().count != experts.count)
    throw Error("ParallelTrainer: the model holds experts [" + std::to_string(model.expert_shard().first) + ", +" +
                std::to_string(model.expert_shard().count) + "), the plan gives this rank [" +
                std::to_string(experts.first) + ", +" + std::to_string(experts.count) + ") (+0: all)");
  replica_group_ = groups.dp_cp;
  if (ep) {
    groups.expert_parallel = &mesh_->group("ep");
    groups.experts = &mesh_->group(expert_data_dims);
    replica_group_ = groups.experts;  // who holds every weight of this rank
    expert_comm_ = std::make_unique<ExpertParallelComm<T>>(*groups.expert_parallel);
    model.set_block_comm(expert_comm_.get());
  }
  if (expected.sliced()) {
    groups.tensor = &mesh_->group("tp");
    tensor_comm_ = std::make_unique<TensorParallelComm<T>>(*groups.tensor, model.config(), expected);
    model.set_block_comm(tensor_comm_.get());
    model.set_vocabulary(tensor_comm_.get());
  }
  if (cp > 1) {
    context_comm_ = std::make_unique<ContextParallelComm<T>>(mesh_->group("cp"), plan_.cp_algo);
    model.set_context_split(cp, plan_.coordinate("cp", world.rank()));
    if (tensor_comm_) {
      tensor_context_comm_ = std::make_unique<TensorContextComm<T>>(*tensor_comm_, *context_comm_);
      model.set_block_comm(tensor_context_comm_.get());
    } else {
      model.set_block_comm(context_comm_.get());
    }
  }
  // Pipeline parallelism: this rank's model holds its stages' units, and the step's passes run
  // as this rank's list of the schedule.
  const std::vector<UnitRange> stages = plan_.held_units(model.config(), world.rank());
  for (int u = 0; u < model.num_units(); ++u) {
    bool expected_held = stages.empty();
    for (const UnitRange& r : stages) expected_held = expected_held || r.contains(u);
    if (model.runs_unit(u) != expected_held)
      throw Error("ParallelTrainer: the model " + std::string(model.runs_unit(u) ? "holds " : "lacks ") +
                  unit_name(u, model.num_layers()) + ", which the plan gives " + (expected_held ? "this rank" : "another pipeline rank"));
  }
  if (plan_.size("pp") > 1) {
    groups.pipeline = &mesh_->group("pp");
    // Tied embeddings: the first and the last stage each hold the embedding (the last as the
    // head's weights); the two ranks of a pipeline that hold it sum their gradients.
    const int pp = plan_.size("pp"), first = 0, last = pp - 1, me = groups.pipeline->rank();
    if (model.config().tie_word_embeddings && (me == first || me == last)) {
      tied_group_ = groups.pipeline->new_group({first, last}, "tied embedding (pp ranks " + std::to_string(first) + ", " +
                                                                   std::to_string(last) + ")");
      groups.tied = tied_group_.get();
    }
    pipeline_ = std::make_unique<PipelineRunner<T>>(*groups.pipeline, plan_.schedule, plan_.pipeline_layout(model.config()));
  }
  dp_cp_group_ = groups.dp_cp;
  strategy_ = make_data_parallel(model, groups, plan_.data_parallel(), opt_.adamw);
  strategy_->set_passes(pipeline_.get());
  strategy_->init_weights(opt_.seed);  // each rank allocates and computes only what it keeps
}

template <class T>
std::string ParallelTrainer<T>::describe() const {
  const TpLayout& t = model_.tp_layout();
  std::string s;
  if (t.sliced()) s = "TP over " + std::to_string(t.tp) + " ranks" + (t.sequence_parallel ? " with SP" : "");
  if (context_comm_)
    s += std::string(s.empty() ? "" : ", ") + "CP over " + std::to_string(plan_.size("cp")) + " ranks (" +
         std::string(context_algo_name(plan_.cp_algo)) + ")";
  if (pipeline_) {
    const PipelineSchedule& sch = pipeline_->schedule(int(rank_micro_batch_count(opt_, plan_.dp())));
    s += std::string(s.empty() ? "" : ", ") + "PP over " + std::to_string(sch.ranks) + " ranks (" + sch.name() + ")";
  }
  if (s.empty()) return strategy_->describe();
  // A single data-parallel rank without ZeRO does nothing worth naming.
  if (dp_group_->size() == 1 && plan_.zero == ZeroStage::none) return s;
  return s + ", " + strategy_->describe();
}

template <class T>
Batch ParallelTrainer<T>::local_tokens(const Batch& b) const {
  if (!context_comm_) return b;
  return context_slice(b, plan_.size("cp"), plan_.coordinate("cp", world_.rank()));
}

template <class T>
StepStats ParallelTrainer<T>::step() {
  const auto t0 = std::chrono::steady_clock::now();
  // Ranks of one tensor-parallel group share a data rank: they run the same rows.
  std::vector<Batch> mbs =
      mix_ ? data_rank_micro_batches(*mix_, opt_, steps_done_, dp_group_->rank(), dp_group_->size())
           : data_rank_micro_batches(data_.train(), opt_, steps_done_, dp_group_->rank(), dp_group_->size());
  for (Batch& b : mbs) b = local_tokens(b);
  const T loss_scale = T(1.0 / double(opt_.tokens_per_step()));
  StepStats st = strategy_->step(mbs, opt_.lr_at(schedule_, steps_done_ + 1), loss_scale, opt_.grad_clip);
  if (model_.config().moe()) sum_routing(st, strategy_->passes().routing, strategy_->passes().aux_terms);
  // Loss and norm are global (all-reduced), so every rank stops at the same step.
  check_finite(steps_done_ + 1, st.loss, st.grad_norm * st.grad_norm);
  st.step = ++steps_done_;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

template <class T>
void ParallelTrainer<T>::sum_routing(StepStats& into, const StepStats& local, const std::vector<double>& terms) {
  // The aux loss: every rank gathers every data rank's (share, aux) per micro-batch (each has as
  // many micro-batches) and folds them in global micro-batch order (rank 0's first), as one
  // device adds its micro-batches: the same bits on every rank and plan. The [L, E] counts are
  // integers, summed over the data ranks.
  const int64_t L = model_.config().num_hidden_layers, E = model_.config().num_local_experts;
  const int dp = dp_cp_group_->size();
  std::vector<double> all(terms.size() * size_t(dp));
  dp_cp_group_->all_gather(all.data(), terms.data(), int64_t(terms.size()), DType::f64, {.label = "aux loss"})->wait();
  double aux = 0;
  for (size_t i = 0; i + 1 < all.size(); i += 2) aux = add_weighted_aux(aux, all[i], all[i + 1]);
  std::vector<int64_t> counts(size_t(L * E), 0);
  for (int64_t l = 0; l < L && !local.expert_tokens.empty(); ++l)
    for (int64_t e = 0; e < E; ++e) counts[size_t(l * E + e)] = local.expert_tokens[size_t(l)][size_t(e)];
  dp_cp_group_->all_reduce(counts.data(), L * E, DType::i64, ReduceOp::sum, {.label = "expert token counts"})->wait();
  into.aux_loss = aux;
  into.expert_tokens.assign(size_t(L), std::vector<int64_t>(size_t(E), 0));
  for (int64_t l = 0; l < L; ++l)
    for (int64_t e = 0; e < E; ++e) into.expert_tokens[size_t(l)][size_t(e)] = counts[size_t(l * E + e)];
}

template <class T>
LossSum ParallelTrainer<T>::validation_loss(int64_t max_windows) {
  const TokenSpan val = data_.validation();
  int64_t windows = num_eval_windows(int64_t(val.size()), opt_.seq_len);
  if (max_windows > 0) windows = std::min(windows, max_windows);
  const int64_t dp = dp_group_->size(), d = dp_group_->rank();
  const int64_t w0 = windows * d / dp, w1 = windows * (d + 1) / dp;
  const int64_t rows = std::max<int64_t>(1, rank_micro_batch_rows(opt_, int(dp)));
  // Every data rank makes the same number of evaluate calls, because under ZeRO-3 each one gathers
  // parameters over the data group. When dp does not divide the windows, a rank with one window
  // fewer evaluates a spare window (its last, or window 0) and drops that loss.
  const int64_t most = (windows + dp - 1) / dp, spare = std::max<int64_t>(0, w1 - 1);
  LossSum local;
  for (int64_t i = 0; i < most; i += rows) {
    const int64_t a = w0 + i, b = std::min(w1, a + rows);
    Batch whole = a < b ? eval_windows(val, opt_.seq_len, a, b) : eval_windows(val, opt_.seq_len, spare, spare + 1);
    if (opt_.doc_mask) mark_documents(whole, opt_.doc_separator);  // over whole rows, before the context split
    const LossSum part = strategy_->evaluate(local_tokens(whole));
    if (a >= b) continue;
    local.loss_sum += part.loss_sum;
    local.tokens += part.tokens;
  }
  return all_reduce_loss(pipeline_ ? &pipeline_->group() : nullptr, all_reduce_loss(*dp_cp_group_, local));
}

namespace {

// Throws this rank's own error if it failed, else one naming the rank that did.
[[noreturn]] void throw_checkpoint_failure(const std::exception_ptr& own, int failed_rank, const std::string& dir) {
  if (own) std::rethrow_exception(own);
  throw IoError("checkpoint " + dir + " was not written: rank " + std::to_string(failed_rank) + " failed");
}

}  // namespace

template <class T>
void ParallelTrainer<T>::write_share(TrainingCheckpointWriter<T>& writer) {
  if (!strategy_->weights_finite())
    throw DivergenceError("step " + std::to_string(steps_done_) + ": some weights of this rank are not finite "
                          "(training diverged; is --lr too large?); the state is not saved");
  strategy_->save_state(writer);
  writer.finish();
}

template <class T>
void ParallelTrainer<T>::save_state(TrainingStateImage<T>& image, const std::function<void()>& written) {
  // The phases of save_checkpoint without the files: rank 0 lays the image out, then every rank
  // writes its share through the same strategy code, each phase closed by a collective.
  std::exception_ptr error;
  int32_t failed = 0;
  if (world_.rank() == 0)
    failed = capture_failure(error, [&] {
      TrainingCheckpointWriter<T>(image, 0, model_.config(), model_.param_specs())
          .create(strategy_->optimizer_steps(), steps_done_, opt_);
    });
  int bad = first_failed_rank(world_, failed, "state image laid out");
  if (bad >= 0) throw_checkpoint_failure(error, bad, "<in-memory image>");
  failed = capture_failure(error, [&] {
    TrainingCheckpointWriter<T> writer(image, world_.rank(), model_.config(), model_.param_specs());
    write_share(writer);
    if (written) written();
  });
  bad = first_failed_rank(world_, failed, "state image written");
  if (bad >= 0) throw_checkpoint_failure(error, bad, "<in-memory image>");
}

template <class T>
void ParallelTrainer<T>::save_checkpoint(const std::string& dir) {
  // Every rank writes its own share straight into the files; nobody gathers the whole state.
  // Three phases, each closed by a collective, so that a failure on any rank reaches all:
  //   1. world rank 0 stages the directory and creates every file at full size;
  //   2. every rank writes what it is responsible for (strategy save_state) and syncs it;
  //   3. world rank 0 moves the directory into place (or, on failure, removes it).
  // Ranks of several processes (MPI) must share the filesystem, as with any sharded checkpoint.
  std::unique_ptr<StagedDirectory> staged;
  std::string staging;
  std::exception_ptr error;
  int32_t failed = 0;
  if (world_.rank() == 0)
    failed = capture_failure(error, [&] {
      staged = std::make_unique<StagedDirectory>(dir, kConfigFile);  // replaces only a checkpoint
      TrainingCheckpointWriter<T>(staged->staging(), model_.config(), model_.param_specs())
          .create(strategy_->optimizer_steps(), steps_done_, opt_);
      staging = staged->staging();
    });
  // Phase 1 ends with the staging path reaching every rank (other processes cannot derive it).
  int64_t length = failed ? -1 : int64_t(staging.size());
  BroadcastOptions b{.label = "checkpoint staged"};
  world_.broadcast(&length, 1, DType::i64, b)->wait();
  if (length < 0) throw_checkpoint_failure(error, 0, dir);
  staging.resize(size_t(length));
  world_.broadcast(staging.data(), length, DType::u8, b)->wait();

  failed = capture_failure(error, [&] {
    TrainingCheckpointWriter<T> writer(staging, model_.config(), model_.param_specs());
    write_share(writer);
  });
  int bad = first_failed_rank(world_, failed, "checkpoint written");
  if (bad >= 0) throw_checkpoint_failure(error, bad, dir);  // rank 0's `staged` removes the files

  if (world_.rank() == 0) failed = capture_failure(error, [&] { staged->commit(); });
  bad = first_failed_rank(world_, failed, "checkpoint committed");
  if (bad >= 0) throw_checkpoint_failure(error, bad, dir);
}

template <class T>
void ParallelTrainer<T>::load_checkpoint(const std::string& dir) {
  read_share(TrainingCheckpointReader<T>(dir, model_.config(), model_.param_specs()));
}

template <class T>
void ParallelTrainer<T>::load_state(const TrainingStateImage<T>& image) {
  // Closed by a collective, so that image.moves() is complete on return and a rank that cannot
  // load (another model shape, options that cannot resume) stops every rank, not just itself.
  std::exception_ptr error;
  const int32_t failed = capture_failure(error, [&] {
    read_share(TrainingCheckpointReader<T>(image, world_.rank(), model_.config(), model_.param_specs()));
  });
  const int bad = first_failed_rank(world_, failed, "state image loaded");
  if (bad >= 0) {
    if (error) std::rethrow_exception(error);
    throw InputError("the training state image was not loaded: rank " + std::to_string(bad) + " failed");
  }
}

template <class T>
void ParallelTrainer<T>::read_share(const TrainingCheckpointReader<T>& ckpt) {
  check_resumable(ckpt.info().options, ckpt.info().steps_done, opt_);
  strategy_->load_state(ckpt);  // each rank reads only what it keeps
  steps_done_ = ckpt.info().steps_done;
}

template class ParallelTrainer<float>;
template class ParallelTrainer<double>;

}  // namespace llama4d
