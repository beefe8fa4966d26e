// `average`: the mean of checkpoints' weights, checked against a mean the test computes itself
// from the weights it saved.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/model/llama.h"
#include "core/train/checkpoint_average.h"

namespace llama4d {
namespace {

namespace fs = std::filesystem;

std::string fresh(const std::string& name) {
  const std::string d = testing::TempDir() + "/llama4d_average_" + name;
  fs::remove_all(d);
  return d;
}

// Three tiny checkpoints with different weights, stored as `storage`; their weights as saved.
std::vector<std::vector<double>> save_three(const std::string& base, DType storage, std::vector<std::string>& dirs) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  std::vector<std::vector<double>> weights;
  for (int k = 0; k < 3; ++k) {
    Llama<double> model(cfg);
    model.init_weights(uint64_t(100 + k));
    dirs.push_back(base + "_" + std::to_string(k));
    save_model(dirs.back(), cfg, model.param_specs(), model.params(), storage);
    std::vector<double> saved(size_t(model.num_params()));
    load_model(dirs.back(), model.param_specs(), saved.data());  // as rounded to `storage`
    weights.push_back(std::move(saved));
  }
  return weights;
}

TEST(CheckpointAverage, EqualsTheMeanOfTheSavedWeights) {
  for (DType storage : {DType::f64, DType::f32}) {
    std::vector<std::string> dirs;
    const auto w = save_three(fresh(torch_dtype_name(storage)), storage, dirs);
    const std::string out = fresh(torch_dtype_name(storage) + "_out");
    const AverageResult r = average_checkpoints(out, dirs);
    EXPECT_EQ(r.checkpoints, 3);
    EXPECT_EQ(r.dtype, torch_dtype_name(storage));
    const Llama<double> model(load_config(out));
    std::vector<double> got(size_t(model.num_params()));
    load_model(out, model.param_specs(), got.data());
    ASSERT_EQ(got.size(), w[0].size());
    size_t differing_inputs = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double mean = (w[0][i] + w[1][i] + w[2][i]) / 3.0;
      const double want = storage == DType::f32 ? double(float(mean)) : mean;
      ASSERT_EQ(got[i], want) << torch_dtype_name(storage) << " element " << i;
      differing_inputs += w[0][i] != w[1][i];
    }
    EXPECT_GT(differing_inputs, got.size() / 2);  // the inputs really differ: a copy of one would fail
    for (const std::string& d : dirs) fs::remove_all(d);
    fs::remove_all(out);
  }
}

TEST(CheckpointAverage, RefusesFewerThanTwoOrDifferentConfigs) {
  std::vector<std::string> dirs;
  save_three(fresh("refuse"), DType::f32, dirs);
  const std::string out = fresh("refuse_out");
  EXPECT_THROW(average_checkpoints(out, {dirs[0]}), InputError);
  EXPECT_THROW(average_checkpoints(out, {}), InputError);
  // Same shape, other storage dtype: a different config.json.
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  Llama<double> model(cfg);
  model.init_weights(1);
  const std::string f64 = fresh("refuse_f64");
  save_model(f64, cfg, model.param_specs(), model.params(), DType::f64);
  EXPECT_THROW(average_checkpoints(out, {dirs[0], f64}), InputError);
  // Another shape.
  LlamaConfig wide = cfg;
  wide.intermediate_size *= 2;
  Llama<double> other(wide);
  other.init_weights(1);
  const std::string shaped = fresh("refuse_shape");
  save_model(shaped, wide, other.param_specs(), other.params(), DType::f32);
  EXPECT_THROW(average_checkpoints(out, {dirs[0], dirs[1], shaped}), InputError);
  EXPECT_FALSE(fs::exists(out));  // nothing written on refusal
  for (const std::string& d : dirs) fs::remove_all(d);
  fs::remove_all(f64);
  fs::remove_all(shaped);
}

}  // namespace
}  // namespace llama4d
