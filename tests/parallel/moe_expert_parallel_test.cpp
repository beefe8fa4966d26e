// Expert parallelism in the trainer: tiny-moe (4 experts, 2 per token, 2 layers) with `ep` in
// the mesh, each ep rank a data rank routing its own rows and holding E/ep experts, against one
// device cutting the global batch into the same micro-batches (the load-balancing loss is per
// micro-batch). References:
//   - the plain single-device Trainer in fp64: every gradient, weight, loss and norm within 1e-12
//     element by element at every step;
//   - the step's aux loss and per-expert token counts: the plain Trainer's (counts exactly);
//   - the parameters each rank allocates: one device's count less the experts it does not hold,
//     by hand from tiny-moe's sizes;
//   - the all-to-all bytes of the first step: each rank's rows for another rank's experts, counted
//     from one device's routing of that rank's micro-batch with the same initial weights.
#include <gtest/gtest.h>

#include "core/comm/traffic_labels.h"
#include "parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

ParallelPlan plan_of(const char* mesh) { return ParallelPlan::parse(mesh); }

struct EpCase {
  const char* name;
  const char* mesh;
  int world;
  int64_t micro_batch_size;  // of the 24 rows: 4 data ranks give 6 a rank, 2 give 12
};

class MoeExpertParallel : public testing::TestWithParam<EpCase> {};

// fp64, 3 steps with clipping active, two micro-batches a rank.
TEST_P(MoeExpertParallel, Fp64WithinOneInATrillionOfOneDevice) {
  const EpCase& c = GetParam();
  EquivalenceOptions o;
  o.model = test::tiny_moe();
  o.train = test::options(3, c.micro_batch_size);
  o.plan = plan_of(c.mesh);
  const EquivalenceReport r = verify_plan<double>(o, test::corpus(), test::virtual_launcher(c.world));
  test::expect_fp64_within_one_in_a_trillion(r, c.world);
  EXPECT_FALSE(r.plain_per_tensor) << "expert parallelism is held element by element";
  // From the same weights every rank's forward is one device's on its rows (expert_parallel.cpp),
  // so the first step's loss has the replay's bits; the experts' gradients are summed in another
  // order, and from then on the weights differ in their last bits.
  ASSERT_FALSE(r.losses_parallel.empty());
  EXPECT_EQ(r.losses_parallel[0], r.losses_single[0]) << r.table();
  for (const RankComparison& rank : r.per_rank) EXPECT_TRUE(rank.tokens_equal) << "rank " << rank.rank;
}

const EpCase kEpCases[] = {
    {"ep2", "ep=2", 2, 6},
    {"ep2_dp2", "ep=2,dp=2", 4, 3},
    {"ep4", "ep=4", 4, 3},
    {"dp2_ep2", "dp=2,ep=2", 4, 3},
};
LLAMA4D_INSTANTIATE(Ep, MoeExpertParallel, kEpCases, full,
                    {{"ep2_dp2", test::Tier::quick}, {"ep4", test::Tier::sanitizer}});

// The routing metrics on every rank are the global step's. From the same initial weights (step
// 1) the aux loss folded over the data ranks in rank order is the plain Trainer's sum over the
// same micro-batches bit for bit, and the per-expert token counts are its counts; at step 2 the
// weights differ in their last bits (the experts' gradients were summed in another order), so
// the aux loss is held to fp32 rounding and the counts to every token reaching its 2 experts.
TEST(MoeExpertParallelMetrics, AuxLossAndExpertTokensEqualOneDevice) {
  const TrainOptions opt = test::options(2, 6);  // 4 data ranks: one micro-batch of 6 rows a rank
  std::vector<StepStats> one;
  {
    Llama<float> model(test::tiny_moe());
    model.init_weights(opt.seed);
    Trainer<float> trainer(model, test::corpus(), opt);
    for (int s = 0; s < 2; ++s) one.push_back(trainer.step());
  }
  const ParallelPlan plan = plan_of("ep=2,dp=2");
  std::vector<std::vector<StepStats>> ranks(4);
  test::virtual_launcher(4)([&](ProcessGroup& world) {
    Llama<float> model = plan.make_model<float>(test::tiny_moe(), world.memory(), world.rank());
    ParallelTrainer<float> trainer(world, model, test::corpus(), opt, plan);
    for (int s = 0; s < 2; ++s) ranks[size_t(world.rank())].push_back(trainer.step());
  });
  for (int r = 0; r < 4; ++r)
    for (int s = 0; s < 2; ++s) {
      const StepStats& p = ranks[size_t(r)][size_t(s)];
      const std::string at = "rank " + std::to_string(r) + " step " + std::to_string(s + 1);
      EXPECT_GT(one[size_t(s)].aux_loss, 0.0);
      ASSERT_EQ(p.expert_tokens.size(), 2u) << at;
      if (s == 0) {
        EXPECT_EQ(p.aux_loss, one[0].aux_loss) << at;
        EXPECT_EQ(p.loss, one[0].loss) << at;
        EXPECT_EQ(p.expert_tokens, one[0].expert_tokens) << at;
        continue;
      }
      EXPECT_NEAR(p.aux_loss, one[size_t(s)].aux_loss, 1e-5 * one[size_t(s)].aux_loss) << at;
      for (const std::vector<int64_t>& layer : p.expert_tokens) {
        int64_t sum = 0;
        for (int64_t c : layer) sum += c;
        EXPECT_EQ(sum, 24 * 16 * 2) << at;
      }
    }
}

// Memory and traffic of the first step on ep=2,dp=2 (fp32, one micro-batch of 6 rows a rank).
//   parameters per rank: N - L·(E - E/ep)·3·I·C   (the router and attention whole, E/ep experts)
//   tokens per MoE layer and micro-batch, rank r:  dispatch = sum over q != r of rows(r -> q)·C·4
//     bytes, combine = sum over s != r of rows(s -> r)·C·4, and the same two again in the backward,
//   rows(r -> q) = the tokens of r's micro-batch routed to q's experts (k choices each).
TEST(MoeExpertParallelAccounting, ExpertParametersAndAllToAllBytesEqualTheFormulas) {
  const LlamaConfig cfg = test::tiny_moe();
  const TrainOptions opt = test::options(1, 6);
  const ParallelPlan plan = plan_of("ep=2,dp=2");
  const int P = 2, W = 4;
  const int64_t C = cfg.hidden_size, I = cfg.intermediate_size, E = cfg.num_local_experts, L = cfg.num_hidden_layers;
  const int64_t El = E / P;
  // One device's routing of each rank's micro-batch, from the initial weights: [rank][l*E + e].
  std::vector<std::vector<int64_t>> routed(W);
  int64_t one_device_params = 0;
  {
    Llama<float> model(cfg);
    model.init_weights(opt.seed);
    one_device_params = model.num_params();
    for (int r = 0; r < W; ++r) {
      const std::vector<Batch> mbs = data_rank_micro_batches(test::corpus().train(), opt, 0, r, W);
      ASSERT_EQ(mbs.size(), 1u);
      model.forward(mbs[0].tokens.data(), mbs[0].targets.data(), mbs[0].B, mbs[0].seq);
      routed[size_t(r)] = model.expert_counts();
      model.backward(1.0f);
    }
  }
  VirtualClusterOptions vo;
  vo.ranks = W;
  VirtualCluster cluster(vo);
  std::vector<int64_t> param_bytes(W), held_params(W);
  cluster.run([&](ProcessGroup& world) {
    ops::set_backend_threads(1);
    Llama<float> model = plan.make_model<float>(cfg, world.memory(), world.rank());
    ParallelTrainer<float> trainer(world, model, test::corpus(), opt, plan);
    trainer.step();
    param_bytes[size_t(world.rank())] = world.memory().live(MemoryCategory::params);
    held_params[size_t(world.rank())] = model.num_params();
  });
  const int64_t expected_params = one_device_params - L * (E - El) * 3 * I * C;
  for (int r = 0; r < W; ++r) {
    const std::string at = "rank " + std::to_string(r) + ": ";
    EXPECT_EQ(held_params[size_t(r)], expected_params) << at;
    EXPECT_EQ(param_bytes[size_t(r)], expected_params * 4) << at;
    // The ep group of world rank r: ranks {r - r % P, ...}; its ep coordinate is r % P.
    const int me = r % P, base = r - me;
    int64_t out_rows = 0, in_rows = 0;
    for (int64_t l = 0; l < L; ++l)
      for (int q = 0; q < P; ++q) {
        if (q == me) continue;
        for (int64_t e = q * El; e < (q + 1) * El; ++e) out_rows += routed[size_t(r)][size_t(l * E + e)];
        for (int64_t e = me * El; e < (me + 1) * El; ++e) in_rows += routed[size_t(base + q)][size_t(l * E + e)];
      }
    int64_t dispatch = 0, combine = 0, dispatch_grad = 0, combine_grad = 0;
    for (const TrafficRecord& t : cluster.accounting(r).traffic.records()) {
      if (t.label == label::kEpDispatch) dispatch += t.bytes_sent;
      if (t.label == label::kEpCombine) combine += t.bytes_sent;
      if (t.label == label::kEpDispatchGrad) dispatch_grad += t.bytes_sent;
      if (t.label == label::kEpCombineGrad) combine_grad += t.bytes_sent;
    }
    EXPECT_GT(out_rows, 0) << at << "no token left this rank: the exchange went untested";
    EXPECT_EQ(dispatch, out_rows * C * 4) << at;
    EXPECT_EQ(dispatch_grad, out_rows * C * 4) << at;
    EXPECT_EQ(combine, in_rows * C * 4) << at;
    EXPECT_EQ(combine_grad, in_rows * C * 4) << at;
  }
}

// What expert parallelism does not run yet, or cannot: exit-2 errors naming it.
TEST(MoeExpertParallelRefusals, BadMeshesAreRefusedNamingTheDimension) {
  auto refused = [](const ParallelPlan& plan, const LlamaConfig& cfg, const std::string& want) {
    try {
      plan.validate();
      plan.check_model(cfg, 1);
      ADD_FAILURE() << plan.describe_mesh() << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused(plan_of("ep=3"), test::tiny_moe(), "ep=3 does not divide num_local_experts=4");
  // More ranks than experts: 8 ranks for tiny-moe's 4 would leave half of them without one.
  refused(plan_of("ep=8"), test::tiny_moe(), "ep=8 is more than num_local_experts=4");
  refused(plan_of("ep=2"), LlamaConfig::preset("tiny"), "a dense model has no experts to split");
  for (const char* mesh : {"tp=2,ep=2", "cp=2,ep=2", "pp=2,ep=2"}) {
    refused(plan_of(mesh), test::tiny_moe(), "MoE models run under data and expert parallelism only so far");
    refused(plan_of(mesh), test::tiny_moe(), std::string(mesh).substr(0, 4));
  }
  ParallelPlan zero = plan_of("ep=2,dp=2");
  zero.zero = ZeroStage::zero1;
  refused(zero, test::tiny_moe(), "expert parallelism (ep=2) runs with plain data parallelism only so far");
  EXPECT_NO_THROW(plan_of("ep=4").check_model(test::tiny_moe(), 1));
  EXPECT_NO_THROW(plan_of("ep=2,dp=2").check_model(test::tiny_moe(), 1));
}

}  // namespace
}  // namespace llama4d
