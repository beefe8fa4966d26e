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
#include "core/train/state_image.h"
#include "core/train/train_options.h"

namespace llama4d {

inline constexpr const char* kOptimizerBase = "optimizer";
inline constexpr const char* kTrainerStateFile = "trainer_state.json";

inline constexpr const char* kTrainerStateFormat = "llama4d-trainer-state-v1";

// What trainer_state.json records besides the tensors.
struct TrainingCheckpointInfo {
  TrainOptions options;
  int64_t steps_done = 0;
  int64_t optimizer_steps = 0;  // AdamW updates applied: one per step, so equal to steps_done
  std::string dtype;            // of the weights and moments: "F32" or "F64"
};

// Reads and validates dir/trainer_state.json: its format, the options, 0 <= steps_done <=
// options.steps, optimizer_step == steps_done, a training dtype. InputError naming the file
// and the bad field otherwise (or saying that dir is not a training checkpoint).
TrainingCheckpointInfo read_training_state(const std::string& dir);


struct TrainingCheckpointFiles;  // the laid-out files and this rank's handles on them

// A training checkpoint written piece by piece, by any number of ranks at once: each writes
// the flat ranges it owns (a ZeRO rank its pieces of the weights and moments, a DP replica its
// 1/dp of them) straight into the files, so no rank ever holds the whole state. The files are
// laid out from the specs alone, identically on every rank; one rank creates them first.
// Use inside a StagedDirectory (atomic_dir.h): the checkpoint is whole only once every rank
// has finished.
template <class T>
class TrainingCheckpointWriter {
 public:
  // The layout of the checkpoint's files in `dir` (weights and moments stored as T); no I/O.
  TrainingCheckpointWriter(std::string dir, const LlamaConfig& cfg, const std::vector<ParamSpec>& specs);
  // The same writes into an in-memory image instead (state_image.h), recorded as written by
  // `rank`; create() and finish() do no I/O.
  TrainingCheckpointWriter(TrainingStateImage<T>& image, int rank, const LlamaConfig& cfg,
                           const std::vector<ParamSpec>& specs);
  ~TrainingCheckpointWriter();

  // Once, by one rank, before any rank writes: config.json, trainer_state.json, and the tensor
  // files at full size with their headers. IoError on failure.
  void create(int64_t optimizer_steps, int64_t steps_done, const TrainOptions& options) const;
  // Flat elements [begin, end) of the parameters / AdamW moments, from data[end - begin].
  void params(int64_t begin, int64_t end, const T* data);
  void exp_avg(int64_t begin, int64_t end, const T* data);
  void exp_avg_sq(int64_t begin, int64_t end, const T* data);
  // Syncs everything this rank wrote to disk. IoError on failure.
  void finish();

 private:
  std::string dir_;
  LlamaConfig cfg_;
  std::vector<ParamSpec> specs_;
  std::unique_ptr<TrainingCheckpointFiles> files_;  // null when writing an image
  TrainingStateImage<T>* image_ = nullptr;
  int rank_ = 0;
};

// A whole training checkpoint from one device's full buffers, written atomically.
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
  // Reads an in-memory image instead, counting what `rank` reads in image.moves(). InputError if
  // the image is empty or of another model shape. dir() is "<in-memory image>".
  TrainingCheckpointReader(const TrainingStateImage<T>& image, int rank, const LlamaConfig& cfg,
                           const std::vector<ParamSpec>& specs);
  const std::string& dir() const { return dir_; }
  const TrainingCheckpointInfo& info() const { return info_; }
  int64_t optimizer_steps() const { return info_.optimizer_steps; }
  // Flat elements [begin, end) of the parameters / AdamW moments, into out[end - begin].
  void params(int64_t begin, int64_t end, T* out) const;
  void exp_avg(int64_t begin, int64_t end, T* out) const;
  void exp_avg_sq(int64_t begin, int64_t end, T* out) const;

 private:
  std::string dir_;
  std::vector<ParamSpec> specs_;
  TrainingCheckpointInfo info_;
  std::shared_ptr<const TensorStore> model_, optimizer_;  // null when reading an image
  const TrainingStateImage<T>* image_ = nullptr;
  int rank_ = 0;
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

// The TrainOptions saved in dir/trainer_state.json (read_training_state(dir).options).
TrainOptions read_train_options(const std::string& dir);

}  // namespace llama4d
