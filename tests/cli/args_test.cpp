// Odd values and flags that would do nothing are refused up front: one line, exit 2, before any
// work, and no --out left behind (issue 14, items 11, 13 and 14).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace {

using namespace llama4d::cli_test;

const std::string kTrain = "train --preset tiny --seq-len 32 --steps 1 --eval-every 0 ";

TEST(CliArgs, OddValuesAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--grad-clip -1", "--grad-clip"},
      {"--stop-at 0", "--stop-at"},
      {"--stop-at -3", "--stop-at"},
      {"--save-every -1", "--save-every"},
      {"--eval-every -1", "--eval-every"},
      {"--seed -1", "--seed"},
      {"--mesh dp=2,dp=4", "twice"},
      {"--hbm-gib -1 --mesh dp=2", "--hbm-gib"},
  };
  for (const auto& [flags, needle] : cases) {
    const std::string out = tmp("odd") + "/run";
    expect_bad_input(run(kTrain + flags + " --out " + out), needle);
    EXPECT_FALSE(fs::exists(fs::path(out).parent_path())) << flags << ": a rejected run left its --out behind";
  }
  for (const char* cmd : {"verify --seed -1", "eval --seed -1", "generate --init-seed -1", "generate --seed -1"})
    expect_bad_input(run(cmd), "seed");
  // A device this build has no backend for: refused by every command that computes, naming those it has.
  for (const std::string& cmd : {kTrain + "--out " + tmp("device") + "/run", std::string("verify"), std::string("eval"),
                                std::string("generate"), std::string("bench")})
    expect_bad_input(run(cmd + " --device tpu"), std::string("--device tpu: this build has no such compute backend ") +
                                                     (LLAMA4D_CLI_CUDA ? "(it has: cpu, cuda)" : "(it has: cpu)"));
  // --kernels: an unknown value is refused on any device, and the CPU, with one set of kernels,
  // refuses the flag whatever its value (it would change nothing the user could see).
  for (const std::string& cmd : {kTrain + "--out " + tmp("kernels") + "/run", std::string("verify"), std::string("eval"),
                                std::string("generate"), std::string("bench")}) {
    expect_bad_input(run(cmd + " --kernels quick"), "--kernels quick: use exact or fast");
    for (const char* mode : {"exact", "fast"})
      expect_bad_input(run(cmd + " --kernels " + mode),
                       "--kernels chooses between the CUDA backend's two sets of kernels; --device cpu has one");
  }
}

// --device cuda runs where the build has the CUDA backend and a GPU can run it; anywhere else it
// is refused in one line that says why (no backend in this build, no GPU, no driver).
TEST(CliArgs, CudaRunsOrSaysWhyNot) {
  const Result r = run("verify --device cuda --mesh dp=2 --steps 2 --seq-len 32 --json");
  if (r.code == 0) {
    EXPECT_EQ(nlohmann::json::parse(r.out).at("device").get<std::string>(), "cuda") << r.out;
    return;
  }
  expect_bad_input(r, LLAMA4D_CLI_CUDA ? "--device cuda: " : "--device cuda: this build has no such compute backend");
  if (LLAMA4D_CLI_CUDA) {
    EXPECT_EQ(r.err.find("no such compute backend"), std::string::npos) << r.err;
  }
}

// NCCL moves GPU memory: with the CPU backend computing, --backend nccl is refused before
// anything starts, and a command that has no GPU path says so instead of suggesting --device.
TEST(CliArgs, NcclNeedsTheCudaDevice) {
  const Result r = run("verify --mesh dp=2 --backend nccl --steps 1 --seq-len 32");
  expect_bad_input(r, LLAMA4D_CLI_NCCL ? "--backend nccl moves GPU memory: add --device cuda"
                                       : "--backend nccl: this build has no NCCL backend");
  if (LLAMA4D_CLI_NCCL) expect_bad_input(run("schedule --pp 2 --backend nccl"), "'schedule' computes on the CPU only");
}

// Each of these shapes only the ranks of a mesh, so without one it would do nothing: a run would
// go ahead as a single device and ignore it, and --backend mpi without --mesh under mpirun would
// start N one-rank trainers writing the same --out. So each is refused.
TEST(CliArgs, ParallelFlagsWithoutAMeshAreRefused) {
  for (const std::string flag :
       {"--zero 3", "--keep-params", "--reduce-once", "--hbm-gib 4", "--trace t.json", "--backend mpi", "--algo ring", "--gpus-per-node 2",
        "--timeout 5"}) {
    const std::string out = tmp("nomesh");
    const Result r = run(kTrain + flag + " --out " + out);
    expect_bad_input(r, flag.substr(0, flag.find(' ')));
    EXPECT_NE(r.err.find("--mesh"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
  expect_bad_input(run("bench --preset tiny --seq-len 32 --hbm-gib 4"), "--hbm-gib");
  expect_bad_input(run(kTrain + "--backend mpi --out " + tmp("nomesh_mpi")), "mpirun");
}

// bench's reference BLAS is named when it cannot be used, never silently dropped; the thread
// sweep times the single-rank step only.
TEST(CliArgs, BenchRefusesAReferenceBlasItCannotUseAndASweepOnAMesh) {
  expect_bad_input(run("bench --preset tiny --seq-len 32 --reference-blas /nonexistent/libblas.so"), "cannot load");
  expect_bad_input(run("bench --preset tiny --seq-len 32 --reference-blas libc.so.6"), "cblas_sgemm");
  expect_bad_input(run("bench --preset tiny --seq-len 32 --threads-sweep --mesh dp=2"), "--threads-sweep");
}

// Flags that only the CPU backend reads are refused with another device, before the device is
// even opened (so the message is the same with or without a GPU): accepted, they were ignored.
TEST(CliArgs, CpuOnlyFlagsAreRefusedOffTheCpu) {
  for (const std::string cmd : {"bench --preset tiny --seq-len 32", "verify --mesh dp=2 --steps 1 --seq-len 32"})
    expect_bad_input(run(cmd + " --device cuda --threads 2"), "--threads 2 sets the CPU backend's compute threads");
  expect_bad_input(run("bench --preset tiny --seq-len 32 --device cuda --threads-sweep"), "--threads-sweep");
  expect_bad_input(run("bench --preset tiny --seq-len 32 --device cuda --reference-blas libopenblas.so.0"),
                   "--reference-blas is the CPU backend's yardstick");
}

// A device or a FIFO as --data would block forever (or read /dev/zero until memory ran out): refused.
TEST(CliArgs, DataMustBeAFileOrDirectory) {
  const std::string dir = tmp("fifo");
  fs::create_directories(dir);
  ASSERT_EQ(mkfifo((dir + "/pipe").c_str(), 0600), 0);
  for (const std::string& data : {std::string("/dev/zero"), dir + "/pipe"}) {
    const auto t0 = std::chrono::steady_clock::now();
    expect_bad_input(run(kTrain + "--data " + data + " --out " + dir + "/out"), data);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  }
  expect_bad_input(run("eval --preset tiny --data /dev/zero"), "/dev/zero");
  fs::remove_all(dir);
}

// An unwritable --trace is found before training, not after the whole run has been computed.
TEST(CliArgs, UnwritableTraceIsFoundBeforeTraining) {
  const std::string out = tmp("trace");
  const Result r = run(kTrain + "--mesh dp=2 --trace " + out + "/no/such/dir/t.json --out " + out);
  expect_bad_input(r, "--trace");
  EXPECT_FALSE(fs::exists(out + "/metrics.jsonl")) << "no step ran";
  EXPECT_FALSE(fs::exists(out)) << "and the --out it would have used is not left behind";
}

// A failure found after --out was created (here: the sequence is longer than the model's
// positions, known once the model is built) removes the directories it created, and only those.
TEST(CliArgs, RejectedRunLeavesNoEmptyOut) {
  const std::string parent = tmp("empty_out");
  fs::create_directories(parent);
  expect_bad_input(run("train --preset tiny --seq-len 200 --steps 1 --out " + parent + "/a/b"), "--seq-len");
  EXPECT_TRUE(fs::exists(parent));
  EXPECT_FALSE(fs::exists(parent + "/a"));
  fs::remove_all(parent);
}

// CLI11's own parse errors came on two lines ("Run with --help for more information.").
TEST(CliArgs, ParseErrorsAreOneLine) {
  expect_bad_input(run("train --stepz 3"), "--stepz");
  expect_bad_input(run("train --zero 7 --mesh dp=2"), "--zero");
  expect_bad_input(run("train --mesh"), "--mesh");
}

}  // namespace
