#include "core/comm/traffic_log.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>
#include <nlohmann/json.hpp>

#include "core/tensor/memory_tracker.h"
#include "core/comm/text_table.h"

namespace llama4d {

std::string link_summary(const TrafficRecord& r) {
  if (r.sent_nvlink > 0 && r.sent_ib > 0) return "nvlink+ib";
  if (r.sent_ib > 0) return "ib";
  if (r.sent_nvlink > 0) return "nvlink";
  return "-";
}

void TrafficLog::add(TrafficRecord record) {
  std::lock_guard<std::mutex> lock(mu_);
  records_.push_back(std::move(record));
}

std::vector<TrafficRecord> TrafficLog::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

int64_t TrafficLog::total_sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t s = 0;
  for (const auto& r : records_) s += r.bytes_sent;
  return s;
}

int64_t TrafficLog::total_recv() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t s = 0;
  for (const auto& r : records_) s += r.bytes_recv;
  return s;
}

void TrafficLog::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  records_.clear();
}

namespace {

std::string fmt_us(double us) {
  char buf[64];
  if (us >= 1e6)
    std::snprintf(buf, sizeof buf, "%.3f s", us / 1e6);
  else if (us >= 1e3)
    std::snprintf(buf, sizeof buf, "%.3f ms", us / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.2f us", us);
  return buf;
}

}  // namespace

std::string format_traffic_summary(const std::vector<TrafficRecord>& records) {
  struct Agg {
    int64_t calls = 0, sent = 0, max_rank_sent = 0;
    std::map<int, int64_t> per_rank;
    std::set<std::string> links, algos;
    double sim_us = 0;
  };
  std::map<std::pair<std::string, std::string>, Agg> by_key;
  for (const TrafficRecord& r : records) {
    Agg& a = by_key[{r.group, r.op}];
    a.sent += r.bytes_sent;
    a.per_rank[r.world_rank] += r.bytes_sent;
    const std::string link = link_summary(r);
    if (link != "-") a.links.insert(link);
    a.algos.insert(r.algorithm);
    // A call is counted (and its duration added) once, by its group rank 0 (the sender for p2p).
    if (r.op == "send" || (r.op != "recv" && r.group_rank == 0)) {
      a.calls += 1;
      a.sim_us += r.sim_end_us - r.sim_start_us;
    }
  }
  std::vector<std::vector<std::string>> rows = {
      {"group", "op", "algorithm", "calls", "bytes sent (all ranks)", "max per rank", "links", "simulated time"}};
  for (auto& [key, a] : by_key) {
    for (auto& [rank, b] : a.per_rank) a.max_rank_sent = std::max(a.max_rank_sent, b);
    std::string links, algos;
    for (const auto& l : a.links) { links += links.empty() ? "" : ","; links += l; }
    for (const auto& l : a.algos) { algos += algos.empty() ? "" : ","; algos += l; }
    rows.push_back({key.first, key.second, algos, std::to_string(a.calls), format_bytes(a.sent),
                    format_bytes(a.max_rank_sent), links.empty() ? "-" : links, fmt_us(a.sim_us)});
  }
  return format_table(rows);
}

std::string format_rank_traffic(const std::vector<TrafficRecord>& records) {
  struct Agg {
    int64_t sent = 0, recv = 0, nvlink = 0, ib = 0, ops = 0;
    double sim_us = 0;
  };
  std::map<int, Agg> by_rank;
  for (const TrafficRecord& r : records) {
    Agg& a = by_rank[r.world_rank];
    a.sent += r.bytes_sent;
    a.recv += r.bytes_recv;
    a.nvlink += r.sent_nvlink;
    a.ib += r.sent_ib;
    a.ops += 1;
    a.sim_us += r.sim_end_us - r.sim_start_us;
  }
  std::vector<std::vector<std::string>> rows = {
      {"rank", "ops", "sent", "received", "sent over nvlink", "sent over ib", "simulated comm time"}};
  for (auto& [rank, a] : by_rank)
    rows.push_back({std::to_string(rank), std::to_string(a.ops), format_bytes(a.sent), format_bytes(a.recv),
                    format_bytes(a.nvlink), format_bytes(a.ib), fmt_us(a.sim_us)});
  return format_table(rows);
}

nlohmann::json traffic_json(const std::vector<TrafficRecord>& records) {
  nlohmann::json out = nlohmann::json::array();
  for (const TrafficRecord& r : records)
    out.push_back({{"op", r.op}, {"group", r.group}, {"algorithm", r.algorithm}, {"label", r.label},
                   {"world_rank", r.world_rank}, {"group_rank", r.group_rank}, {"group_size", r.group_size},
                   {"seq", r.seq}, {"dtype", std::string(dtype_name(r.dtype))}, {"count", r.count},
                   {"bytes_sent", r.bytes_sent}, {"bytes_recv", r.bytes_recv}, {"sent_nvlink", r.sent_nvlink},
                   {"sent_ib", r.sent_ib}, {"link", link_summary(r)}, {"sim_start_us", r.sim_start_us},
                   {"sim_end_us", r.sim_end_us}, {"wall_start_us", r.wall_start_us}, {"wall_end_us", r.wall_end_us}});
  return out;
}

}  // namespace llama4d
