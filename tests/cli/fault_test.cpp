// Failures injected into a running `train` on virtual GPUs (--faults), named when detected, and
// recovered from by the supervisor (--max-restarts) from the latest checkpoint: the recovered
// run's final checkpoint is byte for byte the one of a run without failures, on DP, ZeRO-3, TP,
// PP and a 4D plan. Bad schedules exit 2 naming the fault. Every run is `tiny`, 4 steps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <vector>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "tests/common/tier.h"

namespace fault_cli {

using namespace llama4d::cli_test;

const std::string kFaultRun = " --preset tiny --seq-len 32 --eval-every 0 --steps 4 --timeout 1";

std::string schedule(const std::string& name, const std::string& faults) {
  const std::string path = tmp(name) + ".json";
  std::ofstream(path, std::ios::trunc) << R"({"seed": 11, "faults": [)" << faults << "]}";
  return path;
}

TEST(FaultCli, BadSchedulesAndFlagsExitTwoNamingThem) {
  const std::string out = " --out " + tmp("faults_bad");
  const std::string dp2 = kFaultRun + " --mesh dp=2" + out;
  const auto with = [&](const std::string& faults) { return " --faults " + schedule("faults_bad_s", faults); };
  expect_bad_input(run("train" + dp2 + with(R"({"kind": "crash", "rank": 2, "step": 1})")), "rank 2 does not exist");
  expect_bad_input(run("train" + dp2 + with(R"({"kind": "hang", "rank": 0, "step": 5})")), "step 5 does not exist");
  expect_bad_input(run("train" + dp2 + " --stop-at 2" + with(R"({"kind": "crash", "rank": 0, "step": 3})")),
                   "step 3 does not exist");
  expect_bad_input(run("train" + dp2 + with(R"({"kind": "meteor", "rank": 0, "step": 1})")), "\"kind\" \"meteor\"");
  expect_bad_input(run("train" + dp2 + with(R"({"kind": "slow", "rank": 0, "step": 1})")), "\"factor\"");
  expect_bad_input(run("train" + dp2 + with(R"({"kind": "crash", "rank": 0, "step": 1, "factor": 2})")),
                   "slow faults only");
  expect_bad_input(run("train" + dp2 + with(R"({"kind": "crash", "rank": -1, "step": 1})")), "\"rank\" -1");
  expect_bad_input(run("train" + dp2 + with(R"({"kind": "crash", "rank": 0, "step": 1, "rank": 1})")), "twice");
  expect_bad_input(run("train" + dp2 + " --zero 3" + with(R"({"kind": "sdc", "rank": 0, "step": 1})")), "ZeRO-3");
  expect_bad_input(run("train" + dp2 + " --faults " + tmp("faults_missing") + ".json"), "--faults");
  expect_bad_input(run("train" + dp2 + " --max-restarts -1"), "--max-restarts");
  expect_bad_input(run("train --preset tiny --steps 4" + out + with(R"({"kind": "crash", "rank": 0, "step": 1})")),
                   "--faults applies to the ranks of a parallel --mesh");
  expect_bad_input(run("train" + dp2 + " --zero 3 --check-replicas"), "--check-replicas");
  expect_bad_input(run("train --preset tiny --steps 4 --mesh tp=2 --check-replicas" + out), "it would check nothing");
  EXPECT_FALSE(fs::exists(tmp("faults_bad") + "/checkpoint")) << "a refused run wrote nothing";
}

struct Recovery;
void PrintTo(const Recovery& c, std::ostream* os);

struct Recovery {
  const char* name;
  std::string mesh;    // plan flags
  std::string faults;  // schedule entries
  std::string named;   // what the failure's cause must say
  std::string flight;  // how the flight recorder's diagnosis must begin ("": not checked)
  // The steps every rank had finished past the step-2 checkpoint when the fault stopped them: a
  // fault before step k leaves k - 1 finished, an sdc found after step k leaves k (goodput.h).
  int lost_steps;
};

void PrintTo(const Recovery& c, std::ostream* os) { *os << c.name; }

class RecoveryCli : public testing::TestWithParam<Recovery> {};

// Straight run and faulted run on the same mesh: the faulted one restarts once from the step-2
// checkpoint and ends on the same bytes; metrics.jsonl holds each step once.
TEST_P(RecoveryCli, RecoveredRunIsByteIdenticalToAnUninterruptedOne) {
  const Recovery& c = GetParam();
  const std::string straight = tmp(std::string("faults_straight_") + c.name), faulted = tmp(std::string("faults_") + c.name);
  const Result s = run("train" + kFaultRun + c.mesh + " --out " + straight + " --json");
  ASSERT_EQ(s.code, 0) << s.err;
  const Result f = run("train" + kFaultRun + c.mesh + " --save-every 2 --max-restarts 2 --out " + faulted + " --faults " +
                       schedule(std::string("faults_s_") + c.name, c.faults) + " --json");
  ASSERT_EQ(f.code, 0) << f.err;
  const nlohmann::json g = nlohmann::json::parse(f.out).at("goodput");
  EXPECT_EQ(g.at("restarts").get<int>(), 1) << g.dump();
  EXPECT_EQ(g.at("lost_steps").get<int>(), c.lost_steps) << g.dump();
  ASSERT_EQ(g.at("failures").size(), 1u) << g.dump();
  EXPECT_NE(g.at("failures")[0].get<std::string>().find(c.named), std::string::npos) << g.dump();
  EXPECT_NE(f.err.find("restarting (1 of 2) from " + faulted + "/checkpoint (step 2)"), std::string::npos) << f.err;
  if (!c.flight.empty()) {
    const nlohmann::json fr = nlohmann::json::parse(read_file(faulted + "/flight_recorder.json"));
    EXPECT_EQ(fr.at("diagnosis").get<std::string>().rfind(c.flight, 0), 0u) << fr.at("diagnosis");
    EXPECT_NE(f.err.find("  " + c.flight), std::string::npos) << "printed too:\n" << f.err;
  }
  EXPECT_GT(g.at("goodput").get<double>(), 0.0);
  EXPECT_LT(g.at("goodput").get<double>(), 1.0);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(read_file(straight + "/checkpoint/" + file) == read_file(faulted + "/checkpoint/" + file)) << file;
  std::ifstream metrics(faulted + "/metrics.jsonl");
  int64_t expect = 1;
  for (std::string line; std::getline(metrics, line);)
    EXPECT_EQ(nlohmann::json::parse(line).at("step").get<int64_t>(), expect++);
  EXPECT_EQ(expect, 5);
  fs::remove_all(straight);
  fs::remove_all(faulted);
}

const Recovery kRecoveries[] = {
    {"dp_crash", " --mesh dp=2", R"({"kind": "crash", "rank": 1, "step": 3})", "injected crash on rank 1 at step 3", "", 0},
    {"zero3_link", " --mesh dp=2 --zero 3", R"({"kind": "collective", "rank": 0, "step": 3})",
     "injected collective failure on rank 0 at step 3", "", 0},
    {"tp_hang", " --mesh tp=2", R"({"kind": "hang", "rank": 1, "step": 3})", "timeout after 1000 ms: rank 1 of 'tp' (world rank 1) never called",
     "rank 1 did not enter reduce_scatter(count=8192 per rank, F32, sum) #58 on group 'tp' (its last: #57, completed)", 0},
    {"pp_sdc", " --mesh pp=2,dp=3 --batch-size 6 --check-replicas", R"({"kind": "sdc", "rank": 1, "step": 3})",
     "silent data corruption after step 3: the weights of world rank 1 differ from the other replicas' in dp", "", 1},
    {"4d_slow_then_crash", " --mesh tp=2,pp=2,dp=2 --micro-batch-size 2",
     R"({"kind": "slow", "rank": 6, "step": 1, "factor": 2, "steps": 2}, {"kind": "crash", "rank": 5, "step": 4})",
     "injected crash on rank 5 at step 4", "", 1},
};

// Tiers: the sanitizer presets run the crash on DP (the supervisor's loop); the release preset
// every strategy and kind.
LLAMA4D_INSTANTIATE(Faults, RecoveryCli, kRecoveries, full, {{"dp_crash", llama4d::test::Tier::sanitizer}});

TEST(FaultCli, FailureWithoutRestartsOrPastThemEndsTheRunNamingIt) {
  const std::string out = tmp("faults_give_up");
  const std::string twice = schedule("faults_twice", R"({"kind": "crash", "rank": 1, "step": 2}, {"kind": "crash", "rank": 0, "step": 3})");
  const Result none = run("train" + kFaultRun + " --mesh dp=2 --out " + out + " --faults " + twice);
  EXPECT_EQ(none.code, 1) << none.err;
  EXPECT_NE(none.err.find("injected crash on rank 1 at step 2"), std::string::npos) << none.err;
  const Result past = run("train" + kFaultRun + " --mesh dp=2 --max-restarts 1 --out " + out + " --faults " + twice);
  EXPECT_EQ(past.code, 1) << past.err;
  EXPECT_NE(past.err.find("gave up after 1 restart: injected crash on rank 0 at step 3"), std::string::npos) << past.err;
  EXPECT_FALSE(fs::exists(out + "/checkpoint")) << "no step finished was saved: nothing half-written either";
  // With two replicas a corrupted one cannot be told from the other: both are named.
  const Result sdc = run("train" + kFaultRun + " --mesh dp=2 --check-replicas --out " + out + " --faults " +
                         schedule("faults_sdc2", R"({"kind": "sdc", "rank": 0, "step": 1, "element": 5, "bit": 3})"));
  EXPECT_EQ(sdc.code, 1) << sdc.err;
  EXPECT_NE(sdc.err.find("after step 1: the weights of world ranks 0, 1 differ from each other"), std::string::npos)
      << sdc.err;
  fs::remove_all(out);
}
LLAMA4D_TIER(FaultCli, FailureWithoutRestartsOrPastThemEndsTheRunNamingIt, full);

// Straggler detection: a slow fault (factor 60 on rank 2 of dp=4 for steps 2-3) is flagged naming
// rank 2 and exactly those steps, and the run goes on to the bytes of the run without it (a slow
// rank changes timing only). Steps of 8-25 ms, so the fault's rank sleeps 59 of them (0.5-1.5 s)
// after working its step; the detection factor is 2 and the margin 0.2 s, far above what four
// ranks sharing 2 cores with other tests lose to scheduling (a 30 ms margin flagged a healthy
// rank about one run in three under a loaded ctest -j2). Without the fault nobody is flagged. Bad
// values exit 2 naming the flag.
TEST(FaultCli, SlowRankIsFlaggedAsStragglerAndTheRunEndsOnTheSameBytes) {
  const std::string detect = " --preset tiny --seq-len 128 --batch-size 16 --eval-every 0 --steps 4 --mesh dp=4 "
                             "--straggler-factor 2 --straggler-margin 0.2 --json";
  const std::string straight = tmp("faults_straggler_straight"), slow = tmp("faults_straggler_slow");
  const Result s = run("train" + detect + " --out " + straight);
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_EQ(nlohmann::json::parse(s.out).at("stragglers"), nlohmann::json::array()) << s.err;
  EXPECT_EQ(s.err.find("straggler:"), std::string::npos) << s.err;
  const Result f = run("train" + detect + " --out " + slow + " --faults " +
                       schedule("faults_straggler", R"({"kind": "slow", "rank": 2, "step": 2, "factor": 60, "steps": 2})"));
  ASSERT_EQ(f.code, 0) << f.err;
  const nlohmann::json st = nlohmann::json::parse(f.out).at("stragglers");
  // Flagged from the fault's first step, and never outside its steps 2-3. (Its second step is
  // flagged in most runs but not all on this loaded machine: see the report of issue 53.)
  ASSERT_EQ(st.size(), 1u) << st.dump() << f.err;
  EXPECT_EQ(st[0].at("rank"), 2);
  EXPECT_EQ(st[0].at("first_step"), 2);
  EXPECT_GE(st[0].at("last_step").get<int>(), 2);
  EXPECT_LE(st[0].at("last_step").get<int>(), 3);
  EXPECT_GT(st[0].at("worst_ratio").get<double>(), 2.0);
  EXPECT_NE(f.err.find("train: straggler: rank 2 took"), std::string::npos) << f.err;
  EXPECT_NE(f.err.find("at step 2,"), std::string::npos) << f.err;
  for (const char* other : {"at step 1,", "at step 4,", "straggler: rank 0", "straggler: rank 1", "straggler: rank 3"})
    EXPECT_EQ(f.err.find(other), std::string::npos) << other << f.err;
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(read_file(straight + "/checkpoint/" + file) == read_file(slow + "/checkpoint/" + file)) << file;
  for (const char* bad : {" --straggler-factor 1", " --straggler-factor -2", " --straggler-factor 0.5"}) {
    const Result b = run("train" + kFaultRun + " --mesh dp=2 --out " + slow + bad);
    EXPECT_EQ(b.code, 2) << bad << b.err;
    EXPECT_NE(b.err.find("--straggler-factor"), std::string::npos) << b.err;
  }
  const Result m = run("train" + kFaultRun + " --mesh dp=2 --out " + slow + " --straggler-margin -1");
  EXPECT_EQ(m.code, 2) << m.err;
  EXPECT_NE(m.err.find("--straggler-margin"), std::string::npos) << m.err;
  const Result one = run("train --preset tiny --steps 4 --out " + slow + " --straggler-factor 2");
  EXPECT_EQ(one.code, 2) << one.err;
  EXPECT_NE(one.err.find("--straggler-factor applies to the ranks of a parallel --mesh"), std::string::npos) << one.err;
  fs::remove_all(straight);
  fs::remove_all(slow);
}

// The chaos test: schedules drawn by --fault-rate (each of 16 ranks fails at each of 4 steps with
// probability 0.03, causes from Llama 3's Table 5: crashes, link failures, hangs, silent corruption,
// slowdowns) on a 4D plan (tp, cp, pp, dp of 2), checkpointing every step (asynchronously for odd
// seeds), with at most 2 restarts. Every run either recovers to the bytes of the run without
// failures, or gives up naming the failure that stopped it; none outlives its limit (a hang the
// watchdog missed would); nothing half-written is left: <out> holds the checkpoint with exactly its
// four files, the JSON records and metrics, no staging directory.
void expect_chaos_schedules_end_well(int first_seed, int seeds) {
  const std::string mesh = " --mesh tp=2,cp=2,pp=2,dp=2 --micro-batch-size 2 --check-replicas";
  const std::string straight = tmp("faults_chaos_straight_" + std::to_string(first_seed));
  ASSERT_EQ(run("train" + kFaultRun + mesh + " --out " + straight).code, 0);
  const std::string model = read_file(straight + "/checkpoint/model.safetensors");
  const std::string optimizer = read_file(straight + "/checkpoint/optimizer.safetensors");
  int recovered = 0, gave_up = 0, faulted = 0;
  for (int seed = first_seed; seed < first_seed + seeds; ++seed) {
    SCOPED_TRACE("--fault-seed " + std::to_string(seed));
    const std::string out = tmp("faults_chaos_" + std::to_string(seed));
    const Result r = run("train" + kFaultRun + mesh + " --save-every 1 --max-restarts 2 --fault-rate 0.03 --fault-seed " +
                             std::to_string(seed) + (seed % 2 ? " --async-checkpoint" : "") + " --out " + out + " --json",
                         60);
    ASSERT_NE(r.code, 124) << "hung past 60 s:\n" << r.err;
    const nlohmann::json drawn = nlohmann::json::parse(read_file(out + "/faults_drawn.json"));
    faulted += !drawn.at("faults").empty();
    if (r.code == 0) {
      ++recovered;
      EXPECT_TRUE(read_file(out + "/checkpoint/model.safetensors") == model) << r.err;
      EXPECT_TRUE(read_file(out + "/checkpoint/optimizer.safetensors") == optimizer) << r.err;
    } else {
      ++gave_up;
      EXPECT_EQ(r.code, 1) << r.err;
      const size_t at = r.err.find("gave up after 2 restarts: ");
      ASSERT_NE(at, std::string::npos) << r.err;
      const std::string cause = r.err.substr(at);
      EXPECT_TRUE(cause.find("injected ") != std::string::npos || cause.find("timeout after") != std::string::npos ||
                  cause.find("silent data corruption") != std::string::npos)
          << "a named cause: " << cause;
    }
    for (const auto& e : fs::directory_iterator(out))
      EXPECT_TRUE(e.path().filename() == "checkpoint" || e.path().extension() == ".json" ||
                  e.path().extension() == ".jsonl")
          << "left behind: " << e.path();
    if (fs::exists(out + "/checkpoint")) {
      int files = 0;
      for (const auto& e : fs::directory_iterator(out + "/checkpoint")) files += e.is_regular_file();
      EXPECT_EQ(files, 4) << "config, weights, moments, trainer state";
    }
    fs::remove_all(out);
  }
  fs::remove_all(straight);
  if (seeds >= 50) {  // the seeds chosen draw failures for most runs, and give up on some
    EXPECT_GE(faulted, seeds / 2);
    EXPECT_GE(recovered, seeds / 2);
    EXPECT_GE(gave_up, 1);
  }
}

TEST(FaultCli, ChaosFiftySeededSchedulesOn4dRecoverBitwiseOrNameTheirCause) { expect_chaos_schedules_end_well(1, 50); }
LLAMA4D_TIER(FaultCli, ChaosFiftySeededSchedulesOn4dRecoverBitwiseOrNameTheirCause, full);

TEST(FaultCli, ChaosAHandfulOfSeededSchedulesOn4d) { expect_chaos_schedules_end_well(101, 4); }
LLAMA4D_TIER(FaultCli, ChaosAHandfulOfSeededSchedulesOn4d, quick);

// plan's failure model on the paper's layout: 16,384 GPUs by default from the mesh, 90.37% at
// 30 s checkpoints and 5 min restarts (worked out by hand in tests/plan/failure_model_test.cpp).
TEST(FaultCli, PlanReportsTheFailureModelOfItsGpus) {
  const std::string paper = "plan --preset llama3-405b --mesh tp=8,cp=1,pp=16,dp=128";
  const Result r = run(paper + " --checkpoint-s 30 --restart-s 300 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json f = nlohmann::json::parse(r.out).at("failure_model");
  EXPECT_EQ(f.at("gpus").get<double>(), 16384);
  EXPECT_NEAR(f.at("goodput_at_daly").get<double>(), 0.903701, 1e-6);
  EXPECT_EQ(f.at("sweep").size(), 13u);
  expect_bad_input(run(paper + " --restart-s 300"), "add --checkpoint-s");
  expect_bad_input(run(paper + " --checkpoint-s 0"), "--checkpoint-s must be > 0");
  expect_bad_input(run(paper + " --checkpoint-s 30 --failure-gpus 0"), "--failure-gpus");
  expect_bad_input(run(paper + " --checkpoint-s 30 --mtbf-hours 0"), "--mtbf-hours");
  expect_bad_input(run("plan --llama3 --checkpoint-s 30"), "--checkpoint-s");
}

// Heartbeats: a rank hung outside any collective (as its step begins: a stalled data loader; or
// once its step computed, before its after-step work, its peer waiting in the checkpoint save) is named by the heartbeat (0.5 s) with its
// rank, step and phase, long before its peers' collective timeout (20 s) would fire: a failure
// naming the heartbeat and not "timeout after 20000 ms" is one found by the heartbeat first (the
// injected hang lasts past the 20 s otherwise). The supervisor restarts twice and the run ends on
// the bytes of the run without faults.
TEST(FaultCli, HangOutsideCollectivesIsNamedByTheHeartbeatAndRecoveredBitwise) {
  const std::string beat = " --preset tiny --seq-len 32 --eval-every 0 --steps 4 --mesh dp=2 --timeout 20";
  const std::string straight = tmp("faults_heartbeat_straight"), hung = tmp("faults_heartbeat_hung");
  const Result s = run("train" + beat + " --out " + straight);
  ASSERT_EQ(s.code, 0) << s.err;
  const Result f = run("train" + beat + " --heartbeat-timeout 0.5 --save-every 1 --max-restarts 2 --json --out " + hung +
                       " --faults " + schedule("faults_heartbeat", R"({"kind": "hang", "rank": 0, "step": 2, "phase": "after-step"},
                                                                   {"kind": "hang", "rank": 1, "step": 3})"));
  ASSERT_EQ(f.code, 0) << f.err;
  const nlohmann::json g = nlohmann::json::parse(f.out).at("goodput");
  ASSERT_EQ(g.at("failures").size(), 2u) << g.dump();
  const std::string first = g.at("failures")[0].get<std::string>(), second = g.at("failures")[1].get<std::string>();
  EXPECT_NE(first.find("heartbeat: rank 0 silent for"), std::string::npos) << first;
  EXPECT_NE(first.find("its last beat: step 2 (phase step:"), std::string::npos) << first;
  EXPECT_NE(first.find("while rank 1 reached step 2 (phase after-step:"), std::string::npos) << first;
  EXPECT_NE(first.find("injected hang on rank 0 at step 2 (after its step)"), std::string::npos) << first;
  EXPECT_NE(second.find("heartbeat: rank 1 silent for"), std::string::npos) << second;
  EXPECT_NE(second.find("its last beat: step 2 (phase after-step:"), std::string::npos) << second;
  for (const std::string& e : {first, second}) EXPECT_EQ(e.find("timeout after"), std::string::npos) << e;
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(read_file(straight + "/checkpoint/" + file) == read_file(hung + "/checkpoint/" + file)) << file;
  const Result over = run("train" + kFaultRun + " --mesh dp=2 --heartbeat-timeout 1 --out " + hung);
  EXPECT_EQ(over.code, 2) << over.err;
  EXPECT_NE(over.err.find("--heartbeat-timeout 1.000000 s is not under --timeout 1 s"), std::string::npos) << over.err;
  expect_bad_input(run("train --preset tiny --steps 4 --heartbeat-timeout 0.5 --out " + hung),
                   "--heartbeat-timeout applies to the ranks of a parallel --mesh");
  expect_bad_input(run("train" + kFaultRun + " --mesh dp=2 --out " + hung + " --faults " +
                       schedule("faults_heartbeat_bad", R"({"kind": "crash", "rank": 0, "step": 1, "phase": "step"})")),
                   "\"phase\" applies to hang faults only");
  expect_bad_input(run("train" + kFaultRun + " --mesh dp=2 --out " + hung + " --faults " +
                       schedule("faults_heartbeat_bad", R"({"kind": "hang", "rank": 0, "step": 1, "phase": "lunch"})")),
                   "\"phase\" \"lunch\" is not");
  fs::remove_all(straight);
  fs::remove_all(hung);
}
// Sanitizer tier: ThreadSanitizer runs only this tier of tests/cli, and this is its run of the
// heartbeat monitor's thread beside the ranks'.
LLAMA4D_TIER(FaultCli, HangOutsideCollectivesIsNamedByTheHeartbeatAndRecoveredBitwise, sanitizer);

// The f64 weights of a checkpoint's model.safetensors, by tensor name (the format: an 8-byte
// little-endian header length, the JSON header, the raw data).
std::map<std::string, std::vector<double>> f64_tensors(const std::string& path) {
  const std::string b = read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  const nlohmann::json h = nlohmann::json::parse(b.substr(8, n));
  std::map<std::string, std::vector<double>> out;
  for (const auto& [name, t] : h.items()) {
    if (name == "__metadata__") continue;
    EXPECT_EQ(t.at("dtype"), "F64") << name;
    const size_t from = t.at("data_offsets")[0], to = t.at("data_offsets")[1];
    std::vector<double>& v = out[name];
    v.resize((to - from) / 8);
    std::memcpy(v.data(), b.data() + 8 + n + from, to - from);
  }
  return out;
}

// A node lost for good (a permanent crash of rank 2 at step 3 on dp=4): with --on-lost-node
// shrink the supervisor goes on from the step-2 checkpoint on dp=3, the global batch of 12 rows
// kept (4 micro-batches of 1 row per rank instead of 3). The rows of a step are a pure function
// of the step, so the run trains on the same rows as the uninterrupted dp=4 run; but it is not
// bit for bit: each rank sums its micro-batches' gradients before the ordered all-reduce sums the
// ranks', so dp=4 adds (r0+r1+r2) + (r3+r4+r5) + ... and dp=3 adds (r0+...+r3) + (r4+...+r7) + ...:
// the same twelve terms in another association, which rounds differently. In f64 the final
// weights agree with the dp=4 run's within 1e-12 (the oracle: the uninterrupted run).
TEST(FaultCli, LostNodeShrinksToFewerReplicasWithTheGlobalBatchKept) {
  const std::string run4 = " --preset tiny --seq-len 32 --eval-every 0 --steps 4 --timeout 5 --dtype f64 --mesh dp=4 "
                           "--batch-size 12 --micro-batch-size 1";
  const std::string straight = tmp("faults_shrink_straight"), shrunk = tmp("faults_shrink");
  const Result s = run("train" + run4 + " --out " + straight);
  ASSERT_EQ(s.code, 0) << s.err;
  const Result f = run("train" + run4 + " --save-every 2 --max-restarts 1 --on-lost-node shrink --json --out " + shrunk +
                       " --faults " + schedule("faults_shrink_s", R"({"kind": "crash", "rank": 2, "step": 3, "permanent": true})"));
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_NE(f.err.find("going on with --mesh dp=3 instead of dp=4, 4 rows per data rank"), std::string::npos) << f.err;
  const nlohmann::json j = nlohmann::json::parse(f.out);
  EXPECT_EQ(j.at("mesh"), "dp=3");
  EXPECT_EQ(j.at("goodput").at("restarts"), 1);
  const auto a = f64_tensors(straight + "/checkpoint/model.safetensors");
  const auto b = f64_tensors(shrunk + "/checkpoint/model.safetensors");
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (const auto& [name, v] : a) {
    ASSERT_EQ(v.size(), b.at(name).size()) << name;
    for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::abs(v[i] - b.at(name)[i]));
  }
  EXPECT_LE(worst, 1e-12);
  // From the in-memory copies instead (one GPU per node, so the lost rank's node holds one
  // replica): the same restored state on the same dp=3 mesh, so the bytes of the disk restart.
  const std::string copied = tmp("faults_shrink_copies");
  const Result m = run("train" + run4 + " --gpus-per-node 1 --memory-copy-every 1 --max-restarts 1 --on-lost-node shrink "
                       "--out " + copied + " --faults " + schedule("faults_shrink_s", R"({"kind": "crash", "rank": 2, "step": 3, "permanent": true})"));
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_NE(m.err.find("restarting (1 of 1) from the in-memory copies (step 2)"), std::string::npos) << m.err;
  EXPECT_TRUE(read_file(copied + "/checkpoint/model.safetensors") == read_file(shrunk + "/checkpoint/model.safetensors"));
  fs::remove_all(copied);
  // Bad input: below one replica, and a smaller dp that does not divide the batch.
  expect_bad_input(run("train" + kFaultRun + " --mesh tp=2 --max-restarts 1 --on-lost-node shrink --out " + shrunk),
                   "it cannot shrink below 1 replica");
  expect_bad_input(run("train" + kFaultRun + " --mesh dp=4 --batch-size 8 --max-restarts 1 --on-lost-node shrink --out " + shrunk),
                   "--on-lost-node shrink: on --mesh dp=3 (dp 4 - 1): --batch-size 8 is not divisible by the 3");
  expect_bad_input(run("train" + kFaultRun + " --mesh dp=2 --max-restarts 1 --on-lost-node grow --out " + shrunk),
                   "--on-lost-node must be spare or shrink");
  fs::remove_all(straight);
  fs::remove_all(shrunk);
}
LLAMA4D_TIER(FaultCli, LostNodeShrinksToFewerReplicasWithTheGlobalBatchKept, quick);

}  // namespace fault_cli

namespace memory_copy_cli {

using namespace llama4d::cli_test;
using fault_cli::kFaultRun;
using fault_cli::schedule;

const std::string kCopyRun = kFaultRun + " --mesh dp=4 --gpus-per-node 2 --memory-copy-every 2";

// A crash at step 3 takes rank 1's node (ranks 0 and 1) with it; the supervisor restores step 2
// from the copies on node 1, without a checkpoint on disk, and ends on the uninterrupted bytes.
// Crashes on both nodes lose both holders of rank 0's shard: the run says so and resumes from disk.
// (Both crashes may fire in one attempt, or the second in the attempt restored from memory, before
// it took a new copy: either way both nodes' memory is gone, hence --max-restarts 2.)
TEST(MemoryCopyCli, RecoversANodeFromMemoryAndFallsBackToDiskWhenBothHoldersAreLost) {
  const std::string straight = tmp("copies_straight"), memory = tmp("copies_memory"), disk = tmp("copies_disk");
  const Result s = run("train" + kFaultRun + " --mesh dp=4 --out " + straight + " --json");
  ASSERT_EQ(s.code, 0) << s.err;
  const Result m = run("train" + kCopyRun + " --max-restarts 1 --out " + memory + " --json --faults " +
                       schedule("copies_one", R"({"kind": "crash", "rank": 1, "step": 3})"));
  ASSERT_EQ(m.code, 0) << m.err;
  EXPECT_NE(m.err.find("restarting (1 of 1) from the in-memory copies (step 2)"), std::string::npos) << m.err;
  const nlohmann::json g = nlohmann::json::parse(m.out).at("goodput");
  EXPECT_EQ(g.at("recoveries").at("from_memory").get<int>(), 1) << g.dump();
  EXPECT_GT(g.at("memory_copy_s").get<double>(), 0.0) << g.dump();
  EXPECT_EQ(g.at("lost_steps").get<int>(), 0) << g.dump();
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(read_file(straight + "/checkpoint/" + file) == read_file(memory + "/checkpoint/" + file)) << file;

  const Result d = run("train" + kCopyRun + " --max-restarts 2 --save-every 2 --out " + disk + " --json --faults " +
                       schedule("copies_two", R"({"kind": "crash", "rank": 1, "step": 3}, {"kind": "crash", "rank": 3, "step": 3})"));
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.err.find("cannot recover from memory: the in-memory copy of rank 0's shard (step 2) is lost: it was held "
                       "by rank 0 (node 0) and its partner rank 2 (node 1), and both failed; falling back to disk"),
            std::string::npos)
      << d.err;
  EXPECT_NE(d.err.find(" of 2) from " + disk + "/checkpoint (step 2)"), std::string::npos) << d.err;
  EXPECT_EQ(nlohmann::json::parse(d.out).at("goodput").at("recoveries").at("from_disk").get<int>(), 1);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(read_file(straight + "/checkpoint/" + file) == read_file(disk + "/checkpoint/" + file)) << file;
  for (const std::string& dir : {straight, memory, disk}) fs::remove_all(dir);
}
LLAMA4D_TIER(MemoryCopyCli, RecoversANodeFromMemoryAndFallsBackToDiskWhenBothHoldersAreLost, quick);

TEST(MemoryCopyCli, BadPlacementExitsTwoNamingIt) {
  const std::string out = " --out " + tmp("copies_bad");
  expect_bad_input(run("train" + kFaultRun + " --mesh dp=4 --memory-copy-every 0" + out), "--memory-copy-every must be >= 1");
  expect_bad_input(run("train" + kFaultRun + " --mesh dp=4 --memory-copy-every -2" + out), "--memory-copy-every");
  expect_bad_input(run("train" + kFaultRun + " --mesh dp=4 --gpus-per-node 4 --memory-copy-every 1" + out),
                   "the replica group of 2 must span 2 nodes");
  expect_bad_input(run("train" + kFaultRun + " --mesh dp=3 --gpus-per-node 2 --memory-copy-every 1" + out),
                   "not a whole number of nodes");
  expect_bad_input(run("train --preset tiny --steps 2 --memory-copy-every 1" + out), "--memory-copy-every copies the shards");
  expect_bad_input(run("train" + kFaultRun + " --mesh dp=4 --gpus-per-node 2 --memory-copy-every 1" + out),
                   "--memory-copy-every keeps copies to restart from, and --max-restarts is 0");
  EXPECT_FALSE(fs::exists(tmp("copies_bad") + "/checkpoint")) << "a refused run wrote nothing";
}
LLAMA4D_TIER(MemoryCopyCli, BadPlacementExitsTwoNamingIt, quick);

}  // namespace memory_copy_cli
