#pragma once
// The trainer's whole state held in memory instead of on disk: exactly what a training checkpoint
// (checkpoint_state.h) holds, keyed the way its files are.
//   "model"      <name>              weights, whole Hugging Face tensors, in the training dtype T
//   "optimizer"  exp_avg.<name>      AdamW first moments, same shapes
//   "optimizer"  exp_avg_sq.<name>   AdamW second moments
//   info                             steps done, AdamW step count, the run's TrainOptions
// Batches need no saved state (a pure function of seed, step and row), as on disk.
//
// Filled by a TrainingCheckpointWriter and read by a TrainingCheckpointReader built on the image,
// so ParallelTrainer saves and loads an image through the same strategy code that writes files:
// every rank writes what it owns and reads what it keeps. Ranks of one process (virtual GPUs)
// share one image; writers of different ranks touch disjoint ranges, and the bookkeeping of who
// wrote what is locked. An image does not cross processes (MPI ranks keep their own).
//
// moves(): for each rank, the bytes it read that it had not written itself — what re-sharding
// would have to send between devices. Loading on the plan that saved moves 0 bytes for a plain
// DP or ZeRO rank only when it reads back what it wrote.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/model/config.h"
#include "core/model/params.h"
#include "core/train/train_options.h"

namespace llama4d {

struct TrainingCheckpointInfo;

// Bytes each rank read from an image that it had not written (index = rank; missing = 0).
struct StateMoves {
  std::vector<int64_t> bytes_moved;   // per reading rank
  std::vector<int64_t> bytes_read;    // per reading rank, moved or not
  int64_t total_moved() const;
  int64_t total_read() const;
};

// Runs of elements of an image, back to back in `data`: what one rank wrote (its shard of the
// state), to keep or to send to another rank and put back later.
template <class T>
struct StateShard {
  struct Run {
    std::string key;  // file + "/" + tensor name, as the image keys it
    int64_t begin = 0, count = 0;
  };
  std::vector<Run> runs;
  std::vector<T> data;  // sum of the runs' counts
};

template <class T>
class TrainingStateImage {
 public:
  TrainingStateImage() = default;
  TrainingStateImage(const TrainingStateImage&) = delete;
  TrainingStateImage& operator=(const TrainingStateImage&) = delete;

  // Once, by one rank, before any rank writes: the whole tensors at full size (zeros until
  // written) and the small records of trainer_state.json. Forgets earlier contents and moves.
  void create(const LlamaConfig& cfg, int64_t optimizer_steps, int64_t steps_done, const TrainOptions& options);
  bool created() const { return created_; }
  const LlamaConfig& config() const { return config_; }
  int64_t steps_done() const { return steps_done_; }
  int64_t optimizer_steps() const { return optimizer_steps_; }
  const TrainOptions& options() const { return options_; }

  // Flat elements [begin, end) of the buffer `specs` describe (a rank's, possibly tensor-parallel
  // slices or a pipeline stage's subset), from/into data, into/from the tensors prefix + name of
  // file `file` ("model" or "optimizer"). Only the elements the rank counts are written (replicas
  // are another rank's), as write_flat_range does. InputError for a range outside the buffer or a
  // tensor the image lacks; reads refuse non-finite values like read_flat_range.
  void write(int rank, const std::string& file, const std::vector<ParamSpec>& specs, int64_t begin, int64_t end,
             const T* data, const std::string& prefix);
  void read(int rank, const std::string& file, const std::vector<ParamSpec>& specs, int64_t begin, int64_t end,
            T* out, const std::string& prefix) const;

  // The whole tensor stored under file/name (for tests and tools). InputError if absent.
  const std::vector<T>& tensor(const std::string& file, const std::string& name) const;
  // The elements `rank` wrote, in key and element order; with_data false: the runs only (to
  // receive a shard whose layout is known into them).
  StateShard<T> written_by(int rank, bool with_data = true) const;
  // Puts a shard back, recorded as written by `rank`. InputError if a run lies outside its tensor.
  void put(int rank, const StateShard<T>& shard);
  // Drops the tensors (keeps config, steps and options): the memory of an image no longer needed.
  void release();
  StateMoves moves() const;
  // Bytes of tensor data held.
  int64_t bytes() const;

 private:
  struct Tensor {
    std::vector<T> data;
    std::vector<int32_t> writer;  // rank that wrote each element, -1 if none
  };
  Tensor& find(const std::string& key);
  const Tensor& find(const std::string& key) const;

  bool created_ = false;
  LlamaConfig config_;
  int64_t steps_done_ = 0, optimizer_steps_ = 0;
  TrainOptions options_;
  std::map<std::string, Tensor> tensors_;  // key: file + "/" + tensor name
  mutable std::mutex mutex_;               // guards moves_
  mutable StateMoves moves_;
};

extern template class TrainingStateImage<float>;
extern template class TrainingStateImage<double>;

}  // namespace llama4d
