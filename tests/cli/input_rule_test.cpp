// Issue 52's reproducers, run on the real binary: numbers read as written on every command (item
// 3), special files refused by name (item 4), files that could mean two things refused (item 5),
// the right message and exit code (item 8), and a first hour without surprises (item 9).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace {

using namespace llama4d::cli_test;

const std::string kTinyTrain = "train --preset tiny --eval-every 0 ";
const std::string kTinyRun = kTinyTrain + "--seq-len 16 --batch-size 2 ";

// One finished tiny run's checkpoint, made once and copied by the tests that change it.
const std::string& tiny_checkpoint() {
  static const std::string dir = [] {
    // ctest runs each test as its own process, several at once: one run per process.
    const std::string out = tmp("input_rule_run_" + std::to_string(getpid()));
    const Result r = run(kTinyRun + "--steps 1 --out " + out);
    EXPECT_EQ(r.code, 0) << r.err;
    return out + "/checkpoint";
  }();
  return dir;
}

std::string copy_of_checkpoint(const std::string& name) {
  const std::string dir = tmp(name);
  fs::copy(tiny_checkpoint(), dir, fs::copy_options::recursive);
  return dir;
}

// ---- Item 3: one rule for every number ---------------------------------------------------------

TEST(InputRule, LeadingZerosAreDecimal) {
  const Result r = run(kTinyTrain + "--steps 03 --batch-size 04 --seq-len 016 --json --out " + tmp("octal"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("options").at("steps"), 3);
  EXPECT_EQ(j.at("options").at("batch_size"), 4) << "016 was read as octal 14 before";
  EXPECT_EQ(j.at("options").at("seq_len"), 16);
  const Result s = run("schedule --pp 010 --micro-batches 010 --json");
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_EQ(nlohmann::json::parse(s.out).at("ranks"), 10);
  EXPECT_EQ(nlohmann::json::parse(s.out).at("micro_batches"), 10);
}

TEST(InputRule, NumbersOutOfTheRuleAreRefusedNamingTheFlag) {
  const std::string out = " --out " + tmp("numbers");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {kTinyRun + "--steps 9223372036854775808" + out, "--steps"},
      {kTinyRun + "--steps ''" + out, "--steps"},
      {kTinyRun + "--grad-clip ''" + out, "--grad-clip"},
      {kTinyRun + "--steps 0x10" + out, "--steps"},
      {kTinyRun + "--steps +3" + out, "--steps"},
      {kTinyRun + "--lr nan" + out, "--lr"},
      {kTinyRun + "--lr inf" + out, "--lr"},
      {kTinyRun + "--lr 1e999" + out, "--lr"},
      {kTinyRun + "--seed -1" + out, "--seed"},
      {kTinyRun + "--threads 2147483648" + out, "--threads"},
      {"eval --preset tiny --seq-len 16 --max-windows -1", "--max-windows"},
      {"plan --efficiency nan", "--efficiency"},
      {"plan --hbm-gb nan", "--hbm-gb"},
      {"plan --tokens -1", "--tokens"},
      {"plan --gpu-tflops inf", "--gpu-tflops"},
      {"schedule --costs inf,1,1", "--costs"},
      {"schedule --costs 1,1,1,", "--costs"},
      {"schedule --pp ''", "--pp"},
      {"bench --gemm-seconds inf", "--gemm-seconds"},
      {"bench comm --min-bytes 010x", "--min-bytes"},
      {"verify --micro-batch-size -2", "--micro-batch-size"},
      {"verify --mesh dp=+2", "dp"},
      {"verify --mesh dp=0x2", "dp"},
      {"verify --mesh dp=99999999999", "dp"},
      {"verify --mesh tp=2,dp=1000000", "ranks"},
      {"verify --mesh tp=2,pp=2 --pp-layers 1,x", "--pp-layers"},
  };
  for (const auto& [args, needle] : cases) {
    SCOPED_TRACE(args);
    expect_bad_input(run(args), needle);
  }
}

TEST(InputRule, EmptyValuesAreErrorsNotDefaults) {
  const std::string out = " --out " + tmp("empty");
  for (const std::string flag : {"--data", "--mesh", "--pp-layers", "--config", "--out", "--ac"}) {
    SCOPED_TRACE(flag);
    expect_bad_input(run(kTinyRun + "--steps 1 " + flag + " ''" + out), flag);
  }
  expect_bad_input(run("eval --preset tiny --seq-len 16 --data ''"), "--data");
  expect_bad_input(run("verify --data ''"), "--data");
}

// ---- Item 4: special files are refused by name, never waited on --------------------------------

TEST(InputRule, SpecialFilesAsConfigOrDataAreRefused) {
  const std::string dir = tmp("special");
  fs::create_directories(dir + "/corpus");
  ASSERT_EQ(mkfifo((dir + "/fifo.json").c_str(), 0600), 0);
  ASSERT_EQ(symlink((dir + "/loop").c_str(), (dir + "/loop").c_str()), 0);
  expect_bad_input(run(kTinyRun + "--steps 1 --config " + dir + "/fifo.json --out " + dir + "/o"), "FIFO");
  expect_bad_input(run(kTinyRun + "--steps 1 --config /dev/zero --out " + dir + "/o"), "/dev/zero");
  expect_bad_input(run(kTinyRun + "--steps 1 --config " + dir + "/loop --out " + dir + "/o"), "symlink loop");
  expect_bad_input(run(kTinyRun + "--steps 1 --data " + dir + "/loop --out " + dir + "/o"), "symlink loop");
  // A FIFO among a directory's documents is reported, not skipped.
  std::ofstream(dir + "/corpus/a.txt") << std::string(4000, 'a');
  ASSERT_EQ(mkfifo((dir + "/corpus/b.txt").c_str(), 0600), 0);
  expect_bad_input(run(kTinyRun + "--steps 1 --data " + dir + "/corpus --out " + dir + "/o"), "b.txt");
  fs::remove_all(dir);
}

TEST(InputRule, SpecialFilesInACheckpointAreRefused) {
  for (const std::string file : {"config.json", "model.safetensors"}) {
    SCOPED_TRACE(file);
    const std::string ck = copy_of_checkpoint("special_ck");
    fs::remove(ck + "/" + file);
    ASSERT_EQ(mkfifo((ck + "/" + file).c_str(), 0600), 0);
    expect_bad_input(run("eval --checkpoint " + ck + " --seq-len 16 --max-windows 1"), file);
    fs::remove_all(ck);
  }
}

// ---- Item 5: files that could mean two things --------------------------------------------------

TEST(InputRule, NonFiniteWeightsAreRefusedNamingTheTensor) {
  const std::string ck = copy_of_checkpoint("nan_ck");
  std::string bytes = read_file(ck + "/model.safetensors");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bytes.data() + 8 + n, &nan, 4);  // the first element of the first tensor
  std::ofstream(ck + "/model.safetensors", std::ios::binary | std::ios::trunc) << bytes;
  expect_bad_input(run("eval --checkpoint " + ck + " --seq-len 16 --max-windows 1"), "NaN");
  expect_bad_input(run("generate --checkpoint " + ck + " --max-new-tokens 2"), "NaN");
  fs::remove_all(ck);
}

TEST(InputRule, ConfigWithADuplicateKeyIsRefused) {
  const std::string dir = tmp("dup_config");
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << read_file(tiny_checkpoint() + "/config.json").insert(1, "\"num_hidden_layers\": 9,");
  expect_bad_input(run(kTinyRun + "--steps 1 --config " + dir + "/config.json --out " + dir + "/o"),
                   "num_hidden_layers");
  fs::remove_all(dir);
}

// ---- Item 8: the right message and exit code ---------------------------------------------------

TEST(InputRule, MessagesNameTheRealProblem) {
  const std::string out = tmp("messages");
  const Result huge = run(kTinyTrain + "--seq-len 16 --steps 1 --batch-size 2147483648 --out " + out);
  expect_bad_input(huge, "bytes");
  const Result long_seq = run(kTinyTrain + "--batch-size 2 --steps 1 --seq-len 9223372036854775807 --out " + out);
  EXPECT_EQ(long_seq.code, 2) << long_seq.err;
  EXPECT_EQ(long_seq.err.find("-9223372036854775808"), std::string::npos) << "overflowed: " << long_seq.err;
  expect_bad_input(run("bench --preset tiny --warmup 9223372036854775807"), "--warmup");
  expect_bad_input(run("schedule --svg " + testing::TempDir()), "--svg");
  expect_bad_input(run("schedule --pp 100000"), "--pp");
  expect_bad_input(run("verify --sp off"), "--sp");
  expect_bad_input(run(kTinyRun + "--steps 1 --sp off --out " + out), "--sp");
  const Result fly = run("fly");
  expect_bad_input(fly, "'fly' is not a command");
  for (const char* name : {"train", "eval", "generate", "verify", "schedule", "plan", "bench"})
    EXPECT_NE(fly.err.find(name), std::string::npos) << fly.err;
  fs::remove_all(out);
}

TEST(InputRule, ModelWeightsAsOptimizerStateAreNamedAsSuch) {
  const std::string ck = copy_of_checkpoint("swapped_optimizer");
  fs::copy_file(ck + "/model.safetensors", ck + "/optimizer.safetensors", fs::copy_options::overwrite_existing);
  const Result r = run("train --resume " + ck + " --steps 2 --out " + tmp("swapped_out"));
  expect_bad_input(r, "optimizer.safetensors");
  EXPECT_EQ(r.err.find("tie_word_embeddings"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exp_avg"), std::string::npos) << r.err;
  fs::remove_all(ck);
}

// ---- Item 9: the first hour --------------------------------------------------------------------

TEST(InputRule, EveryPresetRunsWithItsDefaults) {
  // tiny has 128 positions; train's default --seq-len is 256.
  const Result r = run("train --preset tiny --steps 1 --eval-every 0 --json --out " + tmp("tiny_defaults"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("options").at("seq_len"), 128);
  EXPECT_EQ(j.at("model"), "preset tiny");
  EXPECT_NE(r.err.find("preset tiny"), std::string::npos) << "train says which model ran: " << r.err;
  const Result e = run("eval --preset tiny --max-windows 1 --json");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_EQ(nlohmann::json::parse(e.out).at("seq_len"), 128);
}

TEST(InputRule, VerifySaysWhichModelRan) {
  const Result r = run("verify --mesh dp=2 --steps 1 --seq-len 16 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("preset tiny"), std::string::npos) << r.err;
}

TEST(InputRule, AMissingCheckpointSaysWhichCommandMakesIt) {
  const std::string missing = tmp("no_such_checkpoint");
  for (const std::string cmd : {"eval", "generate"})
    expect_bad_input(run(cmd + " --checkpoint " + missing), "llama4d train --out");
}

}  // namespace
