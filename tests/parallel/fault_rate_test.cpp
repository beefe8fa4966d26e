// Failures drawn at a rate (core/parallel/fault_rate.h): the same seed draws the same schedule;
// the number drawn and their kinds follow the rate and Llama 3's Table 5 counts (expectations from
// the binomial distribution, by hand: n trials of probability p give n p +- 5 sqrt(n p (1 - p)));
// the table sums to its 419 interruptions; a bad rate is named.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/parallel/fault_rate.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

TEST(FaultRate, Table5SumsTo419AndMapsEveryCause) {
  int total = 0, crash = 0;
  for (const FailureCause& c : llama3_failure_causes()) {
    total += c.count;
    crash += c.kind == FaultKind::crash ? c.count : 0;
  }
  EXPECT_EQ(total, 419);  // "The Llama 3 Herd of Models", section 3.3.4: 419 unexpected interruptions
  EXPECT_EQ(llama3_failure_causes().size(), 18u);
  EXPECT_EQ(crash, 148 + 72 + 54 + 32 + 19 + 3 + 3 + 2 + 2 + 2 + 2 + 2);
}

TEST(FaultRate, SameSeedSameScheduleAnotherSeedAnother) {
  const DrawnSchedule a = draw_fault_schedule(0.05, 7, 16, 50), b = draw_fault_schedule(0.05, 7, 16, 50);
  const DrawnSchedule c = draw_fault_schedule(0.05, 8, 16, 50);
  EXPECT_EQ(a.schedule.to_json(), b.schedule.to_json());
  EXPECT_NE(a.schedule.to_json(), c.schedule.to_json());
  // Replayable: the schedule reads back as a --faults file, the same faults.
  EXPECT_EQ(FaultSchedule::from_json(a.schedule.to_json(), "test").to_json(), a.schedule.to_json());
  EXPECT_NO_THROW(a.schedule.check_fits(16, 50));
  // A (step, rank) draws the same whether or not more ranks or steps are drawn beside it.
  const DrawnSchedule wider = draw_fault_schedule(0.05, 7, 32, 80);
  for (const Fault& f : a.schedule.faults) {
    bool found = false;
    for (const Fault& g : wider.schedule.faults) found = found || (g.rank == f.rank && g.step == f.step && g.kind == f.kind);
    EXPECT_TRUE(found) << f.describe();
  }
}

TEST(FaultRate, CountAndKindsFollowTheRateAndTable5) {
  const double p = 0.01;
  const int ranks = 1000;
  const int64_t steps = 1000;  // 10^6 trials
  const DrawnSchedule d = draw_fault_schedule(p, 2024, ranks, steps);
  const double n = double(ranks) * double(steps);
  EXPECT_NEAR(double(d.drawn.size()), n * p, 5 * std::sqrt(n * p * (1 - p)));
  std::map<FaultKind, int> kinds;
  for (const DrawnFault& f : d.drawn) ++kinds[f.fault.kind];
  const double m = double(d.drawn.size());
  const std::pair<FaultKind, int> expected[] = {{FaultKind::crash, 341}, {FaultKind::collective, 42},
                                                {FaultKind::hang, 24}, {FaultKind::sdc, 6}, {FaultKind::slow, 6}};
  for (const auto& [kind, count] : expected) {
    const double q = count / 419.0;
    EXPECT_NEAR(kinds[kind], m * q, 5 * std::sqrt(m * q * (1 - q))) << fault_kind_name(kind);
  }
  for (const DrawnFault& f : d.drawn)
    if (f.fault.kind == FaultKind::slow) {
      EXPECT_EQ(f.fault.factor, 2);
      EXPECT_EQ(f.fault.steps, 1);
    }
}

TEST(FaultRate, NoSdcWhereThePlanCannotInjectOneAndBadRatesNamed) {
  const DrawnSchedule with = draw_fault_schedule(0.2, 5, 64, 100), without = draw_fault_schedule(0.2, 5, 64, 100, false);
  int sdc = 0;
  for (const Fault& f : with.schedule.faults) sdc += f.kind == FaultKind::sdc;
  ASSERT_GT(sdc, 0);
  EXPECT_EQ(without.dropped_sdc, sdc);
  EXPECT_EQ(without.schedule.faults.size() + size_t(sdc), with.schedule.faults.size());
  for (const Fault& f : without.schedule.faults) EXPECT_NE(f.kind, FaultKind::sdc);
  for (const double bad : {0.0, -0.1, 1.5, double(NAN)}) {
    try {
      draw_fault_schedule(bad, 1, 2, 2);
      ADD_FAILURE() << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--fault-rate"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace llama4d
