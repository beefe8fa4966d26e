// Checkpoints are unsharded whatever the mesh, and written by every rank at once.
//
// Checkpoints are unsharded whatever the mesh: save on dp=4 ZeRO-3, resume on dp=2 ZeRO-1, and
// the next steps are bitwise equal to one device resumed from the same checkpoint with the
// micro-batches (and order of additions) of dp=2 ZeRO-1.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

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
  ASSERT_EQ(single.params.back().size(), params.size());
  EXPECT_EQ(0, std::memcmp(single.params.back().data(), params.data(), params.size() * sizeof(float)));
  std::filesystem::remove_all(dir);
}

// Every rank writes its own share straight into the files (DP replicas split the buffer, ZeRO
// ranks write their pieces, the first HSDP replica writes for all): the file holds exactly the
// gathered weights, and resuming on the same mesh continues bitwise as if never interrupted
// (which it cannot if any moment was written wrong or not at all).
TEST(ShardedSave, EveryPlanWritesTheGatheredStateAndResumesBitwise) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const TrainOptions opt = test::options(4, 0);
  const std::vector<ParamSpec> specs = llama_param_specs(cfg);
  const std::string dir = testing::TempDir() + "/llama4d_sharded_save";
  for (const ParallelPlan& plan :
       {test::dp_plan(2, 1, ZeroStage::none), test::dp_plan(3, 1, ZeroStage::zero1), test::dp_plan(2, 1, ZeroStage::zero2),
        test::dp_plan(4, 1, ZeroStage::zero3), test::dp_plan(2, 2, ZeroStage::zero3)}) {
    SCOPED_TRACE(plan.to_json().dump());
    std::filesystem::remove_all(dir);
    std::vector<float> saved, straight;
    std::vector<double> straight_losses, resumed_losses;
    test::virtual_launcher(plan.world_size())([&](ProcessGroup& world) {
      Llama<float> model(cfg, &world.memory());
      ParallelTrainer<float> t(world, model, test::corpus(), opt, plan);
      t.step();
      t.step();
      std::vector<float> p;
      t.strategy().gather_params(p);
      t.save_checkpoint(dir);
      std::vector<double> l;
      while (t.steps_done() < opt.steps) l.push_back(t.step().loss);
      if (world.rank() == 0) saved = p, straight_losses = l;
      t.strategy().gather_params(p);
      if (world.rank() == 0) straight = p;
    });
    std::vector<float> in_file(saved.size());
    load_model(dir, specs, in_file.data());
    EXPECT_EQ(0, std::memcmp(in_file.data(), saved.data(), saved.size() * sizeof(float)));
    EXPECT_EQ(read_json_file(dir + "/trainer_state.json")["optimizer_step"], 2);

    std::vector<float> resumed;
    test::virtual_launcher(plan.world_size())([&](ProcessGroup& world) {
      Llama<float> model(cfg, &world.memory());
      ParallelTrainer<float> t(world, model, test::corpus(), opt, plan);
      t.load_checkpoint(dir);
      std::vector<double> l;
      while (t.steps_done() < opt.steps) l.push_back(t.step().loss);
      std::vector<float> p;
      t.strategy().gather_params(p);
      if (world.rank() == 0) resumed = p, resumed_losses = l;
    });
    EXPECT_EQ(resumed_losses, straight_losses);
    ASSERT_EQ(resumed.size(), straight.size());
    EXPECT_EQ(0, std::memcmp(resumed.data(), straight.data(), straight.size() * sizeof(float)));
  }
  std::filesystem::remove_all(dir);
}

// A save that cannot start (the target is someone's folder, not a checkpoint) fails on every
// rank with rank 0's reason or one naming rank 0; nobody waits, and the folder is untouched.
TEST(ShardedSave, FailureOnOneRankReachesEveryRank) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const std::string dir = testing::TempDir() + "/llama4d_not_a_checkpoint";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  { std::ofstream(dir + "/notes.txt") << "mine"; }
  std::vector<std::string> errors(4);
  test::virtual_launcher(4)([&](ProcessGroup& world) {
    Llama<float> model(cfg, &world.memory());
    ParallelTrainer<float> t(world, model, test::corpus(), test::options(1, 0), test::dp_plan(4, 1, ZeroStage::zero3));
    try {
      t.save_checkpoint(dir);
    } catch (const InputError& e) {
      errors[size_t(world.rank())] = std::string("InputError: ") + e.what();
    } catch (const IoError& e) {
      errors[size_t(world.rank())] = std::string("IoError: ") + e.what();
    }
  });
  EXPECT_NE(errors[0].find("InputError: refusing to replace non-empty directory"), std::string::npos) << errors[0];
  for (int r = 1; r < 4; ++r) EXPECT_EQ(errors[size_t(r)], "IoError: checkpoint " + dir + " was not written: rank 0 failed");
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"notes.txt"});
  std::vector<std::string> siblings;
  for (const auto& e : std::filesystem::directory_iterator(testing::TempDir()))
    if (e.path().filename().string().rfind("llama4d_not_a_checkpoint.tmp", 0) == 0) siblings.push_back(e.path());
  EXPECT_TRUE(siblings.empty()) << "a staging directory was left behind";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace llama4d
