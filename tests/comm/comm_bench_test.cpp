// The comm benchmark engine and the `llama4d bench comm` command.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "bench/comm_bench.h"
#include "cli/commands.h"
#include "core/error.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

CommBenchOptions small_options() {
  CommBenchOptions o;
  o.ranks = 3;
  o.min_bytes = 1024;
  o.max_bytes = 4096;
  o.iters = 2;
  o.warmup = 1;
  return o;
}

TEST(CommBench, RowsFollowNcclTestsConventions) {
  const CommBenchReport report = run_comm_bench(small_options());
  EXPECT_EQ(report.ranks, 3);
  EXPECT_GT(report.memcpy_gbps, 0.0);
  ASSERT_EQ(report.rows.size(), 6u * 3u);  // six ops x sizes 1, 2, 4 KiB
  const double n = 3;
  for (const CommBenchRow& r : report.rows) {
    SCOPED_TRACE(r.op + " " + std::to_string(r.bytes));
    EXPECT_EQ(r.iters, 2);
    EXPECT_GT(r.time_us, 0.0);
    EXPECT_NEAR(r.algbw_gbps, double(r.bytes) / (r.time_us * 1e3), 1e-9 * r.algbw_gbps);
    double factor = 1.0;
    if (r.op == "all_reduce") factor = 2 * (n - 1) / n;
    if (r.op == "reduce_scatter" || r.op == "all_gather" || r.op == "all_to_all") factor = (n - 1) / n;
    EXPECT_NEAR(r.busbw_gbps, r.algbw_gbps * factor, 1e-9 * r.algbw_gbps);
    EXPECT_EQ(r.bytes, r.count * 4);
    if (r.op == "all_reduce" || r.op == "broadcast" || r.op == "sendrecv")
      EXPECT_TRUE(r.bytes == 1024 || r.bytes == 2048 || r.bytes == 4096);
    else
      EXPECT_EQ(r.count % 3, 0);  // N blocks of equal size
    EXPECT_GT(r.sim_us, 0.0);
  }
  // The model's time for a 4 KiB ring all_reduce on 3 NVLink ranks: 2(N-1) steps of
  // alpha + chunk / bandwidth with balanced chunks of 342, 341, 341 floats (slowest hop: 342).
  const CommBenchRow& ar = report.rows[2];
  ASSERT_EQ(ar.op, "all_reduce");
  EXPECT_NEAR(ar.sim_us, 4 * (1.0 + 342 * 4 / 450e3), 1e-9);

  const nlohmann::json j = report.to_json();
  EXPECT_EQ(j.at("backend"), "virtual");
  EXPECT_EQ(j.at("buffers"), "private");
  EXPECT_EQ(j.at("ranks"), 3);
  EXPECT_EQ(j.at("rows").size(), 18u);
  for (const char* key : {"op", "bytes", "count", "time_us", "algbw_gbps", "busbw_gbps", "sim_us"})
    EXPECT_TRUE(j.at("rows")[0].contains(key)) << key;
  const std::string table = report.table();
  EXPECT_NE(table.find("memcpy bandwidth"), std::string::npos);
  EXPECT_NE(table.find("busbw(GB/s)"), std::string::npos);
}
LLAMA4D_TIER(CommBench, RowsFollowNcclTestsConventions, full);  // the collectives of the other CommBench cases

TEST(CommBench, RejectsBadOptions) {
  CommBenchOptions o = small_options();
  o.ops = {"all_reduse"};
  EXPECT_THROW(run_comm_bench(o), InputError);
  o = small_options();
  o.min_bytes = 8192;
  EXPECT_THROW(run_comm_bench(o), InputError);
  o = small_options();
  o.backend = "tpu";
  EXPECT_THROW(run_comm_bench(o), InputError);
}

// Without a GPU (or NCCL) the NCCL backend is refused up front with the reason; with one, a world
// of one runs.
TEST(CommBench, NcclRunsOrSaysWhyNot) {
  CommBenchOptions o;
  o.backend = "nccl";
  o.ops = {"all_reduce"};
  o.min_bytes = o.max_bytes = 1024;
  o.iters = 2;
  try {
    const CommBenchReport r = run_comm_bench(o);
    EXPECT_EQ(r.ranks, 1);
    ASSERT_EQ(r.rows.size(), 1u);
    EXPECT_GT(r.rows[0].time_us, 0);
  } catch (const InputError& e) {
    const std::string msg = e.what();
#ifdef LLAMA4D_HAVE_NCCL
    EXPECT_EQ(msg.rfind("--backend nccl: ", 0), 0u) << msg;
#else
    EXPECT_NE(msg.find("this build has no NCCL backend"), std::string::npos) << msg;
#endif
  }
}

TEST(CommBench, CliPrintsOneJsonObject) {
  CLI::App app;
  CLI::App* bench = app.add_subcommand("bench");
  cli::add_bench_comm_command(*bench);
  testing::internal::CaptureStdout();
  app.parse("bench comm --ranks 2 --op all_gather --min-bytes 1K --max-bytes 2K --iters 2 --dtype bf16 --symmetric --json",
            false);
  const std::string out = testing::internal::GetCapturedStdout();
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j.at("ranks"), 2);
  EXPECT_EQ(j.at("dtype"), "BF16");
  EXPECT_EQ(j.at("buffers"), "symmetric");
  ASSERT_EQ(j.at("rows").size(), 2u);
  EXPECT_EQ(j.at("rows")[0].at("op"), "all_gather");
  EXPECT_EQ(j.at("rows")[1].at("bytes"), 2048);
}

TEST(CommBench, WritesAChromeTrace) {
  CommBenchOptions o = small_options();
  o.ops = {"all_reduce"};
  o.max_bytes = 1024;
  o.trace_path = testing::TempDir() + "comm_bench_trace.json";
  run_comm_bench(o);
  std::ifstream in(o.trace_path);
  ASSERT_TRUE(in.good());
  const nlohmann::json j = nlohmann::json::parse(in);
  int comm = 0;
  for (const auto& e : j.at("traceEvents")) comm += e.value("cat", "") == "comm";
  // 3 ranks x (warm-up + 2 timed all_reduces + barrier + max-time all_reduce) x 2 timelines
  EXPECT_EQ(comm, 3 * 5 * 2);
}

TEST(CommBench, CliTableAndErrors) {
  CLI::App app;
  CLI::App* bench = app.add_subcommand("bench");
  cli::add_bench_comm_command(*bench);
  testing::internal::CaptureStdout();
  app.parse("bench comm --ranks 2 --op broadcast --min-bytes 1024 --max-bytes 1024 --iters 2 --algo ordered", false);
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("broadcast"), std::string::npos);
  EXPECT_NE(out.find("algo ordered"), std::string::npos);

  CLI::App app2;
  CLI::App* bench2 = app2.add_subcommand("bench");
  cli::add_bench_comm_command(*bench2);
  EXPECT_THROW(app2.parse("bench comm --ranks 2 --dtype f8", false), InputError);

  // --ranks under a process backend was accepted and ignored; refused before any MPI or NCCL start.
  for (const std::string backend : {"mpi", "nccl"}) {
    CLI::App app3;
    CLI::App* bench3 = app3.add_subcommand("bench");
    cli::add_bench_comm_command(*bench3);
    try {
      app3.parse("bench comm --backend " + backend + " --ranks 2", false);
      ADD_FAILURE() << backend << ": --ranks was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("--ranks counts virtual GPUs"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace llama4d
