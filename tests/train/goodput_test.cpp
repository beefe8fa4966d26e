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

// lost_steps counts from the restored step to the last step every rank finished, so the same
// failure costs the same count whether the lead rank had finished one step more or not: here a
// crash before step 5 on another rank (every rank finished step 4), restored from the step-2
// checkpoint, with the lead rank having seen step 4 (a) or steps 4 and 5 (b): 2 lost steps both.
TEST(GoodputLedger, LostStepsCountFromTheRestoredStepWhereverTheLeadRankStopped) {
  for (const int64_t lead_reached : {4, 5}) {
    SCOPED_TRACE(lead_reached);
    GoodputLedger g;
    g.attempt_started(0, 0);
    g.loop_started(0);
    for (int64_t s = 1; s <= lead_reached; ++s) g.step_done(s, 1, double(s));
    g.saved(2, 0, 2);
    g.attempt_ended(6, "rank 3 crashed", 2, 4);
    const nlohmann::json r = g.report();
    EXPECT_EQ(r.at("lost_steps").get<int64_t>(), 2);
    EXPECT_DOUBLE_EQ(r.at("lost_work_s").get<double>(), double(lead_reached - 2)) << "the lead rank's seconds";
  }
  // Restored from a copy taken after the last step every rank finished: nothing was lost.
  GoodputLedger g;
  g.attempt_started(0, 0);
  g.loop_started(0);
  g.step_done(1, 1, 1);
  g.attempt_ended(2, "hang", 1, 1);
  EXPECT_EQ(g.report().at("lost_steps").get<int64_t>(), 0);
}

// Asynchronous checkpoints: the stall is the wait for the previous write plus the snapshot; the
// write runs beside training (reported per checkpoint, not counted in checkpoint_s); the steps a
// checkpoint holds are kept once its write committed, not when its snapshot was taken.
TEST(GoodputLedger, AsynchronousCheckpointsCountTheirStallsAndKeepStepsOnceCommitted) {
  GoodputLedger g;
  g.attempt_started(0, 0);
  g.loop_started(0);
  g.step_done(1, 1, 1);
  g.step_done(2, 1, 2);
  g.snapshot_taken(2, 0, 0.25, 2.25);  // the write of step 2 runs during steps 3 and 4
  g.step_done(3, 1, 3.25);
  g.write_committed(2, 1.5);
  g.step_done(4, 1, 4.25);
  g.attempt_ended(5.25, "crash", 2);   // steps 3, 4 lost; 1, 2 kept
  const nlohmann::json r = g.report();
  EXPECT_DOUBLE_EQ(r.at("checkpoint_s").get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(r.at("productive_s").get<double>(), 2);
  EXPECT_DOUBLE_EQ(r.at("lost_work_s").get<double>(), 2);
  const nlohmann::json rows = r.at("checkpoints");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].at("step"), 2);
  EXPECT_EQ(rows[0].at("async"), true);
  EXPECT_DOUBLE_EQ(rows[0].at("snapshot_s").get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(rows[0].at("write_s").get<double>(), 1.5);
  // A snapshot whose write never committed keeps nothing, and says so.
  GoodputLedger h;
  h.attempt_started(0, 0);
  h.loop_started(0);
  h.step_done(1, 1, 1);
  h.snapshot_taken(1, 0, 0.5, 1.5);
  h.attempt_ended(2, "the write failed", 0);
  EXPECT_DOUBLE_EQ(h.report().at("productive_s").get<double>(), 0);
  EXPECT_TRUE(h.report().at("checkpoints")[0].at("write_s").is_null());
}

}  // namespace
}  // namespace llama4d
