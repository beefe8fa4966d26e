#pragma once
// The single-rank training loop: gradient accumulation over micro-batches, global
// gradient-norm clipping, warm-up + cosine learning rate, AdamW; checkpoints that resume bitwise.
//
// One optimizer step `s` (0-based):
//   for each micro-batch m:  rows [m*mb, (m+1)*mb) of the global batch of step s
//       grads = 0;  loss_sum += forward(rows);  backward(scale = 1 / tokens_per_step)
//       sum = m == 0 ? grads : sum + grads      (the order of an ordered all-reduce over ranks)
//   grads = sum
//   norm = ||grads||_2;  grads *= min(1, clip / (norm + 1e-6))
//   AdamW(params, grads, lr(s))
// Because every micro-batch's loss is scaled by the GLOBAL token count, the accumulated
// gradient is the gradient of the global mean loss no matter how the batch is cut up — the
// same property data parallelism relies on later.
#include <cstdint>
#include <string>
#include <vector>

#include "core/data/dataset.h"
#include "core/model/llama.h"
#include "core/optim/adamw.h"
#include "core/optim/lr_schedule.h"
#include "core/optim/segmented_norm.h"
#include "core/tensor/buffer.h"
#include "core/train/state_image.h"
#include "core/train/train_options.h"

namespace llama4d {

struct StepStats {
  int64_t step = 0;       // 1-based number of the step just taken
  double loss = 0;        // mean training loss of the global batch
  double lr = 0;
  double grad_norm = 0;   // before clipping
  int64_t tokens = 0;
  double seconds = 0;     // wall time of the step
  // Mixture of experts (empty / 0 for a dense model): the load-balancing losses of the step, each
  // micro-batch's weighted by its share of the tokens as in the objective (Llama::aux_loss), and
  // expert_tokens[l][e] the tokens layer l routed to expert e over the step's micro-batches.
  double aux_loss = 0;
  std::vector<std::vector<int64_t>> expert_tokens;
};

// Mixture of experts: adds the routing of `model`'s last whole-model forward (one micro-batch)
// into `into`: its aux loss weighted by `share` (the micro-batch's tokens x the loss scale, as in
// the objective) and its [L, E] token counts. Every trainer adds its micro-batches with it.
template <class T>
void add_routing(StepStats& into, const Llama<T>& model, double share);
// acc + share * aux, the one place a weighted aux loss is added: never inlined, so every trainer
// (one device adding its micro-batches, a data-parallel rank folding the gathered ones) rounds
// alike whether or not the compiler fuses the multiply-add.
double add_weighted_aux(double acc, double share, double aux);

// Throws DivergenceError naming `step` if the loss or the squared gradient norm is not finite.
void check_finite(int64_t step, double loss, double grad_sum_squares);

template <class T>
class Trainer {
 public:
  // The model must already hold its initial (or loaded) weights.
  Trainer(Llama<T>& model, const TextDataset& data, const TrainOptions& options);

  StepStats step();
  // step() with its ops queued on a GPU's stream (ops::QueuedOps): it waits only where the host
  // hands data over or reads a result (each micro-batch's token and target uploads, and its
  // document ids under --doc-mask; the RoPE tables' upload when a forward first reaches a
  // position; the cross-entropy's target checks, forward and backward, and the losses; the
  // gradient norms; the finite check) and once at its end. step() touches the model's memory through ops alone, which that needs; on the CPU
  // the two are the same.
  StepStats step_queued();
  int64_t steps_done() const { return steps_done_; }
  const TrainOptions& options() const { return opt_; }
  AdamW<T>& optimizer() { return adamw_; }
  Llama<T>& model() { return model_; }

  // Validation loss over up to max_windows windows of the held-out split.
  LossSum validation_loss(int64_t max_windows) const;

  // Writes <dir>/config.json, model.safetensors (in T, so resume is bitwise),
  // optimizer.safetensors (exp_avg.<name>, exp_avg_sq.<name>) and trainer_state.json, all or
  // nothing (a temporary directory renamed into place).
  void save_checkpoint(const std::string& dir) const;
  // The same state into memory (state_image.h), as one rank that owns everything: the snapshot of
  // an asynchronous checkpoint (async_checkpoint.h), which write_state_image turns into the files
  // save_checkpoint writes.
  void save_state(TrainingStateImage<T>& image) const;
  // Restores weights, optimizer state and step count saved by save_checkpoint. The options
  // saved in the checkpoint must match this trainer's (InputError names the first difference).
  void load_checkpoint(const std::string& dir);

 private:
  Llama<T>& model_;
  const TextDataset& data_;
  TrainOptions opt_;
  LrSchedule schedule_;
  AdamW<T> adamw_;
  std::vector<Segment> segments_;
  Buffer<T> grad_sum_;  // [num_params] when accumulating over several micro-batches
  int64_t steps_done_ = 0;
};

extern template class Trainer<float>;
extern template class Trainer<double>;

}  // namespace llama4d
