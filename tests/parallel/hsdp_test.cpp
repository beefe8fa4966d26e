// HSDP overlaps its cross-replica reduction with the backward, as PyTorch's FSDP2 does: per
// micro-batch, every unit's piece of the gradient shard is all-reduced over the dp_replicate group
// on its own, queued right behind that unit's reduce-scatter over dp_shard and before the
// reduce-scatter of the unit below (one whole-shard call after the backward would overlap
// nothing). It moves what one whole-shard call moves, and a rank that dies inside one of these
// all-reduces fails every rank instead of hanging them.
//
// Read from each rank's traffic log: a rank runs all its collectives on one FIFO comm stream, so
// its records are in the order it issued them.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/model/units.h"
#include "core/parallel/parallel_trainer.h"
#include "core/parallel/shard_layout.h"
#include "parallel_test_util.h"
#include "tests/comm/test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

using namespace std::chrono_literals;

// tiny with 4 layers: 6 units (embedding, 4 blocks, norm + head), each a ZeRO segment.
LlamaConfig four_layer_tiny() {
  LlamaConfig c = LlamaConfig::preset("tiny");
  c.num_hidden_layers = 4;
  return c;
}

struct HsdpCase {
  const char* name;
  ZeroStage stage;
  int shard, replicate;
  ReduceAlgo algo;
  const char* ac;
  int64_t micro_batch_size;  // of the 24 / (shard x replicate) rows of a data rank
};

ParallelPlan plan_of(const HsdpCase& c) {
  ParallelPlan p = test::dp_plan(c.shard, c.replicate, c.stage);
  p.ac = Checkpointing::parse(c.ac, four_layer_tiny().num_hidden_layers);
  return p;
}

VirtualClusterOptions cluster_of(const HsdpCase& c) {
  VirtualClusterOptions vo;
  vo.ranks = plan_of(c).world_size();
  vo.algo = c.algo;
  return vo;
}

// One training step of the case on every rank of `cluster`.
void train_one_step(VirtualCluster& cluster, const HsdpCase& c) {
  const ParallelPlan plan = plan_of(c);
  const TrainOptions opt = test::options(1, c.micro_batch_size);
  cluster.run([&](ProcessGroup& world) {
    ops::set_backend_threads(1);
    Llama<float> model = plan.make_model<float>(four_layer_tiny(), world.memory(), world.rank());
    ParallelTrainer<float> trainer(world, model, test::corpus(), opt, plan);
    trainer.step();
  });
}

// Every rank's traffic records of one training step, in the rank's issue order.
std::map<int, std::vector<TrafficRecord>> one_step_per_rank(const HsdpCase& c) {
  VirtualCluster cluster(cluster_of(c));
  train_one_step(cluster, c);
  std::map<int, std::vector<TrafficRecord>> by_rank;
  for (const TrafficRecord& t : cluster.traffic()) by_rank[t.world_rank].push_back(t);
  return by_rank;
}

TEST(Hsdp, ReplicaAllReducePerUnitRightBehindItsReduceScatter) {
  const std::vector<HsdpCase> cases = {
      {"zero3 2x2 ordered", ZeroStage::zero3, 2, 2, ReduceAlgo::ordered, "none", 3},  // 2 micro-batches
      {"zero2 2x4 ring", ZeroStage::zero2, 2, 4, ReduceAlgo::ring, "none", 1},        // 3 micro-batches
      {"zero3 3x2 ring, full AC", ZeroStage::zero3, 3, 2, ReduceAlgo::ring, "full", 2},  // 2 micro-batches
  };
  const LlamaConfig cfg = four_layer_tiny();
  const int L = cfg.num_hidden_layers;
  for (const HsdpCase& c : cases) {
    SCOPED_TRACE(c.name);
    const ShardLayout layout(llama_param_specs(cfg), c.shard);
    const size_t units = layout.segments().size();
    ASSERT_EQ(units, size_t(L + 2));
    const int64_t M = 24 / (c.shard * c.replicate) / c.micro_batch_size;
    const std::map<int, std::vector<TrafficRecord>> by_rank = one_step_per_rank(c);
    ASSERT_EQ(int(by_rank.size()), c.shard * c.replicate);
    std::vector<int64_t> replica_bytes(size_t(c.shard), 0);  // per shard index: sent by its replica group
    for (const auto& [w, records] : by_rank) {
      SCOPED_TRACE("rank " + std::to_string(w));
      const int j = w % c.shard;  // shard index: consecutive ranks form a shard group
      // The gradient reductions in issue order: "RS <unit>" over dp_shard, "AR <unit> <elements>"
      // over dp_replicate, against backward's order (last unit first) per micro-batch.
      std::vector<std::string> seen, expected;
      for (const TrafficRecord& t : records) {
        if (t.op == "reduce_scatter" && t.group == "dp_shard") seen.push_back("RS " + t.label.substr(6));  // "grads "
        if (t.op == "all_reduce" && t.group == "dp_replicate") {
          seen.push_back("AR " + t.label + " " + std::to_string(t.count));
          replica_bytes[size_t(j)] += t.bytes_sent;
        }
      }
      for (int64_t m = 0; m < M; ++m)
        for (size_t s = units; s-- > 0;) {
          const std::string unit = unit_name(layout.segments()[s].unit, L);
          expected.push_back("RS " + unit);
          const int64_t piece = layout.piece(s, j).numel();
          if (piece > 0) expected.push_back("AR grads across replicas " + unit + " " + std::to_string(piece));
        }
      EXPECT_EQ(seen, expected);
    }
    // What one all-reduce of the whole shard per micro-batch would move (comm_model.h: 2(R-1)/R of
    // the buffer per rank, with the ring and the ordered algorithms alike), summed over the R ranks
    // of each replica group.
    for (int j = 0; j < c.shard; ++j)
      EXPECT_EQ(replica_bytes[size_t(j)], M * 2 * (c.replicate - 1) * 4 * layout.shard_numel(j)) << "shard " << j;
  }
}
// The order of the two groups' collectives on every rank.
LLAMA4D_TIER(Hsdp, ReplicaAllReducePerUnitRightBehindItsReduceScatter, sanitizer);

// A rank that dies in the middle of the first per-unit all-reduce across replicas (the head's:
// the first all_reduce anywhere in the step) fails every rank within seconds, not at the
// timeout, and the others name it.
TEST(Hsdp, RankDyingInAReplicaAllReduceFailsEveryRank) {
  const HsdpCase c{"zero3 2x2", ZeroStage::zero3, 2, 2, ReduceAlgo::ordered, "none", 3};
  VirtualClusterOptions vo = cluster_of(c);
  vo.timeout = 60s;
  vo.fault_hook = [](int rank, CommOp op, int64_t seq) {
    if (rank == 3 && op == CommOp::all_reduce && seq == 0) throw std::runtime_error("GPU fell off the bus");
  };
  const ShardLayout layout(llama_param_specs(four_layer_tiny()), c.shard);
  const int64_t head_piece = layout.piece(layout.segments().size() - 1, 3 % c.shard).numel();
  std::string error;
  std::vector<RankFailure> failures;
  const auto t0 = std::chrono::steady_clock::now();
  test::within_deadline(30, [&] {
    VirtualCluster cluster(vo);
    try {
      train_one_step(cluster, c);
    } catch (const CommError& e) {
      error = e.what();
    }
    failures = cluster.failures();
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  EXPECT_TRUE(test::contains(error, "(world rank 3) failed in the middle of all_reduce(count=" +
                                        std::to_string(head_piece) + ", F32, sum) #0 on group 'dp_replicate': GPU "
                                        "fell off the bus"))
      << error;
  ASSERT_EQ(failures.size(), 4u) << error;
  for (const RankFailure& f : failures)
    if (f.rank != 3) {
      EXPECT_TRUE(test::contains(f.message, "world rank 3")) << f.message;
    }
}

}  // namespace
}  // namespace llama4d
