// Every data-parallel strategy, on 2, 3, 4 and 8 virtual GPUs, against one device: after 3
// AdamW steps (with gradient clipping active and gradient accumulation over micro-batches),
// losses, gradients and parameters must be BITWISE identical with ordered reductions.
#include <gtest/gtest.h>

#include "parallel_test_util.h"

namespace llama4d {
namespace {

struct Case {
  const char* name;
  ZeroStage stage;
  bool reshard_after_forward;
  int dp_shard, dp_replicate;
  int64_t micro_batch_size;  // 0: one micro-batch per rank
};

std::string case_name(const testing::TestParamInfo<Case>& info) { return info.param.name; }

class Equivalence : public testing::TestWithParam<Case> {};

TEST_P(Equivalence, BitwiseEqualToOneDevice) {
  const Case& c = GetParam();
  EquivalenceOptions o;
  o.model = LlamaConfig::preset("tiny");
  o.train = test::options(3, c.micro_batch_size);
  o.plan = test::dp_plan(c.dp_shard, c.dp_replicate, c.stage, c.reshard_after_forward);
  const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(o.plan.world_size()));
  EXPECT_TRUE(r.ok) << r.table();
  EXPECT_TRUE(r.bitwise) << r.table();
  ASSERT_EQ(r.losses_parallel.size(), 3u);
  // Training happened (the comparison is not between two untouched models).
  EXPECT_NE(r.losses_single[0], r.losses_single[2]);
}

const Case kCases[] = {
    {"DP_dp2", ZeroStage::none, true, 2, 1, 0},
    {"DP_dp3_accumulate", ZeroStage::none, true, 3, 1, 2},
    {"DP_dp4", ZeroStage::none, true, 4, 1, 3},
    {"DP_dp8_accumulate", ZeroStage::none, true, 8, 1, 1},
    {"ZeRO1_dp2", ZeroStage::zero1, true, 2, 1, 0},
    {"ZeRO1_dp3", ZeroStage::zero1, true, 3, 1, 4},
    {"ZeRO1_dp4_accumulate", ZeroStage::zero1, true, 4, 1, 2},
    {"ZeRO1_dp8", ZeroStage::zero1, true, 8, 1, 0},
    {"ZeRO2_dp2_accumulate", ZeroStage::zero2, true, 2, 1, 4},
    {"ZeRO2_dp3", ZeroStage::zero2, true, 3, 1, 0},
    {"ZeRO2_dp4", ZeroStage::zero2, true, 4, 1, 0},
    {"ZeRO2_dp8_accumulate", ZeroStage::zero2, true, 8, 1, 1},
    {"ZeRO3_dp2", ZeroStage::zero3, true, 2, 1, 0},
    {"ZeRO3_dp3_accumulate", ZeroStage::zero3, true, 3, 1, 2},
    {"ZeRO3_dp4", ZeroStage::zero3, true, 4, 1, 0},
    {"ZeRO3_dp8", ZeroStage::zero3, true, 8, 1, 0},
    {"ZeRO3_keep_dp2", ZeroStage::zero3, false, 2, 1, 0},
    {"ZeRO3_keep_dp3", ZeroStage::zero3, false, 3, 1, 0},
    {"ZeRO3_keep_dp4_accumulate", ZeroStage::zero3, false, 4, 1, 3},
    {"ZeRO3_keep_dp8", ZeroStage::zero3, false, 8, 1, 0},
    {"HSDP_2x2", ZeroStage::zero3, true, 2, 2, 0},
    {"HSDP_2x2_accumulate", ZeroStage::zero3, true, 2, 2, 2},
    {"HSDP_4x2", ZeroStage::zero3, true, 4, 2, 0},
    {"HSDP_2x4", ZeroStage::zero3, false, 2, 4, 0},
    {"HSDP_3x2_zero2", ZeroStage::zero2, true, 3, 2, 0},
};
INSTANTIATE_TEST_SUITE_P(DataParallel, Equivalence, testing::ValuesIn(kCases), case_name);

// Activation checkpointing under data parallelism: every policy, with ZeRO-3 resharding (the
// recompute gathers a unit's weights again inside backward) and with plain DP, still equals one
// device that keeps every activation, bit for bit.
TEST(Equivalence, ActivationCheckpointingWithZero3AndDp) {
  LlamaConfig cfg = LlamaConfig::preset("tiny");
  cfg.num_hidden_layers = 3;  // every:2 leaves a short segment at the top
  for (const char* ac : {"selective", "full", "every:2"})
    for (ZeroStage stage : {ZeroStage::zero3, ZeroStage::none}) {
      EquivalenceOptions o;
      o.model = cfg;
      o.train = test::options(3, 2);
      o.plan = test::dp_plan(stage == ZeroStage::zero3 ? 4 : 2, 1, stage);
      o.plan.ac = Checkpointing::parse(ac, int(cfg.num_hidden_layers));
      const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(o.plan.world_size()));
      EXPECT_TRUE(r.bitwise) << ac << "\n" << r.table();
      EXPECT_NE(r.strategy.find(o.plan.ac.describe()), std::string::npos) << r.strategy;
    }
}

// The bits differ with ring reductions: every chunk of a ring all-reduce is summed starting at
// a different rank, so (a + b) + c becomes (b + c) + a, and fp32 rounds each differently. The
// harness then bounds the relative error of the gradients instead.
TEST(Equivalence, RingReductionsDifferOnlyByRounding) {
  EquivalenceOptions o;
  o.model = LlamaConfig::preset("tiny");
  o.train = test::options(3, 0);
  o.train.grad_clip = 0;  // compare the optimizer's input, not a clipped one
  o.plan = test::dp_plan(4, 1, ZeroStage::zero2);
  o.plan.algo = ReduceAlgo::ring;
  const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(4, ReduceAlgo::ring));
  EXPECT_FALSE(r.bitwise) << "ring order is expected to change some bits";
  // Same weights, different order of additions: rounding-level differences only.
  EXPECT_GT(r.first_step_grad_rel_err, 0.0);
  EXPECT_LE(r.first_step_grad_rel_err, 1e-6) << r.table();
  EXPECT_TRUE(r.ok) << r.table();
}

TEST(Equivalence, Fp64AlsoBitwise) {
  EquivalenceOptions o;
  o.model = LlamaConfig::preset("tiny");
  o.train = test::options(2, 0);
  o.plan = test::dp_plan(3, 1, ZeroStage::zero3);
  const EquivalenceReport r = verify_plan<double>(o, test::corpus(), test::virtual_launcher(3));
  EXPECT_TRUE(r.bitwise) << r.table();
}

// Sharded clipping: the global gradient norm each rank computes from its gradient shard equals
// the single-device norm exactly, here with clipping strong enough to act on every step.
TEST(Equivalence, ShardedGradNormEqualsSingleDevice) {
  EquivalenceOptions o;
  o.model = LlamaConfig::preset("tiny");
  o.train = test::options(2, 0);
  o.train.grad_clip = 0.05;
  o.plan = test::dp_plan(8, 1, ZeroStage::zero3);
  const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(8));
  ASSERT_EQ(r.grad_norms_parallel.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(r.grad_norms_parallel[i], r.grad_norms_single[i]) << "step " << i + 1;
    EXPECT_GT(r.grad_norms_single[i], o.train.grad_clip);  // clipping did act
  }
  EXPECT_TRUE(r.bitwise) << r.table();
}

}  // namespace
}  // namespace llama4d
