#pragma once
// A virtual GPU's HBM: what each rank holds, by category, against a capacity. Every Buffer
// (core/tensor/buffer.h) is charged here when it is allocated and credited when it is freed, so
// what a rank reports is what the process really allocated for it, and a strategy that does not
// fit fails the way a real GPU would, with an OutOfMemoryError that says what was live.
// Thread-safe: a rank's compute and communication threads may both allocate.
#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace llama4d {

// scratch: temporaries of one op or unit (backward work buffers), freed when it returns.
// other: state that is neither trained nor per token: the model's RoPE tables (cos and sin,
// [positions, hd/2] each, core/model/llama.h cover_positions).
enum class MemoryCategory : uint8_t { params, grads, optimizer, activations, scratch, comm_buffers, other };
constexpr int kMemoryCategories = 7;
std::string_view memory_category_name(MemoryCategory c);

// "1.50 GiB", "512.0 MiB", "12 B".
std::string format_bytes(int64_t bytes);

class MemoryTracker {
 public:
  // capacity_bytes 0 = unlimited.
  MemoryTracker(int rank, int64_t capacity_bytes) : rank_(rank), capacity_(capacity_bytes) {}

  // Records `bytes` more of `category`. Throws OutOfMemoryError naming the rank, the capacity,
  // the live breakdown and the request (`what`, e.g. "layer 3 activations") when it would not fit.
  void allocate(MemoryCategory category, int64_t bytes, std::string_view what = "");
  // Returns bytes; throws Error when more is released than is live (an accounting bug).
  void release(MemoryCategory category, int64_t bytes);

  int rank() const { return rank_; }
  int64_t capacity() const;
  void set_capacity(int64_t capacity_bytes);
  int64_t live(MemoryCategory category) const;
  int64_t live_total() const;
  int64_t peak(MemoryCategory category) const;  // highest live value of this category
  int64_t peak_total() const;                   // highest live total (not the sum of peaks)
  void reset_peaks();                           // peaks restart from what is live now
  // "live 1.2 GiB (params 512 MiB, grads 512 MiB, ...), peak 1.5 GiB of 2.0 GiB"
  std::string summary() const;

 private:
  std::string live_breakdown_locked() const;

  const int rank_;
  mutable std::mutex mu_;
  int64_t capacity_;
  std::array<int64_t, kMemoryCategories> live_{}, peak_{};
  int64_t live_total_ = 0, peak_total_ = 0;
};

// A rank's bytes by category: its peaks so far, or what is live now.
struct RankMemory {
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0, scratch = 0, comm_buffers = 0, other = 0, total = 0;
};
RankMemory memory_peaks(const MemoryTracker& tracker);
RankMemory memory_live(const MemoryTracker& tracker);
// [{"rank": r, "params": ..., "grads": ..., ...}] for reports.
nlohmann::json memory_json(const std::vector<RankMemory>& per_rank);

// RAII: holds `bytes` of `category` on a tracker for its lifetime.
class MemoryReservation {
 public:
  MemoryReservation() = default;
  MemoryReservation(MemoryTracker& tracker, MemoryCategory category, int64_t bytes, std::string_view what = "");
  ~MemoryReservation() { reset(); }
  MemoryReservation(MemoryReservation&& other) noexcept;
  MemoryReservation& operator=(MemoryReservation&& other) noexcept;
  MemoryReservation(const MemoryReservation&) = delete;
  MemoryReservation& operator=(const MemoryReservation&) = delete;
  void reset();
  int64_t bytes() const { return bytes_; }

 private:
  MemoryTracker* tracker_ = nullptr;
  MemoryCategory category_ = MemoryCategory::other;
  int64_t bytes_ = 0;
};

}  // namespace llama4d
