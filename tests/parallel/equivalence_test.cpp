// Every data-parallel strategy, on 2, 3, 4 and 8 virtual GPUs, against one device: for 3 AdamW
// steps (with gradient clipping active and, in all but three cases, at least two micro-batches
// per rank), on every rank, losses, token counts, gradient norms, gradients and parameters must
// be BITWISE identical with ordered reductions at every step.
#include <gtest/gtest.h>

#include "../comm/host_collective_reduce.h"
#include "../ops/operand_log.h"
#include "parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

struct Case {
  const char* name;
  ZeroStage stage;
  bool reshard_after_forward;
  int dp_shard, dp_replicate;
  int64_t micro_batch_size;  // 0: one micro-batch per rank (batch 24 = 24 / (shard x replicate) rows)
  bool reduce_once = false;  // ZeRO-2/3: accumulate locally, one reduce-scatter per step
};


class Equivalence : public testing::TestWithParam<Case> {};

TEST_P(Equivalence, BitwiseEqualToOneDevice) {
  const Case& c = GetParam();
  EquivalenceOptions o;
  o.model = LlamaConfig::preset("tiny");
  o.train = test::options(3, c.micro_batch_size);
  o.plan = test::dp_plan(c.dp_shard, c.dp_replicate, c.stage, c.reshard_after_forward);
  o.plan.reduce_once = c.reduce_once;
  const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(o.plan.world_size()));
  EXPECT_TRUE(r.ok) << r.table();
  EXPECT_TRUE(r.bitwise) << r.table();
  ASSERT_EQ(r.losses_parallel.size(), 3u);
  ASSERT_EQ(int(r.per_rank.size()), o.plan.world_size()) << "every rank reported";
  // Training happened (the comparison is not between two untouched models).
  EXPECT_NE(r.losses_single[0], r.losses_single[2]);
}

const Case kCases[] = {
    {"DP_dp2", ZeroStage::none, true, 2, 1, 0},
    {"DP_dp3_accumulate", ZeroStage::none, true, 3, 1, 2},
    {"DP_dp4_accumulate", ZeroStage::none, true, 4, 1, 3},
    {"DP_dp8_accumulate", ZeroStage::none, true, 8, 1, 1},
    {"ZeRO1_dp2_accumulate", ZeroStage::zero1, true, 2, 1, 6},
    {"ZeRO1_dp3_accumulate", ZeroStage::zero1, true, 3, 1, 4},
    {"ZeRO1_dp4_accumulate", ZeroStage::zero1, true, 4, 1, 2},
    {"ZeRO1_dp8_accumulate", ZeroStage::zero1, true, 8, 1, 1},
    {"ZeRO2_dp2_accumulate", ZeroStage::zero2, true, 2, 1, 4},
    {"ZeRO2_dp3", ZeroStage::zero2, true, 3, 1, 0},
    {"ZeRO2_dp4_accumulate", ZeroStage::zero2, true, 4, 1, 3},
    {"ZeRO2_dp8_accumulate", ZeroStage::zero2, true, 8, 1, 1},
    {"ZeRO3_dp2_accumulate", ZeroStage::zero3, true, 2, 1, 3},
    {"ZeRO3_dp3_accumulate", ZeroStage::zero3, true, 3, 1, 2},
    {"ZeRO3_dp4_accumulate", ZeroStage::zero3, true, 4, 1, 3},
    {"ZeRO3_dp8_accumulate", ZeroStage::zero3, true, 8, 1, 1},
    {"ZeRO3_keep_dp2_accumulate", ZeroStage::zero3, false, 2, 1, 4},
    {"ZeRO3_keep_dp3", ZeroStage::zero3, false, 3, 1, 0},
    {"ZeRO3_keep_dp4_accumulate", ZeroStage::zero3, false, 4, 1, 3},
    {"ZeRO3_keep_dp8_accumulate", ZeroStage::zero3, false, 8, 1, 1},
    {"HSDP_2x2", ZeroStage::zero3, true, 2, 2, 0},
    {"HSDP_2x2_accumulate", ZeroStage::zero3, true, 2, 2, 2},
    {"HSDP_4x2_accumulate", ZeroStage::zero3, true, 4, 2, 1},
    {"HSDP_2x4_accumulate", ZeroStage::zero3, false, 2, 4, 1},
    {"HSDP_3x2_zero2_accumulate", ZeroStage::zero2, true, 3, 2, 2},
    {"ZeRO2_reduce_once_dp3_accumulate", ZeroStage::zero2, true, 3, 1, 2, true},
    {"ZeRO3_keep_reduce_once_dp4_accumulate", ZeroStage::zero3, false, 4, 1, 2, true},
    {"HSDP_2x2_reduce_once_accumulate", ZeroStage::zero3, true, 2, 2, 2, true},
};
// Tiers: the sanitizer presets run each strategy once (with accumulation and an odd rank count where
// its code branches on them); the release preset runs every case.
LLAMA4D_INSTANTIATE(DataParallel, Equivalence, kCases, full,
                    {{"DP_dp3_accumulate", test::Tier::sanitizer},
                     {"ZeRO1_dp3_accumulate", test::Tier::sanitizer},
                     {"ZeRO2_dp3", test::Tier::sanitizer},
                     {"ZeRO3_dp2_accumulate", test::Tier::sanitizer},
                     {"ZeRO3_keep_dp3", test::Tier::sanitizer},
                     {"HSDP_2x2", test::Tier::sanitizer},
                     {"ZeRO3_keep_reduce_once_dp4_accumulate", test::Tier::sanitizer}});

// What a GPU needs of every strategy and of the harness's replays: every kernel they call takes
// the backend's memory (tests/ops/operand_log.h: each pointer starts inside a device_alloc block),
// never the host's heap, which a GPU kernel cannot read. fp32, the plans not covered in bf16 by
// Bf16Equivalence.EveryProductReadsBf16BackendOperandsUnderEveryStrategy.
TEST(Equivalence, EveryKernelTakesBackendMemory) {
  const struct {
    const char* mesh;
    ZeroStage zero;
    PipelineScheduleKind schedule;
    ContextAlgo cp_algo;
  } cases[] = {{"dp_shard=2,dp_replicate=2", ZeroStage::zero3, PipelineScheduleKind::one_f_one_b, ContextAlgo::allgather},
               {"dp=2", ZeroStage::zero1, PipelineScheduleKind::one_f_one_b, ContextAlgo::allgather},
               {"pp=2,dp=2", ZeroStage::zero2, PipelineScheduleKind::zb_h1, ContextAlgo::allgather},
               {"tp=2,cp=2", ZeroStage::none, PipelineScheduleKind::one_f_one_b, ContextAlgo::ring},
               {"tp=2,cp=2,pp=2,dp=2", ZeroStage::zero1, PipelineScheduleKind::one_f_one_b, ContextAlgo::allgather}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.mesh);
    test::LoggingOperands logging(&test::host_collective_reduce);
    EquivalenceOptions o;
    o.model = LlamaConfig::preset("tiny");
    o.model.tie_word_embeddings = true;  // the head's part of the embedding's gradient across stages
    o.train = test::options(2, 2);
    o.train.batch_size = 8;
    o.plan = ParallelPlan::parse(c.mesh);
    o.plan.zero = c.zero, o.plan.schedule = c.schedule, o.plan.cp_algo = c.cp_algo;
    const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(o.plan.world_size()));
    const test::OperandLog log = logging.log();
    EXPECT_TRUE(r.ok) << r.table();
    EXPECT_GT(log.products_as_stored, 0);
    EXPECT_TRUE(log.not_backend_memory.empty()) << log.not_backend_memory.front();
    // The process group hands every reduction to the backend (a GPU reduces on the device), on
    // the backend's memory, but for the host's own f64 sums (losses, token counts and the
    // gradient norm's partial sums of squares, which sum_squares_chunks returns to the host).
    EXPECT_GT(log.collective_reductions_on_backend, 0);
    for (const auto& x : log.collective_reductions_touching_host)
      EXPECT_TRUE(x.dtype == DType::f64 && x.host_pointers == x.pointers) << x.describe();
    // Ordered reductions keep every bit, here through the process group's path for a backend that
    // reduces (as the CUDA backend does), wherever the plan is bitwise: not with cp, whose weight
    // gradients add the tokens of each rank's chunks apart (four_d_test.cpp).
    if (o.plan.size("cp") == 1) {
      EXPECT_TRUE(r.bitwise) << r.table();
    }
  }
}
// The plans it runs are the sanitizer cases of their strategies.
LLAMA4D_TIER(Equivalence, EveryKernelTakesBackendMemory, full);

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
// ZeRO-3 regathers for a recompute in TensorParallel/.../tp4_dp2_zero3_full_ac.
LLAMA4D_TIER(Equivalence, ActivationCheckpointingWithZero3AndDp, full);

// The bits differ with ring reductions: every chunk of a ring all-reduce is summed starting at
// a different rank, so (a + b) + c becomes (b + c) + a, and fp32 rounds each differently. The
// harness then bounds the relative error of the gradients instead.
TEST(Equivalence, RingReductionsDifferOnlyByRounding) {
  EquivalenceOptions o;
  o.model = LlamaConfig::preset("tiny");
  o.train = test::options(3, 2);
  o.train.grad_clip = 0;  // compare the optimizer's input, not a clipped one
  o.plan = test::dp_plan(4, 1, ZeroStage::zero2);
  o.plan.algo = ReduceAlgo::ring;
  const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(4, ReduceAlgo::ring));
  EXPECT_FALSE(r.bitwise) << "ring order is expected to change some bits";
  // Same weights, different order of additions: rounding-level differences only, at every step
  // within a bound 10x the worst measured.
  ASSERT_EQ(r.errors_per_step.size(), 3u);
  ASSERT_EQ(r.bounds_per_step.size(), 3u);
  EXPECT_GT(r.errors_per_step[0].grad_element, 0.0);
  EXPECT_LE(r.errors_per_step[0].grad_element, 3.7e-6) << r.table();
  for (size_t s = 0; s < 3; ++s) EXPECT_TRUE(r.errors_per_step[s].within(r.bounds_per_step[s])) << "step " << s + 1;
  EXPECT_TRUE(r.ok) << r.table();
}
// The ring order of every data-parallel collective.
LLAMA4D_TIER(Equivalence, RingReductionsDifferOnlyByRounding, sanitizer);

// The same bounds in fp64 are nine orders of magnitude tighter; both references must agree.
TEST(Equivalence, RingReductionsFp64AgreeWithThePlainTrainer) {
  EquivalenceOptions o;
  o.model = LlamaConfig::preset("tiny");
  o.train = test::options(3, 1);
  o.plan = test::dp_plan(3, 2, ZeroStage::zero3);
  o.plan.algo = ReduceAlgo::ring;
  const EquivalenceReport r = verify_plan<double>(o, test::corpus(), test::virtual_launcher(6, ReduceAlgo::ring));
  EXPECT_TRUE(r.plain_checked);
  EXPECT_TRUE(r.plain_ok) << r.table();
  EXPECT_LE(r.max_errors.grad_element, 1.8e-12) << r.table();
  EXPECT_TRUE(r.ok) << r.table();
}
LLAMA4D_TIER(Equivalence, RingReductionsFp64AgreeWithThePlainTrainer, full);  // its fp32 twin runs the same code

// fp64, one plan per strategy: bitwise to the replay, and within 1e-12 of the plain single-device
// Trainer, which batches and adds in its own order (nothing shared with the strategies' split).
TEST(Equivalence, Fp64EveryStrategyAgreesWithThePlainTrainer) {
  for (const ParallelPlan& plan : {test::dp_plan(3, 1, ZeroStage::none), test::dp_plan(4, 1, ZeroStage::zero1),
                                   test::dp_plan(3, 1, ZeroStage::zero2), test::dp_plan(8, 1, ZeroStage::zero3),
                                   test::dp_plan(4, 1, ZeroStage::zero3, false), test::dp_plan(2, 2, ZeroStage::zero3)}) {
    EquivalenceOptions o;
    o.model = LlamaConfig::preset("tiny");
    o.train = test::options(2, 1);
    o.plan = plan;
    const EquivalenceReport r = verify_plan<double>(o, test::corpus(), test::virtual_launcher(plan.world_size()));
    EXPECT_TRUE(r.bitwise) << r.table();
    ASSERT_TRUE(r.plain_checked);
    EXPECT_LE(r.plain_max_rel_err, 1e-12) << r.table();
    EXPECT_GT(r.plain_max_rel_err, 0.0) << "the plain trainer adds in another order; identical bits would be luck";
    EXPECT_TRUE(r.ok) << r.table();
  }
}
// Every strategy again in fp64: the cases above run their code.
LLAMA4D_TIER(Equivalence, Fp64EveryStrategyAgreesWithThePlainTrainer, full);

// Rows of the global batch are split by the harness itself (not by the strategies' function), so
// a data rank that trains overlapping rows -- e.g. its first row computed from the micro-batch
// size -- fails here: 3 micro-batches per rank, each rank's rows compared with one device's.
TEST(Equivalence, DataRanksTrainTheirOwnRowsOfTheGlobalBatch) {
  EquivalenceOptions o;
  o.model = LlamaConfig::preset("tiny");
  o.train = test::options(2, 2);  // 24 rows over dp=4: 6 rows per rank, 3 micro-batches of 2
  o.plan = test::dp_plan(4, 1, ZeroStage::zero1);
  const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(4));
  EXPECT_EQ(r.micro_batches_per_rank, 3);
  EXPECT_TRUE(r.bitwise) << r.table();
  EXPECT_TRUE(r.ok) << r.table();
}

// Every rank reports the global token count (24 rows x 16 positions) at every step: a loss
// all-reduce that averages instead of summing keeps the mean loss right but not the count.
TEST(Equivalence, TokenCountsAreTheGlobalBatchOnEveryRank) {
  EquivalenceOptions o;
  o.model = LlamaConfig::preset("tiny");
  o.train = test::options(2, 3);
  o.plan = test::dp_plan(4, 1, ZeroStage::zero2);
  const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(4));
  EXPECT_EQ(r.tokens_single, (std::vector<int64_t>{24 * 16, 24 * 16}));
  EXPECT_EQ(r.tokens_parallel, r.tokens_single);
  for (const RankComparison& rc : r.per_rank) EXPECT_TRUE(rc.tokens_equal) << "rank " << rc.rank;
  EXPECT_TRUE(r.ok) << r.table();
}

// An odd shape: hidden 38, intermediate 308, one head, over 8 ranks. Segment lengths are not
// multiples of 8 x the shard alignment, so pieces are uneven and some ranks own little or
// nothing of a segment; if a piece size were rounded down, elements would belong to no rank.
TEST(Equivalence, OddShapesOnEightRanks) {
  LlamaConfig cfg = LlamaConfig::preset("tiny");
  cfg.hidden_size = 38;
  cfg.intermediate_size = 308;
  cfg.num_attention_heads = 1;
  cfg.num_key_value_heads = 1;
  cfg.head_dim = 38;
  for (ZeroStage stage : {ZeroStage::zero1, ZeroStage::zero3}) {
    EquivalenceOptions o;
    o.model = cfg;
    o.train = test::options(2, 1);
    o.plan = test::dp_plan(8, 1, stage);
    const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(8));
    EXPECT_TRUE(r.bitwise) << r.table();
    EXPECT_TRUE(r.ok) << r.table();
  }
}
// Uneven pieces: ZeRO1_dp3_accumulate and ZeRO2_dp3 split unevenly too.
LLAMA4D_TIER(Equivalence, OddShapesOnEightRanks, full);

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
