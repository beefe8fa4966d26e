#include "core/comm/trace.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace llama4d {

namespace {

constexpr const char* kOutsideSpans = "compute (outside spans)";
constexpr size_t kNoEvent = size_t(-1);

}  // namespace

RankTrace::RankTrace(int rank, Clock::time_point origin, double gpu_tflops)
    : rank_(rank), origin_(origin), tflops_(gpu_tflops) {
  if (!(gpu_tflops > 0)) throw InputError("the modelled GPU's rate must be positive, got " + std::to_string(gpu_tflops) + " TFLOP/s");
}

double RankTrace::wall_now_us() const {
  return std::chrono::duration<double, std::micro>(Clock::now() - origin_).count();
}

double RankTrace::sim_now_us() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sim_compute_us_;
}

double RankTrace::comm_clock_us() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sim_comm_us_;
}

void RankTrace::push_locked(TraceEvent e) {
  if (recording_) events_.push_back(std::move(e));
}

// Advances the compute clock. Inside a span the span's own interval grows (it is written at
// end_span); outside, the time becomes (or extends) a top-level "outside spans" event so the
// top-level events keep tiling the clock.
void RankTrace::charge_locked(double sim_us, double flops) {
  if (open_.empty() && recording_) {
    const double wall = wall_now_us();
    TraceEvent* last = events_.empty() ? nullptr : &events_.back();
    if (last && last->name == kOutsideSpans && last->sim_end_us == sim_compute_us_) {
      last->sim_end_us += sim_us, last->flops += flops, last->wall_end_us = wall;
    } else {
      TraceEvent e;
      e.name = kOutsideSpans;
      e.flops = flops;
      e.wall_start_us = e.wall_end_us = wall;
      e.sim_start_us = sim_compute_us_;
      e.sim_end_us = sim_compute_us_ + sim_us;
      events_.push_back(std::move(e));
    }
  } else if (!open_.empty()) {
    open_.back().flops += flops;
  }
  sim_compute_us_ += sim_us;
  totals_.compute_us += sim_us;
  totals_.flops += flops;
}

void RankTrace::add_flops(double flops) {
  if (!(flops > 0)) return;
  std::lock_guard<std::mutex> lock(mu_);
  charge_locked(flops / (tflops_ * 1e6), flops);  // 1 TFLOP/s = 1e6 FLOPs per microsecond
}

void RankTrace::begin_span(std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  Open o{std::move(name), wall_now_us(), sim_compute_us_, 0, kNoEvent};
  if (recording_) {
    // Reserved now so events stay in start order, parents before their children.
    TraceEvent e;
    e.name = o.name;
    e.depth = int(open_.size());
    o.event = events_.size();
    events_.push_back(std::move(e));
  }
  open_.push_back(std::move(o));
}

void RankTrace::end_span(double extra_sim_us) {
  std::lock_guard<std::mutex> lock(mu_);
  if (open_.empty()) return;  // cleared while open
  if (extra_sim_us > 0) charge_locked(extra_sim_us, 0);
  const Open o = std::move(open_.back());
  open_.pop_back();
  if (o.event == kNoEvent || o.event >= events_.size()) return;
  TraceEvent& e = events_[o.event];
  e.flops = o.flops;
  e.wall_start_us = o.wall_start_us;
  e.wall_end_us = wall_now_us();
  e.sim_start_us = o.sim_start_us;
  e.sim_end_us = sim_compute_us_;
}

void RankTrace::add_comm(std::string name, std::string detail, double wall_start_us, double wall_end_us,
                         double ready_us, double sim_start_us, double sim_end_us) {
  std::lock_guard<std::mutex> lock(mu_);
  sim_comm_us_ = std::max(sim_comm_us_, sim_end_us);
  totals_.comm_us += sim_end_us - sim_start_us;
  if (sim_start_us > ready_us) {
    TraceEvent w;
    w.name = "wait for peers: " + name;
    w.category = TraceCategory::wait;
    w.lane = TraceLane::comm;
    w.detail = detail;
    w.wall_start_us = wall_start_us, w.wall_end_us = wall_end_us;
    w.sim_start_us = ready_us, w.sim_end_us = sim_start_us;
    push_locked(std::move(w));
  }
  TraceEvent e;
  e.name = std::move(name);
  e.category = TraceCategory::comm;
  e.lane = TraceLane::comm;
  e.detail = std::move(detail);
  e.wall_start_us = wall_start_us, e.wall_end_us = wall_end_us;
  e.sim_start_us = sim_start_us, e.sim_end_us = sim_end_us;
  push_locked(std::move(e));
}

void RankTrace::join_comm(double sim_end_us, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!(sim_end_us > sim_compute_us_)) return;  // the result was there already: overlapped
  TraceEvent w;
  w.name = "wait: " + what;
  w.category = TraceCategory::wait;
  w.depth = int(open_.size());
  w.wall_start_us = w.wall_end_us = wall_now_us();
  w.sim_start_us = sim_compute_us_;
  w.sim_end_us = sim_end_us;
  push_locked(std::move(w));
  totals_.wait_us += sim_end_us - sim_compute_us_;
  sim_compute_us_ = sim_end_us;
}

void RankTrace::set_recording(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  recording_ = on;
}

std::vector<TraceEvent> RankTrace::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

TimelineTotals RankTrace::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  TimelineTotals t = totals_;
  t.clock_us = sim_compute_us_;
  return t;
}

void RankTrace::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  events_.clear();
  open_.clear();
  totals_ = {};
  sim_compute_us_ = sim_comm_us_ = 0;
}

ComputeScope::ComputeScope(RankTrace& trace, std::string name, double sim_us) : trace_(trace), sim_us_(sim_us) {
  trace_.begin_span(std::move(name));
}

ComputeScope::~ComputeScope() { trace_.end_span(sim_us_); }

namespace {

constexpr int kSimPidOffset = 100000;

nlohmann::json meta(const char* what, int pid, int tid, const std::string& name) {
  return {{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

const char* category_name(TraceCategory c) {
  switch (c) {
    case TraceCategory::compute: return "compute";
    case TraceCategory::comm: return "comm";
    case TraceCategory::wait: return "wait";
  }
  return "?";
}

}  // namespace

nlohmann::json chrome_trace_json(const std::vector<const RankTrace*>& ranks) {
  nlohmann::json events = nlohmann::json::array();
  for (const RankTrace* t : ranks) {
    const int r = t->rank();
    for (int sim = 0; sim < 2; ++sim) {
      const int pid = sim ? kSimPidOffset + r : r;
      events.push_back(meta("process_name", pid, 0, "rank " + std::to_string(r) + (sim ? " (simulated)" : " (wall)")));
      events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
      events.push_back(meta("thread_name", pid, 0, "compute"));
      events.push_back(meta("thread_name", pid, 1, "comm"));
    }
    for (const TraceEvent& e : t->events()) {
      const int tid = e.lane == TraceLane::comm ? 1 : 0;
      const char* cat = category_name(e.category);
      nlohmann::json args = {{"sim_start_us", e.sim_start_us}, {"sim_end_us", e.sim_end_us}};
      if (!e.detail.empty()) args["detail"] = e.detail;
      if (e.category == TraceCategory::compute) args["flops"] = e.flops;
      // A wait is the model's: its wall-clock duration is not measured.
      if (e.category != TraceCategory::wait)
        events.push_back({{"name", e.name}, {"cat", cat}, {"ph", "X"}, {"pid", r}, {"tid", tid},
                          {"ts", e.wall_start_us}, {"dur", std::max(0.0, e.wall_end_us - e.wall_start_us)},
                          {"args", args}});
      events.push_back({{"name", e.name}, {"cat", cat}, {"ph", "X"}, {"pid", kSimPidOffset + r}, {"tid", tid},
                        {"ts", e.sim_start_us}, {"dur", std::max(0.0, e.sim_end_us - e.sim_start_us)},
                        {"args", args}});
    }
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

void write_chrome_trace(const std::string& path, const std::vector<const RankTrace*>& ranks) {
  std::ofstream out(path);
  if (!out) throw IoError("cannot open trace file '" + path + "' for writing");
  out << chrome_trace_json(ranks).dump() << '\n';
  if (!out) throw IoError("failed writing trace file '" + path + "'");
}

}  // namespace llama4d
