#pragma once
// A rank's flight recorder, as PyTorch's NCCL flight recorder: the last collectives this rank
// issued on any of its groups (which group, its members, the call's sequence number on that
// group, its description and bytes) and whether each completed, failed, or is still in flight.
// When a job fails, the recorders of all ranks side by side say which rank did not enter which
// call: for each group, a member whose last sequence number is behind its peers' never issued
// the call they are waiting in (flight_diagnosis).
//
// One per rank (RankAccounting), written from the rank's compute thread (issue) and its comm
// stream (completion), hence the mutex. Keeps the last `capacity` entries.
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace llama4d {

struct FlightEntry {
  enum class State : uint8_t { issued, completed, failed };
  int64_t id = 0;              // this rank's running count of recorded calls
  std::string group;           // the group's name
  std::vector<int> members;    // its world ranks
  int64_t seq = -1;            // the call's index among the group's collectives; -1: send / recv
  std::string call;            // "all_reduce(count=16960, F32, sum)"
  int64_t bytes = 0;           // the call's whole buffer (all ranks' chunks for reduce_scatter, all_gather)
  State state = State::issued;
  std::string error;           // failed: why
};

// Entries a rank's recorder keeps by default.
inline constexpr size_t kFlightRecorderEntries = 32;

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = kFlightRecorderEntries) : capacity_(capacity) {}
  // Records a call as issued; returns its id for completed / failed.
  int64_t issued(FlightEntry entry);
  void completed(int64_t id);
  void failed(int64_t id, const std::string& error);
  std::vector<FlightEntry> entries() const;

 private:
  FlightEntry* find(int64_t id);
  size_t capacity_;
  mutable std::mutex mu_;
  std::deque<FlightEntry> entries_;
  int64_t next_id_ = 0;
};

// The ranks' recorders (index: world rank) as JSON: {"ranks": [{"rank", "entries": [...]}]}.
nlohmann::json flight_json(const std::vector<std::vector<FlightEntry>>& ranks);

// For every group (by its members) whose members' last collective sequence numbers differ:
// "rank 1 did not enter all_reduce(count=16960, F32, sum) #16 on group 'world' (its last: #15,
// completed)", one line per lagging member, those blocked in no call first (the cause: hung,
// crashed or slow outside communication), then those blocked in another group's call (held up
// by the first); "" when every group's members issued the same calls. A member with no call on
// the group among a full recorder's entries may have entered it before they were pushed out: it
// is listed last, as not seen rather than as not entering.
std::string flight_diagnosis(const std::vector<std::vector<FlightEntry>>& ranks);

}  // namespace llama4d
