// The cluster model on the virtual backend: bytes and link classes per rank, simulated time
// from the alpha-beta model, HBM accounting, traces, summaries.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "backends/virtual/virtual_cluster.h"
#include "core/comm/comm_model.h"
#include "core/comm/trace.h"
#include "core/error.h"
#include "tests/comm/test_util.h"

namespace llama4d {
namespace {

using test::contains;

TEST(Cluster, LinksNodesAndAlphaBeta) {
  const ClusterSpec c = ClusterSpec::for_ranks(16, 8);
  EXPECT_EQ(c.nodes, 2);
  EXPECT_EQ(c.node_of(7), 0);
  EXPECT_EQ(c.node_of(8), 1);
  EXPECT_EQ(c.link_between(3, 5), LinkClass::nvlink);
  EXPECT_EQ(c.link_between(7, 8), LinkClass::infiniband);
  EXPECT_EQ(c.link_between(4, 4), LinkClass::self);
  // H100 figures: NVLink 450 GB/s per direction + 1 us, IB 50 GB/s + 5 us.
  EXPECT_DOUBLE_EQ(c.transfer_us(LinkClass::nvlink, 450'000), 1.0 + 1.0);
  EXPECT_DOUBLE_EQ(c.transfer_us(LinkClass::infiniband, 50'000), 5.0 + 1.0);
  EXPECT_DOUBLE_EQ(c.transfer_us(LinkClass::infiniband, 0), 0.0);
  EXPECT_EQ(scaled_hbm_bytes(kLlama3_8bParams), kH100HbmBytes);
  EXPECT_EQ(scaled_hbm_bytes(kLlama3_8bParams / 2), kH100HbmBytes / 2);
  EXPECT_THROW(ClusterSpec::for_ranks(0), InputError);
  ClusterSpec bad = c;
  bad.nvlink.bandwidth_gbps = 0;
  EXPECT_THROW(bad.validate(16), InputError);
  EXPECT_THROW(c.validate(17), InputError);
  EXPECT_TRUE(contains(c.describe(), "2 nodes x 8 GPUs"));
}

// One all_reduce of S bytes on 16 ranks over two 8-GPU nodes: every rank sends 2(N-1)/N * S;
// in the ring only the hops 7 -> 8 and 15 -> 0 cross nodes, so ranks 7 and 15 send everything
// over InfiniBand and the ring's steps are paced by IB.
TEST(VirtualAccounting, RingAcrossNodesCountsLinksAndTime) {
  VirtualClusterOptions o;
  o.ranks = 16;
  o.algo = ReduceAlgo::ring;
  VirtualCluster cluster(o);
  const int64_t count = 16 * 1024;  // divisible by 16
  const int64_t S = count * 4;
  cluster.run([&](ProcessGroup& pg) {
    std::vector<float> v(size_t(count), 1.0f);
    AllReduceOptions ao{.label = "grads"};
    pg.all_reduce(v.data(), count, DType::f32, ReduceOp::sum, ao);
    for (float x : v) ASSERT_EQ(x, 16.0f);
  });
  const int n = 16;
  const double step_us = 5.0 + double(S / n) / 50e3;  // the slowest hop of every step is IB
  for (int r = 0; r < n; ++r) {
    const std::vector<TrafficRecord> recs = cluster.accounting(r).traffic.records();
    ASSERT_EQ(recs.size(), 1u);
    const TrafficRecord& t = recs[0];
    EXPECT_EQ(t.bytes_sent, 2 * (n - 1) * S / n);
    EXPECT_EQ(t.bytes_recv, 2 * (n - 1) * S / n);
    EXPECT_EQ(t.sent_ib, (r == 7 || r == 15) ? t.bytes_sent : 0) << r;
    EXPECT_EQ(t.sent_nvlink, (r == 7 || r == 15) ? 0 : t.bytes_sent) << r;
    EXPECT_EQ(t.label, "grads");
    EXPECT_EQ(t.algorithm, "ring");
    EXPECT_NEAR(t.sim_end_us - t.sim_start_us, 2 * (n - 1) * step_us, 1e-6);
  }
  const std::string summary = cluster.traffic_summary();
  EXPECT_TRUE(contains(summary, "world")) << summary;
  EXPECT_TRUE(contains(summary, "nvlink,nvlink+ib") || contains(summary, "ib,nvlink")) << summary;
  EXPECT_TRUE(contains(cluster.rank_summary(), "over ib"));
}

// `ordered` is a direct (two-shot) all-reduce: each phase sends (N-1)/N * S per rank at once,
// limited by the per-GPU link bandwidth.
TEST(VirtualAccounting, OrderedAllReduceTimeOnOneNode) {
  VirtualClusterOptions o;
  o.ranks = 8;
  o.algo = ReduceAlgo::ordered;
  VirtualCluster cluster(o);
  const int64_t count = 8 * 4096, S = count * 4;
  cluster.run([&](ProcessGroup& pg) {
    std::vector<float> v(size_t(count), float(pg.rank()));
    pg.all_reduce(v.data(), count, DType::f32, ReduceOp::sum);
  });
  const TrafficRecord t = cluster.accounting(5).traffic.records().at(0);
  EXPECT_EQ(t.bytes_sent, 2 * 7 * S / 8);
  EXPECT_EQ(t.algorithm, "direct");
  EXPECT_NEAR(t.sim_end_us - t.sim_start_us, 2 * (1.0 + double(7 * S / 8) / 450e3), 1e-6);
}

TEST(VirtualAccounting, RingAndOrderedDifferInTheLastBits) {
  // Same inputs, two algorithms: ordered equals the sequential rank-order sum exactly; ring
  // adds in a different order per chunk and differs somewhere.
  const int n = 8;
  const int64_t count = 4096;
  auto value = [](int r, int64_t i) { return std::ldexp(float((r * 131 + i * 71) % 1999) - 999.0f, int((i + r) % 23) - 11); };
  std::vector<std::vector<float>> results;
  for (ReduceAlgo algo : {ReduceAlgo::ordered, ReduceAlgo::ring}) {
    VirtualClusterOptions o;
    o.ranks = n;
    o.algo = algo;
    VirtualCluster cluster(o);
    std::vector<float> rank0;
    cluster.run([&](ProcessGroup& pg) {
      std::vector<float> v(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) v[size_t(i)] = value(pg.rank(), i);
      pg.all_reduce(v.data(), count, DType::f32, ReduceOp::sum);
      if (pg.rank() == 0) rank0 = v;
    });
    results.push_back(rank0);
  }
  int64_t differ = 0;
  for (int64_t i = 0; i < count; ++i) {
    float seq = value(0, i);
    for (int r = 1; r < n; ++r) seq += value(r, i);
    EXPECT_EQ(std::memcmp(&results[0][size_t(i)], &seq, 4), 0) << "ordered != sequential at " << i;
    differ += std::memcmp(&results[0][size_t(i)], &results[1][size_t(i)], 4) != 0;
  }
  EXPECT_GT(differ, 0) << "ring and ordered gave identical bits everywhere";
}

TEST(VirtualAccounting, SimulatedClocksFollowTheSlowestRankAndOverlap) {
  VirtualClusterOptions o;
  o.ranks = 4;
  o.algo = ReduceAlgo::ring;
  VirtualCluster cluster(o);
  const int64_t count = 4 * 1000;
  const double ar_us = 2 * 3 * (1.0 + 1000 * 4 / 450e3);  // 2(N-1) steps, one NVLink hop each
  cluster.run([&](ProcessGroup& pg) {
    std::vector<float> v(size_t(count), 1.0f);
    { ComputeScope c(pg.trace(), "forward", 100.0 * (pg.rank() + 1)); }  // rank 3 is slowest: 400 us
    pg.all_reduce(v.data(), count, DType::f32, ReduceOp::sum);
    // Synchronous: everyone waited for rank 3, then for the transfer.
    EXPECT_NEAR(pg.trace().sim_now_us(), 400.0 + ar_us, 1e-6);
    // Async: the second all_reduce overlaps 1000 us of compute and costs nothing extra.
    AllReduceOptions ao{.async_op = true};
    auto w = pg.all_reduce(v.data(), count, DType::f32, ReduceOp::sum, ao);
    { ComputeScope c(pg.trace(), "backward", 1000.0); }
    w->wait();
    EXPECT_NEAR(pg.trace().sim_now_us(), 400.0 + ar_us + 1000.0, 1e-6);
  });
  // Rank 0: two compute spans, two transfers, 300 us waiting for rank 3 on the comm lane, and
  // one blocked stretch on the compute lane (the synchronous call); the async one was hidden.
  const std::vector<TraceEvent> ev = cluster.accounting(0).trace.events();
  int compute = 0, comm = 0, peer_waits = 0, blocked = 0;
  for (const TraceEvent& e : ev) {
    if (e.category == TraceCategory::compute) ++compute;
    if (e.category == TraceCategory::comm) {
      ++comm;
      EXPECT_NEAR(e.sim_end_us - e.sim_start_us, ar_us, 1e-9);
      EXPECT_LE(e.wall_start_us, e.wall_end_us);
    }
    if (e.category == TraceCategory::wait && e.lane == TraceLane::comm) {
      ++peer_waits;
      EXPECT_NEAR(e.sim_start_us, 100.0, 1e-9);
      EXPECT_NEAR(e.sim_end_us, 400.0, 1e-9);  // the collective started when the slowest rank arrived
    }
    if (e.category == TraceCategory::wait && e.lane == TraceLane::compute) {
      ++blocked;
      EXPECT_NEAR(e.sim_end_us - e.sim_start_us, 300.0 + ar_us, 1e-9);
    }
  }
  EXPECT_EQ(compute, 2);
  EXPECT_EQ(comm, 2);
  EXPECT_EQ(peer_waits, 1);
  EXPECT_EQ(blocked, 1);

  const nlohmann::json j = chrome_trace_json(cluster.traces());
  int complete = 0, sim_pids = 0, waits = 0;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    ++complete;
    EXPECT_TRUE(e.contains("ts") && e.contains("dur"));
    sim_pids += e.at("pid").get<int>() >= 100000;
    waits += e.at("cat") == "wait";
  }
  // Every rank: 2 compute spans and 2 transfers on both timelines, plus its waits (simulated
  // only): ranks 0-2 waited for rank 3 (a comm-lane wait each) and every rank was blocked once.
  EXPECT_EQ(waits, 3 + 4);
  EXPECT_EQ(complete, 4 * 4 * 2 + waits);
  EXPECT_EQ(sim_pids, 4 * 4 + waits);
}

TEST(MemoryTracker, PeaksCategoriesAndOutOfMemory) {
  MemoryTracker m(3, 1000);
  m.allocate(MemoryCategory::params, 400, "weights");
  {
    MemoryReservation acts(m, MemoryCategory::activations, 300, "layer 1");
    EXPECT_EQ(m.live_total(), 700);
  }
  m.allocate(MemoryCategory::grads, 400);
  EXPECT_EQ(m.live_total(), 800);
  EXPECT_EQ(m.peak_total(), 800);
  EXPECT_EQ(m.peak(MemoryCategory::activations), 300);
  EXPECT_EQ(m.live(MemoryCategory::activations), 0);
  try {
    m.allocate(MemoryCategory::optimizer, 201, "adam moments");
    FAIL() << "no OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "rank 3 out of memory")) << msg;
    EXPECT_TRUE(contains(msg, "201 B of optimizer (adam moments)")) << msg;
    EXPECT_TRUE(contains(msg, "capacity 1000 B")) << msg;
    EXPECT_TRUE(contains(msg, "params 400 B, grads 400 B")) << msg;
  }
  EXPECT_EQ(m.live_total(), 800);  // a failed allocation changes nothing
  m.release(MemoryCategory::grads, 400);
  EXPECT_THROW(m.release(MemoryCategory::grads, 1), Error);
  m.reset_peaks();
  EXPECT_EQ(m.peak_total(), 400);
  EXPECT_TRUE(contains(m.summary(), "peak 400 B of 1000 B"));
  MemoryTracker unlimited(0, 0);
  unlimited.allocate(MemoryCategory::other, int64_t(1) << 50);
  EXPECT_EQ(format_bytes(3 << 20), "3.0 MiB");
}

TEST(VirtualAccounting, EagerSendsHoldCommBuffersUntilReceived) {
  VirtualClusterOptions o;
  o.ranks = 2;
  VirtualCluster cluster(o);
  cluster.run([](ProcessGroup& pg) {
    std::vector<double> v(1000, 1.0);
    if (pg.rank() == 0) {
      pg.send(v.data(), 1000, DType::f64, 1);
      EXPECT_GE(pg.memory().peak(MemoryCategory::comm_buffers), 8000);
    }
    pg.barrier();
    if (pg.rank() == 1) pg.recv(v.data(), 1000, DType::f64, 0);
    pg.barrier();
  });
  EXPECT_EQ(cluster.accounting(0).memory.live(MemoryCategory::comm_buffers), 0);
  EXPECT_EQ(cluster.accounting(0).memory.peak(MemoryCategory::comm_buffers), 8000);
}

TEST(VirtualGroups, SameRanksTwiceMakeDistinctGroups) {
  VirtualClusterOptions o;
  o.ranks = 4;
  VirtualCluster cluster(o);
  cluster.run([](ProcessGroup& world) {
    const std::vector<int> evens = {0, 2}, odds = {1, 3};
    const std::vector<int>& mine = world.rank() % 2 ? odds : evens;
    auto a = world.new_group(mine, "a");
    auto b = world.new_group(mine, "b");
    EXPECT_EQ(a->size(), 2);
    EXPECT_EQ(a->rank(), world.rank() / 2);
    EXPECT_EQ(a->world_ranks(), mine);
    // Interleave async collectives on both: they must not match each other.
    int64_t x = world.rank(), y = 100 * world.rank();
    AllReduceOptions ao{.async_op = true};
    auto wb = b->all_reduce(&y, 1, DType::i64, ReduceOp::sum, ao);
    auto wa = a->all_reduce(&x, 1, DType::i64, ReduceOp::sum, ao);
    wa->wait();
    wb->wait();
    EXPECT_EQ(x, world.rank() % 2 ? 1 + 3 : 0 + 2);
    EXPECT_EQ(y, world.rank() % 2 ? 400 : 200);
    EXPECT_THROW(world.new_group({(world.rank() + 1) % 4}), InputError);  // not a member
    EXPECT_THROW(world.new_group({0, 0}), InputError);
  });
  EXPECT_TRUE(contains(cluster.traffic_summary(), "a"));
}

TEST(VirtualGroups, BadArgumentsAreInputErrors) {
  VirtualClusterOptions o;
  o.ranks = 2;
  VirtualCluster cluster(o);
  cluster.run([](ProcessGroup& pg) {
    std::vector<float> v(8);
    EXPECT_THROW(pg.all_reduce(v.data(), -1, DType::f32, ReduceOp::sum), InputError);
    EXPECT_THROW(pg.all_reduce(v.data(), 4, DType::f16, ReduceOp::sum), InputError);
    BroadcastOptions bo{.root = 2};
    EXPECT_THROW(pg.broadcast(v.data(), 4, DType::f32, bo), InputError);
    EXPECT_THROW(pg.send(v.data(), 4, DType::f32, pg.rank()), InputError);
    EXPECT_THROW(pg.reduce_scatter_v(v.data(), v.data(), {1, 2, 3}, DType::f32, ReduceOp::sum), InputError);
    EXPECT_THROW(pg.all_gather(v.data() + 1, v.data(), 2, DType::f32), InputError);  // overlapping, not in place
  });
  VirtualClusterOptions none;
  none.ranks = 0;
  EXPECT_THROW(VirtualCluster{none}, InputError);
}

}  // namespace
}  // namespace llama4d
