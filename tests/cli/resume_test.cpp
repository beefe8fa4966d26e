// Resuming through the command line the way a user does: a checkpoint resumes on its own mesh
// and on any other, every flag on resume either applies or is refused by name (never ignored),
// trainer_state.json is validated, and metrics.jsonl holds each step once.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "tests/common/tier.h"

namespace {

using namespace llama4d::cli_test;

const std::string kRun = " --preset tiny --seq-len 32 --eval-every 0";

nlohmann::json train_json(const std::string& args) {
  const Result r = run("train" + args + " --json");
  EXPECT_EQ(r.code, 0) << args << "\n" << r.err;
  return r.code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
}

// step -> row, checking that no step appears twice and the steps run 1, 2, ... in order.
std::map<int64_t, nlohmann::json> metrics_rows(const std::string& out) {
  std::ifstream in(out + "/metrics.jsonl");
  std::map<int64_t, nlohmann::json> rows;
  int64_t expect = 1;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line);
    EXPECT_EQ(row.at("step").get<int64_t>(), expect++) << "metrics.jsonl rows out of order or repeated";
    rows[row.at("step").get<int64_t>()] = row;
  }
  return rows;
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_file(path)); }

void write_json(const std::string& path, const nlohmann::json& j) { std::ofstream(path, std::ios::trunc) << j.dump(2); }

// bf16 mixed precision saves its f32 master weights and its mode: a resume without --dtype goes
// on in bf16 and lands on the straight run's bytes; --dtype f32 on it is refused by name.
TEST(ResumeCli, Bf16ResumesInBf16Bitwise) {
  const std::string straight = tmp("resume_bf16_straight"), half = tmp("resume_bf16_half");
  const nlohmann::json js = train_json(kRun + " --dtype bf16 --steps 4 --out " + straight);
  ASSERT_FALSE(js.is_null());
  EXPECT_EQ(js.at("dtype"), "bf16");
  ASSERT_FALSE(train_json(kRun + " --dtype bf16 --steps 4 --stop-at 2 --out " + half).is_null());
  EXPECT_EQ(read_json(half + "/checkpoint/trainer_state.json").at("options").at("bf16_compute"), true);
  expect_bad_input(run("train --resume " + half + "/checkpoint --out " + half + " --dtype f32"), "--dtype");
  const nlohmann::json jr = train_json(" --resume " + half + "/checkpoint --out " + half);
  ASSERT_FALSE(jr.is_null());
  EXPECT_EQ(jr.at("dtype"), "bf16");
  EXPECT_EQ(js.at("final_loss").get<double>(), jr.at("final_loss").get<double>());
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(read_file(straight + "/checkpoint/" + f) == read_file(half + "/checkpoint/" + f)) << f;
  fs::remove_all(straight);
  fs::remove_all(half);
}
LLAMA4D_TIER(ResumeCli, Bf16ResumesInBf16Bitwise, full);  // the resume code of the fp32 cases

// Issue 14 item 2: a dp=4 ZeRO-3 run with the default micro-batch must not save the resolved
// micro-batch (the whole batch of 8), which no rank of 2 rows can split, so that not even dp=4
// could resume it. It resumes on its own mesh bitwise (3 + 3 steps = 6 straight steps, same
// bytes), and on other meshes (dp=2, one device) to within rounding of the straight run.
TEST(ResumeCli, DefaultMicroBatchResumesOnItsOwnMeshBitwiseAndOnOthers) {
  const std::string mesh = " --mesh dp=4 --zero 3";
  const std::string straight = tmp("resume_straight");
  const nlohmann::json js = train_json(kRun + mesh + " --steps 6 --out " + straight);
  ASSERT_FALSE(js.is_null());

  const std::string half = tmp("resume_half");
  ASSERT_FALSE(train_json(kRun + mesh + " --steps 6 --stop-at 3 --out " + half).is_null());
  EXPECT_EQ(read_json(half + "/checkpoint/trainer_state.json").at("options").at("micro_batch_size"), 0)
      << "the micro-batch is saved as asked (0: all of a rank's rows), not resolved for this mesh";

  for (const std::string& other : {mesh, std::string(" --mesh dp=2"), std::string("")}) {
    const std::string out = tmp("resume_on");
    fs::create_directories(out);
    fs::copy(half, out, fs::copy_options::recursive);
    const nlohmann::json jr = train_json(" --resume " + out + "/checkpoint --out " + out + other);
    ASSERT_FALSE(jr.is_null()) << other;
    EXPECT_EQ(jr.at("steps").get<int>(), 6) << other;
    EXPECT_EQ(jr.at("steps_this_run").get<int>(), 3) << other;
    EXPECT_EQ(metrics_rows(out).size(), 6u) << other;
    const double a = js.at("final_loss").get<double>(), b = jr.at("final_loss").get<double>();
    if (other == mesh) {
      EXPECT_EQ(a, b);
      for (const char* f : {"model.safetensors", "optimizer.safetensors"})
        EXPECT_TRUE(read_file(straight + "/checkpoint/" + f) == read_file(out + "/checkpoint/" + f)) << f;
    } else {
      // Another split of the batch rounds differently; a lost moment or step count would not be
      // this close (it moves the loss by ~1e-3).
      EXPECT_NEAR(a, b, 1e-5 * a) << other;
    }
    fs::remove_all(out);
  }
  fs::remove_all(straight);
  fs::remove_all(half);
}
// Resuming on another mesh runs in Reshard.SaveOnZero3Dp4ResumeOnZero1Dp2.
LLAMA4D_TIER(ResumeCli, DefaultMicroBatchResumesOnItsOwnMeshBitwiseAndOnOthers, full);

// Issue 14 item 10: resume must not ignore these without a word. Each would change what the run
// computes, so each is refused, naming the flag, before anything is written; the same value as
// the checkpoint's is fine, and the flags that may change do.
TEST(ResumeCli, FlagsThatChangeTheMathAreRefusedByName) {
  const std::string dir = tmp("resume_flags");
  ASSERT_FALSE(train_json(kRun + " --steps 6 --stop-at 2 --batch-size 4 --out " + dir).is_null());
  const std::string data = dir + "/other.txt";
  {
    std::ofstream f(data);
    for (int i = 0; i < 400; ++i) f << "some other text, line " << i << "\n";
  }
  const std::string ckpt = dir + "/checkpoint";
  const std::string before = read_file(ckpt + "/model.safetensors");
  const std::string resume = "train --resume " + ckpt + " --out " + dir + " ";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"--lr 0.01", "--lr"},
      {"--min-lr 0", "--min-lr"},
      {"--warmup-steps 1", "--warmup-steps"},
      {"--batch-size 8", "--batch-size"},
      {"--seq-len 16", "--seq-len"},
      {"--seed 5", "--seed"},
      {"--grad-clip 0.5", "--grad-clip"},
      {"--weight-decay 0", "--weight-decay"},
      {"--preset small", "--preset"},
      {"--dtype f64", "--dtype"},
      {"--dtype bf16", "--dtype"},
      {"--data " + data, "--data"},
      {"--steps 1", "--steps"},
      {"--stop-at 2", "--stop-at"},
  };
  for (const auto& [flags, name] : refused) expect_bad_input(run(resume + flags), name);
  EXPECT_TRUE(read_file(ckpt + "/model.safetensors") == before) << "a refused resume wrote the checkpoint";
  EXPECT_EQ(metrics_rows(dir).size(), 2u);

  // The checkpoint's own values, given again, and the flags that may change.
  const nlohmann::json j = train_json(" --resume " + ckpt + " --out " + dir +
                                      " --preset tiny --dtype f32 --lr 0.003 --batch-size 4 --seq-len 32"
                                      " --steps 8 --micro-batch-size 2 --stop-at 4");
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j.at("steps").get<int>(), 4);
  EXPECT_EQ(j.at("options").at("steps").get<int>(), 8) << "--steps extends the run";
  EXPECT_EQ(j.at("options").at("micro_batch_size").get<int>(), 2);
  EXPECT_EQ(read_json(ckpt + "/trainer_state.json").at("options").at("steps").get<int>(), 8);
  fs::remove_all(dir);
}

// The text a run trains on defines its batches. A resume reads it from where the first run did,
// or from where --data says it has moved; other text (or the file changed since) is refused.
TEST(ResumeCli, DataMayMoveButNotChange) {
  const std::string dir = tmp("resume_data");
  fs::create_directories(dir);
  {
    std::ofstream f(dir + "/a.txt");
    for (int i = 0; i < 300; ++i) f << "line " << i << " of the text this run trains on\n";
  }
  ASSERT_FALSE(train_json(kRun + " --steps 4 --stop-at 1 --data " + dir + "/a.txt --out " + dir).is_null());
  const std::string resume = "train --resume " + dir + "/checkpoint --out " + dir + " ";
  fs::copy_file(dir + "/a.txt", dir + "/moved.txt");
  ASSERT_FALSE(train_json(" --resume " + dir + "/checkpoint --out " + dir + " --stop-at 2 --data " + dir + "/moved.txt")
                   .is_null());
  std::ofstream(dir + "/moved.txt", std::ios::app) << "one more line\n";
  expect_bad_input(run(resume + "--data " + dir + "/moved.txt"), "--data");
  std::ofstream(dir + "/a.txt", std::ios::app) << "one more line\n";
  // The checkpoint now names moved.txt, which has changed too.
  expect_bad_input(run(resume), "moved.txt");
  fs::remove_all(dir);
}

// Issue 14 item 4: --save-every and --eval-every (and the other loop settings) must survive a
// resume, or a kill after a resume would lose everything since it. They are kept with the
// checkpoint and restored unless given again.
TEST(ResumeCli, LoopSettingsSurviveAResume) {
  const std::string dir = tmp("resume_loop");
  ASSERT_FALSE(
      train_json(" --preset tiny --seq-len 32 --eval-windows 2 --steps 8 --stop-at 2 --save-every 2 --eval-every 2 --out " + dir)
          .is_null());
  const nlohmann::json j = train_json(" --resume " + dir + "/checkpoint --out " + dir + " --stop-at 5");
  ASSERT_FALSE(j.is_null());
  const nlohmann::json& loop = j.at("options").at("loop");
  EXPECT_EQ(loop.at("save_every").get<int>(), 2);
  EXPECT_EQ(loop.at("eval_every").get<int>(), 2);
  EXPECT_EQ(loop.at("eval_windows").get<int>(), 2);
  const auto rows = metrics_rows(dir);
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_TRUE(rows.at(4).contains("val_loss")) << "--eval-every 2 still applies after the resume";
  EXPECT_FALSE(rows.at(3).contains("val_loss"));
  // Given again, a loop setting changes.
  const nlohmann::json k = train_json(" --resume " + dir + "/checkpoint --out " + dir + " --stop-at 6 --save-every 3");
  ASSERT_FALSE(k.is_null());
  EXPECT_EQ(k.at("options").at("loop").at("save_every").get<int>(), 3);
  fs::remove_all(dir);
}

// Issue 14 item 12: metrics.jsonl must hold each step once: never appended across unrelated
// runs, never repeating the steps a killed run logged after its last save. A new run starts it
// afresh; a resume keeps the rows up to the checkpoint's step.
TEST(ResumeCli, MetricsHoldEachStepOnce) {
  const std::string dir = tmp("resume_metrics");
  fs::create_directories(dir);
  std::ofstream(dir + "/metrics.jsonl") << R"({"step": 1, "loss": 9.0})" << "\n" << R"({"step": 7, "loss": 9.0})" << "\n";
  ASSERT_FALSE(train_json(kRun + " --steps 6 --stop-at 3 --out " + dir).is_null());
  auto rows = metrics_rows(dir);
  ASSERT_EQ(rows.size(), 3u) << "a new run starts metrics.jsonl afresh";
  EXPECT_NE(rows.at(1).at("loss").get<double>(), 9.0);
  // What a run killed after step 5 (last save at 3) leaves: rows 4 and 5, the last one cut short.
  std::ofstream(dir + "/metrics.jsonl", std::ios::app) << R"({"step": 4, "loss": 9.0})" << "\n"
                                                       << R"({"step": 5, "lo)";
  ASSERT_FALSE(train_json(" --resume " + dir + "/checkpoint --out " + dir).is_null());
  rows = metrics_rows(dir);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_NE(rows.at(4).at("loss").get<double>(), 9.0) << "the resumed run's step 4 replaces the killed run's";
  fs::remove_all(dir);
}

// Issue 14 item 16: resuming a finished run must not print "final loss nan". It trains nothing
// (re-running a finished job is harmless), says so and how to extend it, and --steps extends it.
TEST(ResumeCli, FinishedRunSaysHowToExtendIt) {
  const std::string dir = tmp("resume_finished");
  ASSERT_FALSE(train_json(kRun + " --steps 2 --out " + dir).is_null());
  const Result again = run("train --resume " + dir + "/checkpoint --out " + dir + " --json");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find("had finished all 2 steps, nothing to train"), std::string::npos) << again.err;
  EXPECT_EQ(again.err.find("nan"), std::string::npos) << again.err;
  EXPECT_TRUE(nlohmann::json::parse(again.out).at("final_loss").is_null());
  const nlohmann::json longer = train_json(" --resume " + dir + "/checkpoint --steps 3 --out " + dir);
  ASSERT_FALSE(longer.is_null());
  EXPECT_EQ(longer.at("steps_this_run").get<int64_t>(), 1);
  EXPECT_TRUE(std::isfinite(longer.at("final_loss").get<double>()));
  fs::remove_all(dir);
}

// Issue 14 item 10: trainer_state.json is checked (format, step ranges, the optimizer's step
// count, dtype, numbers a JSON parser overflows on) with a one-line error naming the file. An
// older file without "loop" still resumes.
TEST(ResumeCli, TrainerStateIsValidated) {
  const std::string dir = tmp("resume_state");
  ASSERT_FALSE(train_json(kRun + " --steps 4 --stop-at 2 --out " + dir).is_null());
  const std::string state = dir + "/checkpoint/trainer_state.json";
  const nlohmann::json good = read_json(state);
  const std::string resume = "train --resume " + dir + "/checkpoint --out " + dir;
  auto mutated = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    write_json(state, j);
  };
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& j) { j["format"] = "llama4d-trainer-state-v9"; }, "format"},
      {[](nlohmann::json& j) { j.erase("format"); }, "format"},
      {[](nlohmann::json& j) { j["steps_done"] = 5; }, "steps_done"},
      {[](nlohmann::json& j) { j["steps_done"] = -1; }, "steps_done"},
      {[](nlohmann::json& j) { j["optimizer_step"] = 1; }, "optimizer_step"},
      {[](nlohmann::json& j) { j["dtype"] = "BF16"; }, "dtype"},
      {[](nlohmann::json& j) { j["options"]["micro_batch_size"] = -2; }, "--micro-batch-size"},
      {[](nlohmann::json& j) { j["options"].erase("seq_len"); }, "seq_len"},
  };
  for (const auto& [edit, needle] : cases) {
    mutated(edit);
    const Result r = run(resume);
    expect_bad_input(r, needle);
    EXPECT_NE(r.err.find("trainer_state.json"), std::string::npos) << r.err;
  }
  std::string text = good.dump();
  text.replace(text.find("\"lr\":0.003"), 10, "\"lr\":1e999");
  std::ofstream(state, std::ios::trunc) << text;
  expect_bad_input(run(resume), "trainer_state.json");

  // Written before "loop" existed, with the micro-batch resolved: still resumes.
  mutated([](nlohmann::json& j) {
    j["options"].erase("loop");
    j["options"]["micro_batch_size"] = 8;
  });
  const nlohmann::json r = train_json(" --resume " + dir + "/checkpoint --out " + dir);
  ASSERT_FALSE(r.is_null());
  EXPECT_EQ(r.at("steps").get<int>(), 4);
  fs::remove_all(dir);
}

}  // namespace
