#pragma once
// What each collective costs in the cluster model: bytes every rank sends and receives, over
// which link class, and the simulated duration. Backends fill the traffic log from these
// plans, and they move data so that the plan describes the algorithm they simulate:
//
//   ring reduce-scatter   N-1 steps; at step s rank r sends chunk (r-1-s) mod N to rank r+1.
//                         Per rank: S - |chunk r| sent, i.e. (N-1)/N * S for equal chunks.
//   ring all-gather       N-1 steps; at step s rank r sends chunk (r-s) mod N to rank r+1.
//   direct reduce-scatter every rank sends chunk j straight to rank j ("ordered" algorithm:
//                         the owner then adds the N contributions in rank order).
//   direct all-gather     every rank sends its chunk straight to every other rank.
//   all-reduce            reduce-scatter + all-gather over a balanced split of the buffer:
//                         2(N-1)/N * S per rank for both algorithms (equal chunks).
//   broadcast             pipelined chain root -> root+1 -> ...: every rank but the last sends S.
//   all-to-all            direct: rank i sends block j to rank j.
//   barrier               dissemination, ceil(log2 N) rounds of latency, no payload.
// Time: a ring step lasts as long as its slowest hop (alpha + bytes / bandwidth); a direct
// phase lasts as long as the busiest rank's busiest link class; phases add up.
#include <cstdint>
#include <string>
#include <vector>

#include "core/comm/cluster.h"
#include "core/comm/comm_types.h"

namespace llama4d {

struct CommPlan {
  std::string algorithm;                 // "ring", "direct", "chain", "dissemination", "none"
  std::vector<int64_t> bytes_sent;       // [N] per group rank
  std::vector<int64_t> bytes_recv;       // [N]
  std::vector<int64_t> sent_nvlink;      // [N] part of bytes_sent that crossed NVLink
  std::vector<int64_t> sent_ib;          // [N] part of bytes_sent that crossed InfiniBand
  double sim_us = 0;                     // modelled duration; every member finishes together
};

// Balanced split of `count` elements into n chunks, the first count % n one element longer.
std::vector<int64_t> split_counts(int64_t count, int n);
// Exclusive prefix sums: where each chunk starts.
std::vector<int64_t> prefix_offsets(const std::vector<int64_t>& counts);

// world_ranks[i] is the world rank of group rank i (the cluster places world ranks on nodes).
// counts[i]: elements of chunk i (the chunk group rank i ends up owning); elem: bytes per element.
CommPlan plan_reduce_scatter(const ClusterSpec& cluster, const std::vector<int>& world_ranks,
                             const std::vector<int64_t>& counts, int64_t elem, ReduceAlgo algo);
CommPlan plan_all_gather(const ClusterSpec& cluster, const std::vector<int>& world_ranks,
                         const std::vector<int64_t>& counts, int64_t elem, ReduceAlgo algo);
CommPlan plan_all_reduce(const ClusterSpec& cluster, const std::vector<int>& world_ranks, int64_t count,
                         int64_t elem, ReduceAlgo algo);
CommPlan plan_broadcast(const ClusterSpec& cluster, const std::vector<int>& world_ranks, int64_t bytes, int root);
// bytes[i][j]: bytes group rank i sends to group rank j (the diagonal stays local).
CommPlan plan_all_to_all(const ClusterSpec& cluster, const std::vector<int>& world_ranks,
                         const std::vector<std::vector<int64_t>>& bytes);
CommPlan plan_barrier(const ClusterSpec& cluster, const std::vector<int>& world_ranks);
// One message of `bytes` from group rank `from` to group rank `to`: alpha + bytes / bandwidth.
CommPlan plan_p2p(const ClusterSpec& cluster, const std::vector<int>& world_ranks, int from, int to, int64_t bytes);

}  // namespace llama4d
