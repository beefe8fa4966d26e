// Resume: 10 steps, save, a fresh process-like restart that loads the checkpoint and runs 10
// more, must equal 20 straight steps BITWISE (every loss and every parameter). This holds only
// if the checkpoint stores weights and both AdamW moments in the training dtype, restores the
// step counter (bias correction, LR schedule) and batches depend on the step alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/tensor/dtype.h"
#include "core/train/checkpoint_state.h"
#include "core/train/trainer.h"
#include "train_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

template <class T>
void check_resume_bitwise() {
  const TextDataset data = make_dataset(test::small_corpus(), 32);
  const TrainOptions opt = test::tiny_options(20);
  const std::string dir = testing::TempDir() + "/llama4d_resume_" + std::string(dtype_name(dtype_of<T>()));
  std::filesystem::remove_all(dir);

  // 20 straight steps.
  Llama<T> straight(test::tiny_config());
  straight.init_weights(opt.seed);
  Trainer<T> a(straight, data, opt);
  std::vector<double> losses_straight;
  for (int i = 0; i < 20; ++i) losses_straight.push_back(a.step().loss);

  // 10 steps, checkpoint, a new model + trainer from the checkpoint, 10 more.
  std::vector<double> losses_resumed;
  {
    Llama<T> first(test::tiny_config());
    first.init_weights(opt.seed);
    Trainer<T> b(first, data, opt);
    for (int i = 0; i < 10; ++i) losses_resumed.push_back(b.step().loss);
    b.save_checkpoint(dir);
  }
  Llama<T> second(test::tiny_config());
  second.init_weights(12345);  // deliberately different: everything must come from the checkpoint
  Trainer<T> c(second, data, opt);
  c.load_checkpoint(dir);
  EXPECT_EQ(c.steps_done(), 10);
  for (int i = 0; i < 10; ++i) losses_resumed.push_back(c.step().loss);

  ASSERT_EQ(losses_straight.size(), losses_resumed.size());
  for (size_t i = 0; i < losses_straight.size(); ++i)
    EXPECT_EQ(losses_straight[i], losses_resumed[i]) << "loss of step " << i + 1 << " differs";
  EXPECT_EQ(0, std::memcmp(straight.params(), second.params(), size_t(straight.num_params()) * sizeof(T)))
      << "parameters after 20 steps differ";
  EXPECT_EQ(0, std::memcmp(a.optimizer().exp_avg_sq().data(), c.optimizer().exp_avg_sq().data(),
                           size_t(straight.num_params()) * sizeof(T)));
  // Training moved the weights (so the comparison above is not trivially true).
  Llama<T> init(test::tiny_config());
  init.init_weights(opt.seed);
  EXPECT_NE(0, std::memcmp(init.params(), straight.params(), size_t(init.num_params()) * sizeof(T)));
  std::filesystem::remove_all(dir);
}

TEST(Resume, TenPlusTenEqualsTwentyBitwiseFp32) { check_resume_bitwise<float>(); }
TEST(Resume, TenPlusTenEqualsTwentyBitwiseFp64) { check_resume_bitwise<double>(); }

TEST(Resume, RefusesCheckpointTrainedWithOtherOptions) {
  const TextDataset data = make_dataset(test::small_corpus(), 32);
  const std::string dir = testing::TempDir() + "/llama4d_resume_mismatch";
  std::filesystem::remove_all(dir);
  TrainOptions opt = test::tiny_options(4);
  Llama<float> m(test::tiny_config());
  m.init_weights(1);
  Trainer<float> t(m, data, opt);
  t.step();
  t.save_checkpoint(dir);
  opt.lr *= 2;
  Trainer<float> other(m, data, opt);
  EXPECT_THROW(other.load_checkpoint(dir), InputError);
  EXPECT_EQ(read_train_options(dir).lr, test::tiny_options(4).lr);
  std::filesystem::remove_all(dir);
}
LLAMA4D_TIER(Resume, TenPlusTenEqualsTwentyBitwiseFp64, full);  // its fp32 twin runs the same code

// Every option that reaches trainer_state.json is in the table that decides what a resume may
// change; one missing from it would be neither applied nor refused on resume.
TEST(Resume, EveryOptionIsClassifiedForResume) {
  std::vector<std::string> keys;
  const nlohmann::json j = TrainOptions().to_json();
  for (const auto& [k, v] : j.items())
    if (k == "adamw")
      for (const auto& [ka, va] : v.items()) keys.push_back("/adamw/" + ka);
    else if (k != "loop")
      keys.push_back("/" + k);
  std::vector<std::string> table;
  for (const TrainOptionField& f : train_option_fields()) table.push_back(f.pointer);
  std::sort(keys.begin(), keys.end());
  std::sort(table.begin(), table.end());
  EXPECT_EQ(keys, table);
}

TEST(Resume, OnlyStepsAndMicroBatchMayChange) {
  const TrainOptions saved = test::tiny_options(10);
  TrainOptions asked = saved;
  asked.steps = 20;
  asked.micro_batch_size = 0;  // automatic: saved as asked, not as the 4 it resolves to
  asked.loop = R"({"save_every": 5})";
  EXPECT_NO_THROW(check_resumable(saved, 6, asked));
  EXPECT_EQ(asked.to_json().at("micro_batch_size"), 0);
  asked.steps = 5;
  EXPECT_THROW(check_resumable(saved, 6, asked), InputError);  // below the steps done
  for (const TrainOptionField& f : train_option_fields()) {
    if (f.may_change_on_resume) continue;
    nlohmann::json j = saved.to_json();
    const nlohmann::json::json_pointer at(f.pointer);
    nlohmann::json& v = j[at];
    if (v.is_boolean())
      v = !v.get<bool>();
    else if (v.is_number_unsigned())
      v = v.get<uint64_t>() * 2;
    else if (v.is_number_integer())
      v = v.get<int64_t>() * 2;
    else
      v = v.get<double>() / 2;
    try {
      check_resumable(saved, 6, TrainOptions::from_json(j));
      ADD_FAILURE() << f.flag << " changed without an error";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(f.flag), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace llama4d
