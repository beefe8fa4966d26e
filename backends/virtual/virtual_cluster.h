#pragma once
// The virtual backend: N "GPUs" as N threads of one process. VirtualCluster launches them,
// hands each a ProcessGroup for the world, and keeps each rank's accounting (HBM, traffic,
// timeline) for summaries after the run.
//
//   VirtualClusterOptions opt;
//   opt.ranks = 8;
//   VirtualCluster cluster(opt);
//   cluster.run([&](ProcessGroup& world) {
//     std::vector<float> g(n, float(world.rank()));
//     world.all_reduce(g.data(), n, DType::f32, ReduceOp::sum);
//   });
//   std::cout << cluster.traffic_summary();
//
// Faults never hang: when a rank's function throws, every rank blocked in (or later entering)
// a communication gets a CommError naming the failed rank; a rank that does not show up within
// the timeout is named by its peers; run() rethrows the first failure.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/cluster.h"
#include "core/comm/comm_types.h"
#include "core/comm/process_group.h"
#include "core/comm/rank_accounting.h"

namespace llama4d {

// The most virtual GPUs one process runs (one thread each).
inline constexpr int kMaxVirtualRanks = 1024;

struct VirtualClusterOptions {
  int ranks = 8;
  // Links, GPUs per node and HBM capacity. `nodes` is derived: ceil(ranks / gpus_per_node).
  ClusterSpec cluster;
  ReduceAlgo algo = ReduceAlgo::ordered;
  std::chrono::milliseconds timeout{60000};  // default wait for peers in every group
  // Fault injection for tests and lessons: runs on a rank's communication thread in the middle
  // of every collective (all ranks arrived, this rank has not moved its data yet). Throwing or
  // stalling here is "a GPU dying mid-collective".
  std::function<void(int world_rank, CommOp op, int64_t seq)> fault_hook;
};

struct RankFailure {
  int rank = 0;
  std::string message;
};

namespace virt {
struct World;
}

class VirtualCluster {
 public:
  explicit VirtualCluster(VirtualClusterOptions options);
  ~VirtualCluster();
  VirtualCluster(const VirtualCluster&) = delete;
  VirtualCluster& operator=(const VirtualCluster&) = delete;

  int size() const { return options_.ranks; }
  const ClusterSpec& cluster() const { return options_.cluster; }
  ReduceAlgo algo() const { return options_.algo; }

  // Runs fn(world) on every rank, one thread each, and returns when all are done. Groups made
  // inside are valid only during the call. Rethrows the first failure (llama4d errors as they
  // are; anything else as CommError "rank r failed: ..."). Accounting accumulates across runs.
  void run(const std::function<void(ProcessGroup& world)>& fn);
  // Every rank that failed in the last run, in the order the failures happened.
  std::vector<RankFailure> failures() const { return failures_; }

  RankAccounting& accounting(int rank);
  const RankAccounting& accounting(int rank) const;
  std::vector<TrafficRecord> traffic() const;        // all ranks' records
  std::vector<const RankTrace*> traces() const;
  std::string traffic_summary() const;               // per (group, op)
  std::string rank_summary() const;                  // per rank: traffic and memory peaks
  void write_trace(const std::string& path) const;   // Chrome trace JSON
  void reset_accounting();                           // clears traffic, traces and peaks

 private:
  VirtualClusterOptions options_;
  RankTrace::Clock::time_point origin_;
  std::vector<std::unique_ptr<RankAccounting>> accounting_;
  std::vector<RankFailure> failures_;
};

}  // namespace llama4d
