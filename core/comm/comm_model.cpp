#include "core/comm/comm_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace llama4d {

std::vector<int64_t> split_counts(int64_t count, int n) {
  std::vector<int64_t> counts(size_t(n), count / n);
  for (int i = 0; i < int(count % n); ++i) ++counts[size_t(i)];
  return counts;
}

std::vector<int64_t> prefix_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) offsets[i] = offsets[i - 1] + counts[i - 1];
  return offsets;
}

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

CommPlan empty_plan(int n, std::string algorithm) {
  CommPlan p;
  p.algorithm = std::move(algorithm);
  p.bytes_sent.assign(size_t(n), 0);
  p.bytes_recv.assign(size_t(n), 0);
  p.sent_nvlink.assign(size_t(n), 0);
  p.sent_ib.assign(size_t(n), 0);
  return p;
}

// Adds one message of `bytes` from group rank i to group rank j to the per-rank totals.
void count_message(CommPlan& p, const ClusterSpec& c, const std::vector<int>& ranks, int i, int j, int64_t bytes) {
  if (bytes <= 0 || i == j) return;
  p.bytes_sent[size_t(i)] += bytes;
  p.bytes_recv[size_t(j)] += bytes;
  if (c.link_between(ranks[size_t(i)], ranks[size_t(j)]) == LinkClass::infiniband)
    p.sent_ib[size_t(i)] += bytes;
  else
    p.sent_nvlink[size_t(i)] += bytes;
}

// A ring phase: at step s, group rank r sends chunk chunk_of(r, s) to rank r+1. Each step lasts
// as long as its slowest hop.
template <class ChunkOf>
void ring_phase(CommPlan& p, const ClusterSpec& c, const std::vector<int>& ranks, const std::vector<int64_t>& counts,
                int64_t elem, ChunkOf chunk_of) {
  const int n = int(ranks.size());
  for (int s = 0; s < n - 1; ++s) {
    double step_us = 0;
    for (int r = 0; r < n; ++r) {
      const int next = mod(r + 1, n);
      const int64_t bytes = counts[size_t(chunk_of(r, s))] * elem;
      count_message(p, c, ranks, r, next, bytes);
      step_us = std::max(step_us, c.transfer_us(c.link_between(ranks[size_t(r)], ranks[size_t(next)]), bytes));
    }
    p.sim_us += step_us;
  }
}

// A direct phase: bytes[i][j] from i to j, all at once. A rank's NVLink and IB traffic flow in
// parallel, each class limited by its own per-GPU bandwidth; the phase lasts as long as the
// busiest (rank, direction, class).
void direct_phase(CommPlan& p, const ClusterSpec& c, const std::vector<int>& ranks,
                  const std::vector<std::vector<int64_t>>& bytes) {
  const int n = int(ranks.size());
  double phase_us = 0;
  for (int r = 0; r < n; ++r) {
    int64_t out[3] = {0, 0, 0}, in[3] = {0, 0, 0};
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      count_message(p, c, ranks, r, j, bytes[size_t(r)][size_t(j)]);
      const int link = int(c.link_between(ranks[size_t(r)], ranks[size_t(j)]));
      out[link] += bytes[size_t(r)][size_t(j)];
      in[link] += bytes[size_t(j)][size_t(r)];
    }
    for (LinkClass l : {LinkClass::nvlink, LinkClass::infiniband})
      phase_us = std::max({phase_us, c.transfer_us(l, out[int(l)]), c.transfer_us(l, in[int(l)])});
  }
  p.sim_us += phase_us;
}

void check_counts(const std::vector<int>& ranks, const std::vector<int64_t>& counts) {
  if (ranks.empty() || counts.size() != ranks.size())
    throw InputError("comm model: need one count per group rank");
}

}  // namespace

CommPlan plan_reduce_scatter(const ClusterSpec& c, const std::vector<int>& ranks, const std::vector<int64_t>& counts,
                             int64_t elem, ReduceAlgo algo) {
  check_counts(ranks, counts);
  const int n = int(ranks.size());
  if (algo == ReduceAlgo::ring) {
    CommPlan p = empty_plan(n, "ring");
    ring_phase(p, c, ranks, counts, elem, [n](int r, int s) { return mod(r - 1 - s, n); });
    return p;
  }
  CommPlan p = empty_plan(n, "direct");
  std::vector<std::vector<int64_t>> bytes(size_t(n), std::vector<int64_t>(size_t(n), 0));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) bytes[size_t(i)][size_t(j)] = i == j ? 0 : counts[size_t(j)] * elem;
  direct_phase(p, c, ranks, bytes);
  return p;
}

CommPlan plan_all_gather(const ClusterSpec& c, const std::vector<int>& ranks, const std::vector<int64_t>& counts,
                         int64_t elem, ReduceAlgo algo) {
  check_counts(ranks, counts);
  const int n = int(ranks.size());
  if (algo == ReduceAlgo::ring) {
    CommPlan p = empty_plan(n, "ring");
    ring_phase(p, c, ranks, counts, elem, [n](int r, int s) { return mod(r - s, n); });
    return p;
  }
  CommPlan p = empty_plan(n, "direct");
  std::vector<std::vector<int64_t>> bytes(size_t(n), std::vector<int64_t>(size_t(n), 0));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) bytes[size_t(i)][size_t(j)] = i == j ? 0 : counts[size_t(i)] * elem;
  direct_phase(p, c, ranks, bytes);
  return p;
}

CommPlan plan_all_reduce(const ClusterSpec& c, const std::vector<int>& ranks, int64_t count, int64_t elem,
                         ReduceAlgo algo) {
  const std::vector<int64_t> counts = split_counts(count, int(ranks.size()));
  CommPlan p = plan_reduce_scatter(c, ranks, counts, elem, algo);
  const CommPlan ag = plan_all_gather(c, ranks, counts, elem, algo);
  for (size_t i = 0; i < ranks.size(); ++i) {
    p.bytes_sent[i] += ag.bytes_sent[i];
    p.bytes_recv[i] += ag.bytes_recv[i];
    p.sent_nvlink[i] += ag.sent_nvlink[i];
    p.sent_ib[i] += ag.sent_ib[i];
  }
  p.sim_us += ag.sim_us;
  return p;
}

CommPlan plan_broadcast(const ClusterSpec& c, const std::vector<int>& ranks, int64_t bytes, int root) {
  const int n = int(ranks.size());
  CommPlan p = empty_plan(n, "chain");
  if (n == 1 || bytes <= 0) return p;
  // Pipelined chain: the payload streams through every hop, so the time is every hop's latency
  // plus one pass over the slowest hop.
  double alphas = 0, min_bw = 1e300;
  for (int pos = 0; pos < n - 1; ++pos) {
    const int from = mod(root + pos, n), to = mod(root + pos + 1, n);
    count_message(p, c, ranks, from, to, bytes);
    const LinkParams& lp = c.params(c.link_between(ranks[size_t(from)], ranks[size_t(to)]));
    alphas += lp.alpha_us;
    min_bw = std::min(min_bw, lp.bandwidth_gbps);
  }
  p.sim_us = alphas + double(bytes) / (min_bw * 1e3);
  return p;
}

CommPlan plan_all_to_all(const ClusterSpec& c, const std::vector<int>& ranks,
                         const std::vector<std::vector<int64_t>>& bytes) {
  const int n = int(ranks.size());
  if (bytes.size() != size_t(n)) throw InputError("comm model: all_to_all needs an N x N byte matrix");
  CommPlan p = empty_plan(n, "direct");
  direct_phase(p, c, ranks, bytes);
  return p;
}

CommPlan plan_barrier(const ClusterSpec& c, const std::vector<int>& ranks) {
  const int n = int(ranks.size());
  CommPlan p = empty_plan(n, "dissemination");
  if (n == 1) return p;
  bool crosses_nodes = false;
  for (int r : ranks) crosses_nodes |= c.node_of(r) != c.node_of(ranks[0]);
  const double alpha = crosses_nodes ? c.infiniband.alpha_us : c.nvlink.alpha_us;
  p.sim_us = std::ceil(std::log2(double(n))) * alpha;
  return p;
}

CommPlan plan_p2p(const ClusterSpec& c, const std::vector<int>& ranks, int from, int to, int64_t bytes) {
  CommPlan p = empty_plan(int(ranks.size()), "p2p");
  count_message(p, c, ranks, from, to, bytes);
  p.sim_us = c.transfer_us(c.link_between(ranks[size_t(from)], ranks[size_t(to)]), bytes);
  return p;
}

}  // namespace llama4d
