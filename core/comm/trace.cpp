#include "core/comm/trace.h"

#include <algorithm>
#include <fstream>

#include "core/error.h"

namespace llama4d {

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

void RankTrace::add_compute(std::string name, double wall_start_us, double wall_end_us, double sim_us) {
  std::lock_guard<std::mutex> lock(mu_);
  const double dur = sim_us >= 0 ? sim_us : std::max(0.0, wall_end_us - wall_start_us);
  const double start = sim_compute_us_;
  sim_compute_us_ += dur;
  if (recording_)
    events_.push_back({std::move(name), TraceCategory::compute, "", wall_start_us, wall_end_us, start, start + dur});
}

void RankTrace::add_comm(std::string name, std::string detail, double wall_start_us, double wall_end_us,
                         double sim_start_us, double sim_end_us) {
  std::lock_guard<std::mutex> lock(mu_);
  sim_comm_us_ = std::max(sim_comm_us_, sim_end_us);
  if (recording_)
    events_.push_back({std::move(name), TraceCategory::comm, std::move(detail), wall_start_us, wall_end_us,
                       sim_start_us, sim_end_us});
}

void RankTrace::join_comm(double sim_end_us) {
  std::lock_guard<std::mutex> lock(mu_);
  sim_compute_us_ = std::max(sim_compute_us_, sim_end_us);
}

void RankTrace::set_recording(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  recording_ = on;
}

std::vector<TraceEvent> RankTrace::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

void RankTrace::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  events_.clear();
  sim_compute_us_ = sim_comm_us_ = 0;
}

ComputeScope::ComputeScope(RankTrace& trace, std::string name, double sim_us)
    : trace_(trace), name_(std::move(name)), sim_us_(sim_us), wall_start_us_(trace.wall_now_us()) {}

ComputeScope::~ComputeScope() { trace_.add_compute(std::move(name_), wall_start_us_, trace_.wall_now_us(), sim_us_); }

namespace {

constexpr int kSimPidOffset = 100000;

nlohmann::json meta(const char* what, int pid, int tid, const std::string& name) {
  return {{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
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
      const int tid = e.category == TraceCategory::comm ? 1 : 0;
      const char* cat = e.category == TraceCategory::comm ? "comm" : "compute";
      nlohmann::json args = {{"sim_start_us", e.sim_start_us}, {"sim_end_us", e.sim_end_us}};
      if (!e.detail.empty()) args["detail"] = e.detail;
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
