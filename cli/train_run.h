#pragma once
// What a `llama4d train` run is before it computes: the flags (TrainArgs), and the run they
// resolve to (Run) — on --resume, the checkpoint's model, options and loop settings with the
// flags that may change applied — and the data it trains on. Shared by the files of `train`:
// train_command.cpp (the command and a one-rank run), train_loop.cpp (the loop every rank runs),
// train_parallel.cpp (one launch of a parallel mesh), train_supervisor.cpp (faults and restarts)
// and train_recipe.cpp (--recipe's stages).
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/common.h"
#include "cli/launch.h"
#include "cli/parallel_options.h"
#include "core/data/dataset.h"
#include "core/parallel/straggler_detector.h"
#include "core/train/model_directory.h"
#include "core/train/train_options.h"

namespace llama4d::cli::training {

struct TrainArgs {
  ModelChoice model;
  ParallelChoice parallel;
  LaunchOptions launch;
  TrainOptions opt;
  std::string data, out = "runs/train", resume, init, faults, recipe;
  std::vector<std::string> stages;  // --stage: a recipe's stages on the command line (core/train/stage_flags.h)
  int64_t eval_every = 100, eval_windows = 64, save_every = 0, log_every = 10, stop_at = 0, max_restarts = 0;
  int64_t memory_copy_every = 0;  // 0: no in-memory copies
  bool check_replicas = false;
  bool async_checkpoint = false;  // --async-checkpoint: snapshot to host memory, write in the background
  double fault_rate = 0;  // --fault-rate: failures per rank per step (0: none drawn)
  int64_t fault_seed = 0;  // --fault-seed: the seed of the schedule --fault-rate draws
  std::string on_lost_node = "spare";  // --on-lost-node: spare (same mesh) | shrink (dp - 1)
  double heartbeat_timeout_s = 0;  // --heartbeat-timeout: a rank silent this long is named (0: off)
  StragglerOptions stragglers;
  ComputeChoice compute;
  bool json = false, force = false;
};

// The loop settings a checkpoint keeps (TrainOptions::loop) and a resume restores unless they are
// given again: a resumed run evaluates and saves as the first one did.
struct LoopSetting {
  const char* flag;
  const char* key;
  int64_t TrainArgs::*value;
};
inline constexpr LoopSetting kLoopSettings[] = {{"--eval-every", "eval_every", &TrainArgs::eval_every},
                                         {"--eval-windows", "eval_windows", &TrainArgs::eval_windows},
                                         {"--save-every", "save_every", &TrainArgs::save_every},
                                         {"--log-every", "log_every", &TrainArgs::log_every}};

// The run as it will go: the flags' model, options and data; on --resume, those of the checkpoint.
struct Run {
  TrainArgs args;
  LlamaConfig cfg;
  // The model directory of --init (or of a --resume checkpoint that holds tokenizer files): its
  // tokenizer encodes the data. Null: llama4d's byte tokenizer, as for every preset.
  std::shared_ptr<const ModelDirectory> model_dir;
  // Its tokenizer files (name, bytes), read before training: written beside every checkpoint
  // saved, so the result is a model directory transformers and llama4d load with its tokenizer.
  std::vector<std::pair<std::string, std::string>> tokenizer_files;
};


// Everything about the run that can be checked without computing: done before anything is
// written, so a bad flag costs nothing and leaves nothing behind.
Run resolve_run(const TrainArgs& a, const CLI::App& cmd);

// Which model the run trains: the checkpoint it resumes, or the flags' choice.
std::string model_name(const TrainArgs& a);

// Text at `path` in the run's tokens, split into train and held-out rows as every corpus is:
// the run's --data, or one source of a recipe's data mix.
TextDataset load_source(const Run& r, const std::string& path);

// The corpus the batches come from. On resume it must be the text the run started on (the
// file may have moved: --data names the new place), else every batch would differ.
TextDataset load_run_data(Run& r, bool data_given);

// The model directory's tokenizer files, written beside a checkpoint into `dir`.
void write_tokenizer_files(const Run& r, const std::string& dir);

// The unigram entropy of the validation split: a byte model's baseline (one token per byte);
// NaN for another tokenizer's ids.
double unigram_nats(const Run& r, const TextDataset& data);

// Saved absolute, so that a resume started from another directory finds the data.
std::string absolute_path(const std::string& path);

// The step the run ends at: --steps, or --stop-at where that comes first.
int64_t last_step(const TrainArgs& a);

}  // namespace llama4d::cli::training
