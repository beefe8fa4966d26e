// Pipeline parallelism on virtual GPUs: every schedule trains bitwise like one device
// accumulating the same micro-batches in the same order (alone, with data parallelism under
// DP and ZeRO 1/2/3, with activation checkpointing), its timeline on the simulated clock has
// exactly the formula's bubble on uniform stages, each rank allocates only its stages, holds
// as many micro-batches as the schedule says, and sends 2 m b s h elements per boundary; a
// wrong schedule fails naming the rank and the action.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "core/parallel/pipeline_parallel.h"
#include "core/parallel/pipeline_picture.h"
#include "parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

using Kind = PipelineScheduleKind;

// `small`'s depth (6 layers) at tiny's width, so the matrix of schedules stays fast.
LlamaConfig six_layers() {
  LlamaConfig c = LlamaConfig::preset("tiny");
  c.num_hidden_layers = 6;
  c.max_position_embeddings = 64;
  return c;
}

struct PpCase {
  std::string name;
  Kind kind;
  int pp, m, chunks = 1;
  const char* data = "";  // extra mesh dims, e.g. "dp=2"
  ZeroStage zero = ZeroStage::none;
  const char* ac = "none";
  bool keep_params = false;
  bool tied = false;  // tie_word_embeddings: the first and last stage each hold the embedding
};

EquivalenceOptions options_for(const PpCase& c) {
  EquivalenceOptions o;
  o.model = six_layers();
  o.model.tie_word_embeddings = c.tied;
  o.plan = ParallelPlan::parse("pp=" + std::to_string(c.pp) + (*c.data ? "," : "") + c.data);
  o.plan.schedule = c.kind;
  o.plan.pp_chunks = c.chunks;
  o.plan.zero = c.zero;
  o.plan.reshard_after_forward = !c.keep_params;
  o.plan.ac = Checkpointing::parse(c.ac, int(o.model.num_hidden_layers));
  o.train = test::options(3, 1);
  o.train.batch_size = c.m * o.plan.dp();  // one row per micro-batch: m micro-batches per data rank
  return o;
}

class PipelineEquivalence : public testing::TestWithParam<PpCase> {};

// fp32, ordered reductions: losses, gradient norms, every gradient and parameter after 3 AdamW
// steps (clipping active) bitwise equal to the replay, on every rank.
TEST_P(PipelineEquivalence, BitwiseEqualToOneDevice) {
  const EquivalenceOptions o = options_for(GetParam());
  const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(o.plan.world_size()));
  EXPECT_TRUE(r.ok) << r.table();
  EXPECT_TRUE(r.bitwise) << r.table();
  EXPECT_EQ(int(r.per_rank.size()), o.plan.world_size());
  EXPECT_EQ(r.micro_batches_per_rank, GetParam().m);
}

std::vector<PpCase> schedule_matrix() {
  std::vector<PpCase> out;
  for (int p : {2, 3, 4})
    for (int m : {1, p, 2 * p, 2 * p + 1})
      for (Kind k : {Kind::gpipe, Kind::one_f_one_b, Kind::zb_h1})
        out.push_back({std::string(pipeline_schedule_name(k)) + "_pp" + std::to_string(p) + "_m" + std::to_string(m), k, p, m});
  for (int p : {2, 3})
    for (int m : {p, 2 * p}) out.push_back({"interleaved_pp" + std::to_string(p) + "_v2_m" + std::to_string(m), Kind::interleaved, p, m, 2});
  for (auto& c : out)
    for (char& ch : c.name)
      if (ch == '-') ch = '_';
  return out;
}
// Tiers: release only; the Composed cases run every schedule's code under the sanitizers.
LLAMA4D_INSTANTIATE(Schedules, PipelineEquivalence, schedule_matrix(), full, {});

// The real `small` preset (6 layers, 6 query and 2 key/value heads, width 288): 1F1B on 4 stages
// (1, 2, 1, 2 layers), Llama 3's 1, 2, 2, 1, interleaved on 3 ranks x 2 chunks, ZB-H1 on 3.
TEST(PipelineEquivalence, SmallPresetBitwise) {
  struct Case {
    Kind kind;
    int pp, m, chunks;
    std::vector<int> layers;
  };
  for (const Case& c : {Case{Kind::one_f_one_b, 4, 8, 1, {}}, Case{Kind::one_f_one_b, 4, 5, 1, {1, 2, 2, 1}},
                        Case{Kind::interleaved, 3, 6, 2, {}}, Case{Kind::zb_h1, 3, 4, 1, {}}}) {
    EquivalenceOptions o;
    o.model = LlamaConfig::preset("small");
    o.plan = ParallelPlan::parse("pp=" + std::to_string(c.pp));
    o.plan.schedule = c.kind;
    o.plan.pp_chunks = c.chunks;
    o.plan.pp_layers = c.layers;
    o.train = test::options(3, 1);
    o.train.batch_size = c.m;
    const EquivalenceReport r = verify_plan<float>(o, test::corpus(), test::virtual_launcher(c.pp));
    EXPECT_TRUE(r.ok && r.bitwise) << o.plan.describe() << "\n" << r.table();
  }
}
// Small's shape on 4 stages: the tiny cases run the same runner.
LLAMA4D_TIER(PipelineEquivalence, SmallPresetBitwise, full);

const PpCase kComposed[] = {
    {"1f1b_pp2_dp2_ddp", Kind::one_f_one_b, 2, 4, 1, "dp=2", ZeroStage::none},
    {"1f1b_pp2_dp2_zero1", Kind::one_f_one_b, 2, 4, 1, "dp=2", ZeroStage::zero1},
    {"zb_h1_pp2_dp2_zero2", Kind::zb_h1, 2, 3, 1, "dp=2", ZeroStage::zero2},
    {"1f1b_pp3_dp2_zero3", Kind::one_f_one_b, 3, 4, 1, "dp=2", ZeroStage::zero3},
    {"1f1b_pp2_dp2_zero3_keep_params", Kind::one_f_one_b, 2, 4, 1, "dp=2", ZeroStage::zero3, "none", true},
    {"interleaved_pp2_dp2_zero3_selective", Kind::interleaved, 2, 4, 2, "dp=2", ZeroStage::zero3, "selective"},
    {"gpipe_pp2_full_ac", Kind::gpipe, 2, 3, 1, "", ZeroStage::none, "full"},
    {"zb_h1_pp3_every2_ac", Kind::zb_h1, 3, 4, 1, "", ZeroStage::none, "every:2"},
    {"1f1b_pp2_hsdp_2x2_zero3", Kind::one_f_one_b, 2, 2, 1, "dp_shard=2,dp_replicate=2", ZeroStage::zero3},
    // Tied embeddings: the last stage's copy of the embedding (its head's weights) and the first
    // stage's sum their gradients after data parallelism; both copies take the same step.
    {"tied_1f1b_pp3", Kind::one_f_one_b, 3, 4, 1, "", ZeroStage::none, "none", false, true},
    {"tied_gpipe_pp2_dp2_zero1", Kind::gpipe, 2, 3, 1, "dp=2", ZeroStage::zero1, "none", false, true},
    {"tied_zb_h1_pp2_dp2_zero2", Kind::zb_h1, 2, 3, 1, "dp=2", ZeroStage::zero2, "none", false, true},
    {"tied_interleaved_pp2_dp2_zero3", Kind::interleaved, 2, 4, 2, "dp=2", ZeroStage::zero3, "selective", false, true},
    {"tied_1f1b_pp2_dp2_zero3_keep_params", Kind::one_f_one_b, 2, 2, 1, "dp=2", ZeroStage::zero3, "none", true, true},
};
// Tiers: the sanitizer presets run GPipe with full checkpointing, interleaving under ZeRO-3 and a
// tied zero-bubble pipeline (1F1B runs in the 4D case); the release preset runs every case.
LLAMA4D_INSTANTIATE(Composed, PipelineEquivalence, kComposed, full,
                    {{"gpipe_pp2_full_ac", test::Tier::sanitizer},
                     {"interleaved_pp2_dp2_zero3_selective", test::Tier::sanitizer},
                     {"tied_zb_h1_pp2_dp2_zero2", test::Tier::sanitizer}});

// With tensor parallelism inside each stage (and sequence parallelism, so a stage boundary
// carries each rank's 1/tp of the rows), the pipeline adds no rounding of its own: losses,
// gradient norms and every step's errors against one device are exactly those of the same plan
// without pp. (TP alone is bitwise against its rank-order replay: tensor_parallel_test.)
TEST(PipelineEquivalence, WithTensorParallelismAddsNothingToTp) {
  auto run = [](const char* mesh) {
    EquivalenceOptions o;
    o.model = six_layers();
    o.plan = ParallelPlan::parse(mesh);
    o.plan.schedule = Kind::one_f_one_b;
    o.plan.zero = o.plan.dp() > 1 ? ZeroStage::zero3 : ZeroStage::none;
    o.train = test::options(3, 1);
    o.train.batch_size = 3 * o.plan.dp();
    return verify_plan<double>(o, test::corpus(), test::virtual_launcher(o.plan.world_size()));
  };
  for (const auto& [with_pp, without] : {std::pair{"tp=2,pp=2", "tp=2"}, {"tp=2,pp=3,dp=2", "tp=2,dp=2"}}) {
    const EquivalenceReport r = run(with_pp), ref = run(without);
    EXPECT_TRUE(r.tokens_parallel == ref.tokens_parallel && !r.losses_parallel.empty()) << with_pp;
    EXPECT_EQ(r.plain_max_rel_err, ref.plain_max_rel_err) << with_pp;
    EXPECT_EQ(r.losses_parallel, ref.losses_parallel) << with_pp;
    EXPECT_EQ(r.grad_norms_parallel, ref.grad_norms_parallel) << with_pp;
    ASSERT_EQ(r.errors_per_step.size(), ref.errors_per_step.size());
    for (size_t s = 0; s < r.errors_per_step.size(); ++s) {
      const StepErrors &a = r.errors_per_step[s], &b = ref.errors_per_step[s];
      EXPECT_EQ(a.grad_tensor, b.grad_tensor) << with_pp << " step " << s + 1;
      EXPECT_EQ(a.param_tensor, b.param_tensor) << with_pp << " step " << s + 1;
    }
  }
}
// Tp x pp also runs in the 4D sanitizer case.
LLAMA4D_TIER(PipelineEquivalence, WithTensorParallelismAddsNothingToTp, full);

// The runtime's own timeline on the simulated clock, with uniform stages (each action a fixed
// modelled time) and free transfers, has the bubble fraction of the formula, to rounding.
TEST(PipelineTimeline, BubbleOfEveryScheduleEqualsTheFormula) {
  const StageCosts costs{10, 15, 5};  // microseconds: I = 1.5 F, W = F / 2
  for (Kind k : {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved, Kind::zb_h1})
    for (int p : {2, 3, 4})
      for (int m : {p, 2 * p, 2 * p + 1}) {
        const int v = k == Kind::interleaved ? 2 : 1;
        if (k == Kind::interleaved && m % p != 0) continue;
        const PipelineSchedule s = make_pipeline_schedule(k, p, m, v);
        VirtualClusterOptions vo;
        vo.ranks = p;
        VirtualCluster cluster(vo);
        cluster.run([&](ProcessGroup& world) { run_modelled_pipeline(world, s, costs); });
        const PipelinePicture pic = pipeline_picture(cluster.traces(), s.name());
        double busy = 0;
        for (double b : pic.busy_us()) busy += b;
        const double measured = 1.0 - busy / (double(p) * pic.end_us);
        EXPECT_NEAR(measured, pipeline_bubble_formula(k, p, m, v, costs), 1e-12) << s.name();
        EXPECT_NEAR(pic.end_us, simulate_pipeline_schedule(s, costs).makespan, 1e-9) << s.name();
        EXPECT_EQ(int(pic.boxes.size()), p * m * v * (k == Kind::zb_h1 ? 3 : 2)) << s.name();
      }
}

// A list that waits for a message no rank sends fails, naming the rank and the action, instead
// of hanging: within the group timeout, or at once when the rank that should send has finished.
TEST(PipelineTimeline, AWrongScheduleFailsNamingRankAndAction) {
  PipelineSchedule s = make_pipeline_schedule(Kind::gpipe, 2, 2);
  s.actions[1].pop_back();  // rank 1 forgets to send micro-batch 1's gradient back
  VirtualClusterOptions vo;
  vo.ranks = 2;
  vo.timeout = std::chrono::milliseconds(2000);
  VirtualCluster cluster(vo);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    cluster.run([&](ProcessGroup& world) { run_modelled_pipeline(world, s, StageCosts{}); });
    FAIL() << "the broken schedule ran to the end";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("pipeline: recv gradient 1 from rank 1"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 0"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1900));
}

// One training step of a pipeline plan; every rank's memory peaks and the run's traffic.
struct StepRecord {
  std::vector<RankMemory> memory;
  std::vector<int> peak_in_flight;
  std::vector<TrafficRecord> traffic;
  std::vector<int64_t> params_held;
};

StepRecord one_step(const LlamaConfig& cfg, Kind k, int p, int m, int chunks = 1) {
  ParallelPlan plan = ParallelPlan::parse("pp=" + std::to_string(p));
  plan.schedule = k;
  plan.pp_chunks = chunks;
  TrainOptions opt = test::options(1, 1);
  opt.batch_size = m;
  VirtualClusterOptions vo;
  vo.ranks = p;
  VirtualCluster cluster(vo);
  StepRecord rec;
  rec.memory.resize(size_t(p));
  rec.peak_in_flight.resize(size_t(p));
  rec.params_held.resize(size_t(p));
  cluster.run([&](ProcessGroup& world) {
    ops::set_backend_threads(1);
    Llama<float> model = plan.make_model<float>(cfg, world.memory(), world.rank());
    ParallelTrainer<float> trainer(world, model, test::corpus(), opt, plan);
    trainer.step();
    rec.memory[size_t(world.rank())] = trainer.strategy().peak_memory();
    rec.peak_in_flight[size_t(world.rank())] = trainer.pipeline()->peak_in_flight();
    rec.params_held[size_t(world.rank())] = model.num_params();
  });
  rec.traffic = cluster.traffic();
  return rec;
}

// Each rank allocates the weights, gradients and AdamW moments of its stages only: together
// exactly one device's.
TEST(PipelineMemory, EachRankAllocatesOnlyItsStages) {
  const LlamaConfig cfg = six_layers();
  const StepRecord r = one_step(cfg, Kind::one_f_one_b, 3, 3);
  const int64_t whole = Llama<float>(cfg).num_params();
  int64_t sum = 0;
  for (int rank = 0; rank < 3; ++rank) {
    const int64_t n = r.params_held[size_t(rank)];
    sum += n;
    EXPECT_EQ(r.memory[size_t(rank)].params, 4 * n) << "rank " << rank;
    EXPECT_EQ(r.memory[size_t(rank)].grads, 4 * n) << "rank " << rank;
    EXPECT_EQ(r.memory[size_t(rank)].optimizer, 8 * n) << "rank " << rank;
    EXPECT_LT(n, whole);
  }
  EXPECT_EQ(sum, whole);
}

// The peak activation memory of a stage is its peak number of micro-batches in flight times
// one micro-batch's activations (measured with m = 1): GPipe holds all m, 1F1B at most p - r.
TEST(PipelineMemory, ActivationPeaksFollowTheMicroBatchesInFlight) {
  const LlamaConfig cfg = six_layers();
  const int p = 3, m = 6;
  const StepRecord one = one_step(cfg, Kind::gpipe, p, 1);
  for (Kind k : {Kind::gpipe, Kind::one_f_one_b, Kind::zb_h1}) {
    const StepRecord r = one_step(cfg, k, p, m);
    for (int rank = 0; rank < p; ++rank) {
      const int expect = k == Kind::gpipe ? m : k == Kind::one_f_one_b ? std::min(m, p - rank) : std::min(m, p);
      EXPECT_EQ(r.peak_in_flight[size_t(rank)], expect) << pipeline_schedule_name(k) << " rank " << rank;
      if (k == Kind::zb_h1) continue;  // a micro-batch between I and W holds less than a whole one
      EXPECT_EQ(r.memory[size_t(rank)].activations, expect * one.memory[size_t(rank)].activations)
          << pipeline_schedule_name(k) << " rank " << rank;
    }
  }
}

// Every stage boundary carries 2 m b s h elements per step: m activations forward, m gradients back.
TEST(PipelineTraffic, TwoMbshElementsPerBoundary) {
  const LlamaConfig cfg = six_layers();
  const int p = 3, m = 4;
  const StepRecord r = one_step(cfg, Kind::one_f_one_b, p, m);
  std::map<int, int64_t> sent;  // world rank -> bytes sent point to point
  for (const TrafficRecord& t : r.traffic)
    if (t.op == "send") sent[t.world_rank] += t.bytes_sent;
  const int64_t bsh = 1 * 16 * cfg.hidden_size, f32 = 4;  // one row of 16 tokens per micro-batch
  EXPECT_EQ(sent[0], m * bsh * f32);           // activations to rank 1
  EXPECT_EQ(sent[1], 2 * m * bsh * f32);       // activations to 2, gradients to 0
  EXPECT_EQ(sent[2], m * bsh * f32);           // gradients to 1
  EXPECT_EQ(sent[0] + sent[1] + sent[2], (p - 1) * 2 * m * bsh * f32);
}

TEST(PipelinePlan, BadPlansNameTheConstraint) {
  const LlamaConfig cfg = six_layers();
  auto message = [&](const std::string& mesh, Kind k, int chunks, int m, std::vector<int> layers = {}) -> std::string {
    try {
      ParallelPlan p = ParallelPlan::parse(mesh);
      p.schedule = k;
      p.pp_chunks = chunks;
      p.pp_layers = layers;
      p.validate();
      p.check_model(cfg, m);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message("pp=4", Kind::interleaved, 2, 4).find("every stage needs at least one layer"), std::string::npos);
  EXPECT_NE(message("pp=2", Kind::interleaved, 2, 3).find("not a multiple of 2"), std::string::npos);
  EXPECT_NE(message("pp=2", Kind::one_f_one_b, 2, 4).find("needs --schedule interleaved"), std::string::npos);
  EXPECT_NE(message("pp=3", Kind::one_f_one_b, 1, 4, {1, 2, 2}).find("adds up to 5 layers"), std::string::npos);
}

}  // namespace
}  // namespace llama4d
