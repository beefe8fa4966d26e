// `train --async-checkpoint`: the checkpoint directory a run writes in the background is, file for
// file, the bytes of the same run with synchronous checkpoints (the oracle: the sharded save every
// other test checks against one device), on one rank and on a mesh; the JSON and the goodput
// ledger report each checkpoint's stalls (the snapshot, the wait for the previous write) and its
// write; a crash while a write may still be in flight recovers from that checkpoint to the bytes
// of an uninterrupted run; the flag is refused by name where it cannot run.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "tests/common/tier.h"

namespace async_checkpoint_cli {

using namespace llama4d::cli_test;

const std::string kRun = " --preset tiny --seq-len 32 --eval-every 0 --steps 6 --save-every 2";

void expect_same_checkpoint(const std::string& a, const std::string& b) {
  for (const char* file : {"config.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"})
    EXPECT_TRUE(read_file(a + "/checkpoint/" + file) == read_file(b + "/checkpoint/" + file)) << file;
}

TEST(AsyncCheckpointCli, SameBytesAsSynchronousCheckpointsAndEachStallReported) {
  for (const std::string mesh : {"", " --mesh tp=2,pp=2,dp=2 --micro-batch-size 2 --timeout 1"}) {
    SCOPED_TRACE(mesh);
    const std::string sync = tmp("async_sync"), async = tmp("async_async");
    const Result s = run("train" + kRun + mesh + " --out " + sync + " --json");
    ASSERT_EQ(s.code, 0) << s.err;
    const Result a = run("train" + kRun + mesh + " --async-checkpoint --out " + async + " --json");
    ASSERT_EQ(a.code, 0) << a.err;
    expect_same_checkpoint(sync, async);
    const nlohmann::json j = nlohmann::json::parse(a.out), rows = j.at("checkpoints");
    ASSERT_EQ(rows.size(), 3u) << rows.dump();  // steps 2, 4 and the end
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(rows[i].at("step").get<int>(), 2 * int(i + 1));
      EXPECT_EQ(rows[i].at("async"), true);
      EXPECT_GE(rows[i].at("snapshot_s").get<double>(), 0.0);
      EXPECT_GT(rows[i].at("write_s").get<double>(), 0.0) << "every write committed and was timed";
      EXPECT_DOUBLE_EQ(rows[i].at("stall_s").get<double>(),
                       rows[i].at("snapshot_s").get<double>() + rows[i].at("wait_s").get<double>());
    }
    EXPECT_NE(a.err.find("train: checkpoint of step 4 written in the background in"), std::string::npos) << a.err;
    const nlohmann::json sync_rows = nlohmann::json::parse(s.out).at("checkpoints");
    ASSERT_EQ(sync_rows.size(), 3u);
    EXPECT_EQ(sync_rows[0].at("async"), false);
    if (!mesh.empty()) EXPECT_EQ(j.at("goodput").at("checkpoints"), rows) << "the ledger holds the same rows";
    for (const auto& e : fs::directory_iterator(async))
      EXPECT_TRUE(e.path().filename() == "checkpoint" || e.path().extension() == ".jsonl") << "left behind: " << e.path();
    fs::remove_all(sync);
    fs::remove_all(async);
  }
}
LLAMA4D_TIER(AsyncCheckpointCli, SameBytesAsSynchronousCheckpointsAndEachStallReported, quick);

// Rank 1 crashes before step 3, right after the step-2 snapshot: its write may still be in flight
// when the job fails. It finishes before the supervisor looks at the disk, so the restart begins
// at step 2, and the run ends on the uninterrupted run's bytes.
TEST(AsyncCheckpointCli, CrashWhileTheWriteMayBeInFlightRecoversFromIt) {
  const std::string straight = tmp("async_straight"), faulted = tmp("async_faulted");
  const std::string faults = tmp("async_faults") + ".json";
  std::ofstream(faults, std::ios::trunc) << R"({"seed": 3, "faults": [{"kind": "crash", "rank": 1, "step": 3}]})";
  ASSERT_EQ(run("train" + kRun + " --mesh dp=2 --timeout 1 --out " + straight).code, 0);
  const Result f = run("train" + kRun + " --mesh dp=2 --timeout 1 --async-checkpoint --max-restarts 1 --faults " + faults +
                       " --out " + faulted + " --json");
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_NE(f.err.find("restarting (1 of 1) from " + faulted + "/checkpoint (step 2)"), std::string::npos) << f.err;
  const nlohmann::json g = nlohmann::json::parse(f.out).at("goodput");
  EXPECT_EQ(g.at("lost_steps").get<int>(), 0) << "every rank had finished step 2 only: " << g.dump();
  expect_same_checkpoint(straight, faulted);
  fs::remove_all(straight);
  fs::remove_all(faulted);
}
LLAMA4D_TIER(AsyncCheckpointCli, CrashWhileTheWriteMayBeInFlightRecoversFromIt, quick);

TEST(AsyncCheckpointCli, RefusedByNameWhereItCannotRun) {
  const std::string out = " --out " + tmp("async_bad");
  expect_bad_input(run("train --async-checkpoint --recipe " + std::string(LLAMA4D_SOURCE_DIR) +
                       "/data/recipes/laptop.json" + out),
                   "--async-checkpoint and --recipe");
  EXPECT_FALSE(fs::exists(tmp("async_bad") + "/checkpoint"));
}
LLAMA4D_TIER(AsyncCheckpointCli, RefusedByNameWhereItCannotRun, quick);

}  // namespace async_checkpoint_cli
