// A mixture-of-experts Llama (tiny-moe: 4 experts, 2 per token) under data parallelism and
// ZeRO-1/2/3 against one device. The expert weights are ordinary parameters to these strategies;
// what is new is the load-balancing loss, computed per micro-batch (its f and P over that
// micro-batch's tokens) and weighted by the micro-batch's share of the global tokens. So one
// device cutting the global batch into the same micro-batches (--micro-batch-size) is the
// reference: the replay bitwise, the plain single-device Trainer in fp64 within 1e-12, and the
// step's aux_loss and expert_tokens (summed over the data ranks) equal to the plain Trainer's.
#include <gtest/gtest.h>

#include "parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

struct MoeCase {
  const char* name;
  ZeroStage stage;
  int dp;
  int64_t micro_batch_size;  // of the 24 rows: dp=2 gives 12 a rank, dp=4 gives 6
};

class MoeDataParallel : public testing::TestWithParam<MoeCase> {};

// fp64, 3 steps with clipping active: bitwise against the replay of the same micro-batches, and
// within 1e-12 of the plain Trainer (its own data path, micro-batches added in its own order).
TEST_P(MoeDataParallel, Fp64EqualsOneDevice) {
  const MoeCase& c = GetParam();
  EquivalenceOptions o;
  o.model = test::tiny_moe();
  o.train = test::options(3, c.micro_batch_size);
  o.plan = test::dp_plan(c.dp, 1, c.stage);
  const EquivalenceReport r = verify_plan<double>(o, test::corpus(), test::virtual_launcher(c.dp));
  EXPECT_TRUE(r.bitwise) << r.table();
  test::expect_fp64_within_one_in_a_trillion(r, c.dp);
}

const MoeCase kMoeCases[] = {
    {"DP_dp2", ZeroStage::none, 2, 6},       {"ZeRO1_dp2", ZeroStage::zero1, 2, 6},
    {"ZeRO3_dp2", ZeroStage::zero3, 2, 4},   {"ZeRO1_dp4", ZeroStage::zero1, 4, 3},
    {"ZeRO2_dp4", ZeroStage::zero2, 4, 6},   {"ZeRO3_dp4", ZeroStage::zero3, 4, 3},
};
LLAMA4D_INSTANTIATE(Moe, MoeDataParallel, kMoeCases, full,
                    {{"ZeRO1_dp2", test::Tier::quick}, {"ZeRO3_dp4", test::Tier::quick}});

// HSDP (ZeRO-3 inside pairs, replicated across them) in fp64: the experts shard like any weight.
TEST(MoeDataParallelHsdp, Fp64EqualsOneDevice) {
  EquivalenceOptions o;
  o.model = test::tiny_moe();
  o.train = test::options(3, 3);
  o.plan = test::dp_plan(2, 2, ZeroStage::zero3);
  const EquivalenceReport r = verify_plan<double>(o, test::corpus(), test::virtual_launcher(4));
  EXPECT_TRUE(r.bitwise) << r.table();
  test::expect_fp64_within_one_in_a_trillion(r, 4);
}
LLAMA4D_TIER(MoeDataParallelHsdp, Fp64EqualsOneDevice, full);  // ZeRO-3's and DP's cases run its code

// fp32 and ZeRO-3 on 4 ranks, two micro-batches each: bitwise against the replay.
TEST(MoeDataParallelFp32, Zero3Dp4BitwiseToTheReplay) {
  EquivalenceOptions o;
  o.model = test::tiny_moe();
  o.train = test::options(3, 3);
  o.plan = test::dp_plan(4, 1, ZeroStage::zero3);
  const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(4));
  EXPECT_TRUE(r.ok) << r.table();
  EXPECT_TRUE(r.bitwise) << r.table();
  ASSERT_EQ(r.losses_parallel.size(), 3u);
  EXPECT_NE(r.losses_single[0], r.losses_single[2]);
}

// The step's routing metrics on every data rank are the global step's: with one micro-batch per
// rank, the aux loss summed over the ranks in rank order is the plain Trainer's sum over the same
// micro-batches bit for bit, and the per-expert token counts are its counts (every token of the
// 24 x 16 reaching its 2 experts, in each of the 2 layers).
TEST(MoeDataParallelMetrics, AuxLossAndExpertTokensAreSummedOverTheDataRanks) {
  for (const ZeroStage stage : {ZeroStage::none, ZeroStage::zero3}) {
    const TrainOptions opt = test::options(2, 6);  // dp=4: one micro-batch of 6 rows a rank
    std::vector<StepStats> one;
    {
      Llama<float> model(test::tiny_moe());
      model.init_weights(opt.seed);
      Trainer<float> trainer(model, test::corpus(), opt);
      for (int s = 0; s < 2; ++s) one.push_back(trainer.step());
    }
    const ParallelPlan plan = test::dp_plan(4, 1, stage);
    std::vector<std::vector<StepStats>> ranks(4);
    test::virtual_launcher(4)([&](ProcessGroup& world) {
      Llama<float> model = plan.make_model<float>(test::tiny_moe(), world.memory(), world.rank());
      ParallelTrainer<float> trainer(world, model, test::corpus(), opt, plan);
      for (int s = 0; s < 2; ++s) ranks[size_t(world.rank())].push_back(trainer.step());
    });
    for (int r = 0; r < 4; ++r)
      for (int s = 0; s < 2; ++s) {
        const StepStats& p = ranks[size_t(r)][size_t(s)];
        EXPECT_GT(one[size_t(s)].aux_loss, 0.0);
        EXPECT_EQ(p.aux_loss, one[size_t(s)].aux_loss) << "rank " << r << " step " << s << " diff " << (p.aux_loss - one[size_t(s)].aux_loss);
        EXPECT_EQ(p.expert_tokens, one[size_t(s)].expert_tokens) << "rank " << r << " step " << s;
        ASSERT_EQ(p.expert_tokens.size(), 2u);
        for (const std::vector<int64_t>& layer : p.expert_tokens) {
          int64_t sum = 0;
          for (int64_t c : layer) sum += c;
          EXPECT_EQ(sum, 24 * 16 * 2);
        }
      }
  }
}

// Tensor, context and pipeline parallelism do not split an MoE layer yet: refused by name
// (expert parallelism: moe_expert_parallel_test.cpp).
TEST(MoeDataParallelRefusals, TpCpPpAreRefusedNamingTheDim) {
  for (const char* mesh : {"tp=2", "cp=2", "pp=2", "dp=2,tp=2"}) {
    const ParallelPlan plan = ParallelPlan::parse(mesh);
    try {
      plan.check_model(test::tiny_moe(), 1);
      ADD_FAILURE() << mesh << " was accepted";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("MoE models run under data and expert parallelism only so far"), std::string::npos) << what;
      EXPECT_NE(what.find(std::string(mesh).substr(std::string(mesh).rfind(',') + 1)), std::string::npos) << what;
    }
  }
  EXPECT_NO_THROW(ParallelPlan::parse("dp=4").check_model(test::tiny_moe(), 1));
  EXPECT_NO_THROW(ParallelPlan::parse("dp_shard=2,dp_replicate=2").check_model(test::tiny_moe(), 1));
}

}  // namespace
}  // namespace llama4d
