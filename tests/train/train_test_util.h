#pragma once
// A tiny model and a small in-memory corpus, so trainer tests run in well under a second a step.
#include <string>

#include "core/data/dataset.h"
#include "core/model/config.h"
#include "core/train/train_options.h"

namespace llama4d::test {

inline LlamaConfig tiny_config() {
  LlamaConfig c = LlamaConfig::preset("tiny");
  return c;
}

inline std::string small_corpus() {
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "Sentence number " + std::to_string(i) + " says that gradients add up across ranks. ";
  return text;
}

inline TrainOptions tiny_options(int64_t steps) {
  TrainOptions o;
  o.steps = steps;
  o.batch_size = 4;
  o.micro_batch_size = 2;
  o.seq_len = 32;
  o.lr = 1e-2;
  o.min_lr = 1e-3;
  o.warmup_steps = 3;
  o.seed = 7;
  return o;
}

}  // namespace llama4d::test
