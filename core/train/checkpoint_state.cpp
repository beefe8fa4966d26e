#include "core/train/checkpoint_state.h"

#include <filesystem>

#include "core/error.h"
#include "core/ops.h"
#include "core/io/atomic_dir.h"
#include "core/io/checkpoint.h"
#include "core/io/tensor_files.h"

namespace llama4d {

struct TrainingCheckpointFiles {
  TensorFilesLayout model, optimizer;
  std::unique_ptr<TensorFilesWriter> model_writer, optimizer_writer;  // opened on first write
};

template <class T>
TrainingCheckpointWriter<T>::TrainingCheckpointWriter(std::string dir, const LlamaConfig& cfg,
                                                      const std::vector<ParamSpec>& specs)
    : dir_(std::move(dir)), cfg_(cfg), specs_(specs), files_(std::make_unique<TrainingCheckpointFiles>()) {
  // Weights and moments in the training dtype: resuming rounds nothing. The files hold the whole
  // tensors even when this rank's specs are tensor-parallel slices of them.
  const DType storage = dtype_of<T>();
  const std::vector<ParamSpec> whole = llama_param_specs(cfg);
  files_->model = tensor_files_layout(kModelBase, flat_tensors<T>(whole, nullptr, storage), kModelMetadata);
  std::vector<TensorToWrite> moments = flat_tensors<T>(whole, nullptr, storage, "exp_avg.");
  for (TensorToWrite& t : flat_tensors<T>(whole, nullptr, storage, "exp_avg_sq.")) moments.push_back(std::move(t));
  files_->optimizer = tensor_files_layout(kOptimizerBase, moments);
}

template <class T>
TrainingCheckpointWriter<T>::~TrainingCheckpointWriter() = default;

template <class T>
void TrainingCheckpointWriter<T>::create(int64_t optimizer_steps, int64_t steps_done,
                                         const TrainOptions& options) const {
  write_config_file(dir_, cfg_, dtype_of<T>());
  create_tensor_files(dir_, files_->model);
  create_tensor_files(dir_, files_->optimizer);
  write_json_file(dir_ + "/" + kTrainerStateFile, {{"format", "llama4d-trainer-state-v1"},
                                                   {"steps_done", steps_done},
                                                   {"optimizer_step", optimizer_steps},
                                                   {"dtype", std::string(dtype_name(dtype_of<T>()))},
                                                   {"options", options.to_json()}});
}

template <class T>
void TrainingCheckpointWriter<T>::params(int64_t begin, int64_t end, const T* data) {
  if (!files_->model_writer) files_->model_writer = std::make_unique<TensorFilesWriter>(dir_, files_->model);
  write_flat_range(*files_->model_writer, specs_, begin, end, data);
}

template <class T>
void TrainingCheckpointWriter<T>::exp_avg(int64_t begin, int64_t end, const T* data) {
  if (!files_->optimizer_writer)
    files_->optimizer_writer = std::make_unique<TensorFilesWriter>(dir_, files_->optimizer);
  write_flat_range(*files_->optimizer_writer, specs_, begin, end, data, "exp_avg.");
}

template <class T>
void TrainingCheckpointWriter<T>::exp_avg_sq(int64_t begin, int64_t end, const T* data) {
  if (!files_->optimizer_writer)
    files_->optimizer_writer = std::make_unique<TensorFilesWriter>(dir_, files_->optimizer);
  write_flat_range(*files_->optimizer_writer, specs_, begin, end, data, "exp_avg_sq.");
}

template <class T>
void TrainingCheckpointWriter<T>::finish() {
  if (files_->model_writer) files_->model_writer->finish();
  if (files_->optimizer_writer) files_->optimizer_writer->finish();
}

template <class T>
void save_training_checkpoint(const std::string& dir, const Llama<T>& model, const AdamW<T>& adamw,
                              const TrainOptions& options, int64_t steps_done) {
  if (adamw.begin() != 0 || adamw.end() != model.num_params())
    throw Error("save_training_checkpoint: the optimizer must cover the whole model");
  StagedDirectory staged(dir, kConfigFile);  // an existing directory is replaced only if it is a checkpoint
  TrainingCheckpointWriter<T> writer(staged.staging(), model.config(), model.param_specs());
  writer.create(adamw.step_count(), steps_done, options);
  const int64_t n = model.num_params();
  writer.params(0, n, model.params());
  writer.exp_avg(0, n, adamw.exp_avg().data());
  writer.exp_avg_sq(0, n, adamw.exp_avg_sq().data());
  writer.finish();
  staged.commit();
}

TrainOptions read_train_options(const std::string& dir) {
  const std::string path = dir + "/" + kTrainerStateFile;
  if (!std::filesystem::exists(path))
    throw InputError(dir + " is not a training checkpoint (no " + kTrainerStateFile + ")");
  const nlohmann::json j = read_json_file(path);
  if (!j.contains("options")) throw InputError(path + ": missing \"options\"");
  return TrainOptions::from_json(j.at("options"));
}

template <class T>
TrainingCheckpointReader<T>::TrainingCheckpointReader(const std::string& dir, const LlamaConfig& cfg,
                                                      const std::vector<ParamSpec>& specs)
    : dir_(dir), specs_(specs) {
  const LlamaConfig saved = load_config(dir);
  if (saved.to_json() != cfg.to_json())
    throw InputError("checkpoint " + dir + " holds a different model shape than the one requested");
  info_.options = read_train_options(dir);
  const nlohmann::json state = read_json_file(dir + "/" + kTrainerStateFile);
  try {
    info_.steps_done = state.at("steps_done").get<int64_t>();
    optimizer_steps_ = state.at("optimizer_step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(dir + "/" + kTrainerStateFile + ": " + e.what());
  }
  model_ = std::make_shared<const TensorStore>(TensorStore::open(dir));
  optimizer_ = std::make_shared<const TensorStore>(TensorStore::open(dir, kOptimizerBase));
}

template <class T>
void TrainingCheckpointReader<T>::params(int64_t begin, int64_t end, T* out) const {
  read_flat_range(*model_, specs_, begin, end, out);
}

template <class T>
void TrainingCheckpointReader<T>::exp_avg(int64_t begin, int64_t end, T* out) const {
  read_flat_range(*optimizer_, specs_, begin, end, out, "exp_avg.");
}

template <class T>
void TrainingCheckpointReader<T>::exp_avg_sq(int64_t begin, int64_t end, T* out) const {
  read_flat_range(*optimizer_, specs_, begin, end, out, "exp_avg_sq.");
}

template <class T>
TrainingCheckpointInfo read_training_checkpoint(const std::string& dir, const LlamaConfig& cfg,
                                                const std::vector<ParamSpec>& specs, std::vector<T>& params,
                                                std::vector<T>& exp_avg, std::vector<T>& exp_avg_sq,
                                                int64_t& optimizer_steps) {
  const TrainingCheckpointReader<T> ckpt(dir, cfg, specs);
  const int64_t n = specs.back().offset + specs.back().numel;
  params.resize(size_t(n)), exp_avg.resize(size_t(n)), exp_avg_sq.resize(size_t(n));
  ckpt.params(0, n, params.data());
  ckpt.exp_avg(0, n, exp_avg.data());
  ckpt.exp_avg_sq(0, n, exp_avg_sq.data());
  optimizer_steps = ckpt.optimizer_steps();
  return ckpt.info();
}

template <class T>
TrainingCheckpointInfo load_training_checkpoint(const std::string& dir, Llama<T>& model, AdamW<T>& adamw) {
  if (adamw.begin() != 0 || adamw.end() != model.num_params())
    throw Error("load_training_checkpoint: the optimizer must cover the whole model");
  std::vector<T> params, m, v;
  int64_t optimizer_steps = 0;
  const TrainingCheckpointInfo info =
      read_training_checkpoint(dir, model.config(), model.param_specs(), params, m, v, optimizer_steps);
  ops::copy(model.params(), params.data(), model.num_params());
  adamw.load_state(optimizer_steps, m, v);
  return info;
}

#define LLAMA4D_INSTANTIATE(T)                                                                                   \
  template void save_training_checkpoint<T>(const std::string&, const Llama<T>&, const AdamW<T>&,                \
                                            const TrainOptions&, int64_t);                                       \
  template TrainingCheckpointInfo read_training_checkpoint<T>(const std::string&, const LlamaConfig&,            \
                                                              const std::vector<ParamSpec>&, std::vector<T>&,    \
                                                              std::vector<T>&, std::vector<T>&, int64_t&);       \
  template TrainingCheckpointInfo load_training_checkpoint<T>(const std::string&, Llama<T>&, AdamW<T>&);         \
  template class TrainingCheckpointReader<T>;                                                                     \
  template class TrainingCheckpointWriter<T>;
LLAMA4D_INSTANTIATE(float)
LLAMA4D_INSTANTIATE(double)
#undef LLAMA4D_INSTANTIATE

}  // namespace llama4d
