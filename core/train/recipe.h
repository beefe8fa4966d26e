#pragma once
// A training recipe: the run as a sequence of stages, each with its own global batch, sequence
// length, mesh, data mix and learning-rate segment, as Llama 3 pre-trains (ramping the batch
// and the context, then annealing on upsampled high-quality data with the LR going linearly to
// zero: "The Llama 3 Herd of Models", 2024, sections 3.4.1-3.4.3).
//
// The file is one JSON object:
//   {"name": "laptop", "seed": 1337, "stages": [
//      {"name": "ramp", "steps": 20, "batch_size": 8, "seq_len": 64, "dp": 2, "cp": 1,
//       "data": {"data/corpus": 1},
//       "lr": {"shape": "warmup", "from": 0, "to": 3e-3}},
//      {"name": "anneal", "tokens": 32768, "batch_size": 16, "seq_len": 256, "dp": 2, "cp": 4,
//       "data": {"data/corpus": 1, "data/code": 3},
//       "lr": {"shape": "linear", "from": 3e-4, "to": 0}}]}
// or the same keys in TOML, in a file whose name ends in .toml (core/io/toml_file.h):
//   name = "laptop"
//   seed = 1337
//   [[stages]]
//   name = "ramp"
//   steps = 20
//   batch_size = 8
//   seq_len = 64
//   dp = 2
//   data = { "data/corpus" = 1 }
//   lr = { shape = "warmup", from = 0, to = 3e-3 }
// A stage's length is "steps" or "tokens" (exactly one; tokens must be a whole number of
// steps of batch_size x seq_len). The mesh keys are dp, tp, cp, pp (default 1). An LR segment's
// "name" (default: the file's name without its extension) is what a resumed run is checked
// against. `train --recipe` reads a relative data path as relative to the recipe file. An LR segment's shape is "warmup" or "linear" (a straight line from `from` to `to` over the stage) or
// "cosine" (half a cosine from `from` down to `to`).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/data/data_mix.h"
#include "core/optim/lr_schedule.h"
#include "core/train/train_options.h"

namespace llama4d {

struct RecipeStage {
  std::string name;
  int64_t steps = 0;
  int64_t batch_size = 0, seq_len = 0;
  int64_t dp = 1, tp = 1, cp = 1, pp = 1;
  std::vector<MixEntry> data;  // source path -> weight, in the file's order
  LrSegment lr;
  int64_t tokens() const { return steps * batch_size * seq_len; }
  // "tp=2,cp=2,dp=2": the dimensions above 1, innermost first (Llama 3's order); "dp=1" for one rank.
  std::string mesh() const;
  nlohmann::json to_json() const;
};

struct Recipe {
  std::string name;
  uint64_t seed = 1337;
  std::vector<RecipeStage> stages;
  int64_t total_steps() const;
  // The stage holding global step `step` (0-based) and the step within it: {stage, k}.
  std::pair<size_t, int64_t> locate(int64_t step) const;
  double lr_at(int64_t step) const;
  // Global steps done before stage i.
  int64_t first_step(size_t i) const;
  // A hash of the seed and the stages as parsed (FNV-1a, 64 bits, of to_json() without the
  // name), "fnv1a64:0123abcd...": a resumed run must follow the recipe it started.
  std::string fingerprint() const;
  // `base` with what stage i defines: batch_size, seq_len, seed, steps (the stage's end as a
  // global step) and the recipe position with the stage's LR segment.
  TrainOptions stage_options(const TrainOptions& base, size_t i) const;
  nlohmann::json to_json() const;
};

// Parses and validates a recipe for a model with `max_positions` positions. InputError naming
// the stage (number and name) and the key for: an unknown key, a missing one, a value of the
// wrong type or outside its range, both or neither of steps/tokens, tokens that are not a whole
// number of steps, a batch_size that dp does not divide, a seq_len above max_positions or that
// 2·cp does not divide (context parallelism's load-balanced chunks), a data weight <= 0, no
// stages.
Recipe parse_recipe(const nlohmann::json& j, int64_t max_positions);
// The file (TOML where its name ends in .toml, else JSON) through parse_recipe; errors name the
// file too.
Recipe load_recipe(const std::string& path, int64_t max_positions);

}  // namespace llama4d
