// Straggler detection (core/parallel/straggler_detector.h): the flag rule on hand-made times,
// and the compute clock telling a slow rank from the one waiting for it on virtual GPUs.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "backends/virtual/virtual_cluster.h"
#include "core/error.h"
#include "core/parallel/straggler_detector.h"
#include "tests/comm/test_util.h"

namespace llama4d {
namespace {

TEST(StragglerDetector, MedianOfOddAndEvenCounts) {
  EXPECT_DOUBLE_EQ(median_of({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(median_of({10, 1, 3, 2}), 2.5);  // (2 + 3) / 2
}

TEST(StragglerDetector, FlagsARankPastFactorAndMarginAndGroupsConsecutiveSteps) {
  StragglerDetector d({1.5, 0.05});
  // Median 0.1 s; rank 2 at 0.4 s: 4x the median and 0.3 s over it.
  const auto f = d.observe(3, {0.1, 0.1, 0.4, 0.1});
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].rank, 2);
  EXPECT_EQ(f[0].step, 3);
  EXPECT_DOUBLE_EQ(f[0].seconds, 0.4);
  EXPECT_DOUBLE_EQ(f[0].median, 0.1);
  d.observe(4, {0.1, 0.1, 0.6, 0.1});   // 6x: the same episode, worse
  EXPECT_TRUE(d.observe(5, {0.1, 0.12, 0.1, 0.1}).empty());  // 1.2x: under the factor
  // 4x but only 0.03 s over the median: under the margin (noise on fast steps).
  EXPECT_TRUE(d.observe(6, {0.01, 0.01, 0.04, 0.01}).empty());
  d.observe(7, {0.1, 0.1, 0.2, 0.1});   // 2x after a gap: a new episode
  const nlohmann::json j = d.to_json();
  ASSERT_EQ(j.size(), 2u) << j.dump();
  EXPECT_EQ(j[0]["rank"], 2);
  EXPECT_EQ(j[0]["first_step"], 3);
  EXPECT_EQ(j[0]["last_step"], 4);
  EXPECT_DOUBLE_EQ(j[0]["worst_ratio"].get<double>(), 0.6 / 0.1);
  EXPECT_EQ(j[1]["first_step"], 7);
  EXPECT_EQ(j[1]["last_step"], 7);
  EXPECT_DOUBLE_EQ(j[1]["worst_ratio"].get<double>(), 2.0);
}

TEST(StragglerDetector, FactorZeroIsOffAndBadOptionsNameTheirFlag) {
  StragglerDetector off({0, 0});
  EXPECT_TRUE(off.observe(1, {0.1, 0.1, 9.0, 0.1}).empty());
  EXPECT_NO_THROW(check_straggler_options({0, 0}));
  EXPECT_NO_THROW(check_straggler_options({1.5, 0.05}));
  for (const double bad : {1.0, 0.5, -1.0, double(NAN)}) {
    try {
      check_straggler_options({bad, 0.05});
      ADD_FAILURE() << bad;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--straggler-factor"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(check_straggler_options({1.5, -0.1}), InputError);
}

// Rank 1 works 300 ms before the exchange; rank 0 does nothing and waits for it inside the first
// all-gather. Wall time from start to the second exchange is ~300 ms on both; the compute clock
// gives rank 1 its 300 ms and rank 0 almost none, because rank 0's wait is blocked time.
TEST(StepComputeClock, CountsTheSlowRanksWorkNotTheWaitOfItsPeers) {
  VirtualClusterOptions o;
  o.ranks = 2;
  o.timeout = std::chrono::milliseconds(10000);
  std::vector<double> seen;
  test::within_deadline(30, [&] {
    VirtualCluster cluster(o);
    cluster.run([&](ProcessGroup& world) {
      StepComputeClock clock;
      if (world.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      share_step_times(world, 0);  // rank 0 waits here for rank 1
      const std::vector<double> t = share_step_times(world, clock.seconds());
      if (world.rank() == 0) seen = t;
    });
  });
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_GE(seen[1], 0.3);
  EXPECT_LT(seen[0], 0.15) << "rank 0's wait for rank 1 counted as compute";
}

}  // namespace
}  // namespace llama4d
