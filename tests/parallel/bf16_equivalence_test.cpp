// bf16 mixed precision (TrainOptions::bf16_compute) under every strategy against one device in
// bf16: with ordered reductions and without context parallelism every loss, gradient and
// parameter is bitwise the reference's, ZeRO-3 gathers, tensor and sequence parallelism's split
// sums (their replay rounds at the model's points), pipeline stages and activation checkpointing
// included; context parallelism, whose attention merges in another order, stays within the
// measured bf16 bounds. The rounding itself is checked in tests/model/bf16_compute_test.cpp.
#include <gtest/gtest.h>

#include "parallel_test_util.h"

namespace llama4d {
namespace {

EquivalenceReport verify_bf16(const char* mesh, ZeroStage zero, const char* ac = "none") {
  EquivalenceOptions o;
  o.model = LlamaConfig::preset("tiny");
  o.train = test::options(3, 0);
  o.train.batch_size = 8;
  o.train.micro_batch_size = 2;
  o.train.bf16_compute = true;
  o.plan = ParallelPlan::parse(mesh);
  o.plan.zero = zero;
  o.plan.ac = Checkpointing::parse(ac, int(o.model.num_hidden_layers));
  return verify_plan<float>(o, test::corpus(), test::virtual_launcher(o.plan.world_size()));
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

TEST(Bf16Equivalence, ContextParallelismWithinTheBf16Bounds) {
  for (const char* mesh : {"cp=2", "tp=2,cp=2"}) {
    SCOPED_TRACE(mesh);
    const EquivalenceReport r = verify_bf16(mesh, ZeroStage::none);
    EXPECT_TRUE(r.ok) << r.table();
    ASSERT_EQ(r.bounds_per_step.size(), 3u);
    EXPECT_LT(r.bounds_per_step[0].grad_tensor, 1.0) << "the first step's gradients are bounded";
  }
}

}  // namespace
}  // namespace llama4d
