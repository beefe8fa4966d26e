// Checkpoints are unsharded whatever the mesh: save on dp=4 ZeRO-3, resume on dp=2 ZeRO-1, and
// the next steps are bitwise equal to one device resumed from the same checkpoint with the
// micro-batches (and order of additions) of dp=2 ZeRO-1.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/train/checkpoint_state.h"
#include "parallel_test_util.h"

namespace llama4d {
namespace {

TEST(Reshard, SaveOnZero3Dp4ResumeOnZero1Dp2) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const TrainOptions opt = test::options(5, 0);
  const std::string dir = testing::TempDir() + "/llama4d_reshard";
  std::filesystem::remove_all(dir);

  test::virtual_launcher(4)([&](ProcessGroup& world) {
    Llama<float> model(cfg, &world.memory());
    ParallelTrainer<float> t(world, model, test::corpus(), opt, test::dp_plan(4, 1, ZeroStage::zero3));
    t.step();
    t.step();
    t.save_checkpoint(dir);
  });
  ASSERT_TRUE(std::filesystem::exists(dir + "/model.safetensors"));
  EXPECT_EQ(read_train_options(dir).batch_size, opt.batch_size);

  const ParallelPlan z1 = test::dp_plan(2, 1, ZeroStage::zero1);
  std::vector<float> params;
  std::vector<double> losses;
  test::virtual_launcher(2)([&](ProcessGroup& world) {
    Llama<float> model(cfg, &world.memory());
    ParallelTrainer<float> t(world, model, test::corpus(), opt, z1);  // initialised, then overwritten
    t.load_checkpoint(dir);
    EXPECT_EQ(t.steps_done(), 2);
    std::vector<double> l;
    while (t.steps_done() < opt.steps) l.push_back(t.step().loss);
    std::vector<float> p;
    t.strategy().gather_params(p);
    if (world.rank() == 0) params = p, losses = l;
  });

  EquivalenceOptions o;
  o.model = cfg;
  o.train = opt;
  o.plan = z1;
  const ReplayResult<float> single = replay_on_one_device<float>(o, test::corpus(), dir);
  ASSERT_EQ(single.losses.size(), 3u);
  ASSERT_EQ(losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(single.losses[i], losses[i]) << "step " << i + 3;
  ASSERT_EQ(single.params.size(), params.size());
  EXPECT_EQ(0, std::memcmp(single.params.data(), params.data(), params.size() * sizeof(float)));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace llama4d
