#include "core/train/checkpoint_average.h"

#include <filesystem>

#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/model/llama.h"

namespace llama4d {

namespace {

DType storage_of(const std::string& torch_dtype) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    if (torch_dtype_name(t) == torch_dtype) return t;
  }
  return DType::f32;  // config.json without torch_dtype: load_model converts, save as f32
}

}  // namespace

nlohmann::json AverageResult::to_json() const {
  return {{"checkpoints", checkpoints}, {"parameters", parameters}, {"dtype", dtype}};
}

AverageResult average_checkpoints(const std::string& out, const std::vector<std::string>& inputs) {
  if (inputs.size() < 2) {
    throw InputError("averaging needs at least 2 checkpoints, got " + std::to_string(inputs.size()));
  }
  const std::string config_file = "config.json";
  const nlohmann::json first = read_json_file((std::filesystem::path(inputs[0]) / config_file).string());
  for (size_t k = 1; k < inputs.size(); ++k) {
    const nlohmann::json other = read_json_file((std::filesystem::path(inputs[k]) / config_file).string());
    if (other != first) {
      throw InputError("checkpoint " + inputs[k] + " has a different config.json from " + inputs[0] +
                       " (shape or dtype); only checkpoints of one model can be averaged");
    }
  }
  const LlamaConfig cfg = load_config(inputs[0]);
  const Llama<double> model(cfg);  // for the parameter layout: [num_params] flat, specs in order
  const std::vector<ParamSpec>& specs = model.param_specs();
  const size_t n = size_t(model.num_params());
  std::vector<double> sum(n, 0.0), one(n);
  for (const std::string& dir : inputs) {
    load_model(dir, specs, one.data());
    for (size_t i = 0; i < n; ++i) sum[i] += one[i];
  }
  const double count = double(inputs.size());
  for (double& v : sum) v /= count;
  AverageResult r;
  r.checkpoints = int64_t(inputs.size());
  r.parameters = int64_t(n);
  r.dtype = first.value("torch_dtype", torch_dtype_name(DType::f32));
  save_model(out, cfg, specs, sum.data(), storage_of(r.dtype));
  return r;
}

}  // namespace llama4d
