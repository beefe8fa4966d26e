// The failure model against numbers worked out by hand (Python, from the formulas in
// core/plan/failure_model.h) and against the Llama 3 paper: 419 unexpected interruptions in 54
// days on 16,384 GPUs is a job MTBF of 3.09 h, and the >90% effective training time the paper
// reports needs checkpoints of about 30 s and restarts of about 5 minutes at that rate.
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/plan/failure_model.h"

namespace llama4d {
namespace {

TEST(FailureModel, Llama3RateIntervalsAndGoodputMatchTheHandComputedValues) {
  FailureModel f;
  f.gpus = 16384;
  f.checkpoint_s = 30;
  f.restart_s = 300;
  // 54 days x 24 h / 419 = 3.0931 h.
  EXPECT_NEAR(f.job_mtbf_s() / 3600, 3.09308, 1e-5);
  EXPECT_NEAR(f.young_interval_s(), 817.377, 1e-3);  // sqrt(2 x 30 x 11135.08)
  EXPECT_NEAR(f.daly_interval_s(), 797.499, 1e-3);
  EXPECT_NEAR(f.goodput(f.daly_interval_s()), 0.903701, 1e-6);
  EXPECT_GT(f.goodput(f.daly_interval_s()), 0.90) << "the paper's >90% at 30 s checkpoints, 5 min restarts";
  f.checkpoint_s = 60;
  f.restart_s = 600;
  EXPECT_NEAR(f.goodput(f.daly_interval_s()), 0.852551, 1e-6);
  EXPECT_LT(f.goodput(f.daly_interval_s()), 0.90) << "1 min checkpoints and 10 min restarts fall short of it";
  // Half the GPUs, twice the MTBF.
  f.gpus = 8192;
  EXPECT_NEAR(f.job_mtbf_s() / 3600, 2 * 3.09308, 2e-5);
}

TEST(FailureModel, DalysIntervalIsTheBottomOfTheSweepsU) {
  FailureModel f;
  f.gpus = 16384;
  f.checkpoint_s = 45;
  f.restart_s = 420;
  double best = 0, best_at = 0;  // a fine scan, independent of Daly's closed form
  for (double t = 10; t < 20000; t *= 1.001)
    if (f.goodput(t) > best) best = f.goodput(t), best_at = t;
  EXPECT_NEAR(f.daly_interval_s(), best_at, 0.01 * best_at);
  EXPECT_NEAR(f.goodput(f.daly_interval_s()), best, 1e-6);
  const nlohmann::json j = f.to_json(13);
  const auto& sweep = j.at("sweep");
  ASSERT_EQ(sweep.size(), 13u);
  for (size_t i = 1; i < sweep.size(); ++i) {  // rises to the middle point, falls after it
    const double prev = sweep[i - 1].at("goodput").get<double>(), g = sweep[i].at("goodput").get<double>();
    if (i <= 6) EXPECT_GT(g, prev) << i;
    else EXPECT_LT(g, prev) << i;
  }
  EXPECT_NEAR(sweep[6].at("interval_s").get<double>(), f.daly_interval_s(), 1e-9);
}

TEST(FailureModel, BadValuesAreRefusedByName) {
  FailureModel f;
  EXPECT_THROW(f.validate(), InputError);  // no checkpoint cost
  f.checkpoint_s = 10;
  EXPECT_NO_THROW(f.validate());
  f.restart_s = -1;
  EXPECT_THROW(f.validate(), InputError);
  f.restart_s = 0;
  f.gpus = 0.5;
  EXPECT_THROW(f.validate(), InputError);
}

}  // namespace
}  // namespace llama4d
