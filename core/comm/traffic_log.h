#pragma once
// Every byte a rank moved: one record per operation per rank, with the bytes it sent and
// received, over which link class, and the simulated interval. Summaries aggregate the records
// of all ranks per (group, op) and per rank.
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/comm/comm_types.h"

namespace llama4d {

struct TrafficRecord {
  std::string op;              // "all_reduce", "send", ...
  std::string group;           // group name ("world", "dp", ...)
  std::string algorithm;       // "ring", "direct", "chain", "p2p", "dissemination"
  std::string label;           // the caller's options.label
  int world_rank = 0, group_rank = 0, group_size = 1;
  int64_t seq = 0;             // index of the call on its group (per peer pair for send/recv)
  DType dtype = DType::f32;
  int64_t count = 0;           // elements of the buffer the op is named after (all_reduce: the buffer)
  int64_t bytes_sent = 0, bytes_recv = 0;
  int64_t sent_nvlink = 0, sent_ib = 0;
  double sim_start_us = 0, sim_end_us = 0;
  double wall_start_us = 0, wall_end_us = 0;
};

// "nvlink", "ib", "nvlink+ib" or "-" (nothing sent).
std::string link_summary(const TrafficRecord& r);

class TrafficLog {
 public:
  void add(TrafficRecord record);
  std::vector<TrafficRecord> records() const;
  int64_t total_sent() const;
  int64_t total_recv() const;
  void clear();

 private:
  mutable std::mutex mu_;
  std::vector<TrafficRecord> records_;
};

// Per (group, op): calls, bytes sent by all ranks, the most one rank sent, link classes and
// simulated time (sum over calls of each call's duration).
std::string format_traffic_summary(const std::vector<TrafficRecord>& records);
// Per world rank: bytes sent / received, split by link class, simulated comm time.
std::string format_rank_traffic(const std::vector<TrafficRecord>& records);
nlohmann::json traffic_json(const std::vector<TrafficRecord>& records);

}  // namespace llama4d
