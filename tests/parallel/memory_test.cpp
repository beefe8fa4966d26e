// Per-rank memory of the sharded states against the textbook formulas (N params, 4-byte fp32):
//   optimizer: 8N (DP)  vs  8 * shard   (ZeRO-1/2/3)
//   params:    4N (DP, ZeRO-1/2)  vs  4 * shard + gathered layers (ZeRO-3)
//   grads:     4N (DP, ZeRO-1)    vs  4 * shard + unreduced layers (ZeRO-2/3)
// where shard = the elements a rank owns: N / dp up to the alignment padding of its pieces.
#include <gtest/gtest.h>

#include "core/parallel/shard_layout.h"
#include "parallel_test_util.h"

namespace llama4d {
namespace {

// tiny with 8 layers, so "a few layers in flight" is clearly less than the whole model.
LlamaConfig deep_tiny() {
  LlamaConfig c = LlamaConfig::preset("tiny");
  c.num_hidden_layers = 8;
  return c;
}

EquivalenceReport run(ZeroStage stage, int dp) {
  EquivalenceOptions o;
  o.model = deep_tiny();
  o.train = test::options(1, 0);
  o.plan = test::dp_plan(dp, 1, stage);
  return verify_plan<float>(o, test::corpus(), test::virtual_launcher(dp));
}

TEST(Memory, ShardsPartitionTheModelWithBoundedPadding) {
  const auto specs = llama_param_specs(LlamaConfig::preset("tiny"));
  const int64_t N = specs.back().offset + specs.back().numel;
  for (int dp : {1, 2, 3, 4, 8}) {
    const ShardLayout layout(specs, dp);
    int64_t total = 0;
    for (int r = 0; r < dp; ++r) {
      total += layout.shard_numel(r);
      // No rank holds more than its even share plus one alignment block per segment.
      EXPECT_LE(layout.shard_numel(r), (N + dp - 1) / dp + int64_t(layout.segments().size()) * kShardAlign);
    }
    EXPECT_EQ(total, N) << "pieces must partition the flat buffer (dp=" << dp << ")";
  }
}

TEST(Memory, DataParallelReplicatesEverything) {
  const int64_t N = deep_tiny().num_parameters();
  const EquivalenceReport r = run(ZeroStage::none, 4);
  for (const RankMemory& m : r.memory) {
    EXPECT_EQ(m.params, 4 * N);
    EXPECT_EQ(m.grads, 4 * N);
    EXPECT_EQ(m.optimizer, 8 * N);
    EXPECT_GT(m.activations, 0);
  }
}

TEST(Memory, ZeroStagesShardWhatTheyPromise) {
  const auto specs = llama_param_specs(deep_tiny());
  const int64_t N = specs.back().offset + specs.back().numel;
  const int dp = 4;
  const ShardLayout layout(specs, dp);
  int64_t largest_segment = 0;
  for (const Segment& s : layout.segments()) largest_segment = std::max(largest_segment, s.numel());

  const EquivalenceReport z1 = run(ZeroStage::zero1, dp), z2 = run(ZeroStage::zero2, dp), z3 = run(ZeroStage::zero3, dp);
  for (int r = 0; r < dp; ++r) {
    const int64_t shard = layout.shard_numel(r);
    // ZeRO-1: the optimizer is sharded; gradients accumulate in full, then reduce-scatter.
    EXPECT_EQ(z1.memory[size_t(r)].optimizer, 8 * shard);
    EXPECT_EQ(z1.memory[size_t(r)].params, 4 * N);
    EXPECT_EQ(z1.memory[size_t(r)].grads, 4 * N);  // reduce-scattered in place
    // ZeRO-2: + gradients: the shard plus the full gradients of the few layers still being
    // reduced (at most 2 in flight + the one computing + the two root segments).
    EXPECT_EQ(z2.memory[size_t(r)].optimizer, 8 * shard);
    EXPECT_EQ(z2.memory[size_t(r)].params, 4 * N);
    EXPECT_GE(z2.memory[size_t(r)].grads, 4 * shard);
    EXPECT_LE(z2.memory[size_t(r)].grads, 4 * (shard + 5 * largest_segment));
    EXPECT_LT(z2.memory[size_t(r)].grads, 4 * N);
    // ZeRO-3: + parameters: the shard plus the layers gathered at one time (the root unit and at
    // most two layers with prefetch), far below the full model.
    EXPECT_EQ(z3.memory[size_t(r)].optimizer, 8 * shard);
    EXPECT_GE(z3.memory[size_t(r)].params, 4 * shard);
    EXPECT_LE(z3.memory[size_t(r)].params, 4 * (shard + 4 * largest_segment));
    EXPECT_LT(z3.memory[size_t(r)].total, z1.memory[size_t(r)].total);
  }
}

}  // namespace
}  // namespace llama4d
