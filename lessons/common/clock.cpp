#include "lessons/common/clock.h"

#include <algorithm>
#include <cmath>

#include "core/comm/text_table.h"
#include "core/error.h"

namespace llama4d::lesson {

TimelineTotals time_delta(const TimelineTotals& after, const TimelineTotals& before) {
  TimelineTotals d;
  d.clock_us = after.clock_us - before.clock_us;
  d.compute_us = after.compute_us - before.compute_us;
  d.wait_us = after.wait_us - before.wait_us;
  d.comm_us = after.comm_us - before.comm_us;
  d.flops = after.flops - before.flops;
  return d;
}

namespace {

std::string us(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

double transfer_us(int64_t bytes, const LinkParams& link) {
  return bytes > 0 ? link.alpha_us + double(bytes) / (link.bandwidth_gbps * 1e3) : 0.0;
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// One direct phase: rank i sends out(i) bytes and receives in(i); the busiest end sets the time.
template <class Out, class In>
double direct_us(size_t n, Out out, In in, const LinkParams& link) {
  double t = 0;
  for (size_t i = 0; i < n; ++i) t = std::max({t, transfer_us(out(i), link), transfer_us(in(i), link)});
  return t;
}

double ring_us(const std::vector<int64_t>& counts, int64_t elem, const LinkParams& link) {
  const int64_t largest = *std::max_element(counts.begin(), counts.end());
  return double(counts.size() - 1) * transfer_us(largest * elem, link);
}

}  // namespace

std::string time_table(const std::vector<TimelineTotals>& per_rank, double gpu_tflops) {
  std::vector<std::vector<std::string>> rows = {
      {"rank", "step us", "compute us", "exposed comm us", "comm busy us", "hidden"}};
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const TimelineTotals& t = per_rank[r];
    const double hidden = t.comm_us > 0 ? std::max(0.0, 1.0 - t.wait_us / t.comm_us) : 0.0;
    rows.push_back({std::to_string(r), us(t.clock_us), us(t.compute_us), us(t.wait_us), us(t.comm_us),
                    t.comm_us > 0 ? us(100 * hidden) + "%" : "-"});
  }
  char head[160];
  std::snprintf(head, sizeof head, "On the simulated clock (each GPU %g TFLOP/s; links by the alpha-beta model):\n",
                gpu_tflops);
  return head + format_table(rows);
}

double reduce_scatter_us(const std::vector<int64_t>& counts, int64_t elem, ReduceAlgo algo, const LinkParams& link) {
  if (counts.size() < 2) return 0;
  if (algo == ReduceAlgo::ring) return ring_us(counts, elem, link);
  const int64_t S = sum(counts), n = int64_t(counts.size());
  return direct_us(
      counts.size(), [&](size_t i) { return (S - counts[i]) * elem; }, [&](size_t i) { return (n - 1) * counts[i] * elem; },
      link);
}

double all_gather_us(const std::vector<int64_t>& counts, int64_t elem, ReduceAlgo algo, const LinkParams& link) {
  if (counts.size() < 2) return 0;
  if (algo == ReduceAlgo::ring) return ring_us(counts, elem, link);
  const int64_t S = sum(counts), n = int64_t(counts.size());
  return direct_us(
      counts.size(), [&](size_t i) { return (n - 1) * counts[i] * elem; }, [&](size_t i) { return (S - counts[i]) * elem; },
      link);
}

double all_reduce_us(int64_t count, int n, int64_t elem, ReduceAlgo algo, const LinkParams& link) {
  std::vector<int64_t> counts(size_t(n), count / n);
  for (int64_t i = 0; i < count % n; ++i) ++counts[size_t(i)];
  return reduce_scatter_us(counts, elem, algo, link) + all_gather_us(counts, elem, algo, link);
}

double collective_us(const TrafficRecord& r, ReduceAlgo algo, const LinkParams& link) {
  const int n = r.group_size;
  const int64_t elem = int64_t(dtype_size(r.dtype));
  std::vector<int64_t> counts(size_t(n), r.count / n);
  for (int64_t i = 0; i < r.count % n; ++i) ++counts[size_t(i)];
  if (r.op == "all_reduce") return all_reduce_us(r.count, n, elem, algo, link);
  if (r.op == "reduce_scatter") return reduce_scatter_us(counts, elem, algo, link);
  if (r.op == "all_gather") return all_gather_us(counts, elem, algo, link);
  throw Error("collective_us: no formula here for " + r.op);
}

double bucket_pipeline_tail_us(const std::vector<double>& backward_us, const std::vector<double>& all_reduce_us) {
  double t = 0, stream_free = 0;
  for (size_t k = 0; k < backward_us.size(); ++k) {
    t += backward_us[k];                                          // unit k's backward ends
    stream_free = std::max(t, stream_free) + all_reduce_us[k];  // its bucket leaves the stream
  }
  return std::max(0.0, stream_free - t);
}

std::vector<int64_t> unit_parameters(const LlamaConfig& c) {
  const int64_t C = c.hidden_size, V = c.vocab_size, q = c.q_dim(), kv = c.kv_dim();
  std::vector<int64_t> p = {V * C};
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    p.push_back(2 * C + (q + 2 * kv) * C + q * C + 3 * C * c.intermediate_size);
  p.push_back(C + (c.tie_word_embeddings ? 0 : V * C));
  return p;
}

int64_t ns(double us) { return std::llround(us * 1e3); }

}  // namespace llama4d::lesson
