// The goodput ledger's arithmetic on a scripted supervised run: two attempts, a failure after an
// unsaved step, a restart; every second lands in exactly one bucket.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/train/goodput.h"

namespace llama4d {
namespace {

TEST(GoodputLedger, ScriptedRunWithOneFailure) {
  GoodputLedger g;
  g.attempt_started(0, 0);
  g.loop_started(1);          // startup 1 s
  g.step_done(1, 2, 3);       // steps 1, 2: 2 s each
  g.step_done(2, 2, 5);
  g.saved(2, 0.5, 5.5);       // checkpoint 0.5 s: steps 1, 2 kept
  g.step_done(3, 2, 7.5);     // step 3: lost
  g.attempt_ended(8.5, "rank 1 crashed");  // detection 1 s
  EXPECT_EQ(g.last_saved_step(), 2);
  g.attempt_started(8.5, 2);
  g.loop_started(10);         // restart 1.5 s
  g.step_done(3, 2, 12);
  g.step_done(4, 2, 14);
  g.saved(4, 0.5, 14.5);
  g.attempt_ended(15, "");    // 0.5 s of other
  const nlohmann::json r = g.report();
  EXPECT_DOUBLE_EQ(r.at("wall_s").get<double>(), 15);
  EXPECT_DOUBLE_EQ(r.at("productive_s").get<double>(), 8);
  EXPECT_DOUBLE_EQ(r.at("lost_work_s").get<double>(), 2);
  EXPECT_EQ(r.at("lost_steps").get<int64_t>(), 1);
  EXPECT_DOUBLE_EQ(r.at("checkpoint_s").get<double>(), 1);
  EXPECT_DOUBLE_EQ(r.at("startup_s").get<double>(), 1);
  EXPECT_DOUBLE_EQ(r.at("restart_s").get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(r.at("detection_s").get<double>(), 1);
  EXPECT_DOUBLE_EQ(r.at("other_s").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(r.at("goodput").get<double>(), 8.0 / 15);
  EXPECT_EQ(r.at("restarts").get<int>(), 1);
  EXPECT_EQ(r.at("failures"), nlohmann::json::array({"rank 1 crashed"}));
}

// A failure right after a save the lead rank did not see finish: the steps the checkpoint on disk
// holds are kept, the later ones lost.
TEST(GoodputLedger, ACheckpointFoundOnDiskKeepsItsSteps) {
  GoodputLedger g;
  g.attempt_started(0, 0);
  g.loop_started(0);
  for (int64_t s = 1; s <= 3; ++s) g.step_done(s, 1, double(s));
  g.attempt_ended(4, "crash", 2);
  EXPECT_EQ(g.last_saved_step(), 2);
  const nlohmann::json r = g.report();
  EXPECT_DOUBLE_EQ(r.at("productive_s").get<double>(), 2);
  EXPECT_DOUBLE_EQ(r.at("lost_work_s").get<double>(), 1);
  EXPECT_EQ(r.at("lost_steps").get<int64_t>(), 1);
}

}  // namespace
}  // namespace llama4d
