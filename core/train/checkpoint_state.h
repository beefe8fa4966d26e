#pragma once
// A training checkpoint = a model checkpoint (HF layout) + what resuming bitwise needs:
//   config.json, model.safetensors      weights in the training dtype (no rounding on resume)
//   optimizer.safetensors               exp_avg.<name>, exp_avg_sq.<name> (AdamW moments)
//   trainer_state.json                  steps done, AdamW step count, the run's TrainOptions
// Written all-or-nothing: a crash mid-save leaves the previous checkpoint intact.
// Batches need no saved state: they are a pure function of (seed, step, row).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/io/checkpoint.h"
#include "core/model/llama.h"
#include "core/optim/adamw.h"
#include "core/train/train_options.h"

namespace llama4d {

inline constexpr const char* kOptimizerBase = "optimizer";
inline constexpr const char* kTrainerStateFile = "trainer_state.json";

struct TrainingCheckpointInfo {
  TrainOptions options;
  int64_t steps_done = 0;
};


// Everything a checkpoint holds, as full (unsharded) flat buffers. Sharded strategies gather
// into this form, so a run saved on one mesh resumes on any other.
template <class T>
struct TrainingState {
  const T* params = nullptr;      // [num_params]
  const T* exp_avg = nullptr;     // [num_params]
  const T* exp_avg_sq = nullptr;  // [num_params]
  int64_t optimizer_steps = 0;
  int64_t steps_done = 0;
};

template <class T>
void save_training_checkpoint(const std::string& dir, const LlamaConfig& cfg, const std::vector<ParamSpec>& specs,
                              const TrainingState<T>& state, const TrainOptions& options);
template <class T>
void save_training_checkpoint(const std::string& dir, const Llama<T>& model, const AdamW<T>& adamw,
                              const TrainOptions& options, int64_t steps_done);

// A training checkpoint opened for reading piece by piece: a sharded rank reads the flat
// ranges it owns and nothing else. Opening validates the model shape and reads the small JSON
// files; the tensors are read on request.
template <class T>
class TrainingCheckpointReader {
 public:
  // InputError if dir is not a training checkpoint of this model shape.
  TrainingCheckpointReader(const std::string& dir, const LlamaConfig& cfg, const std::vector<ParamSpec>& specs);
  const std::string& dir() const { return dir_; }
  const TrainingCheckpointInfo& info() const { return info_; }
  int64_t optimizer_steps() const { return optimizer_steps_; }
  // Flat elements [begin, end) of the parameters / AdamW moments, into out[end - begin].
  void params(int64_t begin, int64_t end, T* out) const;
  void exp_avg(int64_t begin, int64_t end, T* out) const;
  void exp_avg_sq(int64_t begin, int64_t end, T* out) const;

 private:
  std::string dir_;
  std::vector<ParamSpec> specs_;
  TrainingCheckpointInfo info_;
  int64_t optimizer_steps_ = 0;
  std::shared_ptr<const TensorStore> model_, optimizer_;
};

// Reads the full state of a checkpoint whose shape matches cfg: params, moments [num_params] each.
template <class T>
TrainingCheckpointInfo read_training_checkpoint(const std::string& dir, const LlamaConfig& cfg,
                                                const std::vector<ParamSpec>& specs, std::vector<T>& params,
                                                std::vector<T>& exp_avg, std::vector<T>& exp_avg_sq,
                                                int64_t& optimizer_steps);

// Loads weights into `model` and moments into `adamw` (which must cover the whole buffer).
template <class T>
TrainingCheckpointInfo load_training_checkpoint(const std::string& dir, Llama<T>& model, AdamW<T>& adamw);

// The TrainOptions saved in dir/trainer_state.json (InputError if it is not a training checkpoint).
TrainOptions read_train_options(const std::string& dir);

}  // namespace llama4d
