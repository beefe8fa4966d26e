#include "core/tensor/memory_tracker.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace llama4d {

std::string_view memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::params: return "params";
    case MemoryCategory::grads: return "grads";
    case MemoryCategory::optimizer: return "optimizer";
    case MemoryCategory::activations: return "activations";
    case MemoryCategory::scratch: return "scratch";
    case MemoryCategory::comm_buffers: return "comm buffers";
    case MemoryCategory::other: return "other";
  }
  return "?";
}

std::string format_bytes(int64_t bytes) {
  char buf[64];
  const double b = double(bytes);
  const double ab = b < 0 ? -b : b;
  if (ab >= double(1LL << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1LL << 30));
  else if (ab >= double(1LL << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1LL << 20));
  else if (ab >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%lld B", (long long)bytes);
  return buf;
}

std::string MemoryTracker::live_breakdown_locked() const {
  std::string s;
  for (int c = 0; c < kMemoryCategories; ++c) {
    if (!s.empty()) s += ", ";
    s += std::string(memory_category_name(MemoryCategory(c))) + " " + format_bytes(live_[size_t(c)]);
  }
  return s;
}

void MemoryTracker::allocate(MemoryCategory category, int64_t bytes, std::string_view what) {
  if (bytes < 0) throw Error("memory tracker: negative allocation of " + std::to_string(bytes) + " bytes");
  std::lock_guard<std::mutex> lock(mu_);
  if (capacity_ > 0 && live_total_ + bytes > capacity_) {
    std::string request = format_bytes(bytes) + " of " + std::string(memory_category_name(category));
    if (!what.empty()) request += " (" + std::string(what) + ")";
    throw OutOfMemoryError("rank " + std::to_string(rank_) + " out of memory: cannot allocate " + request +
                           "; capacity " + format_bytes(capacity_) + ", live " + format_bytes(live_total_) + " [" +
                           live_breakdown_locked() + "], free " + format_bytes(capacity_ - live_total_));
  }
  const size_t c = size_t(category);
  live_[c] += bytes;
  peak_[c] = std::max(peak_[c], live_[c]);
  live_total_ += bytes;
  peak_total_ = std::max(peak_total_, live_total_);
}

void MemoryTracker::release(MemoryCategory category, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t c = size_t(category);
  if (bytes < 0 || bytes > live_[c])
    throw Error("memory tracker: rank " + std::to_string(rank_) + " releases " + format_bytes(bytes) + " of " +
                std::string(memory_category_name(category)) + " but holds " + format_bytes(live_[c]));
  live_[c] -= bytes;
  live_total_ -= bytes;
}

int64_t MemoryTracker::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_;
}

void MemoryTracker::set_capacity(int64_t capacity_bytes) {
  if (capacity_bytes < 0) throw InputError("HBM capacity must be >= 0 (0 = unlimited)");
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = capacity_bytes;
}

int64_t MemoryTracker::live(MemoryCategory category) const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_[size_t(category)];
}

int64_t MemoryTracker::live_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_total_;
}

int64_t MemoryTracker::peak(MemoryCategory category) const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_[size_t(category)];
}

int64_t MemoryTracker::peak_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_total_;
}

void MemoryTracker::reset_peaks() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = live_;
  peak_total_ = live_total_;
}

std::string MemoryTracker::summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string s = "live " + format_bytes(live_total_) + " [" + live_breakdown_locked() + "], peak " +
                  format_bytes(peak_total_);
  s += capacity_ > 0 ? " of " + format_bytes(capacity_) : " (no capacity limit)";
  return s;
}

MemoryReservation::MemoryReservation(MemoryTracker& tracker, MemoryCategory category, int64_t bytes,
                                     std::string_view what)
    : category_(category) {
  tracker.allocate(category, bytes, what);
  tracker_ = &tracker;
  bytes_ = bytes;
}

MemoryReservation::MemoryReservation(MemoryReservation&& other) noexcept
    : tracker_(other.tracker_), category_(other.category_), bytes_(other.bytes_) {
  other.tracker_ = nullptr;
  other.bytes_ = 0;
}

MemoryReservation& MemoryReservation::operator=(MemoryReservation&& other) noexcept {
  if (this != &other) {
    reset();
    tracker_ = other.tracker_;
    category_ = other.category_;
    bytes_ = other.bytes_;
    other.tracker_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void MemoryReservation::reset() {
  if (tracker_) tracker_->release(category_, bytes_);
  tracker_ = nullptr;
  bytes_ = 0;
}

namespace {

template <class Read>
RankMemory by_category(Read read, int64_t total) {
  RankMemory m;
  m.params = read(MemoryCategory::params);
  m.grads = read(MemoryCategory::grads);
  m.optimizer = read(MemoryCategory::optimizer);
  m.activations = read(MemoryCategory::activations);
  m.scratch = read(MemoryCategory::scratch);
  m.comm_buffers = read(MemoryCategory::comm_buffers);
  m.other = read(MemoryCategory::other);
  m.total = total;
  return m;
}

}  // namespace

RankMemory memory_peaks(const MemoryTracker& t) {
  return by_category([&](MemoryCategory c) { return t.peak(c); }, t.peak_total());
}

RankMemory memory_live(const MemoryTracker& t) {
  return by_category([&](MemoryCategory c) { return t.live(c); }, t.live_total());
}

nlohmann::json memory_json(const std::vector<RankMemory>& per_rank) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const RankMemory& m = per_rank[r];
    out.push_back({{"rank", r}, {"params", m.params}, {"grads", m.grads}, {"optimizer", m.optimizer},
                   {"activations", m.activations}, {"scratch", m.scratch}, {"comm_buffers", m.comm_buffers},
                   {"other", m.other}, {"total", m.total}});
  }
  return out;
}

}  // namespace llama4d
