#pragma once
// Each rank's timeline: compute spans, communication spans and waits, each with its wall-clock
// interval (what this laptop did) and its simulated interval (what the modelled H100 cluster
// would have done), exported as Chrome trace / Perfetto JSON.
//
// Simulated time. A rank has two simulated clocks, like a GPU with a compute stream and a
// communication stream:
//   - compute clock: advanced by the work of the ops this rank's thread runs, FLOPs / the
//     modelled GPU's rate (core/ops.h reports them through ops::FlopSink; ClusterSpec::gpu_tflops),
//     and by waits for communication;
//   - comm clock: a collective starts when the issuing rank's compute clock reached the call,
//     its comm stream is free, and every peer got there too (the slowest rank sets the start);
//     it lasts the cluster model's duration. The time a rank's comm stream sat ready while a
//     peer had not arrived is a "wait for peers" span of its own, never part of the transfer.
//     Waiting for the result (a synchronous call, or Work::wait() of an async one) moves the
//     compute clock up to the collective's end: a "wait" span on the compute lane, the exposed
//     communication; async communication that ends before it is waited for costs nothing.
//
// Spans. begin_span / end_span bracket named compute ("forward layer 3"); they nest (a
// recompute inside a backward, a wait inside a unit). A span's simulated interval runs from the
// compute clock at its begin to the clock at its end, so it contains its children; its self
// time (duration minus its direct children's) is the FLOPs charged while it was innermost.
// Work outside any span is recorded as "compute (outside spans)", so the top-level events of a
// rank's compute lane (depth 0: spans and waits) tile its compute clock: their durations add up
// to it. (A span's self time also includes any modelled time ComputeScope charged on top.)
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/ops.h"

namespace llama4d {

// compute: a span of work; comm: a transfer; wait: the compute lane blocked on a result, or (on
// the comm lane) a collective waiting for its slowest peer.
enum class TraceCategory : uint8_t { compute, comm, wait };
enum class TraceLane : uint8_t { compute, comm };

struct TraceEvent {
  std::string name;     // "all_reduce", "forward layer 3", "wait: all_reduce"
  TraceCategory category = TraceCategory::compute;
  TraceLane lane = TraceLane::compute;
  std::string detail;   // group, bytes, label
  int depth = 0;        // nesting on the compute lane (0 = top level)
  double flops = 0;     // compute: FLOPs charged while this span was innermost
  double wall_start_us = 0, wall_end_us = 0;
  double sim_start_us = 0, sim_end_us = 0;
};

// What a rank's simulated compute lane spent its time on (top-level accounting).
struct TimelineTotals {
  double clock_us = 0;    // the compute clock
  double compute_us = 0;  // FLOPs / rate, summed over every span
  double wait_us = 0;     // blocked on communication results (exposed communication)
  double comm_us = 0;     // comm lane busy transferring (overlapped or not)
  double flops = 0;
};

class RankTrace : public ops::FlopSink {
 public:
  using Clock = std::chrono::steady_clock;
  // `origin`: wall time zero, shared by every rank of a run so their timelines line up.
  // `gpu_tflops`: the modelled GPU's rate; each reported FLOP advances the compute clock by
  // 1 / (gpu_tflops * 1e6) microseconds.
  RankTrace(int rank, Clock::time_point origin, double gpu_tflops);

  int rank() const { return rank_; }
  double gpu_tflops() const { return tflops_; }
  double wall_now_us() const;
  double sim_now_us() const;         // compute clock
  double comm_clock_us() const;      // when this rank's comm stream is next free (simulated)

  // ops::FlopSink: the ops of this rank's thread report their work here.
  void add_flops(double flops) override;
  // Bracket named compute on this rank (nesting allowed; end closes the innermost). extra_sim_us
  // is modelled time charged on top of the FLOPs (tests and benchmarks that model a duration).
  void begin_span(std::string name);
  void end_span(double extra_sim_us = 0);

  // A finished communication span (backends call this); moves the comm clock to sim_end_us.
  // ready_us: when this rank's comm stream was ready for it; a later start is shown as a
  // "wait for peers" span before the transfer.
  void add_comm(std::string name, std::string detail, double wall_start_us, double wall_end_us, double ready_us,
                double sim_start_us, double sim_end_us);
  // The compute stream waits for a communication result that is ready at sim_end_us.
  void join_comm(double sim_end_us, const std::string& what = "communication");

  // Turning recording off keeps the clocks running but stores no events (long runs).
  void set_recording(bool on);
  std::vector<TraceEvent> events() const;
  TimelineTotals totals() const;
  void clear();  // drops events and resets both clocks and totals to 0

 private:
  struct Open {
    std::string name;
    double wall_start_us, sim_start_us, flops;
    size_t event;  // index reserved in events_ (recording) or SIZE_MAX
  };
  void charge_locked(double sim_us, double flops);
  void push_locked(TraceEvent e);

  const int rank_;
  const Clock::time_point origin_;
  const double tflops_;
  mutable std::mutex mu_;
  double sim_compute_us_ = 0, sim_comm_us_ = 0;
  TimelineTotals totals_;
  bool recording_ = true;
  std::vector<Open> open_;
  std::vector<TraceEvent> events_;
};

// Brackets a block of compute on a rank: `ComputeScope s(pg.trace(), "forward");`. sim_us > 0
// charges that much modelled time on top of the FLOPs the ops inside report.
class ComputeScope {
 public:
  ComputeScope(RankTrace& trace, std::string name, double sim_us = 0);
  ~ComputeScope();
  ComputeScope(const ComputeScope&) = delete;
  ComputeScope& operator=(const ComputeScope&) = delete;

 private:
  RankTrace& trace_;
  double sim_us_;
};

// Chrome trace JSON ({"traceEvents": [...]}, "ts"/"dur" in microseconds). Each rank appears
// twice: process "rank r (wall)" with pid r, and "rank r (simulated)" with pid 100000 + r; each
// has a "compute" and a "comm" thread. Waits exist only on the simulated timeline. Open in
// chrome://tracing or ui.perfetto.dev.
nlohmann::json chrome_trace_json(const std::vector<const RankTrace*>& ranks);
// Writes chrome_trace_json to `path`; IoError when it cannot.
void write_chrome_trace(const std::string& path, const std::vector<const RankTrace*>& ranks);

}  // namespace llama4d
