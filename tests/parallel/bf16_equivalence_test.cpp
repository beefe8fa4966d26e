// bf16 mixed precision (TrainOptions::bf16_compute) under every strategy against one device in
// bf16: with ordered reductions and without context parallelism every loss, gradient and
// parameter is bitwise the reference's, ZeRO-3 gathers, tensor and sequence parallelism's split
// sums (their replay rounds at the model's points), pipeline stages and activation checkpointing
// included; context parallelism, whose attention merges in another order, stays within the
// measured bf16 bounds. The rounding itself is checked in tests/model/bf16_compute_test.cpp.
//
// Gradients reduced in bf16 (ParallelPlan::bf16_grad_reduce) against the replay, which rounds
// each rank's contribution and each sum itself (equivalence.cpp, add_into / round_sum): bitwise
// on every kind of gradient reduction (DP buckets, ZeRO-1 once per step, ZeRO-2/3 per
// micro-batch, HSDP across replicas, the tied embedding's sum across pipeline stages), and the
// reduced gradients are bf16 values, which f32 reductions' are not. The bitwise cases reduce
// through the compute backend, as virtual GPUs over one real GPU do.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>

#include "../comm/host_collective_reduce.h"
#include "../ops/operand_log.h"
#include "core/tensor/bf16_rounding.h"
#include "parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

EquivalenceReport verify_bf16(const char* mesh, ZeroStage zero, const char* ac = "none", bool bf16_grads = false,
                              bool tied = false, ReduceAlgo algo = ReduceAlgo::ordered,
                              ContextAlgo cp_algo = ContextAlgo::allgather) {
  EquivalenceOptions o;
  o.model = LlamaConfig::preset("tiny");
  o.model.tie_word_embeddings = tied;
  o.train = test::options(3, 0);
  o.train.batch_size = 8;
  o.train.micro_batch_size = 2;
  o.train.bf16_compute = true;
  o.plan = ParallelPlan::parse(mesh);
  o.plan.zero = zero;
  o.plan.ac = Checkpointing::parse(ac, int(o.model.num_hidden_layers));
  o.plan.bf16_grad_reduce = bf16_grads;
  o.plan.algo = algo;
  o.plan.cp_algo = cp_algo;
  return verify_plan<float>(o, test::corpus(), test::virtual_launcher(o.plan.world_size(), algo));
}

TEST(Bf16Equivalence, BitwiseWhereTheSumsAreOrdered) {
  const struct {
    const char* mesh;
    ZeroStage zero;
    const char* ac;
  } cases[] = {{"dp=2", ZeroStage::none, "none"},
               {"dp=4", ZeroStage::zero3, "selective"},
               {"tp=2", ZeroStage::none, "none"},
               {"tp=2,dp=2", ZeroStage::zero2, "full"},
               {"pp=2,dp=2", ZeroStage::zero3, "none"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.mesh);
    const EquivalenceReport r = verify_bf16(c.mesh, c.zero, c.ac);
    EXPECT_EQ(r.dtype, "BF16");
    EXPECT_TRUE(r.bitwise) << r.table();
    EXPECT_TRUE(r.ok) << r.table();
    EXPECT_NE(r.losses_single[0], r.losses_single[2]);  // it trained
  }
}
// The same bf16 code as ContextParallelismWithinTheBf16Bounds.
LLAMA4D_TIER(Bf16Equivalence, BitwiseWhereTheSumsAreOrdered, full);

TEST(Bf16Equivalence, ContextParallelismWithinTheBf16Bounds) {
  for (const char* mesh : {"cp=2", "tp=2,cp=2"}) {
    SCOPED_TRACE(mesh);
    const EquivalenceReport r = verify_bf16(mesh, ZeroStage::none);
    EXPECT_TRUE(r.ok) << r.table();
    ASSERT_EQ(r.bounds_per_step.size(), 3u);
    EXPECT_LT(r.bounds_per_step[0].grad_tensor, 1.0) << "the first step's gradients are bounded";
  }
}
LLAMA4D_TIER(Bf16Equivalence, ContextParallelismWithinTheBf16Bounds, sanitizer);  // bf16 mixed precision across ranks

// The harness's bf16 bounds under context parallelism (0.18 on the first step's tensor errors,
// tensor_parallel_tolerance) cover every shape it was measured on, small at 32 tokens and cp 4
// included; on this shape they let a rounding dropped or moved under cp pass. All-gather
// attention computes every query row against the same keys in the same order as one device, so
// the forward (the loss) agrees to f32's last bits and the gradients differ only where dK and dV
// sum their ranks' queries in another order, which now and then moves a bf16 rounding. Measured
// here, tiny, cp 2 and cp 2 x dp 2 all-gather, seeds 1, 3, 7, 11, 42, 1337, first step, as
// {loss and gradient norm, gradient tensor error}: worst {3.9e-9, 2.0e-4} (seed 3, one moved
// rounding; the others {<= 3.9e-9, <= 1.7e-7}). Bounds: 10x the loss, 5x the gradients. Against
// them, attention's output left unrounded under cp measured {>= 3.7e-5, >= 3.4e-3}, and dK
// rounded only after RoPE with dV never rounded {>= 2.7e-7, >= 1.9e-3}, on every seed.
TEST(Bf16Equivalence, ContextParallelFirstStepWithinItsMeasuredSpread) {
  for (const char* mesh : {"cp=2", "cp=2,dp=2"}) {
    SCOPED_TRACE(mesh);
    const EquivalenceReport r = verify_bf16(mesh, ZeroStage::none);
    EXPECT_TRUE(r.ok) << r.table();
    ASSERT_EQ(r.errors_per_step.size(), 3u);
    const StepErrors& first = r.errors_per_step[0];
    EXPECT_LE(first.loss, 4e-8) << r.table();
    EXPECT_LE(first.grad_tensor, 1e-3) << r.table();
    EXPECT_GT(first.grad_tensor, 0) << "dK and dV are summed in another order than one device's";
  }
}

// Under each strategy, and in the one-device replays the harness compares with (tensor
// parallelism's own included), every product and attention call of a bf16 run says its operands
// are bf16, and they are, and every tensor they touch is the backend's memory
// (tests/ops/operand_log.h): what lets a GPU run them, on tensor cores.
TEST(Bf16Equivalence, EveryProductReadsBf16BackendOperandsUnderEveryStrategy) {
  const struct {
    const char* mesh;
    ContextAlgo cp_algo;
  } cases[] = {{"dp=2", ContextAlgo::allgather},
               {"tp=2", ContextAlgo::allgather},
               {"pp=2", ContextAlgo::allgather},
               {"tp=2,cp=2", ContextAlgo::allgather},
               {"cp=2", ContextAlgo::ring}};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.mesh) + (c.cp_algo == ContextAlgo::ring ? " ring" : ""));
    test::LoggingOperands logging;
    const EquivalenceReport r = verify_bf16(c.mesh, ZeroStage::none, "selective", false, false, ReduceAlgo::ordered,
                                            c.cp_algo);
    const test::OperandLog log = logging.log();
    EXPECT_TRUE(r.ok) << r.table();
    EXPECT_GT(log.products_bf16, 0);
    EXPECT_EQ(log.products_as_stored, 0);
    EXPECT_GT(log.attention_bf16, 0);
    EXPECT_EQ(log.attention_as_stored, 0);
    EXPECT_TRUE(log.not_bf16.empty()) << log.not_bf16.front();
    EXPECT_TRUE(log.not_backend_memory.empty()) << log.not_backend_memory.front();
  }
}
// Bf16 under every strategy: ContextParallelismWithinTheBf16Bounds runs the bf16 code.
LLAMA4D_TIER(Bf16Equivalence, EveryProductReadsBf16BackendOperandsUnderEveryStrategy, full);

TEST(Bf16GradReduce, BitwiseWithTheReplayOnEveryKindOfReduction) {
  const struct {
    const char* mesh;
    ZeroStage zero;
    bool tied;
    ReduceAlgo algo;
  } cases[] = {{"dp=2", ZeroStage::none, false, ReduceAlgo::ordered},        // DP buckets
               {"dp=4", ZeroStage::zero1, false, ReduceAlgo::ordered},       // once per step
               {"dp=2", ZeroStage::zero2, true, ReduceAlgo::ordered},        // per micro-batch, f32 accumulation
               {"dp_shard=2,dp_replicate=2", ZeroStage::zero3, false, ReduceAlgo::ordered},  // across replicas
               {"pp=2,dp=2", ZeroStage::zero1, true, ReduceAlgo::ordered},   // the tied sum across stages
               {"pp=2,dp=2", ZeroStage::zero2, true, ReduceAlgo::ordered},   // its parts: f32 sums of 2 micro-batches
               {"tp=2,dp=2", ZeroStage::none, false, ReduceAlgo::ordered},
               {"dp=2", ZeroStage::zero2, false, ReduceAlgo::ring}};         // two addends commute
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.mesh) + " ZeRO-" + std::to_string(int(c.zero)) + (c.tied ? " tied" : ""));
    // The backend takes the process group's reductions, as a GPU does (tests/ops/operand_log.h).
    test::LoggingOperands logging(&test::host_collective_reduce);
    const EquivalenceReport r = verify_bf16(c.mesh, c.zero, "none", true, c.tied, c.algo);
    EXPECT_GT(logging.log().collective_reductions_on_backend, 0);
    EXPECT_NE(r.strategy.find("bf16 gradients"), std::string::npos) << r.strategy;
    EXPECT_TRUE(r.bitwise) << r.table();
    EXPECT_TRUE(r.ok) << r.table();
    EXPECT_NE(r.losses_single[0], r.losses_single[2]);  // it trained
  }
}
// RingOverFourRanksWithinTheBounds reduces in bf16 too.
LLAMA4D_TIER(Bf16GradReduce, BitwiseWithTheReplayOnEveryKindOfReduction, full);

// A ring over more than two ranks rounds every partial sum to bf16 as it travels (as NCCL does),
// which the replay's one rounding per sum does not follow: within the measured bounds instead.
TEST(Bf16GradReduce, RingOverFourRanksWithinTheBounds) {
  const EquivalenceReport r = verify_bf16("dp=4", ZeroStage::zero2, "none", true, false, ReduceAlgo::ring);
  EXPECT_TRUE(r.ok) << r.table();
  EXPECT_FALSE(r.bitwise) << "four ranks summed in ring order round differently somewhere";
  ASSERT_EQ(r.bounds_per_step.size(), 3u);
  ASSERT_EQ(r.errors_per_step.size(), 3u);
  EXPECT_GT(r.errors_per_step[0].grad_tensor, 0) << "the first step's gradients differ by the roundings";
  EXPECT_TRUE(std::isfinite(r.bounds_per_step[0].grad_tensor)) << "and are bounded";
}

// The gradient a step consumes after one bf16 reduction (one micro-batch, no clipping) is a bf16
// value in every element; after an f32 reduction almost none is.
std::vector<float> reduced_grads(ZeroStage zero, bool bf16_grads) {
  ParallelPlan plan = test::dp_plan(2, 1, zero);
  plan.bf16_grad_reduce = bf16_grads;
  TrainOptions opt = test::options(1, 0);
  opt.batch_size = 4;
  opt.grad_clip = 0;
  opt.bf16_compute = true;
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  VirtualClusterOptions vo;
  vo.ranks = 2;
  VirtualCluster cluster(vo);
  std::vector<float> out;
  std::mutex mu;
  cluster.run([&](ProcessGroup& world) {
    ops::set_backend_threads(1);
    Llama<float> model(cfg, &world.memory());
    ParallelTrainer<float> trainer(world, model, test::corpus(), opt, plan);
    trainer.step();
    std::vector<float> g;
    trainer.strategy().gather_grads(g);
    std::lock_guard<std::mutex> lock(mu);
    if (world.rank() == 0) out = g;
  });
  return out;
}

int64_t count_not_bf16(const std::vector<float>& g) {
  int64_t n = 0;
  for (float v : g) n += v != float(nearest_bf16(v));
  return n;
}

TEST(Bf16GradReduce, ReducedGradientsAreBf16Values) {
  for (ZeroStage zero : {ZeroStage::none, ZeroStage::zero1, ZeroStage::zero2, ZeroStage::zero3}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(int(zero)));
    const std::vector<float> wire = reduced_grads(zero, true), f32 = reduced_grads(zero, false);
    ASSERT_EQ(wire.size(), f32.size());
    ASSERT_FALSE(wire.empty());
    EXPECT_EQ(count_not_bf16(wire), 0);
    EXPECT_GT(count_not_bf16(f32), int64_t(f32.size()) / 2);
  }
}

TEST(Bf16GradReduce, RefusedWithoutBf16ComputeOrRanksToReduceOver) {
  ParallelPlan one = ParallelPlan::parse("tp=2");
  one.bf16_grad_reduce = true;
  EXPECT_THROW(one.validate(), InputError);  // dp x cp = 1: nothing to reduce
  ParallelPlan none;
  none.bf16_grad_reduce = true;
  EXPECT_THROW(none.validate(), InputError);  // one device
  ParallelPlan cp = ParallelPlan::parse("cp=2");
  cp.bf16_grad_reduce = true;
  EXPECT_NO_THROW(cp.validate());  // the cp ranks sum their gradients

  // An f32 run keeps f32 gradients: ParallelTrainer refuses the plan before any rank trains.
  ParallelPlan plan = test::dp_plan(2, 1, ZeroStage::none);
  plan.bf16_grad_reduce = true;
  TrainOptions opt = test::options(1, 0);
  VirtualClusterOptions vo;
  vo.ranks = 2;
  VirtualCluster cluster(vo);
  EXPECT_THROW(cluster.run([&](ProcessGroup& world) {
    Llama<float> model(LlamaConfig::preset("tiny"), &world.memory());
    ParallelTrainer<float> trainer(world, model, test::corpus(), opt, plan);
  }),
               InputError);
}

}  // namespace
}  // namespace llama4d

