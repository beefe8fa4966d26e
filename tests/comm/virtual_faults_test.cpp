// Faults on the virtual backend never hang: a rank that throws, stalls mid-collective, never
// arrives or returns early makes every rank fail with an error naming it, within the timeout;
// mismatched calls are reported with both calls. Every scenario runs under a deadline.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "backends/virtual/virtual_cluster.h"
#include "core/error.h"
#include "tests/comm/test_util.h"

namespace llama4d {
namespace {

using test::contains;
using test::within_deadline;
using namespace std::chrono_literals;

struct Outcome {
  std::string error;        // what run() threw
  std::string error_type;   // "CommError", "OutOfMemoryError", ...
  std::vector<RankFailure> failures;
};

Outcome run_scenario(VirtualClusterOptions o, const std::function<void(ProcessGroup&)>& fn) {
  Outcome out;
  within_deadline(20, [&] {
    VirtualCluster cluster(o);
    try {
      cluster.run(fn);
    } catch (const OutOfMemoryError& e) {
      out.error = e.what();
      out.error_type = "OutOfMemoryError";
    } catch (const CommError& e) {
      out.error = e.what();
      out.error_type = "CommError";
    } catch (const std::exception& e) {
      out.error = e.what();
      out.error_type = "other";
    }
    out.failures = cluster.failures();
  });
  return out;
}

// Every rank appears in the failures, and those that did not cause it name the culprit.
void expect_all_failed_naming(const Outcome& out, int ranks, int culprit) {
  ASSERT_EQ(int(out.failures.size()), ranks) << out.error;
  for (const RankFailure& f : out.failures)
    if (f.rank != culprit) {
      EXPECT_TRUE(contains(f.message, "rank " + std::to_string(culprit))) << f.message;
    }
}

VirtualClusterOptions opts(int ranks, std::chrono::milliseconds timeout) {
  VirtualClusterOptions o;
  o.ranks = ranks;
  o.timeout = timeout;
  return o;
}

void some_all_reduces(ProcessGroup& pg, int times) {
  std::vector<float> v(16, 1.0f);
  for (int i = 0; i < times; ++i) pg.all_reduce(v.data(), 16, DType::f32, ReduceOp::sum);
}

TEST(VirtualFaults, RankThatThrowsFailsEveryRank) {
  // The timeout is long: only the abort can make the others fail quickly.
  const auto t0 = std::chrono::steady_clock::now();
  const Outcome out = run_scenario(opts(4, 30s), [](ProcessGroup& pg) {
    if (pg.rank() == 2) throw std::runtime_error("boom on rank two");
    some_all_reduces(pg, 3);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_EQ(out.error_type, "CommError");
  EXPECT_TRUE(contains(out.error, "rank 2 failed: boom on rank two")) << out.error;
  expect_all_failed_naming(out, 4, 2);
  EXPECT_EQ(out.failures[0].rank, 2);
}

TEST(VirtualFaults, RankThatDiesMidCollectiveIsNamed) {
  VirtualClusterOptions o = opts(4, 30s);
  o.fault_hook = [](int rank, CommOp op, int64_t seq) {
    if (rank == 1 && op == CommOp::all_reduce && seq == 1) throw std::runtime_error("GPU fell off the bus");
  };
  const Outcome out = run_scenario(o, [](ProcessGroup& pg) { some_all_reduces(pg, 3); });
  EXPECT_EQ(out.error_type, "CommError");
  EXPECT_TRUE(contains(out.error, "rank 1 failed in the middle of all_reduce(count=16, F32, sum) #1")) << out.error;
  EXPECT_TRUE(contains(out.error, "GPU fell off the bus")) << out.error;
  expect_all_failed_naming(out, 4, 1);
}

TEST(VirtualFaults, RankThatStallsMidCollectiveTimesOut) {
  VirtualClusterOptions o = opts(4, 300ms);
  o.fault_hook = [](int rank, CommOp, int64_t seq) {
    if (rank == 3 && seq == 1) std::this_thread::sleep_for(1500ms);
  };
  const Outcome out = run_scenario(o, [](ProcessGroup& pg) { some_all_reduces(pg, 3); });
  EXPECT_TRUE(contains(out.error, "timeout after 300 ms: rank 3 stopped in the middle of all_reduce")) << out.error;
  expect_all_failed_naming(out, 4, 3);
  // The others gave up at the timeout, long before rank 3 woke up.
  EXPECT_EQ(out.failures.back().rank, 3);
}

TEST(VirtualFaults, RankThatNeverArrivesTimesOut) {
  const Outcome out = run_scenario(opts(3, 300ms), [](ProcessGroup& pg) {
    if (pg.rank() == 1) std::this_thread::sleep_for(1500ms);
    some_all_reduces(pg, 1);
  });
  EXPECT_TRUE(contains(out.error, "timeout after 300 ms: rank 1 never called all_reduce(count=16, F32, sum) #0 on "
                                  "group 'world'"))
      << out.error;
  expect_all_failed_naming(out, 3, 1);
}

TEST(VirtualFaults, RankThatReturnsEarlyIsNamed) {
  const auto t0 = std::chrono::steady_clock::now();
  const Outcome out = run_scenario(opts(4, 30s), [](ProcessGroup& pg) {
    if (pg.rank() == 3) return;
    some_all_reduces(pg, 2);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_TRUE(contains(out.error, "rank 3 finished its function without calling all_reduce")) << out.error;
  EXPECT_EQ(out.failures.size(), 3u);  // rank 3 itself did nothing wrong
}

TEST(VirtualFaults, MismatchedOperationsReportBothCalls) {
  const Outcome out = run_scenario(opts(2, 30s), [](ProcessGroup& pg) {
    std::vector<float> a(20, 1.0f), b(10, 1.0f);
    if (pg.rank() == 0)
      pg.all_reduce(a.data(), 10, DType::f32, ReduceOp::sum);
    else
      pg.all_gather(a.data(), b.data(), 10, DType::f32);
  });
  EXPECT_TRUE(contains(out.error, "collective mismatch on group 'world'")) << out.error;
  EXPECT_TRUE(contains(out.error, "rank 0 called all_reduce(count=10, F32, sum)")) << out.error;
  EXPECT_TRUE(contains(out.error, "rank 1 called all_gather(count=10 per rank, F32)")) << out.error;
  EXPECT_EQ(out.failures.size(), 2u);
}

TEST(VirtualFaults, MismatchedCountsReportBothCalls) {
  const Outcome out = run_scenario(opts(3, 30s), [](ProcessGroup& pg) {
    std::vector<double> a(12, 1.0);
    pg.all_reduce(a.data(), pg.rank() == 2 ? 12 : 10, DType::f64, ReduceOp::avg);
  });
  EXPECT_TRUE(contains(out.error, "different counts")) << out.error;
  EXPECT_TRUE(contains(out.error, "called all_reduce(count=10, F64, avg)")) << out.error;
  EXPECT_TRUE(contains(out.error, "rank 2 called all_reduce(count=12, F64, avg)")) << out.error;
}

TEST(VirtualFaults, MismatchedAllToAllCounts) {
  const Outcome out = run_scenario(opts(2, 30s), [](ProcessGroup& pg) {
    std::vector<int32_t> in(8, 1), out(8, 0);
    // Rank 0 sends 3 elements to rank 1, but rank 1 expects 2 from rank 0.
    const std::vector<int64_t> send = pg.rank() == 0 ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{2, 1};
    const std::vector<int64_t> recv = pg.rank() == 0 ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{2, 1};
    pg.all_to_all_v(out.data(), recv, in.data(), send, DType::i32);
  });
  EXPECT_TRUE(contains(out.error, "all_to_all mismatch")) << out.error;
  EXPECT_TRUE(contains(out.error, "rank 0 sends 3 elements to rank 1, which expects 2")) << out.error;
}

TEST(VirtualFaults, RecvWithoutSendTimesOut) {
  const Outcome out = run_scenario(opts(2, 300ms), [](ProcessGroup& pg) {
    std::vector<float> v(4, 0.0f);
    if (pg.rank() == 1)
      pg.recv(v.data(), 4, DType::f32, 0);
    else
      std::this_thread::sleep_for(1500ms);
  });
  EXPECT_TRUE(contains(out.error, "timeout after 300 ms: rank 1 waited in recv(count=4, F32, from 0, tag 0)")) << out.error;
  EXPECT_TRUE(contains(out.error, "rank 0 never sent")) << out.error;
}

TEST(VirtualFaults, SendRecvMismatchReportsBothCalls) {
  const Outcome out = run_scenario(opts(2, 30s), [](ProcessGroup& pg) {
    std::vector<float> v(8, 0.0f);
    if (pg.rank() == 0)
      pg.send(v.data(), 5, DType::f32, 1);
    else
      pg.recv(v.data(), 4, DType::f32, 0);
  });
  EXPECT_TRUE(contains(out.error, "send/recv mismatch")) << out.error;
  EXPECT_TRUE(contains(out.error, "rank 0 called send(count=5, F32, to 1, tag 0)")) << out.error;
  EXPECT_TRUE(contains(out.error, "rank 1 called recv(count=4, F32, from 0, tag 0)")) << out.error;
}

TEST(VirtualFaults, FailureReachesRanksInOtherGroups) {
  const Outcome out = run_scenario(opts(4, 30s), [](ProcessGroup& world) {
    const bool low = world.rank() < 2;
    std::shared_ptr<ProcessGroup> half = world.new_group(low ? std::vector<int>{0, 1} : std::vector<int>{2, 3}, "half");
    if (world.rank() == 0) throw InputError("bad config on rank 0");
    if (world.rank() >= 2) some_all_reduces(*half, 5);  // fine: rank 0 is not in this group
    world.barrier();                                      // everyone meets rank 0's failure here
  });
  // A llama4d error keeps its type and message.
  EXPECT_EQ(out.error_type, "other");
  EXPECT_EQ(out.error, "bad config on rank 0");
  expect_all_failed_naming(out, 4, 0);
}

TEST(VirtualFaults, OutOfMemoryNamesRankCapacityAndLiveMemory) {
  VirtualClusterOptions o = opts(3, 30s);
  o.cluster.hbm_bytes = 1 << 20;
  const Outcome out = run_scenario(o, [](ProcessGroup& pg) {
    MemoryReservation params(pg.memory(), MemoryCategory::params, 600 << 10, "weights");
    if (pg.rank() == 1) MemoryReservation acts(pg.memory(), MemoryCategory::activations, 512 << 10, "layer 0 attention");
    pg.barrier();
  });
  EXPECT_EQ(out.error_type, "OutOfMemoryError");
  EXPECT_TRUE(contains(out.error, "rank 1 out of memory")) << out.error;
  EXPECT_TRUE(contains(out.error, "512.0 KiB of activations (layer 0 attention)")) << out.error;
  EXPECT_TRUE(contains(out.error, "capacity 1.0 MiB")) << out.error;
  EXPECT_TRUE(contains(out.error, "params 600.0 KiB")) << out.error;
  expect_all_failed_naming(out, 3, 1);
}

TEST(VirtualFaults, AsyncWorkFailsWhenAPeerDies) {
  std::mutex mu;
  std::vector<std::string> seen;
  const Outcome out = run_scenario(opts(3, 30s), [&](ProcessGroup& pg) {
    if (pg.rank() == 2) throw std::runtime_error("rank two crashed");
    std::vector<float> v(64, 1.0f);
    AllReduceOptions ao{.async_op = true};
    auto w = pg.all_reduce(v.data(), 64, DType::f32, ReduceOp::sum, ao);
    try {
      w->wait();
    } catch (const CommError& e) {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(e.what());
      EXPECT_TRUE(w->is_completed());
      throw;
    }
  });
  ASSERT_EQ(seen.size(), 2u);
  for (const std::string& s : seen) EXPECT_TRUE(contains(s, "rank 2 failed: rank two crashed")) << s;
}

}  // namespace
}  // namespace llama4d
