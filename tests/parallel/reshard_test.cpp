// Checkpoints are unsharded whatever the mesh, and written by every rank at once.
//
// Checkpoints are unsharded whatever the mesh: save on dp=4 ZeRO-3, resume on dp=2 ZeRO-1, and
// the next steps are bitwise equal to one device resumed from the same checkpoint with the
// micro-batches (and order of additions) of dp=2 ZeRO-1.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/train/checkpoint_state.h"
#include "parallel_test_util.h"
#include "tests/common/tier.h"

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
LLAMA4D_TIER(Reshard, SaveOnZero3Dp4ResumeOnZero1Dp2, sanitizer);  // every rank writes its pieces of one checkpoint

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
// Every plan again: Reshard.SaveOnZero3Dp4ResumeOnZero1Dp2 writes from several ranks.
LLAMA4D_TIER(ShardedSave, EveryPlanWritesTheGatheredStateAndResumesBitwise, full);

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

namespace llama4d {
namespace {

// Tensor-parallel checkpoints hold the whole Hugging Face tensors: each rank writes the runs of
// its slices (every element once: the replicas of RMSNorm gains and KV heads are another rank's
// to write). Saved on tp=2 x dp=2 under ZeRO-3 in fp64, then:
//   - read back on one device, the file holds exactly what the ranks held (slices compared bitwise);
//   - resumed on the same mesh, training continues bitwise as if never interrupted;
//   - resumed on tp=4 (KV heads replicated), the next steps agree with one device resumed from
//     the same file within the fp64 bounds of tensor parallelism.
TEST(Reshard, TensorParallelSaveResumesOnSameAndOtherTp) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");  // 4 heads, 2 KV heads
  const TrainOptions opt = test::options(5, 0);
  const std::string dir = testing::TempDir() + "/llama4d_tp_reshard";
  std::filesystem::remove_all(dir);
  ParallelPlan saved_plan = ParallelPlan::parse("tp=2,dp=2");
  saved_plan.zero = ZeroStage::zero3;

  std::vector<double> straight_losses;
  std::vector<std::vector<double>> held(4);  // each rank's gathered slices after step 2
  test::virtual_launcher(4)([&](ProcessGroup& world) {
    Llama<double> model = saved_plan.make_model<double>(cfg, world.memory(), world.rank());
    ParallelTrainer<double> t(world, model, test::corpus(), opt, saved_plan);
    t.step();
    t.step();
    t.save_checkpoint(dir);
    t.strategy().gather_params(held[size_t(world.rank())]);
    std::vector<double> l;
    while (t.steps_done() < opt.steps) l.push_back(t.step().loss);
    if (world.rank() == 0) straight_losses = l;
  });

  // The file against every rank's slices.
  const std::vector<ParamSpec> whole = llama_param_specs(cfg);
  std::vector<double> file(size_t(flat_numel(whole))), m, v;
  int64_t optimizer_steps = 0;
  read_training_checkpoint<double>(dir, cfg, whole, file, m, v, optimizer_steps);
  EXPECT_EQ(optimizer_steps, 2);
  for (int w = 0; w < 4; ++w) {
    const std::vector<ParamSpec> mine = llama_param_specs(cfg, saved_plan.tp_layout(cfg, w));
    ASSERT_EQ(held[size_t(w)].size(), size_t(flat_numel(mine)));
    for (size_t i = 0; i < mine.size(); ++i)
      for_each_whole_run(mine[i], 0, mine[i].numel, [&](int64_t at, int64_t at_whole, int64_t n) {
        EXPECT_EQ(0, std::memcmp(held[size_t(w)].data() + mine[i].offset + at, file.data() + whole[i].offset + at_whole,
                                 size_t(n) * sizeof(double)))
            << mine[i].name << " rank " << w;
      });
  }

  auto resume = [&](const ParallelPlan& plan) {
    std::vector<double> losses;
    test::virtual_launcher(plan.world_size())([&](ProcessGroup& world) {
      Llama<double> model = plan.make_model<double>(cfg, world.memory(), world.rank());
      ParallelTrainer<double> t(world, model, test::corpus(), opt, plan);
      t.load_checkpoint(dir);
      std::vector<double> l;
      while (t.steps_done() < opt.steps) l.push_back(t.step().loss);
      if (world.rank() == 0) losses = l;
    });
    return losses;
  };
  const std::vector<double> same = resume(saved_plan);
  ASSERT_EQ(same.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(same[i], straight_losses[i]) << "step " << i + 3 << " on the same mesh";

  const ParallelPlan tp4 = ParallelPlan::parse("tp=4");
  const std::vector<double> other = resume(tp4);
  EquivalenceOptions o;
  o.model = cfg;
  o.train = opt;
  o.plan = tp4;
  const ReplayResult<double> single = replay_on_one_device<double>(o, test::corpus(), dir);
  ASSERT_EQ(other.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(other[i], single.losses[i], 1e-13 * single.losses[i]) << "step " << i + 3;
  std::filesystem::remove_all(dir);
}
// The same writes as SaveOnZero3Dp4ResumeOnZero1Dp2, sliced.
LLAMA4D_TIER(Reshard, TensorParallelSaveResumesOnSameAndOtherTp, full);

}  // namespace
}  // namespace llama4d
