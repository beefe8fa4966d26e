// Tensor parallelism: the layout (which rank holds which heads, columns and vocabulary rows,
// with values worked out by hand), the slices' coverage of every whole tensor, and training on
// tp virtual GPUs against one device: alone, with data parallelism under ZeRO, with activation
// checkpointing, with a vocabulary tp does not divide and with key/value heads replicated.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "core/model/llama.h"
#include "core/model/params.h"
#include "core/model/tp_layout.h"
#include "core/model/initialization.h"
#include "core/parallel/tensor_parallel.h"
#include "parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

// `small`'s attention shape (6 query heads, 2 key/value heads, group 3) at a test-sized width:
// C = 48, head_dim 8, SwiGLU 96, tiny's vocabulary (264: 256 bytes, specials, rounded up), 2 layers.
LlamaConfig small_shaped(int64_t heads = 6, int64_t kv_heads = 2) {
  LlamaConfig c = LlamaConfig::preset("tiny");
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = 8;
  c.hidden_size = 48;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.max_position_embeddings = 64;
  return c;
}

TEST(TpLayout, SmallShapeOnTwoThreeAndSixRanks) {
  const LlamaConfig c = small_shaped();
  ASSERT_EQ(c.vocab_size, 264);
  // tp=2: heads 0-2 read KV head 0, heads 3-5 KV head 1 (group 3): the KV heads split.
  TpLayout t = tp_layout(c, 2, 1);
  EXPECT_EQ(t.heads_begin, 3);
  EXPECT_EQ(t.heads, 3);
  EXPECT_EQ(t.kv_heads_begin, 1);
  EXPECT_EQ(t.kv_heads, 1);
  EXPECT_EQ(t.ffn_begin, 48);
  EXPECT_EQ(t.ffn, 48);
  EXPECT_EQ(t.vocab_begin, 132);
  EXPECT_EQ(t.vocab_rows, 132);
  EXPECT_FALSE(t.replicates_kv_heads(c));
  // tp=3: rank 1 has heads 2 and 3, which read KV heads 0 and 1: both, one query head each.
  t = tp_layout(c, 3, 1);
  EXPECT_EQ(t.heads_begin, 2);
  EXPECT_EQ(t.heads, 2);
  EXPECT_EQ(t.kv_heads_begin, 0);
  EXPECT_EQ(t.kv_heads, 2);
  EXPECT_EQ(t.vocab_begin, 88);
  EXPECT_EQ(t.vocab_rows, 88);
  EXPECT_TRUE(t.replicates_kv_heads(c));
  EXPECT_EQ(t.first_holder_of_kv_head(0, c), 0);  // head 0 first appears on rank 0 (query head 0)
  EXPECT_EQ(t.first_holder_of_kv_head(1, c), 1);  // head 1 on rank 1 (query head 3)
  // tp=6: one query head per rank; ranks 3-5 hold KV head 1.
  t = tp_layout(c, 6, 4);
  EXPECT_EQ(t.heads_begin, 4);
  EXPECT_EQ(t.kv_heads_begin, 1);
  EXPECT_EQ(t.kv_heads, 1);
  EXPECT_EQ(t.ffn_begin, 64);
  EXPECT_EQ(t.ffn, 16);
  EXPECT_EQ(t.vocab_begin, 176);
  EXPECT_EQ(t.vocab_rows, 44);
}

TEST(TpLayout, VocabularyTpDoesNotDivideIsPaddedOnTheLastRank) {
  // 259 rows over 4 ranks: ceil = 65 per rank, the last holds 259 - 195 = 64.
  LlamaConfig c = small_shaped(8, 2);
  c.vocab_size = 259;
  const TpLayout last = tp_layout(c, 4, 3);
  EXPECT_EQ(last.vocab_padded_rows, 65);
  EXPECT_EQ(last.vocab_begin, 195);
  EXPECT_EQ(last.vocab_rows, 64);
  EXPECT_EQ(tp_layout(c, 4, 0).vocab_rows, 65);
}

TEST(TpLayout, BadCutsNameTheConstraint) {
  auto message = [](const LlamaConfig& c, int tp) {
    try {
      tp_layout(c, tp, 0);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(small_shaped(), 4).find("divide num_attention_heads"), std::string::npos);
  EXPECT_NE(message(small_shaped(), 12).find("more ranks than"), std::string::npos);
  // 12 heads, 4 KV heads (group 3) over 3 ranks: rank 0's heads 0-3 read KV heads 0, 0, 0, 1.
  LlamaConfig uneven = small_shaped(12, 4);
  uneven.head_dim = 4;
  EXPECT_NE(message(uneven, 3).find("unequally"), std::string::npos);
  LlamaConfig odd_ffn = small_shaped();
  odd_ffn.intermediate_size = 100;
  EXPECT_NE(message(odd_ffn, 3).find("intermediate_size"), std::string::npos);
}

// Over the ranks of a tensor-parallel group, the counted elements of every tensor's slices
// cover the whole tensor exactly once, and the slices' values are the whole model's values.
TEST(TpLayout, SlicesCoverEveryWholeTensorOnceWithTheSameValues) {
  for (auto [heads, kv, tp] : {std::tuple{6, 2, 2}, {6, 2, 3}, {6, 2, 6}, {8, 2, 4}}) {
    const LlamaConfig c = small_shaped(heads, kv);
    const std::vector<ParamSpec> whole = llama_param_specs(c);
    std::vector<double> whole_values(size_t(flat_numel(whole)));
    init_param_values<double>(whole, 5, 0, flat_numel(whole), whole_values.data());
    std::vector<int> counted(whole_values.size(), 0);
    for (int r = 0; r < tp; ++r) {
      const std::vector<ParamSpec> mine = llama_param_specs(c, tp_layout(c, tp, r));
      ASSERT_EQ(mine.size(), whole.size());
      std::vector<double> values(size_t(flat_numel(mine)));
      init_param_values<double>(mine, 5, 0, flat_numel(mine), values.data());
      for (size_t i = 0; i < mine.size(); ++i) {
        const ParamSpec& p = mine[i];
        ASSERT_EQ(p.name, whole[i].name);
        for_each_whole_run(p, 0, p.numel, [&](int64_t at, int64_t w, int64_t n) {
          for (int64_t k = 0; k < n; ++k) {
            ASSERT_EQ(values[size_t(p.offset + at + k)], whole_values[size_t(whole[i].offset + w + k)])
                << p.name << " tp=" << tp << " rank " << r;
            if (at + k >= p.counted_begin && at + k < p.counted_hi()) ++counted[size_t(whole[i].offset + w + k)];
          }
        });
      }
    }
    for (size_t e = 0; e < counted.size(); ++e)
      ASSERT_EQ(counted[e], 1) << "whole element " << e << " counted " << counted[e] << " times, tp=" << tp;
  }
}

struct TpCase {
  const char* name;
  int64_t vocab;  // 259: tp = 2, 3, 4, 6 leave a short last slice
  int heads, kv_heads;
  int tp;
  const char* data;  // data-parallel dims of the mesh ("" for none)
  ZeroStage stage;
  const char* ac;
  bool tied;
  bool sp = true;  // sequence parallelism
};

void PrintTo(const TpCase& c, std::ostream* os) { *os << c.name; }

class TensorParallelEquivalence : public testing::TestWithParam<TpCase> {};

EquivalenceOptions options_for(const TpCase& c) {
  EquivalenceOptions o;
  o.model = small_shaped(c.heads, c.kv_heads);
  o.model.vocab_size = c.vocab;
  o.model.tie_word_embeddings = c.tied;
  o.plan = ParallelPlan::parse("tp=" + std::to_string(c.tp) + (*c.data ? "," : "") + c.data);
  o.train = test::options(3, 24 / o.plan.dp() / 2);
  o.plan.zero = c.stage;
  o.plan.ac = Checkpointing::parse(c.ac, int(o.model.num_hidden_layers));
  o.plan.sequence_parallel = c.sp;
  return o;
}

// Every rank's slices of the gradients and parameters, the loss and the gradient norm, after 3
// AdamW steps with clipping active and 2 micro-batches per data rank, with ordered reductions:
// bitwise equal to the one-device replay that adds tensor parallelism's split sums in rank order
// (core/verify/tensor_parallel_replay.h), in fp64 and in fp32. Against the plain one-device
// trainer, which adds those numbers in another order (a row-parallel layer's output is one dot
// product over the whole row there, the loss one sum of exponentials), fp64 is within 1e-12 per
// tensor: the independent check that the cut itself is right.
TEST_P(TensorParallelEquivalence, Fp64BitwiseWithTheReplayAndWithinOneInATrillionOfOneDevice) {
  const EquivalenceOptions o = options_for(GetParam());
  const EquivalenceReport r = verify_plan<double>(o, test::corpus(), test::virtual_launcher(o.plan.world_size()));
  EXPECT_TRUE(r.ok) << r.table();
  EXPECT_TRUE(r.bitwise) << r.table();
  EXPECT_TRUE(r.plain_checked);
  EXPECT_LE(r.plain_max_rel_err, 1e-12) << r.table();
  ASSERT_EQ(int(r.per_rank.size()), o.plan.world_size());
  EXPECT_NE(r.losses_single[0], r.losses_single[2]);
}

TEST_P(TensorParallelEquivalence, Fp32BitwiseWithTheReplay) {
  const EquivalenceOptions o = options_for(GetParam());
  const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(o.plan.world_size()));
  EXPECT_TRUE(r.ok) << r.table();
  EXPECT_TRUE(r.bitwise) << r.table();
  ASSERT_EQ(int(r.per_rank.size()), o.plan.world_size());
  EXPECT_NE(r.losses_single[0], r.losses_single[2]);
}

const TpCase kTpCases[] = {
    {"tp2", 264, 6, 2, 2, "", ZeroStage::none, "none", false},
    {"tp3_replicated_kv", 264, 6, 2, 3, "", ZeroStage::none, "none", false},
    {"tp6_replicated_kv_padded_vocab", 259, 6, 2, 6, "", ZeroStage::none, "none", false},
    {"tp4_padded_vocab", 259, 8, 2, 4, "", ZeroStage::none, "none", false},
    {"tp2_tied_padded_vocab", 259, 6, 2, 2, "", ZeroStage::none, "none", true},
    {"tp3_dp2_zero1", 264, 6, 2, 3, "dp=2", ZeroStage::zero1, "none", false},
    {"tp2_dp2_zero3_selective", 264, 6, 2, 2, "dp=2", ZeroStage::zero3, "selective", false},
    {"tp4_dp2_zero3_full_ac", 264, 8, 2, 4, "dp=2", ZeroStage::zero3, "full", false},
    {"tp2_dp2_ddp", 264, 6, 2, 2, "dp=2", ZeroStage::none, "none", false},
    {"tp3_dp2_zero2", 264, 6, 2, 3, "dp=2", ZeroStage::zero2, "none", false},
    {"tp2_hsdp_2x2_zero3", 264, 6, 2, 2, "dp_shard=2,dp_replicate=2", ZeroStage::zero3, "none", false},
    // Without sequence parallelism (the cases above run with it, the default):
    {"tp2_no_sp", 264, 6, 2, 2, "", ZeroStage::none, "none", false, false},
    {"tp3_replicated_kv_no_sp", 264, 6, 2, 3, "", ZeroStage::none, "none", false, false},
    {"tp6_padded_vocab_no_sp", 259, 6, 2, 6, "", ZeroStage::none, "none", false, false},
    {"tp2_tied_no_sp", 259, 6, 2, 2, "", ZeroStage::none, "none", true, false},
    {"tp4_dp2_zero3_full_ac_no_sp", 264, 8, 2, 4, "dp=2", ZeroStage::zero3, "full", false, false},
    {"tp2_dp2_zero1_selective_no_sp", 264, 6, 2, 2, "dp=2", ZeroStage::zero1, "selective", false, false},
};
// Tiers: the sanitizer presets run replicated key/value heads, a tied and padded vocabulary, and
// ZeRO-3 with full checkpointing on 8 ranks, in fp64; the release preset runs every case.
LLAMA4D_INSTANTIATE(TensorParallel, TensorParallelEquivalence, kTpCases, full,
                    {{"tp3_replicated_kv", test::Tier::sanitizer},
                     {"tp2_tied_padded_vocab", test::Tier::sanitizer},
                     {"tp4_dp2_zero3_full_ac", test::Tier::sanitizer}});
// The fp32 replay of every case: release only (the fp64 one above is bitwise with the same replay).
[[maybe_unused]] const bool kFp32ReplayTier =
    test::declare_tier("TensorParallel/TensorParallelEquivalence.Fp32BitwiseWithTheReplay/*", test::Tier::full);

// The replay under pipeline stages, in fp32 with ordered reductions, bitwise: the gradient norm
// adds each stage's replicas before the tensor-parallel ranks' values, and a tied LM head's part
// of the embedding's gradient stays apart until the stages' parts are added. tp=2 x pp=2 x dp=2
// with tied embeddings under ZeRO-2 and zero-bubble's split backward; tp=3 x pp=2 x dp=2 (KV heads
// replicated) under ZeRO-3 with 1F1B.
TEST(TensorParallelEquivalence, Fp32BitwiseUnderPipelineStages) {
  for (const auto& [mesh, tied, stage, schedule] :
       {std::tuple{"tp=2,pp=2,dp=2", true, ZeroStage::zero2, PipelineScheduleKind::zb_h1},
        std::tuple{"tp=3,pp=2,dp=2", false, ZeroStage::zero3, PipelineScheduleKind::one_f_one_b}}) {
    SCOPED_TRACE(mesh);
    EquivalenceOptions o;
    o.model = small_shaped();
    o.model.vocab_size = 259;
    o.model.tie_word_embeddings = tied;
    o.plan = ParallelPlan::parse(mesh);
    o.plan.zero = stage;
    o.plan.schedule = schedule;
    o.train = test::options(3, 6);
    const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(o.plan.world_size()));
    EXPECT_TRUE(r.ok) << r.table();
    EXPECT_TRUE(r.bitwise) << r.table();
  }
}
LLAMA4D_TIER(TensorParallelEquivalence, Fp32BitwiseUnderPipelineStages, full);  // tp x pp runs in the 4D sanitizer case

// Sequence parallelism splits any number of tokens: micro-batches of 4 rows x 16 tokens = 64 rows
// over tp = 3 (22, 21, 21) and tp = 6 (11, 11, 10, 11, 11, 10) still match one device.
TEST(TensorParallelEquivalence, SequenceParallelSplitsAnyTokenCount) {
  for (int tp : {3, 6}) {
    EquivalenceOptions o;
    o.model = small_shaped();
    o.train = test::options(2, 4);
    o.plan = ParallelPlan::parse("tp=" + std::to_string(tp));
    const EquivalenceReport r = verify_plan<double>(o, test::corpus(), test::virtual_launcher(tp));
    EXPECT_TRUE(r.ok) << "tp=" << tp << "\n" << r.table();
  }
}
// Sequence parallelism runs in every sanitizer tp case.
LLAMA4D_TIER(TensorParallelEquivalence, SequenceParallelSplitsAnyTokenCount, full);

// Per-rank memory under tp=2 on deep `tiny` (8 layers, 4 heads, 2 KV heads: one KV head per rank,
// none replicated), as ALLOCATED, against formulas written from the shapes with every sliced
// dimension divided by hand: q/o 4 heads -> 2, k/v 2 -> 1, SwiGLU 176 -> 88, vocabulary 264 -> 132;
// with sequence parallelism the residual stream and the norms' statistics hold half the rows.
TEST(TensorParallelMemory, EveryCategoryIsTheSliceOfOneDevice) {
  LlamaConfig cfg = LlamaConfig::preset("tiny");
  cfg.num_hidden_layers = 8;
  const int64_t C = 64, hd = 16, L = 8, s = 4;
  const int64_t q = 2 * hd, kv = 1 * hd, I = 88, V = 132;  // this rank's slices
  // embedding + 8 x (norms, q, k, v, o, gate, up, down) + final norm + LM head
  const int64_t N = V * C + L * (2 * C + q * C + 2 * kv * C + C * q + 3 * I * C) + C + V * C;
  ASSERT_EQ(N, 132 * 64 + 8 * (128 + 2048 + 2048 + 2048 + 3 * 5632) + 64 + 132 * 64);
  EquivalenceOptions o;
  o.model = cfg;
  o.train = test::options(1, 0);
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel only");
    o.plan = ParallelPlan::parse("tp=2");
    o.plan.sequence_parallel = sp;
    const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(2));
    ASSERT_TRUE(r.ok) << r.table();
    // rows: the residual-stream rows a rank holds (half of them under sequence parallelism).
    const int64_t BT = 24 * 16, nh = 2, rows = sp ? BT / 2 : BT;
    // Kept per block: n1 rstd1 q k v att lse h n2 rstd2 gate up act (n1, n2 gathered to all rows);
    // the head keeps n (all rows), rstd, the [BT, V/tp] logits slice, losses and the log-sum-exp.
    const int64_t block = (BT * (C + q + 2 * kv + q + nh + C + 3 * I) + rows * (1 + C + 1)) * s;
    const int64_t head = (BT * (C + V + 1 + 1) + rows) * s;
    const int64_t activations = 2 * BT * 4 + (L + 1) * rows * C * s + L * block + head;
    // At the head's backward: the residual gradient (rows), one block's temporaries, dlogits and
    // the head's dn; with SP also the final norm's gain gradient [C].
    const int64_t scratch = (rows * C + BT * ((2 * C + 2 * q + 2 * kv + 3 * I) + V + C) + (sp ? C : 0)) * s;
    for (int w = 0; w < 2; ++w) {
      SCOPED_TRACE("rank " + std::to_string(w));
      const RankMemory& m = r.memory[size_t(w)];
      EXPECT_EQ(m.params, s * N);
      EXPECT_EQ(m.grads, s * N);
      EXPECT_EQ(m.optimizer, 2 * s * N);
      EXPECT_EQ(m.activations, activations);
      EXPECT_EQ(m.scratch, scratch);
    }
  }
}
// A count of bytes: the sanitizers add nothing to it.
LLAMA4D_TIER(TensorParallelMemory, EveryCategoryIsTheSliceOfOneDevice, full);

// Every rank's records of the tensor-parallel group's traffic in one training step of a tp-only plan.
std::vector<TrafficRecord> one_step_traffic(const LlamaConfig& cfg, const TrainOptions& opt, const ParallelPlan& plan) {
  VirtualClusterOptions vo;
  vo.ranks = plan.world_size();
  VirtualCluster cluster(vo);
  test::train_steps(cluster, cfg, opt, plan, 1);
  std::vector<TrafficRecord> out;
  for (const TrafficRecord& t : cluster.traffic())
    if (t.group_size == plan.size("tp")) out.push_back(t);
  return out;
}

// What moves over the tensor-parallel group in one training step, per micro-batch, against the
// textbook counts (Megatron: 2 all-reduces of b*s*h in forward and 2 in backward per layer),
// read from the traffic log by label. Full activation checkpointing repeats attention's g (the
// recompute stops before down_proj, whose output the backward never reads).
TEST(TensorParallelTraffic, AllReducesPerLayerAreMegatronsCounts) {
  for (const char* ac : {"none", "full"}) {
    SCOPED_TRACE(ac);
    const LlamaConfig cfg = small_shaped();  // 2 layers, C 48; tp=3 replicates the 2 KV heads
    TrainOptions opt = test::options(1, 12);  // 2 micro-batches of 12 rows x 16 tokens
    ParallelPlan plan = ParallelPlan::parse("tp=3");
    plan.ac = Checkpointing::parse(ac, 2);
    plan.sequence_parallel = false;
    std::map<std::string, std::pair<int64_t, int64_t>> by_label;  // calls, elements (rank 0)
    for (const TrafficRecord& t : one_step_traffic(cfg, opt, plan))
      if (t.world_rank == 0 && t.op == "all_reduce") {
        by_label[t.label].first += 1;
        by_label[t.label].second += t.count;
      }
    const int64_t M = 2, BTC = 12 * 16 * 48, BT = 12 * 16, L = 2, recompute = std::string(ac) == "full" ? 2 : 1;
    using P = std::pair<int64_t, int64_t>;
    EXPECT_EQ(by_label["g forward: o_proj partial sums"], P(M * L * recompute, M * L * recompute * BTC));
    // The recompute of a block whose output is not needed stops before down_proj, so its g too.
    EXPECT_EQ(by_label["g forward: down_proj partial sums"], P(M * L, M * L * BTC));
    EXPECT_EQ(by_label["f backward: attention input gradient"], P(M * L, M * L * BTC));
    EXPECT_EQ(by_label["f backward: MLP input gradient"], P(M * L, M * L * BTC));
    EXPECT_EQ(by_label["vocab-parallel embedding"], P(M, M * BTC));
    EXPECT_EQ(by_label["f backward: head input gradient"], P(M, M * BTC));
    EXPECT_EQ(by_label["vocab-parallel loss: max"], P(M, M * BT));
    EXPECT_EQ(by_label["vocab-parallel loss: sum of exp"], P(M, M * BT));
    EXPECT_EQ(by_label["vocab-parallel loss: target logit"], P(M, M * BT));
    // Replicated KV heads: per layer and micro-batch, k and v gradients of all 2 heads x 8 x 48.
    EXPECT_EQ(by_label["key/value replicas: weight gradient sum"], P(M * L, M * L * 2 * 2 * 8 * 48));
  }
}

// Sequence parallelism moves the same bytes as TP (each all-reduce becomes a reduce-scatter plus
// an all-gather of its halves), in these calls per micro-batch and layer: forward, all-gather
// n1 and n2, reduce-scatter the o_proj and down_proj outputs; backward, all-gather the two output
// gradients, reduce-scatter the two input gradients; plus the gains' gradients (C numbers each).
TEST(TensorParallelTraffic, SequenceParallelSplitsEachAllReduceInItsHalves) {
  const LlamaConfig cfg = small_shaped();
  TrainOptions opt = test::options(1, 12);
  ParallelPlan plan = ParallelPlan::parse("tp=3");
  std::map<std::string, std::pair<int64_t, int64_t>> calls;  // label -> calls, bytes sent (rank 0)
  int64_t sp_bytes = 0;
  for (const TrafficRecord& t : one_step_traffic(cfg, opt, plan))
    if (t.world_rank == 0) {
      calls[t.label].first += 1;
      calls[t.label].second += t.bytes_sent;
      if (t.op != "all_reduce") sp_bytes += t.bytes_sent;
    }
  const int64_t M = 2, L = 2, BTC = 12 * 16 * 48;
  for (const char* label : {"SP forward: attention input all-gather", "SP forward: MLP input all-gather",
                            "SP forward: o_proj reduce-scatter", "SP forward: down_proj reduce-scatter",
                            "SP backward: o_proj output gradient all-gather",
                            "SP backward: down_proj output gradient all-gather",
                            "SP backward: attention input gradient reduce-scatter",
                            "SP backward: MLP input gradient reduce-scatter"})
    EXPECT_EQ(calls[label].first, M * L) << label;
  EXPECT_EQ(calls["sequence-parallel norm gain gradient"].first, M * (2 * L + 1));  // ln1, ln2 per layer; final norm
  EXPECT_EQ(calls["vocab-parallel embedding: reduce-scatter"].first, M);
  EXPECT_EQ(calls["sequence-parallel head input: gather"].first, M);
  EXPECT_EQ(calls["sequence-parallel head input gradient: reduce-scatter"].first, M);
  EXPECT_EQ(calls["sequence-parallel embedding gradient: gather"].first, M);
  // Ring all-gather / reduce-scatter of a [BT, C] fp32 buffer: each rank sends (tp-1)/tp of it.
  // 8 per layer and micro-batch in the blocks, 4 per micro-batch around the embedding and head:
  // the bytes of the 2 x (2L + 2) all-reduces TP would make, 2 (tp-1)/tp each.
  EXPECT_EQ(sp_bytes, M * (8 * L + 4) * BTC * 4 * 2 / 3);
}

}  // namespace
}  // namespace llama4d
