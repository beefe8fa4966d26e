#pragma once
// Everything that defines a training run besides the model shape. Saved with every checkpoint
// (trainer_state.json) so a resumed run continues the same schedule and the same batches.
#include <cstdint>

#include <nlohmann/json.hpp>

#include "core/optim/adamw.h"

namespace llama4d {

struct TrainOptions {
  int64_t steps = 300;             // optimizer steps in the whole run (the LR schedule's length)
  int64_t batch_size = 8;          // sequences per optimizer step: the global batch
  int64_t micro_batch_size = 0;    // sequences per forward/backward; 0 = batch_size (no accumulation)
  int64_t seq_len = 256;           // tokens per sequence
  double lr = 3e-3;                // peak learning rate, reached after warmup_steps
  double min_lr = 3e-4;            // cosine decay floor at `steps`
  int64_t warmup_steps = 30;
  double grad_clip = 1.0;          // global L2 norm; <= 0 disables clipping
  uint64_t seed = 1337;            // initial weights and batches
  AdamWConfig adamw;

  int64_t micro_batches() const { return batch_size / micro(); }
  int64_t micro() const { return micro_batch_size > 0 ? micro_batch_size : batch_size; }
  // Global batch tokens: the denominator of the mean loss whatever the micro-batching or mesh.
  int64_t tokens_per_step() const { return batch_size * seq_len; }

  // Throws InputError naming the first bad value.
  void validate() const;
  nlohmann::json to_json() const;
  static TrainOptions from_json(const nlohmann::json& j);
};

}  // namespace llama4d
