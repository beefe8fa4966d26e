// A training recipe's stage boundary through the trainers (core/train/recipe.h,
// core/parallel/reshard_in_memory.h): the batch doubled from dp=2 to dp=4, the state moved in
// memory, against one device running the same stages; a boundary on the same plan kept in place,
// against saving and resuming.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "core/parallel/reshard_in_memory.h"
#include "core/train/recipe.h"
#include "core/train/trainer.h"
#include "parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Stage 1: 3 steps of 4 rows on dp=2, LR warm-up. Stage 2: 8 rows on dp=4, LR linear to zero.
Recipe ramp(int64_t max_positions) {
  return parse_recipe(nlohmann::json::parse(R"({"name": "ramp", "seed": 5, "stages": [
    {"name": "small", "steps": 3, "batch_size": 4, "seq_len": 16, "dp": 2,
     "data": {"corpus": 1}, "lr": {"shape": "warmup", "from": 0.002, "to": 0.01}},
    {"name": "big", "steps": 3, "batch_size": 8, "seq_len": 16, "dp": 4,
     "data": {"corpus": 1}, "lr": {"shape": "linear", "from": 0.01, "to": 0}}]})"),
                      max_positions);
}

// The reference is one device (Trainer) running each stage with gradient accumulation over
// micro-batches of the rows one data rank holds (2 in both stages), with a checkpoint between
// the stages. Ordered all-reduces add the ranks' gradients in rank order, which the one device's
// micro-batch sum replays, and the loss is scaled by the global token count in both: the weights
// and AdamW moments after the recipe must be the same bytes.
TEST(RecipeStages, BatchRampMovedInMemoryEqualsOneDeviceAcrossACheckpoint) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const Recipe recipe = ramp(cfg.max_position_embeddings);
  const TrainOptions base = test::options(1, 0);
  const TrainOptions first = recipe.stage_options(base, 0), second = recipe.stage_options(base, 1);
  ASSERT_EQ(second.recipe.first_step, 3);
  ASSERT_EQ(second.steps, 6);
  const std::string root = testing::TempDir() + "/llama4d_recipe_stages";
  std::filesystem::remove_all(root);
  const std::string parallel = root + "/parallel", mid = root + "/one_device_mid", one = root + "/one_device";

  InMemoryReshard<float> move;
  const ParallelPlan dp2 = ParallelPlan::parse("dp=2"), dp4 = ParallelPlan::parse("dp=4");
  test::virtual_launcher(2)([&](ProcessGroup& world) {
    Llama<float> model = dp2.make_model<float>(cfg, world.memory(), world.rank());
    ParallelTrainer<float> a(world, model, test::corpus(), first, dp2);
    for (int i = 0; i < 3; ++i) a.step();
    move.capture(a);
  });
  std::vector<double> lr_parallel;
  test::virtual_launcher(4)([&](ProcessGroup& world) {
    Llama<float> model = dp4.make_model<float>(cfg, world.memory(), world.rank());
    ParallelTrainer<float> b(world, model, test::corpus(), second, dp4);
    move.restore(b);
    for (int i = 0; i < 3; ++i) {
      const double lr = b.step().lr;
      if (world.rank() == 0) lr_parallel.push_back(lr);
    }
    b.save_checkpoint(parallel);
  });

  TrainOptions one_first = first, one_second = second;
  one_first.micro_batch_size = one_second.micro_batch_size = 2;
  {
    Llama<float> model(cfg);
    model.init_weights(one_first.seed);
    Trainer<float> t(model, test::corpus(), one_first);
    for (int i = 0; i < 3; ++i) t.step();
    t.save_checkpoint(mid);
  }
  {
    Llama<float> model(cfg);
    Trainer<float> t(model, test::corpus(), one_second);
    t.load_checkpoint(mid);
    for (int i = 0; i < 3; ++i) t.step();
    t.save_checkpoint(one);
  }
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(file_bytes(parallel + "/" + f) == file_bytes(one + "/" + f)) << f;
  // Linear 0.01 -> 0 over 3 steps, by hand.
  ASSERT_EQ(lr_parallel.size(), 3u);
  EXPECT_DOUBLE_EQ(lr_parallel[0], 0.01);
  EXPECT_DOUBLE_EQ(lr_parallel[1], 0.01 * 2 / 3);
  EXPECT_DOUBLE_EQ(lr_parallel[2], 0.01 / 3);
  std::filesystem::remove_all(root);
}
LLAMA4D_TIER(RecipeStages, BatchRampMovedInMemoryEqualsOneDeviceAcrossACheckpoint, quick);

// check_resumable(saved, 3, requested) refuses with an InputError whose message holds `text`.
void expect_refused(const TrainOptions& saved, const TrainOptions& requested, const std::string& text) {
  try {
    check_resumable(saved, 3, requested);
    ADD_FAILURE() << "accepted; expected a refusal saying: " << text;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

// The recipe position decides what a resume accepts: the next stage of the same recipe may
// change batch, seq_len and LR; another recipe, a changed one, or a plain run may not.
TEST(RecipeStages, ResumabilityFollowsTheRecipe) {
  const Recipe recipe = ramp(128);
  const TrainOptions base = test::options(1, 0);
  const TrainOptions first = recipe.stage_options(base, 0), second = recipe.stage_options(base, 1);
  EXPECT_NO_THROW(check_resumable(first, 3, second));
  Recipe other = recipe;
  other.name = "other";
  expect_refused(first, other.stage_options(base, 1), "recipe \"other\" is not the checkpoint's recipe");
  Recipe changed = recipe;
  changed.stages[1].steps = 4;
  expect_refused(first, changed.stage_options(base, 1), "has changed since the checkpoint was saved");
  TrainOptions plain = base;
  plain.steps = 6;
  expect_refused(first, plain, "resume it with --recipe");
  expect_refused(plain, second, "the checkpoint was saved by a run of one shape, not by a recipe");
  // What the recipe does not give still must match.
  TrainOptions clipped = second;
  clipped.grad_clip = 0.5;
  expect_refused(first, clipped, "--grad-clip 0.5 differs from the checkpoint's");
  // The options round-trip through trainer_state.json with the position.
  const TrainOptions back = TrainOptions::from_json(second.to_json());
  EXPECT_EQ(back.to_json(), second.to_json());
  EXPECT_EQ(back.recipe.stage_name, "big");
}
LLAMA4D_TIER(RecipeStages, ResumabilityFollowsTheRecipe, quick);

// A data mix of one source, the train split itself, draws the windows the plain sampler draws
// (DataMix and sample_rows share window_start): so a trainer reading its rows through the mix,
// each data rank its own rows of the global batch, ends on the plain trainer's bytes.
TEST(RecipeStages, MixOfTheTrainSplitAloneEqualsThePlainRows) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const TrainOptions opt = test::options(2, 0);
  const ParallelPlan dp2 = ParallelPlan::parse("dp=2");
  const DataMix mix({{"train", test::corpus().train(), 1}}, opt.seq_len);
  const std::string root = testing::TempDir() + "/llama4d_recipe_mix";
  std::filesystem::remove_all(root);
  for (const bool through_mix : {false, true}) {
    test::virtual_launcher(2)([&](ProcessGroup& world) {
      Llama<float> model = dp2.make_model<float>(cfg, world.memory(), world.rank());
      ParallelTrainer<float> t(world, model, test::corpus(), opt, dp2);
      if (through_mix) t.set_data_mix(&mix);
      t.step();
      t.step();
      t.save_checkpoint(root + (through_mix ? "/mix" : "/plain"));
    });
  }
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(file_bytes(root + "/mix/" + f) == file_bytes(root + "/plain/" + f)) << f;
  // A mix of rows of another length is refused by name.
  const DataMix other({{"train", test::corpus().train(), 1}}, opt.seq_len / 2);
  test::virtual_launcher(2)([&](ProcessGroup& world) {
    Llama<float> model = dp2.make_model<float>(cfg, world.memory(), world.rank());
    ParallelTrainer<float> t(world, model, test::corpus(), opt, dp2);
    EXPECT_THROW(t.set_data_mix(&other), InputError);
  });
  std::filesystem::remove_all(root);
}
LLAMA4D_TIER(RecipeStages, MixOfTheTrainSplitAloneEqualsThePlainRows, quick);

// Two stages on the same plan (only the rows, the sequence length and the LR change): the
// trainer goes on in place (continue_with), and must end on the bytes of saving after stage 1
// and resuming stage 2 on a fresh trainer of that plan from the checkpoint, for a replicated
// state with context parallelism (cp=2, dp=2) and for a sharded one (ZeRO-3 over dp=2).
TEST(RecipeStages, SamePlanBoundaryKeptInPlaceEqualsSaveAndResume) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const Recipe recipe = parse_recipe(nlohmann::json::parse(R"({"name": "long", "seed": 7, "stages": [
    {"name": "seq-16", "steps": 3, "batch_size": 8, "seq_len": 16, "dp": 2, "cp": 2,
     "data": {"corpus": 1}, "lr": {"shape": "cosine", "from": 0.01, "to": 0.005}},
    {"name": "seq-32", "steps": 2, "batch_size": 4, "seq_len": 32, "dp": 2, "cp": 2,
     "data": {"corpus": 1}, "lr": {"shape": "linear", "from": 0.005, "to": 0}}]})"),
                                     cfg.max_position_embeddings);
  const TrainOptions base = test::options(1, 0);
  const TrainOptions first = recipe.stage_options(base, 0), second = recipe.stage_options(base, 1);
  const std::string root = testing::TempDir() + "/llama4d_recipe_same_plan";
  for (const char* mesh : {"cp=2,dp=2", "dp=2/zero3"}) {
    std::filesystem::remove_all(root);
    const std::string m = mesh;
    ParallelPlan plan = ParallelPlan::parse(m.substr(0, m.find('/')));
    if (m.find("zero3") != std::string::npos) plan.zero = ZeroStage::zero3;
    const int ranks = plan.world_size();
    test::virtual_launcher(ranks)([&](ProcessGroup& world) {
      Llama<float> model = plan.make_model<float>(cfg, world.memory(), world.rank());
      ParallelTrainer<float> t(world, model, test::corpus(), first, plan);
      for (int i = 0; i < 3; ++i) t.step();
      t.continue_with(second);
      for (int i = 0; i < 2; ++i) t.step();
      t.save_checkpoint(root + "/in_place");
    });
    test::virtual_launcher(ranks)([&](ProcessGroup& world) {
      Llama<float> model = plan.make_model<float>(cfg, world.memory(), world.rank());
      ParallelTrainer<float> t(world, model, test::corpus(), first, plan);
      for (int i = 0; i < 3; ++i) t.step();
      t.save_checkpoint(root + "/mid");
    });
    test::virtual_launcher(ranks)([&](ProcessGroup& world) {
      Llama<float> model = plan.make_model<float>(cfg, world.memory(), world.rank());
      ParallelTrainer<float> t(world, model, test::corpus(), second, plan);
      t.load_checkpoint(root + "/mid");
      for (int i = 0; i < 2; ++i) t.step();
      t.save_checkpoint(root + "/resumed");
    });
    for (const char* f : {"model.safetensors", "optimizer.safetensors", "trainer_state.json"})
      EXPECT_TRUE(file_bytes(root + "/in_place/" + f) == file_bytes(root + "/resumed/" + f)) << mesh << " " << f;
  }
  // What a resume would refuse, continue_with refuses by name: another seed.
  const ParallelPlan dp2 = ParallelPlan::parse("dp=2");
  TrainOptions reseeded = recipe.stage_options(base, 1);
  reseeded.seed = 8;
  test::virtual_launcher(2)([&](ProcessGroup& world) {
    Llama<float> model = dp2.make_model<float>(cfg, world.memory(), world.rank());
    ParallelTrainer<float> t(world, model, test::corpus(), recipe.stage_options(base, 0), dp2);
    try {
      t.continue_with(reseeded);
      ADD_FAILURE() << "accepted another seed";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--seed 8 differs"), std::string::npos) << e.what();
    }
  });
  std::filesystem::remove_all(root);
}
LLAMA4D_TIER(RecipeStages, SamePlanBoundaryKeptInPlaceEqualsSaveAndResume, quick);

}  // namespace
}  // namespace llama4d
