#include "cli/init_checkpoint.h"

#include "core/io/checkpoint.h"
#include "core/model/llama.h"
#include "core/train/trainer.h"

namespace llama4d::cli {

template <class T>
std::string stage_init_checkpoint(const LlamaConfig& cfg, const std::string& model_dir, const TextDataset& data,
                                  const TrainOptions& opt, const std::string& dir) {
  Llama<T> model(cfg);
  model.init_weights(opt.seed);  // allocates; every value is then read from the directory
  load_model(model_dir, model.param_specs(), model.params());
  const Trainer<T> trainer(model, data, opt);
  trainer.save_checkpoint(dir);
  return dir;
}

template std::string stage_init_checkpoint<float>(const LlamaConfig&, const std::string&, const TextDataset&,
                                                  const TrainOptions&, const std::string&);
template std::string stage_init_checkpoint<double>(const LlamaConfig&, const std::string&, const TextDataset&,
                                                   const TrainOptions&, const std::string&);

}  // namespace llama4d::cli
