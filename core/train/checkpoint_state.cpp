#include "core/train/checkpoint_state.h"

#include <filesystem>
#include <nlohmann/json.hpp>

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
TrainingCheckpointWriter<T>::TrainingCheckpointWriter(TrainingStateImage<T>& image, int rank, const LlamaConfig& cfg,
                                                      const std::vector<ParamSpec>& specs)
    : dir_("<in-memory image>"), cfg_(cfg), specs_(specs), image_(&image), rank_(rank) {}

template <class T>
TrainingCheckpointWriter<T>::~TrainingCheckpointWriter() = default;

template <class T>
void TrainingCheckpointWriter<T>::create(int64_t optimizer_steps, int64_t steps_done,
                                         const TrainOptions& options) const {
  if (image_) return image_->create(cfg_, optimizer_steps, steps_done, options);
  write_config_file(dir_, cfg_, dtype_of<T>());
  create_tensor_files(dir_, files_->model);
  create_tensor_files(dir_, files_->optimizer);
  write_json_file(dir_ + "/" + kTrainerStateFile, {{"format", kTrainerStateFormat},
                                                   {"steps_done", steps_done},
                                                   {"optimizer_step", optimizer_steps},
                                                   {"dtype", std::string(dtype_name(dtype_of<T>()))},
                                                   {"options", options.to_json()}});
}

template <class T>
void TrainingCheckpointWriter<T>::params(int64_t begin, int64_t end, const T* data) {
  if (image_) return image_->write(rank_, kModelBase, specs_, begin, end, data, "");
  if (!files_->model_writer) files_->model_writer = std::make_unique<TensorFilesWriter>(dir_, files_->model);
  write_flat_range(*files_->model_writer, specs_, begin, end, data);
}

template <class T>
void TrainingCheckpointWriter<T>::exp_avg(int64_t begin, int64_t end, const T* data) {
  if (image_) return image_->write(rank_, kOptimizerBase, specs_, begin, end, data, "exp_avg.");
  if (!files_->optimizer_writer)
    files_->optimizer_writer = std::make_unique<TensorFilesWriter>(dir_, files_->optimizer);
  write_flat_range(*files_->optimizer_writer, specs_, begin, end, data, "exp_avg.");
}

template <class T>
void TrainingCheckpointWriter<T>::exp_avg_sq(int64_t begin, int64_t end, const T* data) {
  if (image_) return image_->write(rank_, kOptimizerBase, specs_, begin, end, data, "exp_avg_sq.");
  if (!files_->optimizer_writer)
    files_->optimizer_writer = std::make_unique<TensorFilesWriter>(dir_, files_->optimizer);
  write_flat_range(*files_->optimizer_writer, specs_, begin, end, data, "exp_avg_sq.");
}

template <class T>
void TrainingCheckpointWriter<T>::finish() {
  if (image_) return;
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

TrainingCheckpointInfo read_training_state(const std::string& dir) {
  const std::string path = dir + "/" + kTrainerStateFile;
  recover_interrupted_replace(dir);  // a save killed between its two renames (no atomic exchange)
  if (!std::filesystem::exists(path))
    throw InputError(dir + " is not a training checkpoint (no " + kTrainerStateFile + ")");
  const nlohmann::json j = read_json_file(path);
  TrainingCheckpointInfo info;
  try {
    if (!j.is_object() || j.value("format", "") != kTrainerStateFormat)
      throw InputError("\"format\" is not \"" + std::string(kTrainerStateFormat) + "\"");
    info.options = TrainOptions::from_json(j.at("options"));
    info.steps_done = whole_number(j, "steps_done");
    info.optimizer_steps = whole_number(j, "optimizer_step");
    info.dtype = j.at("dtype").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": " + e.what());
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
  auto fail = [&](const std::string& what) { throw InputError(path + ": " + what); };
  if (info.steps_done < 0 || info.steps_done > info.options.steps)
    fail("steps_done " + std::to_string(info.steps_done) + " is outside [0, options.steps = " +
         std::to_string(info.options.steps) + "]");
  // Every step applies exactly one AdamW update; another count would resume with the wrong bias
  // correction.
  if (info.optimizer_steps != info.steps_done)
    fail("optimizer_step " + std::to_string(info.optimizer_steps) + " differs from steps_done " +
         std::to_string(info.steps_done));
  if (info.dtype != dtype_name(DType::f32) && info.dtype != dtype_name(DType::f64))
    fail("dtype \"" + info.dtype + "\" is not a training dtype (F32 or F64)");
  return info;
}

TrainOptions read_train_options(const std::string& dir) { return read_training_state(dir).options; }

template <class T>
TrainingCheckpointReader<T>::TrainingCheckpointReader(const std::string& dir, const LlamaConfig& cfg,
                                                      const std::vector<ParamSpec>& specs)
    : dir_(dir), specs_(specs) {
  const LlamaConfig saved = load_config(dir);
  if (saved.to_json() != cfg.to_json())
    throw InputError("checkpoint " + dir + " holds a different model shape than the one requested");
  info_ = read_training_state(dir);
  // Reading the weights in another dtype would round them (or invent digits): not a resume.
  if (info_.dtype != dtype_name(dtype_of<T>()))
    throw InputError("checkpoint " + dir + " was trained in " + info_.dtype + ", not " +
                     std::string(dtype_name(dtype_of<T>())) +
                     " (resume with --dtype " + (info_.dtype == dtype_name(DType::f64) ? "f64" : "f32") + ")");
  model_ = std::make_shared<const TensorStore>(TensorStore::open(dir));
  optimizer_ = std::make_shared<const TensorStore>(TensorStore::open(dir, kOptimizerBase));
  // The files hold the whole model; this rank's specs may be a pipeline stage's subset of it.
  const std::vector<ParamSpec> whole = llama_param_specs(cfg);
  check_no_unexpected_tensors(*model_, whole);
  check_no_unexpected_tensors(*optimizer_, whole, {"exp_avg.", "exp_avg_sq."});
}

template <class T>
TrainingCheckpointReader<T>::TrainingCheckpointReader(const TrainingStateImage<T>& image, int rank,
                                                      const LlamaConfig& cfg, const std::vector<ParamSpec>& specs)
    : dir_("<in-memory image>"), specs_(specs), image_(&image), rank_(rank) {
  if (!image.created()) throw InputError("the training state image is empty (nothing was saved into it)");
  if (image.config().to_json() != cfg.to_json())
    throw InputError("the training state image holds a different model shape than the one requested");
  info_.options = image.options();
  info_.steps_done = image.steps_done();
  info_.optimizer_steps = image.optimizer_steps();
  info_.dtype = dtype_name(dtype_of<T>());  // an image of T holds T: nothing to round
}

template <class T>
void TrainingCheckpointReader<T>::params(int64_t begin, int64_t end, T* out) const {
  if (image_) return image_->read(rank_, kModelBase, specs_, begin, end, out, "");
  read_flat_range(*model_, specs_, begin, end, out);
}

template <class T>
void TrainingCheckpointReader<T>::exp_avg(int64_t begin, int64_t end, T* out) const {
  if (image_) return image_->read(rank_, kOptimizerBase, specs_, begin, end, out, "exp_avg.");
  read_flat_range(*optimizer_, specs_, begin, end, out, "exp_avg.");
}

template <class T>
void TrainingCheckpointReader<T>::exp_avg_sq(int64_t begin, int64_t end, T* out) const {
  if (image_) return image_->read(rank_, kOptimizerBase, specs_, begin, end, out, "exp_avg_sq.");
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
