// The planner's memory per rank (formulas, core/plan/memory.cpp) against what the virtual
// cluster's allocator measured for the same plan (every Buffer a rank holds is charged to its
// tracker): exactly, category by category, on every rank.
#include <gtest/gtest.h>

#include "core/plan/memory.h"
#include "tests/parallel/parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

struct MemoryCase {
  const char* name;
  const char* mesh;
  ZeroStage zero;
  const char* ac = "none";
  bool keep_params = false;
  int layers = 4;
  bool sp = true;
  const char* schedule = "1f1b";
  int64_t micro_batch_size = 0;
  int chunks = 1;
  const char* cp_algo = "allgather";
  bool doc_mask = false;
  const char* preset = "tiny";
  bool reduce_once = false;
  bool tied = false;  // the LM head reads the embedding (tie_word_embeddings)
};


class PlannerMemory : public testing::TestWithParam<MemoryCase> {};

// One training step on the virtual cluster (not the harness, whose gathers for the comparison
// allocate too), then every rank's peaks.
TEST_P(PlannerMemory, EqualsTheAllocatorOnEveryRank) {
  const MemoryCase& c = GetParam();
  StepShape s;
  s.model = LlamaConfig::preset(c.preset);
  s.model.num_hidden_layers = c.layers;
  s.model.tie_word_embeddings = c.tied;
  s.plan = ParallelPlan::parse(c.mesh);
  s.plan.zero = c.zero;
  s.plan.reshard_after_forward = !c.keep_params;
  s.plan.reduce_once = c.reduce_once;
  s.plan.ac = Checkpointing::parse(c.ac, c.layers);
  s.plan.sequence_parallel = c.sp;
  s.plan.schedule = parse_pipeline_schedule(c.schedule);
  s.plan.pp_chunks = c.chunks;
  s.plan.cp_algo = parse_context_algo(c.cp_algo);
  TrainOptions opt = test::options(1, c.micro_batch_size);
  opt.seq_len = s.seq_len = 16;
  opt.doc_mask = s.doc_mask = c.doc_mask;
  s.batch_size = opt.batch_size;
  s.micro_batch_size = opt.micro_batch_size;
  VirtualClusterOptions vo;
  vo.ranks = s.plan.world_size();
  VirtualCluster cluster(vo);
  test::train_steps(cluster, s.model, opt, s.plan, 1, c.doc_mask ? test::document_corpus() : test::corpus());

  const std::vector<MemoryPrediction> predicted = predict_memory(s);
  ASSERT_EQ(int(predicted.size()), s.plan.world_size());
  for (int w = 0; w < s.plan.world_size(); ++w) {
    SCOPED_TRACE("rank " + std::to_string(w));
    const MemoryPrediction& p = predicted[size_t(w)];
    const RankMemory m = memory_peaks(cluster.accounting(w).memory);
    EXPECT_EQ(m.params, p.params);
    EXPECT_EQ(m.optimizer, p.optimizer);
    EXPECT_GE(m.grads, p.grads_min);
    EXPECT_LE(m.grads, p.grads);
    EXPECT_GE(m.comm_buffers, p.comm_buffers_min);
    EXPECT_LE(m.comm_buffers, p.comm_buffers);
    EXPECT_EQ(m.activations, p.activations);
    EXPECT_GE(m.scratch, p.scratch_min);
    EXPECT_LE(m.scratch, p.scratch);
    EXPECT_EQ(m.other, p.other);
    // The ranges come from eager sends only: a pipeline's (gradients, activations) and a ring's.
    if (s.plan.size("pp") == 1) {
      EXPECT_EQ(p.scratch_min, p.scratch);
    }
    if (s.plan.size("pp") == 1 && s.plan.cp_algo != ContextAlgo::ring) {
      EXPECT_EQ(p.comm_buffers_min, p.comm_buffers);
    }
  }
}

const MemoryCase kMemoryCases[] = {
    {"dp2", "dp=2", ZeroStage::none},
    {"dp4_zero1", "dp=4", ZeroStage::zero1},
    {"dp4_zero2", "dp=4", ZeroStage::zero2},
    {"dp4_zero3", "dp=4", ZeroStage::zero3},
    {"dp2_zero3_keep_params", "dp=2", ZeroStage::zero3, "none", true},
    {"hsdp_2x2_zero3", "dp_shard=2,dp_replicate=2", ZeroStage::zero3},
    {"tp2_dp2_zero1", "tp=2,dp=2", ZeroStage::zero1},
    {"tp4_zero3", "tp=4,dp=2", ZeroStage::zero3},
    {"pp2_dp2_zero1", "pp=2,dp=2", ZeroStage::zero1},
    {"pp2_dp2_zero3", "pp=2,dp=2", ZeroStage::zero3},
    {"cp2_dp2_zero3", "cp=2,dp=2", ZeroStage::zero3},
    {"tp2_cp2_pp2_dp2_zero3", "tp=2,cp=2,pp=2,dp=2", ZeroStage::zero3},
    {"dp2_selective", "dp=2", ZeroStage::zero2, "selective"},
    {"dp2_full", "dp=2", ZeroStage::zero1, "full"},
    {"cp2_selective", "cp=2", ZeroStage::none, "selective"},
    {"cp4_ring_dp2_zero2", "cp=4,dp=2", ZeroStage::zero2, "none", false, 4, true, "1f1b", 0, 1, "ring"},
    {"tp2", "tp=2", ZeroStage::none},
    {"tp2_nosp", "tp=2", ZeroStage::none, "none", false, 4, false},
    {"tp2_selective", "tp=2", ZeroStage::none, "selective"},
    {"tp2_full", "tp=2", ZeroStage::none, "full"},
    {"tp4", "tp=4", ZeroStage::none},
    {"pp2", "pp=2", ZeroStage::none},
    {"pp2_m4", "pp=2", ZeroStage::none, "none", false, 4, true, "1f1b", 6},
    {"pp4_m6", "pp=4", ZeroStage::none, "none", false, 4, true, "1f1b", 4},
    {"pp2_gpipe_m4", "pp=2", ZeroStage::none, "none", false, 4, true, "gpipe", 6},
    {"pp2_zb_m4", "pp=2", ZeroStage::none, "none", false, 4, true, "zb-h1", 6},
    {"pp2_inter_m4", "pp=2", ZeroStage::none, "none", false, 4, true, "interleaved", 6, 2},
    {"pp2_inter_dp2_zero3_keep_params", "pp=2,dp=2", ZeroStage::zero3, "none", true, 4, true, "interleaved", 6, 2},
    {"pp2_selective_m4", "pp=2", ZeroStage::none, "selective", false, 4, true, "1f1b", 6},
    {"pp2_full_m4", "pp=2", ZeroStage::none, "full", false, 4, true, "1f1b", 6},
    {"pp2_every2_m4", "pp=2", ZeroStage::none, "every:2", false, 6, true, "1f1b", 6},
    {"tp4_pp2_replicated_kv", "tp=4,pp=2", ZeroStage::none, "none", false, 4, true, "1f1b", 6},
    // small's 6 query heads over tp = 3: rank 1's two query heads read different key/value
    // heads, so it holds both (twice the k and v of ranks 0 and 2).
    {"small_tp3_dp2_zero3", "tp=3,dp=2", ZeroStage::zero3, "none", false, 2, true, "1f1b", 0, 1, "allgather", false,
     "small"},
    {"tp4_pp2_nosp", "tp=4,pp=2", ZeroStage::none, "none", false, 4, false, "1f1b", 6},
    {"tp4_pp2_zb_nosp", "tp=4,pp=2", ZeroStage::none, "none", false, 4, false, "zb-h1", 6},
    {"cp2_pp2_allgather", "cp=2,pp=2", ZeroStage::none, "selective", false, 4, true, "1f1b", 6},
    {"cp2_pp2_ring", "cp=2,pp=2", ZeroStage::none, "none", false, 4, true, "1f1b", 6, 1, "ring"},
    {"cp4_pp2_ring_zb", "cp=4,pp=2", ZeroStage::none, "selective", false, 4, true, "zb-h1", 6, 1, "ring"},
    {"doc_tp2_cp2_pp2_zb", "tp=2,cp=2,pp=2", ZeroStage::none, "selective", false, 4, true, "zb-h1", 6, 1, "ring", true},
    {"doc_dp2", "dp=2", ZeroStage::none, "none", false, 4, true, "1f1b", 0, 1, "allgather", true},
    {"tp2_cp2_pp2_full", "tp=2,cp=2,pp=2", ZeroStage::none, "full", false, 4, true, "interleaved", 6, 2, "ring"},
    // --reduce-once: every unit's full gradient stays to the last micro-batch (3 per rank here).
    {"dp2_zero2_reduce_once_m3", "dp=2", ZeroStage::zero2, "none", false, 4, true, "1f1b", 2, 1, "allgather", false,
     "tiny", true},
    {"pp2_zb_dp2_zero2_reduce_once", "pp=2,dp=2", ZeroStage::zero2, "none", false, 4, true, "zb-h1", 6, 1, "allgather",
     false, "tiny", true},
    {"pp2_inter_dp2_zero3_keep_reduce_once", "pp=2,dp=2", ZeroStage::zero3, "none", true, 4, true, "interleaved", 6, 2,
     "allgather", false, "tiny", true},
    // Tied embeddings: the head's unit is the final norm alone (C elements), the LM head reading
    // the embedding's rows; one unit fewer to shard, gather and hold gradients for.
    {.name = "tied_dp2_zero3", .mesh = "dp=2", .zero = ZeroStage::zero3, .tied = true},
    {.name = "tied_tp2_dp2_zero1", .mesh = "tp=2,dp=2", .zero = ZeroStage::zero1, .tied = true},
};
// Tiers: the sanitizer presets keep a case per strategy and composition; the release preset runs
// every case.
LLAMA4D_INSTANTIATE(Plans, PlannerMemory, kMemoryCases, full,
                    {{"cp2_pp2_ring", test::Tier::quick},
                     {"tied_dp2_zero3", test::Tier::quick},
                     {"cp4_ring_dp2_zero2", test::Tier::quick},
                     {"doc_tp2_cp2_pp2_zb", test::Tier::quick},
                     {"dp2_selective", test::Tier::quick},
                     {"pp2_inter_dp2_zero3_keep_params", test::Tier::quick},
                     {"pp2_inter_dp2_zero3_keep_reduce_once", test::Tier::quick},
                     {"pp2_zb_m4", test::Tier::quick},
                     {"tp2_cp2_pp2_dp2_zero3", test::Tier::quick},
                     {"tp4_pp2_nosp", test::Tier::quick}});

}  // namespace
}  // namespace llama4d
