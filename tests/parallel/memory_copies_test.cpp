// In-memory copies (core/parallel/memory_copies.h): a job that loses a node recovers its state
// from the partners' copies and ends on the same bytes as a run that never failed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/comm/traffic_labels.h"
#include "core/parallel/memory_copies.h"
#include "core/train/checkpoint_state.h"
#include "parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

std::string copies_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

ParallelPlan copies_plan(const std::string& text, ZeroStage zero = ZeroStage::none) {
  ParallelPlan p = ParallelPlan::parse(text);
  p.zero = zero;
  return p;
}

constexpr int kGpusPerNode = 2;

// Trains `plan` to opt.steps and saves `dir`; with copies, takes one every K steps. `stop_after`
// > 0: the attempt ends (fails) after that many steps, before saving.
void run_attempt(const ParallelPlan& plan, const TrainOptions& opt, MemoryCopies<float>* copies,
                 const TrainingStateImage<float>* from, int64_t stop_after, const std::string& dir) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  test::virtual_launcher(plan.world_size())([&](ProcessGroup& world) {
    Llama<float> model = plan.make_model<float>(cfg, world.memory(), world.rank());
    ParallelTrainer<float> t(world, model, test::corpus(), opt, plan);
    if (from) t.load_state(*from);
    while (t.steps_done() < opt.steps) {
      t.step();
      if (copies && copies->due(t.steps_done())) copies->take(t, world);
      if (t.steps_done() == stop_after) return;
    }
    t.save_checkpoint(dir);
  });
}

// Copies every 2 steps, 2 GPUs per node; the job fails after step 3, loses one node, restarts
// from the partners' copies of step 2 (no disk) and replays steps 3 and 4. Its final checkpoint
// is byte for byte the uninterrupted one.
void expect_recovery_from_memory_is_bitwise(const ParallelPlan& plan, const std::vector<int>& lost_nodes) {
  SCOPED_TRACE(plan.to_json().dump());
  const TrainOptions opt = test::options(4, 2);
  const std::string root = testing::TempDir() + "/llama4d_memory_copies";
  std::filesystem::remove_all(root);
  run_attempt(plan, opt, nullptr, nullptr, 0, root + "/straight");
  const std::string straight_model = copies_file_bytes(root + "/straight/model.safetensors");
  const std::string straight_moments = copies_file_bytes(root + "/straight/optimizer.safetensors");
  const std::string straight_state = copies_file_bytes(root + "/straight/" + std::string(kTrainerStateFile));
  for (int lost : lost_nodes) {
    SCOPED_TRACE("node " + std::to_string(lost) + " lost");
    MemoryCopies<float> copies(plan.world_size(), kGpusPerNode, 2);
    run_attempt(plan, opt, &copies, nullptr, 3, "");
    EXPECT_EQ(copies.step(), 2);
    copies.lose_node(lost);
    ASSERT_EQ(copies.why_unrecoverable(), "");
    TrainingStateImage<float> image;
    copies.restore_into(image);
    const std::string dir = root + "/recovered" + std::to_string(lost);
    run_attempt(plan, opt, &copies, &image, 0, dir);
    EXPECT_TRUE(copies_file_bytes(dir + "/model.safetensors") == straight_model);
    EXPECT_TRUE(copies_file_bytes(dir + "/optimizer.safetensors") == straight_moments);
    EXPECT_TRUE(copies_file_bytes(dir + "/" + std::string(kTrainerStateFile)) == straight_state);
  }
  std::filesystem::remove_all(root);
}

// ZeRO-3 on dp=4 (2 nodes), each node lost in turn.
TEST(MemoryCopies, RecoveryFromMemoryEqualsAnUninterruptedRun) {
  expect_recovery_from_memory_is_bitwise(copies_plan("dp=4", ZeroStage::zero3), {0, 1});
}
LLAMA4D_TIER(MemoryCopies, RecoveryFromMemoryEqualsAnUninterruptedRun, quick);

// DP, TP, PP and a 4D plan on 16 ranks (8 nodes): the same, losing the last node.
TEST(MemoryCopies, RecoveryFromMemoryEqualsAnUninterruptedRunOnEveryStrategy) {
  for (const ParallelPlan& plan : {copies_plan("dp=4"), copies_plan("tp=2,dp=2", ZeroStage::zero1),
                                   copies_plan("pp=2,dp=2"), copies_plan("dp=2,tp=2,pp=2,cp=2", ZeroStage::zero1)})
    expect_recovery_from_memory_is_bitwise(plan, {plan.world_size() / kGpusPerNode - 1});
}
// Every strategy and a 16-rank 4D plan: seconds; the quick case covers the mechanism.
LLAMA4D_TIER(MemoryCopies, RecoveryFromMemoryEqualsAnUninterruptedRunOnEveryStrategy, full);

// Each rank sends its shard once, by send/recv labelled "in-memory copy", to the same GPU of the
// next node; the shards of all ranks together are the whole state once: 3 N floats (weights and
// two AdamW moments) under ZeRO-3 on dp=4, each rank holding its own shard and its partner's.
TEST(MemoryCopies, EachShardIsSentOnceToTheNextNode) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const int64_t n = flat_numel(llama_param_specs(cfg));
  const ParallelPlan plan = copies_plan("dp=4", ZeroStage::zero3);
  MemoryCopies<float> copies(4, kGpusPerNode, 1);
  EXPECT_EQ(copies.partner(0), 2);
  EXPECT_EQ(copies.partner(3), 1);
  VirtualClusterOptions vo;
  vo.ranks = 4;
  VirtualCluster cluster(vo);
  cluster.run([&](ProcessGroup& world) {
    ops::set_backend_threads(1);
    Llama<float> model(cfg, &world.memory());
    ParallelTrainer<float> t(world, model, test::corpus(), test::options(1, 2), plan);
    t.step();
    copies.take(t, world);
  });
  int64_t sent = 0, held = 0;
  for (int r = 0; r < 4; ++r) {
    int64_t mine = 0;
    for (const TrafficRecord& rec : cluster.accounting(r).traffic.records())
      if (rec.label == label::kInMemoryCopy) mine += rec.bytes_sent;
    EXPECT_GT(mine, 0) << "rank " << r;
    sent += mine;
    held += copies.bytes_held(r);
  }
  EXPECT_EQ(sent, 3 * n * 4);
  EXPECT_EQ(held, 2 * 3 * n * 4);
}
LLAMA4D_TIER(MemoryCopies, EachShardIsSentOnceToTheNextNode, quick);

// Two neighbouring nodes lost: node 0's shards were on node 0 and node 1, so memory cannot
// recover the job, and the reason names the shard and both holders.
TEST(MemoryCopies, BothHoldersLostIsNamed) {
  const ParallelPlan plan = copies_plan("dp=6", ZeroStage::zero1);  // 3 nodes of 2
  MemoryCopies<float> copies(6, kGpusPerNode, 1);
  EXPECT_EQ(copies.why_unrecoverable(), "no in-memory copy has been taken yet");
  EXPECT_EQ(copies.step(), 0);
  run_attempt(plan, test::options(1, 2), &copies, nullptr, 1, "");
  copies.lose_node(1);
  EXPECT_EQ(copies.why_unrecoverable(), "");
  EXPECT_EQ(copies.step(), 1);
  copies.lose_node(0);
  EXPECT_EQ(copies.why_unrecoverable(),
            "the in-memory copy of rank 0's shard (step 1) is lost: it was held by rank 0 (node 0) and its partner "
            "rank 2 (node 1), and both failed");
  TrainingStateImage<float> image;
  EXPECT_THROW(copies.restore_into(image), Error);
}
LLAMA4D_TIER(MemoryCopies, BothHoldersLostIsNamed, quick);

TEST(MemoryCopies, BadPlacementIsRefusedNamingIt) {
  auto message = [](int ranks, int per_node, int64_t every) {
    try {
      MemoryCopies<float> c(ranks, per_node, every);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message(4, 4, 1), "in-memory copies: the replica group of 2 must span 2 nodes, but 4 ranks at 4 per node "
                              "(--gpus-per-node) make 1 node");
  EXPECT_EQ(message(4, 2, 0), "--memory-copy-every must be >= 1 step, got 0");
  EXPECT_EQ(message(4, 2, -3), "--memory-copy-every must be >= 1 step, got -3");
  EXPECT_EQ(message(6, 4, 1), "in-memory copies: 6 ranks are not a whole number of nodes of 4 (--gpus-per-node)");
  EXPECT_EQ(message(4, 2, 1), "accepted");
}
LLAMA4D_TIER(MemoryCopies, BadPlacementIsRefusedNamingIt, quick);

}  // namespace
}  // namespace llama4d
