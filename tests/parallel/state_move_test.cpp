// Trainer state moved through memory (core/train/state_image.h, core/parallel/reshard_in_memory.h):
// an image saved on plan A and loaded on plan B leaves B in the state, byte for byte, that
// saving A to disk and resuming on B leaves it in.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/parallel/reshard_in_memory.h"
#include "core/train/checkpoint_state.h"
#include "parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

std::string state_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

ParallelPlan move_plan(const std::string& text, ZeroStage zero = ZeroStage::none) {
  ParallelPlan p = ParallelPlan::parse(text);
  p.zero = zero;
  return p;
}

struct MoveBoundary {
  const char* name;
  ParallelPlan a, b;
  bool moves_nothing = false;  // every rank of B keeps only what the same rank of A wrote
};

// At each kind of stage boundary of a training recipe (Llama 3 grew the batch, then the context,
// "The Llama 3 Herd of Models", 2024, section 3.4): train two steps on A, then on B both
//   disk:   A saves a checkpoint, B resumes from it, trains one step, saves;
//   memory: A saves an image, B loads it, trains one step, saves.
// Both of B's checkpoints must be the same bytes, file by file, and the step between the same loss.
TEST(StateMove, ReshardInMemoryEqualsSaveAndResumeAtEveryBoundary) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const TrainOptions opt = test::options(3, 2);
  const std::string root = testing::TempDir() + "/llama4d_state_move";
  const std::vector<MoveBoundary> boundaries = {
      {"dp2_to_dp4", move_plan("dp=2"), move_plan("dp=4")},
      {"cp1_to_cp2", move_plan("dp=2"), move_plan("dp=2,cp=2")},
      // A ZeRO-1 rank writes the piece of weights and moments it updates, the same piece ZeRO-3
      // keeps: raising the stage moves nothing.
      {"zero1_to_zero3", move_plan("dp=2", ZeroStage::zero1), move_plan("dp=2", ZeroStage::zero3), true},
      {"tp2_to_tp1", move_plan("tp=2,dp=2", ZeroStage::zero1), move_plan("dp=2", ZeroStage::zero1)},
      {"pp2_to_pp1", move_plan("pp=2"), move_plan("dp=1")},
  };
  for (const MoveBoundary& c : boundaries) {
    SCOPED_TRACE(c.name);
    std::filesystem::remove_all(root);
    const std::string saved = root + "/a", by_disk = root + "/b_disk", by_memory = root + "/b_memory";
    InMemoryReshard<float> move;
    test::virtual_launcher(c.a.world_size())([&](ProcessGroup& world) {
      Llama<float> model = c.a.make_model<float>(cfg, world.memory(), world.rank());
      ParallelTrainer<float> a(world, model, test::corpus(), opt, c.a);
      a.step();
      a.step();
      a.save_checkpoint(saved);
      move.capture(a);
    });
    double loss_disk = 0, loss_memory = 0;
    StateMoves moved;
    test::virtual_launcher(c.b.world_size())([&](ProcessGroup& world) {
      Llama<float> model = c.b.make_model<float>(cfg, world.memory(), world.rank());
      ParallelTrainer<float> b(world, model, test::corpus(), opt, c.b);
      b.load_checkpoint(saved);
      const double l = b.step().loss;
      b.save_checkpoint(by_disk);
      if (world.rank() == 0) loss_disk = l;
    });
    test::virtual_launcher(c.b.world_size())([&](ProcessGroup& world) {
      Llama<float> model = c.b.make_model<float>(cfg, world.memory(), world.rank());
      ParallelTrainer<float> b(world, model, test::corpus(), opt, c.b);  // initialised, then overwritten
      const StateMoves m = move.restore(b);
      EXPECT_EQ(b.steps_done(), 2);
      const double l = b.step().loss;
      b.save_checkpoint(by_memory);
      if (world.rank() == 0) loss_memory = l, moved = m;
    });
    EXPECT_EQ(loss_disk, loss_memory);
    for (const char* f : {"config.json", "model.safetensors", "optimizer.safetensors", kTrainerStateFile})
      EXPECT_TRUE(state_file_bytes(by_disk + "/" + f) == state_file_bytes(by_memory + "/" + f)) << f;
    // B moved something (its ranks do not hold what A's held), never more than it read.
    if (c.moves_nothing)
      EXPECT_EQ(moved.total_moved(), 0);
    else
      EXPECT_GT(moved.total_moved(), 0);
    EXPECT_LE(moved.total_moved(), moved.total_read());
  }
  std::filesystem::remove_all(root);
}
LLAMA4D_TIER(StateMove, ReshardInMemoryEqualsSaveAndResumeAtEveryBoundary, quick);

// What moved, counted by hand. N parameters, 4-byte floats, three tensors each (weights, two
// moments). ZeRO-3 dp=2 saved and loaded on the same plan: each rank reads back exactly its own
// pieces, so nothing moves and 3 N floats are read in all. Plain dp=2 loaded on dp=2: each rank
// wrote half of every tensor and reads all of it, so each moves 3 N / 2 floats.
TEST(StateMove, MovesCountWhatAnotherRankWrote) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const TrainOptions opt = test::options(2, 2);
  const int64_t n = flat_numel(llama_param_specs(cfg));
  for (const ZeroStage zero : {ZeroStage::zero3, ZeroStage::none}) {
    SCOPED_TRACE(int(zero));
    const ParallelPlan p = move_plan("dp=2", zero);
    InMemoryReshard<float> move;
    std::vector<StateMoves> moved(2);
    test::virtual_launcher(2)([&](ProcessGroup& world) {
      Llama<float> model(cfg, &world.memory());
      ParallelTrainer<float> a(world, model, test::corpus(), opt, p);
      a.step();
      move.capture(a);
      Llama<float> model_b(cfg, &world.memory());
      ParallelTrainer<float> b(world, model_b, test::corpus(), opt, p);
      moved[size_t(world.rank())] = move.restore(b);
    });
    const StateMoves& m = moved[0];
    ASSERT_EQ(m.bytes_read.size(), 2u);
    if (zero == ZeroStage::zero3) {
      EXPECT_EQ(m.total_read(), 3 * n * 4);
      EXPECT_EQ(m.total_moved(), 0);
    } else {
      EXPECT_EQ(m.total_read(), 2 * 3 * n * 4);
      EXPECT_EQ(m.bytes_moved[0] + m.bytes_moved[1], 3 * n * 4);
    }
  }
}
LLAMA4D_TIER(StateMove, MovesCountWhatAnotherRankWrote, quick);

// An image of another model shape, or an empty one, is refused on every rank with the reason.
TEST(StateMove, ImageOfAnotherShapeOrEmptyIsRefused) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  LlamaConfig other = cfg;
  other.num_hidden_layers += 1;
  const TrainOptions opt = test::options(2, 2);
  InMemoryReshard<float> empty, move;
  std::vector<std::string> errors(2);
  test::virtual_launcher(2)([&](ProcessGroup& world) {
    Llama<float> model(other, &world.memory());
    ParallelTrainer<float> a(world, model, test::corpus(), opt, move_plan("dp=2"));
    move.capture(a);
    Llama<float> model_b(cfg, &world.memory());
    ParallelTrainer<float> b(world, model_b, test::corpus(), opt, move_plan("dp=2"));
    try {
      empty.restore(b);
    } catch (const InputError& e) {
      errors[size_t(world.rank())] = e.what();
    }
    try {
      move.restore(b);
    } catch (const InputError& e) {
      errors[size_t(world.rank())] += std::string(" | ") + e.what();
    }
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("image is empty"), std::string::npos) << e;
    EXPECT_NE(e.find("different model shape"), std::string::npos) << e;
  }
}
LLAMA4D_TIER(StateMove, ImageOfAnotherShapeOrEmptyIsRefused, quick);

}  // namespace
}  // namespace llama4d
