#pragma once
// Each rank's timeline: compute spans and communication spans, each with its wall-clock
// interval (what this laptop did) and its simulated interval (what the modelled H100 cluster
// would have done), exported as Chrome trace / Perfetto JSON.
//
// Simulated time. A rank has two simulated clocks, like a GPU with a compute stream and a
// communication stream:
//   - compute clock: advanced by compute spans (by the caller's modelled duration, or by the
//     measured wall duration when none is given);
//   - comm clock: a collective starts when the issuing rank's compute clock reached the call,
//     its comm stream is free, and every peer got there too (the slowest rank sets the start);
//     it lasts the cluster model's duration. Waiting for the result (a synchronous call, or
//     Work::wait() of an async one) moves the compute clock up to the collective's end, so
//     overlap of async communication with compute shows up as time saved.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace llama4d {

enum class TraceCategory : uint8_t { compute, comm };

struct TraceEvent {
  std::string name;     // "all_reduce", "forward layer 3"
  TraceCategory category = TraceCategory::compute;
  std::string detail;   // group, bytes, label
  double wall_start_us = 0, wall_end_us = 0;
  double sim_start_us = 0, sim_end_us = 0;
};

class RankTrace {
 public:
  using Clock = std::chrono::steady_clock;
  // `origin`: wall time zero, shared by every rank of a run so their timelines line up.
  RankTrace(int rank, Clock::time_point origin) : rank_(rank), origin_(origin) {}

  int rank() const { return rank_; }
  double wall_now_us() const;
  double sim_now_us() const;         // compute clock
  double comm_clock_us() const;      // when this rank's comm stream is next free (simulated)

  // A finished compute span; advances the compute clock by sim_us, or by the wall duration when
  // sim_us < 0.
  void add_compute(std::string name, double wall_start_us, double wall_end_us, double sim_us = -1);
  // A finished communication span (backends call this); moves the comm clock to sim_end_us.
  void add_comm(std::string name, std::string detail, double wall_start_us, double wall_end_us, double sim_start_us,
                double sim_end_us);
  // The compute stream waits for a communication result that is ready at sim_end_us.
  void join_comm(double sim_end_us);

  // Turning recording off keeps the clocks running but stores no events (long runs).
  void set_recording(bool on);
  std::vector<TraceEvent> events() const;
  void clear();  // drops events and resets both clocks to 0

 private:
  const int rank_;
  const Clock::time_point origin_;
  mutable std::mutex mu_;
  double sim_compute_us_ = 0, sim_comm_us_ = 0;
  bool recording_ = true;
  std::vector<TraceEvent> events_;
};

// Times a block of compute on a rank: `ComputeScope s(pg.trace(), "forward");`.
class ComputeScope {
 public:
  ComputeScope(RankTrace& trace, std::string name, double sim_us = -1);
  ~ComputeScope();
  ComputeScope(const ComputeScope&) = delete;
  ComputeScope& operator=(const ComputeScope&) = delete;

 private:
  RankTrace& trace_;
  std::string name_;
  double sim_us_, wall_start_us_;
};

// Chrome trace JSON ({"traceEvents": [...]}, "ts"/"dur" in microseconds). Each rank appears
// twice: process "rank r (wall)" with pid r, and "rank r (simulated)" with pid 100000 + r; each
// has a "compute" and a "comm" thread. Open in chrome://tracing or ui.perfetto.dev.
nlohmann::json chrome_trace_json(const std::vector<const RankTrace*>& ranks);
// Writes chrome_trace_json to `path`; IoError when it cannot.
void write_chrome_trace(const std::string& path, const std::vector<const RankTrace*>& ranks);

}  // namespace llama4d
