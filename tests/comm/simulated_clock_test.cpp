// The simulated clock of a virtual GPU: compute charged as FLOPs at the modelled rate, links as
// the alpha-beta model, and waiting (for a late peer, for a result) kept apart from both.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "backends/virtual/virtual_cluster.h"
#include "core/comm/trace.h"
#include "core/ops.h"

namespace llama4d {
namespace {

std::vector<TraceEvent> named(const std::vector<TraceEvent>& all, TraceCategory c, TraceLane lane) {
  std::vector<TraceEvent> out;
  for (const TraceEvent& e : all)
    if (e.category == c && e.lane == lane) out.push_back(e);
  return out;
}

// The top-level events of the compute lane tile the compute clock.
double top_level_sum(const std::vector<TraceEvent>& all) {
  double s = 0;
  for (const TraceEvent& e : all)
    if (e.lane == TraceLane::compute && e.depth == 0) s += e.sim_end_us - e.sim_start_us;
  return s;
}

TEST(SimulatedClock, FlopsAdvanceTheComputeClockAtTheModelledRate) {
  VirtualClusterOptions o;
  o.ranks = 1;
  o.cluster.gpu_tflops = 100;  // 1e8 FLOPs per microsecond
  VirtualCluster cluster(o);
  cluster.run([&](ProcessGroup& pg) {
    ops::report_flops(5e8);  // 5 us, outside any span
    {
      ComputeScope outer(pg.trace(), "outer");
      ops::report_flops(1e9);  // 10 us
      {
        ComputeScope inner(pg.trace(), "inner");
        ops::report_flops(2e9);  // 20 us
      }
      ops::report_flops(3e8);  // 3 us
    }
    ops::report_flops(1e8);  // 1 us, outside again
  });
  const std::vector<TraceEvent> ev = cluster.accounting(0).trace.events();
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].name, "compute (outside spans)");
  EXPECT_DOUBLE_EQ(ev[0].sim_end_us, 5.0);
  EXPECT_EQ(ev[1].name, "outer");
  EXPECT_EQ(ev[1].depth, 0);
  EXPECT_DOUBLE_EQ(ev[1].sim_start_us, 5.0);
  EXPECT_DOUBLE_EQ(ev[1].sim_end_us, 38.0);  // contains its child
  EXPECT_DOUBLE_EQ(ev[1].flops, 1.3e9);       // its own work only
  EXPECT_EQ(ev[2].name, "inner");
  EXPECT_EQ(ev[2].depth, 1);
  EXPECT_DOUBLE_EQ(ev[2].sim_start_us, 15.0);
  EXPECT_DOUBLE_EQ(ev[2].sim_end_us, 35.0);
  EXPECT_DOUBLE_EQ(ev[3].sim_start_us, 38.0);
  EXPECT_DOUBLE_EQ(ev[3].sim_end_us, 39.0);
  const TimelineTotals t = cluster.accounting(0).trace.totals();
  EXPECT_DOUBLE_EQ(t.clock_us, 39.0);
  EXPECT_DOUBLE_EQ(t.compute_us, 39.0);
  EXPECT_DOUBLE_EQ(t.flops, 3.9e9);
  EXPECT_DOUBLE_EQ(t.wait_us, 0.0);
  EXPECT_DOUBLE_EQ(top_level_sum(ev), t.clock_us);
}

TEST(SimulatedClock, NoSinkNoCharge) {
  VirtualClusterOptions o;
  o.ranks = 1;
  VirtualCluster cluster(o);
  cluster.run([&](ProcessGroup& pg) {
    ops::ScopedFlopSink none(nullptr);  // e.g. a helper thread's work
    ops::report_flops(1e12);
    EXPECT_DOUBLE_EQ(pg.trace().sim_now_us(), 0.0);
  });
}

// Rank 1 computes 250 us before an all-reduce; rank 0 arrives at 0. Rank 0's comm lane shows
// 250 us of waiting for its peer, then the transfer for exactly the alpha-beta time; its compute
// lane is blocked (exposed) for both.
TEST(SimulatedClock, WaitingForAPeerIsNotTransfer) {
  VirtualClusterOptions o;
  o.ranks = 2;
  VirtualCluster cluster(o);
  const int64_t count = 1000;  // 4000 bytes; 2 ranks: reduce-scatter + all-gather of 2000-byte chunks
  const double ar_us = 2 * (1.0 + 2000 / 450e3);  // two phases, one NVLink message each
  cluster.run([&](ProcessGroup& pg) {
    std::vector<float> v(size_t(count), 1.0f);
    if (pg.rank() == 1) ComputeScope late(pg.trace(), "late", 250.0);
    pg.all_reduce(v.data(), count, DType::f32, ReduceOp::sum);
  });
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    const std::vector<TraceEvent> ev = cluster.accounting(r).trace.events();
    const std::vector<TraceEvent> comm = named(ev, TraceCategory::comm, TraceLane::comm);
    ASSERT_EQ(comm.size(), 1u);
    EXPECT_DOUBLE_EQ(comm[0].sim_start_us, 250.0);
    EXPECT_DOUBLE_EQ(comm[0].sim_end_us - comm[0].sim_start_us, ar_us);  // the transfer only
    const std::vector<TraceEvent> peer_wait = named(ev, TraceCategory::wait, TraceLane::comm);
    ASSERT_EQ(peer_wait.size(), r == 0 ? 1u : 0u);
    if (r == 0) {
      EXPECT_EQ(peer_wait[0].name, "wait for peers: all_reduce");
      EXPECT_DOUBLE_EQ(peer_wait[0].sim_start_us, 0.0);
      EXPECT_DOUBLE_EQ(peer_wait[0].sim_end_us, 250.0);
    }
    const std::vector<TraceEvent> blocked = named(ev, TraceCategory::wait, TraceLane::compute);
    ASSERT_EQ(blocked.size(), 1u);
    EXPECT_DOUBLE_EQ(blocked[0].sim_start_us, r == 0 ? 0.0 : 250.0);
    EXPECT_DOUBLE_EQ(blocked[0].sim_end_us, 250.0 + ar_us);
    const TimelineTotals t = cluster.accounting(r).trace.totals();
    EXPECT_DOUBLE_EQ(t.comm_us, ar_us);
    EXPECT_DOUBLE_EQ(t.wait_us, r == 0 ? 250.0 + ar_us : ar_us);
    EXPECT_DOUBLE_EQ(t.clock_us, 250.0 + ar_us);
    EXPECT_DOUBLE_EQ(top_level_sum(ev), t.clock_us);
  }
}

// A receive posted at 0 for a send made at 300 us waits for the sender, then transfers.
TEST(SimulatedClock, ARecvWaitsForItsSenderApartFromTheTransfer) {
  VirtualClusterOptions o;
  o.ranks = 2;
  VirtualCluster cluster(o);
  const int64_t count = 1000;
  const double p2p_us = 1.0 + 4000 / 450e3;
  cluster.run([&](ProcessGroup& pg) {
    std::vector<float> v(size_t(count), 2.0f);
    if (pg.rank() == 0) {
      { ComputeScope c(pg.trace(), "produce", 300.0); }
      pg.send(v.data(), count, DType::f32, 1);
    } else {
      pg.recv(v.data(), count, DType::f32, 0);
    }
  });
  const std::vector<TraceEvent> ev = cluster.accounting(1).trace.events();
  const std::vector<TraceEvent> peer_wait = named(ev, TraceCategory::wait, TraceLane::comm);
  ASSERT_EQ(peer_wait.size(), 1u);
  EXPECT_DOUBLE_EQ(peer_wait[0].sim_end_us, 300.0);
  const std::vector<TraceEvent> comm = named(ev, TraceCategory::comm, TraceLane::comm);
  ASSERT_EQ(comm.size(), 1u);
  EXPECT_DOUBLE_EQ(comm[0].sim_start_us, 300.0);
  EXPECT_DOUBLE_EQ(comm[0].sim_end_us, 300.0 + p2p_us);
  EXPECT_DOUBLE_EQ(cluster.accounting(1).trace.totals().clock_us, 300.0 + p2p_us);
}

// Every collective's span on the comm lane lasts its alpha-beta time, written out here for 8 ranks
// on one node (NVLink: 1 us + bytes / 450 GB/s), with each rank 10 us later than the one before,
// so the early ones wait for peers before every call and that wait is never part of the span.
TEST(SimulatedClock, EveryCollectiveLastsItsAlphaBetaTime) {
  const int n = 8;
  const int64_t c = 1000;  // elements per chunk, 4000 bytes
  auto hop = [](double bytes) { return 1.0 + bytes / 450e3; };
  for (ReduceAlgo algo : {ReduceAlgo::ordered, ReduceAlgo::ring}) {
    SCOPED_TRACE(algo == ReduceAlgo::ring ? "ring" : "ordered");
    const bool ring = algo == ReduceAlgo::ring;
    // ring: n-1 steps of one chunk per hop; direct: one phase, the busiest rank moves (n-1) chunks.
    const double half = ring ? (n - 1) * hop(4.0 * c) : hop(4.0 * c * (n - 1));
    const std::vector<std::pair<std::string, double>> expected = {
        {"all_reduce", 2 * half},
        {"reduce_scatter", half},
        {"all_gather", half},
        {"broadcast", (n - 1) * 1.0 + 4.0 * c / 450e3},  // pipelined chain: every hop's latency, one pass
        {"all_to_all", hop(4.0 * c * (n - 1))},           // direct: (n-1) blocks out and in
        {"barrier", 3 * 1.0},                              // dissemination: ceil(log2 8) rounds of latency
        {"send", hop(4.0 * c)},
    };
    VirtualClusterOptions o;
    o.ranks = n;
    o.algo = algo;
    VirtualCluster cluster(o);
    cluster.run([&](ProcessGroup& pg) {
      std::vector<float> a(size_t(n * c), 1.0f), b(size_t(n * c), 0.0f);
      const int r = pg.rank();
      auto late = [&] { ComputeScope s(pg.trace(), "skew", 10.0 * r); };
      late();
      pg.all_reduce(a.data(), n * c, DType::f32, ReduceOp::sum);
      late();
      pg.reduce_scatter(b.data(), a.data(), c, DType::f32, ReduceOp::sum);
      late();
      pg.all_gather(a.data(), b.data(), c, DType::f32);
      late();
      pg.broadcast(a.data(), c, DType::f32);
      late();
      pg.all_to_all(b.data(), a.data(), c, DType::f32);
      late();
      pg.barrier();
      late();
      if (r % 2 == 0) pg.send(a.data(), c, DType::f32, r + 1);
      else pg.recv(b.data(), c, DType::f32, r - 1);
    });
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE(r);
      std::map<std::string, double> spans, peer_waits;
      for (const TraceEvent& e : cluster.accounting(r).trace.events()) {
        if (e.category == TraceCategory::comm) spans[e.name] += e.sim_end_us - e.sim_start_us;
        if (e.category == TraceCategory::wait && e.lane == TraceLane::comm) peer_waits[e.name] += 1;
      }
      for (const auto& [op, us] : expected) {
        const std::string name = op == "send" && r % 2 ? "recv" : op;
        // The receiver is 10 us behind its sender: the eager send's data arrived while it computed.
        EXPECT_NEAR(spans[name], name == "recv" ? 0.0 : us, 1e-9) << name;
        // Every rank but the last arrives early at every collective (the p2p pair: the receiver).
        if (op != "send") {
          EXPECT_EQ(peer_waits["wait for peers: " + name], r < n - 1 ? 1 : 0) << name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace llama4d
