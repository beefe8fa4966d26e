// The simulated clock on a real training step: every unit's span carries exactly the FLOPs of
// its matrix products, written out here from the model's shapes (not from the ops' own counting),
// one span per unit per micro-batch and pass, and the top-level spans tile each rank's clock.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "backends/virtual/virtual_cluster.h"
#include "core/parallel/parallel_trainer.h"
#include "tests/parallel/parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

struct UnitFlops {
  double forward = 0, backward = 0, recompute = 0;
};

// Per micro-batch of B rows x T tokens on one device. 2 FLOPs per multiply-add; the backward of
// a product computes two products of the same size (input and weight gradients). Attention scores
// the T(T+1)/2 causal (query, key) pairs per head: q·k and p·v forward (4·hd per pair); backward
// the scores again, dv, dp, dq and dk (10·hd per pair).
std::map<std::string, UnitFlops> expected_flops(const LlamaConfig& c, int64_t B, int64_t T, bool recompute) {
  const double BT = double(B * T), C = double(c.hidden_size), I = double(c.intermediate_size);
  const double qd = double(c.num_attention_heads * c.head_dim), kvd = double(c.num_key_value_heads * c.head_dim);
  const double pairs = double(T * (T + 1) / 2);
  const double proj = 2 * BT * C * (qd + 2 * kvd) + 2 * BT * qd * C + 2 * BT * C * I * 2;  // q,k,v, o, gate, up
  const double down = 2 * BT * I * C;
  const double attn = 4.0 * double(c.head_dim) * double(B * c.num_attention_heads) * pairs;
  std::map<std::string, UnitFlops> f;
  f["embedding"] = {};
  for (int l = 0; l < c.num_hidden_layers; ++l)
    f["layer " + std::to_string(l)] = {proj + down + attn, 2 * (proj + down) + 2.5 * attn,
                                       recompute ? proj + attn : 0};  // the recompute stops before down_proj
  const double head = 2 * BT * C * double(c.vocab_size);
  f["head"] = {head, 2 * head, 0};
  return f;
}

// Self time of event i: its duration minus its direct children's (the next depth, inside it).
double self_us(const std::vector<TraceEvent>& ev, size_t i) {
  const TraceEvent& e = ev[i];
  double t = e.sim_end_us - e.sim_start_us;
  for (const TraceEvent& c : ev)
    if (c.lane == TraceLane::compute && c.depth == e.depth + 1 && c.sim_start_us >= e.sim_start_us &&
        c.sim_end_us <= e.sim_end_us && &c != &e)
      t -= c.sim_end_us - c.sim_start_us;
  return t;
}

void check_step(const ParallelPlan& plan) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const TrainOptions opt = test::options(1, 6);  // 24 rows over dp=2: 2 micro-batches of 6 x 16 tokens
  VirtualClusterOptions vo;
  vo.ranks = plan.world_size();
  vo.cluster.gpu_tflops = 50;
  VirtualCluster cluster(vo);
  test::train_steps(cluster, cfg, opt, plan, 1);
  const auto expected = expected_flops(cfg, 6, 16, plan.ac.kind != Checkpointing::Kind::none);
  const double per_us = 50e6;  // FLOPs per microsecond at 50 TFLOP/s
  for (int r = 0; r < plan.world_size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const RankTrace& trace = cluster.accounting(r).trace;
    const std::vector<TraceEvent> ev = trace.events();
    std::map<std::string, int> spans;
    double total_flops = 0, top_level = 0;
    for (size_t i = 0; i < ev.size(); ++i) {
      const TraceEvent& e = ev[i];
      if (e.lane == TraceLane::compute && e.depth == 0) top_level += e.sim_end_us - e.sim_start_us;
      if (e.category != TraceCategory::compute) continue;
      total_flops += e.flops;
      const size_t space = e.name.find(' ');
      const std::string pass = e.name.substr(0, space), unit = e.name.substr(space + 1);
      ASSERT_TRUE(expected.count(unit)) << e.name;
      const UnitFlops& u = expected.at(unit);
      const double want = pass == "forward" ? u.forward : pass == "backward" ? u.backward : u.recompute;
      ASSERT_TRUE(pass == "forward" || pass == "backward" || pass == "recompute") << e.name;
      EXPECT_EQ(e.flops, want) << e.name;
      EXPECT_NEAR(self_us(ev, i), want / per_us, 1e-9 * (1 + want / per_us)) << e.name;
      ++spans[e.name];
    }
    // One span per unit, pass and micro-batch.
    for (const auto& [unit, f] : expected) {
      EXPECT_EQ(spans["forward " + unit], 2) << unit;
      EXPECT_EQ(spans["backward " + unit], 2) << unit;
      if (f.recompute > 0) {
        EXPECT_EQ(spans["recompute " + unit], 2) << unit;
      }
    }
    const TimelineTotals t = trace.totals();
    EXPECT_EQ(t.flops, total_flops);  // nothing charged outside the units
    EXPECT_NEAR(t.compute_us, total_flops / per_us, 1e-9 * t.compute_us);
    EXPECT_NEAR(top_level, t.clock_us, 1e-9 * t.clock_us);
    EXPECT_NEAR(t.clock_us, t.compute_us + t.wait_us, 1e-9 * t.clock_us);
  }
}

// The clock must not follow this laptop's threads: ZeRO-2 frees a reduced gradient when a poll
// finds its reduce-scatter done, which depends on timing, but every rank's simulated step is the
// same in every run.
TEST(SimulatedClock, ZeroStepTimeDoesNotDependOnThreadTiming) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  const TrainOptions opt = test::options(2, 3);  // 24 rows over dp=4: 2 micro-batches of 3
  const ParallelPlan plan = test::dp_plan(4, 1, ZeroStage::zero2);
  std::vector<std::vector<double>> clocks;
  for (int run = 0; run < 4; ++run) {
    VirtualClusterOptions vo;
    vo.ranks = plan.world_size();
    VirtualCluster cluster(vo);
    test::train_steps(cluster, cfg, opt, plan, 2);
    std::vector<double> c;
    for (int r = 0; r < plan.world_size(); ++r) c.push_back(cluster.accounting(r).trace.totals().clock_us);
    clocks.push_back(c);
  }
  for (size_t run = 1; run < clocks.size(); ++run) EXPECT_EQ(clocks[run], clocks[0]) << "run " << run;
}
LLAMA4D_TIER(SimulatedClock, ZeroStepTimeDoesNotDependOnThreadTiming, sanitizer);  // threads racing the simulated clock

TEST(SimulatedClock, UnitSpansCarryTheirFlopsDataParallel) { check_step(test::dp_plan(2, 1, ZeroStage::none)); }

TEST(SimulatedClock, UnitSpansCarryTheirFlopsZero3WithRecompute) {
  ParallelPlan plan = test::dp_plan(2, 1, ZeroStage::zero3);
  plan.ac = Checkpointing::parse("full", 2);
  check_step(plan);
}

}  // namespace
}  // namespace llama4d
