// Pipeline schedules as data: the lists each schedule gives, their replay on a uniform pipeline
// against the bubble formulas (exactly), the peak number of micro-batches a rank holds, the
// messages per stage boundary, and malformed or deadlocking lists named by rank and action.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "core/parallel/pipeline_layout.h"
#include "core/parallel/pipeline_schedule.h"

namespace llama4d {
namespace {

using Kind = PipelineScheduleKind;
using Op = PipelineAction::Op;

// Written out by hand from the definitions in pipeline_schedule.h (compute actions only).
TEST(PipelineSchedule, ListsForFourRanks) {
  EXPECT_EQ(make_pipeline_schedule(Kind::gpipe, 2, 3).describe(),
            "rank 0: F0 F1 F2 B0 B1 B2\n"
            "rank 1: F0 F1 F2 B0 B1 B2\n");
  EXPECT_EQ(make_pipeline_schedule(Kind::one_f_one_b, 4, 5).describe(),
            "rank 0: F0 F1 F2 F3 B0 F4 B1 B2 B3 B4\n"
            "rank 1: F0 F1 F2 B0 F3 B1 F4 B2 B3 B4\n"
            "rank 2: F0 F1 B0 F2 B1 F3 B2 F4 B3 B4\n"
            "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4\n");
  // ZB-H1: rank r runs W k after I k + r, the last r W at the end.
  EXPECT_EQ(make_pipeline_schedule(Kind::zb_h1, 3, 4).describe(),
            "rank 0: F0 F1 F2 I0 W0 F3 I1 W1 I2 W2 I3 W3\n"
            "rank 1: F0 F1 I0 F2 I1 W0 F3 I2 W1 I3 W2 W3\n"
            "rank 2: F0 I0 F1 I1 F2 I2 W0 F3 I3 W1 W2 W3\n");
  // Interleaved, p = 2, v = 2, m = 4: forwards by groups of p through chunk 0 then chunk 1,
  // warm-up 2 (p - r - 1) + (v - 1) p.
  EXPECT_EQ(make_pipeline_schedule(Kind::interleaved, 2, 4, 2).describe(),
            "rank 0: F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0\n"
            "rank 1: F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0\n");
}

TEST(PipelineSchedule, TransfersSurroundEachComputeAction) {
  const PipelineSchedule s = make_pipeline_schedule(Kind::one_f_one_b, 3, 2);
  // The middle rank receives before and sends after every forward and backward.
  std::vector<std::string> got;
  for (const PipelineAction& a : s.actions[1]) got.push_back(a.describe(false));
  EXPECT_EQ(got, (std::vector<std::string>{"recv activation 0 from rank 0", "F0", "send activation 0 to rank 2",
                                           "recv activation 1 from rank 0", "F1", "send activation 1 to rank 2",
                                           "recv gradient 0 from rank 2", "B0", "send gradient 0 to rank 0",
                                           "recv gradient 1 from rank 2", "B1", "send gradient 1 to rank 0"}));
  // The sender and the receiver of a message compute the same tag; directions differ.
  const PipelineAction send{Op::send_activation, 1, 0, 2}, recv{Op::recv_activation, 1, 0, 1};
  EXPECT_EQ(s.tag(1, send), s.tag(2, recv));
  EXPECT_NE(s.tag(1, send), s.tag(1, {Op::send_gradient, 1, 0, 0}));
}

struct Costs {
  const char* name;
  StageCosts c;
};
const Costs kCosts[] = {{"F=I=W", {1, 1, 1}}, {"I=1.5F, W=F/2", {1, 1.5, 0.5}}, {"uneven", {1.3, 1.7, 0.9}},
                        {"W small", {2, 3, 1}}};

// Each schedule's replay on a uniform pipeline with free transfers has exactly the bubble its
// formula gives (pipeline_schedule.h), for every rank count and number of micro-batches tried.
TEST(PipelineSchedule, BubbleEqualsTheFormulaOnUniformStages) {
  int checked = 0;
  for (Kind k : {Kind::gpipe, Kind::one_f_one_b, Kind::interleaved, Kind::zb_h1})
    for (int p = 1; p <= 5; ++p)
      for (int m = 1; m <= 3 * p + 1; ++m)
        for (int v : {1, 2, 3}) {
          if ((k == Kind::interleaved) != (v > 1) || (k == Kind::interleaved && (m % p != 0 || p == 1))) continue;
          if (k == Kind::zb_h1 && m < p) continue;  // the formula needs m >= p (tested below)
          for (const Costs& c : kCosts) {
            const PipelineSchedule s = make_pipeline_schedule(k, p, m, v);
            const ScheduleSimulation sim = simulate_pipeline_schedule(s, c.c);
            EXPECT_NEAR(sim.bubble_fraction(), pipeline_bubble_formula(k, p, m, v, c.c), 1e-12)
                << s.name() << ", costs " << c.name;
            ++checked;
          }
        }
  EXPECT_GT(checked, 500);
}

// The textbook numbers: p = 4, m = 8: GPipe and 1F1B idle 3/11 of the step (3/8 of the ideal
// time m (F + B)); interleaving two chunks gives 3/19; ZB-H1 with F = I = W gives 3/27, a third of
// 1F1B's idle time (p - 1)(F + I + W) = 9 units.
TEST(PipelineSchedule, TextbookNumbers) {
  const StageCosts unit{1, 1, 1};
  EXPECT_DOUBLE_EQ(simulate_pipeline_schedule(make_pipeline_schedule(Kind::gpipe, 4, 8), unit).bubble_fraction(), 3.0 / 11);
  EXPECT_DOUBLE_EQ(simulate_pipeline_schedule(make_pipeline_schedule(Kind::one_f_one_b, 4, 8), unit).bubble_fraction(),
                   3.0 / 11);
  EXPECT_DOUBLE_EQ(simulate_pipeline_schedule(make_pipeline_schedule(Kind::interleaved, 4, 8, 2), unit).bubble_fraction(),
                   3.0 / 19);
  const ScheduleSimulation zb = simulate_pipeline_schedule(make_pipeline_schedule(Kind::zb_h1, 4, 8), unit);
  EXPECT_DOUBLE_EQ(zb.makespan, 8 * 3 + 3);
  const ScheduleSimulation one = simulate_pipeline_schedule(make_pipeline_schedule(Kind::one_f_one_b, 4, 8), unit);
  EXPECT_DOUBLE_EQ(one.makespan, 8 * 3 + 9);
  // With fewer micro-batches than ranks ZB-H1 cannot fill the cool-down: more than its formula.
  const ScheduleSimulation few = simulate_pipeline_schedule(make_pipeline_schedule(Kind::zb_h1, 4, 2), unit);
  EXPECT_GT(few.bubble_fraction(), pipeline_bubble_formula(Kind::zb_h1, 4, 2, 1, unit) + 0.1);
}

// Peak micro-batches (per chunk) whose activations a rank holds: GPipe all m; 1F1B min(m, p - r);
// ZB-H1 min(m, p) (its deferred W keep micro-batches; no more than 1F1B's first rank holds);
// interleaved its warm-up + 1 (all v m when m = p).
TEST(PipelineSchedule, PeakInFlightMicroBatches) {
  for (int p : {2, 3, 4})
    for (int m : {1, p, 2 * p, 2 * p + 1}) {
      const auto peak = [&](Kind k, int v = 1) {
        return simulate_pipeline_schedule(make_pipeline_schedule(k, p, m, v)).peak_in_flight;
      };
      const std::vector<int> gpipe = peak(Kind::gpipe), one = peak(Kind::one_f_one_b), zb = peak(Kind::zb_h1);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(gpipe[size_t(r)], m);
        EXPECT_EQ(one[size_t(r)], std::min(m, p - r)) << "p=" << p << " m=" << m << " rank " << r;
        EXPECT_EQ(zb[size_t(r)], std::min(m, p)) << "p=" << p << " m=" << m << " rank " << r;
      }
      if (m % p != 0) continue;
      const std::vector<int> inter = peak(Kind::interleaved, 2);
      for (int r = 0; r < p; ++r) {
        const int warmup = m == p ? 2 * m : std::min(2 * (p - r - 1) + p, 2 * m);
        EXPECT_EQ(inter[size_t(r)], std::min(2 * m, warmup + 1)) << "p=" << p << " m=" << m << " rank " << r;
      }
    }
}

// Every stage boundary carries m activations forward and m gradients back; interleaving crosses
// v p - 1 boundaries instead of p - 1.
TEST(PipelineSchedule, MessagesPerBoundary) {
  const ScheduleSimulation s = simulate_pipeline_schedule(make_pipeline_schedule(Kind::one_f_one_b, 4, 6));
  EXPECT_EQ(s.messages, (std::vector<int64_t>{6, 12, 12, 6}));
  const ScheduleSimulation i = simulate_pipeline_schedule(make_pipeline_schedule(Kind::interleaved, 2, 4, 2));
  int64_t total = 0;
  for (int64_t n : i.messages) total += n;
  EXPECT_EQ(total, 2 * 4 * (2 * 2 - 1));
}

std::string error_of(const PipelineSchedule& s) {
  try {
    simulate_pipeline_schedule(s);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(PipelineSchedule, WrongListsAreNamedByRankAndAction) {
  // Rank 0 waits for micro-batch 1's gradient before sending micro-batch 1's activation: a cycle.
  PipelineSchedule s = make_pipeline_schedule(Kind::gpipe, 2, 2);
  auto& r0 = s.actions[0];
  // rank 0: F0 send0 F1 send1 recv_g0 B0 recv_g1 B1 -> move "recv gradient 1" before "F1".
  auto it = std::find_if(r0.begin(), r0.end(), [](const PipelineAction& a) { return a.op == Op::recv_gradient && a.micro_batch == 1; });
  PipelineAction recv = *it;
  r0.erase(it);
  auto f1 = std::find_if(r0.begin(), r0.end(), [](const PipelineAction& a) { return a.op == Op::forward && a.micro_batch == 1; });
  r0.insert(f1, recv);
  EXPECT_NE(error_of(s).find("deadlock: rank 0 waits forever at action recv gradient 1.0 from rank 1"), std::string::npos)
      << error_of(s);

  PipelineSchedule missing = make_pipeline_schedule(Kind::one_f_one_b, 2, 2);
  missing.actions[1].pop_back();  // rank 1's last send of a gradient
  EXPECT_NE(error_of(missing).find("rank 1, action send gradient 1.0"), std::string::npos) << error_of(missing);

  PipelineSchedule early = make_pipeline_schedule(Kind::zb_h1, 2, 2);
  auto& r1 = early.actions[1];
  auto w = std::find_if(r1.begin(), r1.end(), [](const PipelineAction& a) { return a.op == Op::backward_weight; });
  std::rotate(r1.begin(), w, w + 1);  // a W first, before its micro-batch's forward
  EXPECT_NE(error_of(early).find("rank 1, action W"), std::string::npos) << error_of(early);
}

TEST(PipelineSchedule, ConstraintsAreInputErrors) {
  EXPECT_THROW(make_pipeline_schedule(Kind::interleaved, 4, 6, 2), InputError);  // m not a multiple of p
  EXPECT_THROW(make_pipeline_schedule(Kind::interleaved, 4, 8, 1), InputError);  // v < 2
  EXPECT_THROW(make_pipeline_schedule(Kind::one_f_one_b, 4, 8, 2), InputError);  // chunks without interleaving
  EXPECT_THROW(make_pipeline_schedule(Kind::gpipe, 4, 0), InputError);
  EXPECT_THROW(parse_pipeline_schedule("pipedream"), InputError);
  EXPECT_EQ(parse_pipeline_schedule("zb-h1"), Kind::zb_h1);
}

TEST(PipelineLayout, BalancedGivenAndBad) {
  LlamaConfig c = LlamaConfig::preset("small");
  ASSERT_EQ(c.num_hidden_layers, 6);
  const PipelineLayout even = make_pipeline_layout(c, 4, 1);
  EXPECT_EQ(even.layers_per_stage, (std::vector<int>{1, 2, 1, 2}));
  // Units: embedding 0, layers 1..6, head 7.
  EXPECT_EQ(even.stage_units(0, 6).begin, 0);
  EXPECT_EQ(even.stage_units(0, 6).end, 2);
  EXPECT_EQ(even.stage_units(3, 6).begin, 5);
  EXPECT_EQ(even.stage_units(3, 6).end, 8);
  // Llama 3's balance: one layer fewer on the first and last stages.
  const PipelineLayout llama3 = make_pipeline_layout(c, 4, 1, parse_pipeline_layers("1,2,2,1"));
  EXPECT_EQ(llama3.stage_units(1, 6).begin, 2);
  EXPECT_EQ(llama3.stage_units(1, 6).end, 4);
  // Interleaved: rank 1 of 2 holds virtual stages 1 and 3.
  const PipelineLayout inter = make_pipeline_layout(c, 2, 2, {2, 1, 2, 1});
  const std::vector<UnitRange> r1 = inter.rank_units(1, 6);
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(r1[0].begin, 3);
  EXPECT_EQ(r1[0].end, 4);
  EXPECT_EQ(r1[1].begin, 6);
  EXPECT_EQ(r1[1].end, 8);
  EXPECT_THROW(make_pipeline_layout(c, 4, 1, {1, 2, 2}), InputError);     // 3 counts for 4 stages
  EXPECT_THROW(make_pipeline_layout(c, 4, 1, {1, 2, 2, 2}), InputError);  // 7 layers
  EXPECT_THROW(make_pipeline_layout(c, 4, 1, {0, 3, 2, 1}), InputError);  // an empty stage
  EXPECT_THROW(make_pipeline_layout(c, 4, 2), InputError);                // 8 stages, 6 layers
  EXPECT_THROW(parse_pipeline_layers("1,,2"), InputError);
}

}  // namespace
}  // namespace llama4d
