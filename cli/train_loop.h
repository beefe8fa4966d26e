#pragma once
// The loop every rank of a `train` run goes through: steps, metrics, progress, evaluation and
// checkpoints, over a trainer reached through TrainerCalls (one rank's Trainer, or a rank of a
// ParallelTrainer whose calls are collective), with the ledger of a supervised run.
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/train_run.h"
#include "core/parallel/straggler_detector.h"
#include "core/train/async_checkpoint.h"
#include "core/train/goodput.h"
#include "core/train/trainer.h"

namespace llama4d::cli::training {

// What the loop needs from a trainer, single-rank or data-parallel (whose calls are collective).
struct TrainerCalls {
  std::function<StepStats()> step;
  std::function<int64_t()> steps_done;
  std::function<double(int64_t windows)> validation_loss;  // mean
  std::function<void(const std::string& dir)> save;
  // Fault injection and detection around each step (may be empty): before step `next` runs, and
  // after it with its stats.
  std::function<void(int64_t next)> before_step;
  std::function<void(const StepStats&)> after_step;
  // --async-checkpoint (empty: save() writes before it returns). snapshot(dir): the state copied
  // to host memory and its write to dir started in the background; wait_saved(): blocks until
  // the write in flight has committed, throwing its failure, and returns the writes' figures.
  // Every rank calls both, at the same points of the loop.
  std::function<void(const std::string& dir)> snapshot;
  std::function<AsyncCheckpointStats()> wait_saved;
};

// The TrainerCalls of an asynchronous checkpoint through `writer`, shared by the `ranks` ranks of
// this process: `snapshot_into(image, written)` is the trainer's save_state (collective), calling
// `written` once the rank's share is in; the last rank in starts the write, with the tokenizer
// files beside it.
template <class T>
void use_async_checkpoint(TrainerCalls& calls, AsyncCheckpointer<T>& writer, int ranks,
                          std::function<void(TrainingStateImage<T>&, const std::function<void()>&)> snapshot_into,
                          std::function<void(const std::string&)> more_files) {
  calls.snapshot = [&writer, ranks, snapshot_into = std::move(snapshot_into),
                    more_files = std::move(more_files)](const std::string& dir) {
    snapshot_into(writer.image(), [&] { writer.share_written(ranks, dir, more_files); });
  };
  calls.wait_saved = [&writer] {
    writer.wait();
    return writer.stats();
  };
}

// Seconds since `origin`: the clock a supervised run's ledger keeps.
inline double seconds_since(std::chrono::steady_clock::time_point origin) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin).count();
}

// What a supervised run shares with the lead rank's loop: the ledger and its clock, and the
// stragglers found over every attempt (a replayed step is observed again).
struct Supervision {
  GoodputLedger ledger;
  std::optional<StragglerDetector> stragglers;
  std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
  double now() const { return seconds_since(origin); }

  // The last step each rank of the attempt finished (its step() returned): the least of them
  // is where the failure stopped the job, the same however far the lead rank got.
  void attempt_starts(int ranks, int64_t steps_done) {
    std::lock_guard<std::mutex> lock(mu);
    reached.assign(size_t(ranks), steps_done);
  }
  void finished(int rank, int64_t step) {
    std::lock_guard<std::mutex> lock(mu);
    reached.at(size_t(rank)) = step;
  }
  int64_t every_rank_reached() const {
    std::lock_guard<std::mutex> lock(mu);
    return reached.empty() ? -1 : *std::min_element(reached.begin(), reached.end());
  }

 private:
  mutable std::mutex mu;
  std::vector<int64_t> reached;
};


// The run itself: steps, metrics, progress, evaluation, checkpoints. `lead` is the rank that
// writes files and prints; every rank runs the loop (collectives inside the calls).
// A recipe run calls it once per stage: `stage` names the stage in every metrics row, and a
// stage that neither ends the recipe nor reaches --stop-at hands its state on in memory
// (save_at_end false) instead of writing a checkpoint.
nlohmann::json train_loop(const TrainArgs& a, const TrainOptions& opt, const TrainerCalls& t, bool lead,
                          Supervision* sup = nullptr, const std::string& stage = "", bool save_at_end = true);

}  // namespace llama4d::cli::training
