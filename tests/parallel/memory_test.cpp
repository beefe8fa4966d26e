// Per-rank memory of every data-parallel strategy, as ALLOCATED (every Buffer is charged to the
// rank's tracker), against the formulas of lessons 01-03 written out here from the shapes:
// N params in fp32 (s = 4 bytes), shard = the elements a rank owns (N/dp up to padding).
//   params      4N (DP, ZeRO-1/2)      4 shard + the units gathered at one time (ZeRO-3)
//   grads       4N (DP, ZeRO-1)        4 shard + the full gradients of 1..3 units (ZeRO-2/3)
//   optimizer   8N (DP)                8 shard (ZeRO-1/2/3)
//   comm        0 (DP)                 4 shard: the reduce-scatter output (ZeRO-2/3); ZeRO-1's
//                                      is the harness gathering its reduced pieces at the end
//   activations and scratch: one device's, for the rows of one micro-batch
// Exact equality wherever the schedule fixes the number; a range only where thread timing
// decides how many reductions are still in flight. A rank that allocates one byte more fails.
#include <gtest/gtest.h>

#include <algorithm>

#include "parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

// tiny with 8 layers, so "a few layers in flight" is clearly less than the whole model.
LlamaConfig deep_tiny() {
  LlamaConfig c = LlamaConfig::preset("tiny");
  c.num_hidden_layers = 8;
  return c;
}

EquivalenceReport run(const ParallelPlan& plan) {
  EquivalenceOptions o;
  o.model = deep_tiny();
  o.train = test::options(1, 0);
  o.plan = plan;
  return verify_plan<float>(o, test::corpus(), test::virtual_launcher(plan.world_size()));
}

// Segment lengths from the shapes (Llama 3 layout, untied head): the embedding, each block, and
// the final norm + LM head -- the units ZeRO shards one by one.
struct SegmentSizes {
  int64_t embed = 0, layer = 0, head = 0, total = 0;
};
SegmentSizes segment_sizes(const LlamaConfig& c) {
  const int64_t C = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, qd = c.q_dim(), kvd = c.kv_dim();
  SegmentSizes s;
  s.embed = V * C;
  s.layer = C /* input norm */ + C * qd + 2 * C * kvd + qd * C /* q k v o */ + C /* post norm */ + 3 * C * I;
  s.head = C + V * C;
  s.total = s.embed + c.num_hidden_layers * s.layer + s.head;
  return s;
}

// Elements rank r owns of a segment of `len` over n ranks, by the documented rule
// (shard_layout.h): pieces of S = ceil(len / n) rounded up to 512, rank r's piece [rS, (r+1)S)
// clipped to the segment.
int64_t owned(int64_t len, int n, int r) {
  const int64_t S = ((len + n - 1) / n + 511) / 512 * 512;
  return std::max<int64_t>(0, std::min(len, (r + 1) * S) - std::min(len, r * S));
}

// Activations and backward scratch of one whole-model forward + backward on BT = rows * T
// tokens, no checkpointing (the per-policy formulas are in tests/model/units_test.cpp).
struct ActivationBytes {
  int64_t activations = 0, scratch = 0;
};
ActivationBytes one_device(const LlamaConfig& c, int64_t rows, int64_t T) {
  const int64_t s = 4, BT = rows * T, C = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), I = c.intermediate_size,
                V = c.vocab_size, L = c.num_hidden_layers, nh = c.num_attention_heads;
  const int64_t block = BT * (C + 1 + qd + 2 * kvd + qd + nh + C + C + 1 + 3 * I) * s;  // n1 rstd1 q k v att lse h n2 rstd2 gate up act
  const int64_t head = BT * (C + 1 + V + 1) * s;                                         // n rstd logits losses
  ActivationBytes a;
  a.activations = 2 * BT * 4 /* int32 tokens, targets */ + (L + 1) * BT * C * s /* x_0..x_L */ + L * block + head;
  // The residual gradient, one block's backward temporaries (dn dh dq dk dv datt dgate dup
  // dact), and the head's dlogits and dn, all alive during the head's backward.
  a.scratch = BT * (C + (2 * C + 2 * qd + 2 * kvd + 3 * I) + V + C) * s;
  return a;
}

struct Case {
  ZeroStage stage;
  int shard, replicate;
};

TEST(Memory, EveryCategoryMatchesItsFormula) {
  const LlamaConfig cfg = deep_tiny();
  ASSERT_FALSE(cfg.tie_word_embeddings);  // the formulas below count an untied head
  const SegmentSizes seg = segment_sizes(cfg);
  const int64_t N = seg.total;
  // By hand: V=264, C=64, I=176, q 64, kv 32: 264*64 + 8*(64 + 4096 + 2*2048 + 4096 + 64 + 3*11264) + 64 + 264*64.
  ASSERT_EQ(N, 403520);
  const TrainOptions opt = test::options(1, 0);
  const std::vector<Case> cases = {
      {ZeroStage::none, 2, 1},  {ZeroStage::none, 4, 1},  {ZeroStage::none, 8, 1},  {ZeroStage::zero1, 2, 1},
      {ZeroStage::zero1, 4, 1}, {ZeroStage::zero1, 8, 1}, {ZeroStage::zero2, 2, 1}, {ZeroStage::zero2, 4, 1},
      {ZeroStage::zero2, 8, 1}, {ZeroStage::zero3, 2, 1}, {ZeroStage::zero3, 4, 1}, {ZeroStage::zero3, 8, 1},
      {ZeroStage::zero3, 2, 2}, {ZeroStage::zero3, 4, 2}, {ZeroStage::zero2, 2, 4}};
  for (const Case& c : cases) {
    const ParallelPlan plan = test::dp_plan(c.shard, c.replicate, c.stage);
    SCOPED_TRACE(plan.describe());
    const EquivalenceReport r = run(plan);
    ASSERT_TRUE(r.bitwise) << r.table();
    const int64_t embed = seg.embed, head = seg.head, layer = seg.layer;
    std::vector<int64_t> sizes(size_t(cfg.num_hidden_layers), layer);  // every segment, largest first
    sizes.push_back(embed), sizes.push_back(head);
    std::sort(sizes.rbegin(), sizes.rend());
    const ActivationBytes act = one_device(cfg, opt.batch_size / plan.dp(), opt.seq_len);
    for (int w = 0; w < plan.world_size(); ++w) {
      SCOPED_TRACE("rank " + std::to_string(w));
      const RankMemory& m = r.memory[size_t(w)];
      const int r = w % c.shard;
      const int64_t sh = owned(embed, c.shard, r) + cfg.num_hidden_layers * owned(layer, c.shard, r) + owned(head, c.shard, r);
      const int stage = int(c.stage);
      EXPECT_EQ(m.optimizer, stage == 0 ? 8 * N : 8 * sh);
      EXPECT_EQ(m.comm_buffers, stage == 0 ? 0 : 4 * sh);
      if (stage < 3)
        EXPECT_EQ(m.params, 4 * N);
      else  // the embedding stays gathered through the step; 2 blocks, or 1 block + the head
        EXPECT_EQ(m.params, 4 * sh + 4 * (embed + std::max(2 * layer, layer + head)));
      if (stage < 2) {
        EXPECT_EQ(m.grads, 4 * N);
      } else {
        EXPECT_GE(m.grads, 4 * sh + 4 * sizes[0]);
        EXPECT_LE(m.grads, 4 * sh + 4 * (sizes[0] + sizes[1] + sizes[2]));
      }
      EXPECT_EQ(m.activations, act.activations);
      EXPECT_EQ(m.scratch, act.scratch);
      // The RoPE tables: cos and sin, fp32, [seq_len, hd/2] each.
      EXPECT_EQ(m.other, 2 * opt.seq_len * (cfg.head_dim / 2) * 4);
      // The total's peak is one moment: at most the sum of the categories' peaks.
      EXPECT_LE(m.total, m.params + m.grads + m.optimizer + m.activations + m.scratch + m.comm_buffers + m.other);
      EXPECT_GE(m.total, std::max({m.params, m.grads, m.optimizer, m.activations}));
    }
  }
}
LLAMA4D_TIER(Memory, EveryCategoryMatchesItsFormula, full);  // a count of bytes: the sanitizers add nothing to it

}  // namespace
}  // namespace llama4d
