#include "core/train/trainer.h"

#include <chrono>
#include <cmath>

#include "core/data/batch_sampler.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/optim/grad_clip.h"
#include "core/optim/segmented_norm.h"
#include "core/train/checkpoint_state.h"
#include "core/train/evaluate.h"

namespace llama4d {

void check_finite(int64_t step, double loss, double grad_sum_squares) {
  if (std::isfinite(loss) && std::isfinite(grad_sum_squares)) return;
  const double bad = std::isfinite(loss) ? std::sqrt(grad_sum_squares) : loss;
  throw DivergenceError("step " + std::to_string(step) + ": the " + (std::isfinite(loss) ? "gradient norm" : "loss") +
                        " is " + (std::isnan(bad) ? "nan" : "inf") +
                        " (training diverged; is --lr too large?); nothing from this step is saved");
}

[[gnu::noinline]] double add_weighted_aux(double acc, double share, double aux) { return acc + share * aux; }

template <class T>
void add_routing(StepStats& into, const Llama<T>& model, double share) {
  const int64_t L = model.config().num_hidden_layers, E = model.config().num_local_experts;
  const std::vector<int64_t>& counts = model.expert_counts();
  into.aux_loss = add_weighted_aux(into.aux_loss, share, model.aux_loss());
  if (into.expert_tokens.empty()) into.expert_tokens.assign(size_t(L), std::vector<int64_t>(size_t(E), 0));
  for (int64_t l = 0; l < L; ++l)
    for (int64_t e = 0; e < E; ++e) into.expert_tokens[size_t(l)][size_t(e)] += counts[size_t(l * E + e)];
}
template void add_routing<float>(StepStats&, const Llama<float>&, double);
template void add_routing<double>(StepStats&, const Llama<double>&, double);

template <class T>
Trainer<T>::Trainer(Llama<T>& model, const TextDataset& data, const TrainOptions& options)
    : model_(model), data_(data), opt_(options), adamw_(options.adamw, model.param_specs(), &model.memory()),
      segments_(param_segments(model.param_specs())) {
  opt_.validate();
  model_.set_bf16_compute(opt_.bf16_compute);
  // The running sum of the micro-batches' gradients (see step()); charged as gradients, since
  // accumulating costs one more gradient-sized buffer.
  if (opt_.micro_batches() > 1)
    grad_sum_ = Buffer<T>(&model_.memory(), MemoryCategory::grads, model_.num_params(), "gradient sum over micro-batches");
  if (opt_.seq_len > model_.config().max_position_embeddings)
    throw InputError("--seq-len " + std::to_string(opt_.seq_len) + " exceeds the model's max_position_embeddings " +
                     std::to_string(model_.config().max_position_embeddings));
  schedule_ = LrSchedule{.max_lr = opt_.lr, .min_lr = opt_.min_lr,
                         .warmup_steps = std::min(opt_.warmup_steps, opt_.steps), .total_steps = opt_.steps};
  schedule_.validate();
}

template <class T>
StepStats Trainer<T>::step() {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t s = steps_done_, mb = opt_.micro();
  const T loss_scale = T(1.0 / double(opt_.tokens_per_step()));

  const int64_t n = model_.num_params(), micro_batches = opt_.micro_batches();
  // Each micro-batch's gradient is computed into zeroed gradients and then added to the sum of
  // the earlier ones, ((g0 + g1) + g2) + ...: the order of an ordered all-reduce over ranks that
  // each hold one micro-batch (reduction_order, core/comm/reduce_kernels.h). So this trainer with
  // --micro-batch-size equal to a rank's rows gives bitwise what `--mesh dp=N` gives. Letting
  // backward add each micro-batch into the running sum instead (its kernels accumulate with +=)
  // rounds differently: grad norm 2.0821649184 vs 2.0821649145 after one step (issue 14, item 15).
  LossSum loss;
  StepStats st_moe;  // the mixture of experts' aux_loss and expert_tokens, over the micro-batches
  for (int64_t m = 0; m < micro_batches; ++m) {
    model_.zero_grad();
    Batch b = sample_rows(data_.train(), opt_.seq_len, opt_.seed, s, m * mb, (m + 1) * mb);
    if (opt_.doc_mask) mark_documents(b, opt_.doc_separator);
    const LossSum part = model_.forward(b.tokens.data(), b.targets.data(), b.B, b.seq, b.documents());
    loss.loss_sum += part.loss_sum;  // in fp64, in micro-batch order: what all_reduce_loss adds
    loss.tokens += part.tokens;
    if (model_.config().moe()) add_routing(st_moe, model_, double(b.B * b.seq) * double(loss_scale));
    model_.backward(loss_scale);
    if (micro_batches == 1) continue;
    if (m == 0)
      ops::copy(grad_sum_.data(), model_.grads(), n);
    else
      ops::accumulate(grad_sum_.data(), model_.grads(), n);
  }
  if (micro_batches > 1) ops::copy(model_.grads(), grad_sum_.data(), n);

  // The segmented order is the one sharded strategies reproduce bitwise from their shards.
  const double sum_sq = segmented_grad_sum_squares(segments_, model_.grads());
  if (opt_.grad_clip > 0) apply_grad_clip(model_.grads(), n, clip_coefficient(sum_sq, opt_.grad_clip));

  check_finite(s + 1, loss.mean(), sum_sq);
  StepStats st = std::move(st_moe);
  st.lr = opt_.lr_at(schedule_, s + 1);  // the schedule counts updates from 1
  adamw_.step(model_.params(), model_.grads(), st.lr);
  if (!ops::all_finite(model_.params(), n))
    throw DivergenceError("step " + std::to_string(s + 1) + ": the update made some weights non-finite "
                          "(training diverged; is --lr too large?); nothing from this step is saved");
  steps_done_ = s + 1;

  st.step = steps_done_;
  st.loss = loss.mean();
  st.grad_norm = std::sqrt(sum_sq);
  st.tokens = loss.tokens;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

template <class T>
StepStats Trainer<T>::step_queued() {
  ops::QueuedOps queued;
  const StepStats st = step();
  queued.finish();
  return st;
}

template <class T>
LossSum Trainer<T>::validation_loss(int64_t max_windows) const {
  return evaluate_loss(model_, data_.validation(), opt_.seq_len, opt_.micro(), max_windows, opt_.doc_mask, opt_.doc_separator);
}

template <class T>
void Trainer<T>::save_checkpoint(const std::string& dir) const {
  save_training_checkpoint(dir, model_, adamw_, opt_, steps_done_);
}

template <class T>
void Trainer<T>::save_state(TrainingStateImage<T>& image) const {
  TrainingCheckpointWriter<T> writer(image, 0, model_.config(), model_.param_specs());
  writer.create(adamw_.step_count(), steps_done_, opt_);
  const int64_t n = model_.num_params();
  writer.params(0, n, model_.params());
  writer.exp_avg(0, n, adamw_.exp_avg().data());
  writer.exp_avg_sq(0, n, adamw_.exp_avg_sq().data());
}

template <class T>
void Trainer<T>::load_checkpoint(const std::string& dir) {
  const TrainingCheckpointInfo info = load_training_checkpoint(dir, model_, adamw_);
  check_resumable(info.options, info.steps_done, opt_);
  steps_done_ = info.steps_done;
}

template class Trainer<float>;
template class Trainer<double>;

}  // namespace llama4d
