#pragma once
// Internal state shared by the threads of one VirtualCluster::run: the groups, their
// rendezvous slots, point-to-point channels, and the abort flag every wait watches.
// One mutex + condition variable guard all of it: collectives are coarse, and a single lock
// makes "abort wakes every waiter" trivially correct. Data is never moved under the lock.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backends/virtual/virtual_cluster.h"
#include "core/comm/comm_model.h"
#include "core/tensor/memory_tracker.h"
#include "core/comm/process_group.h"
#include "core/ops.h"

namespace llama4d::virt {

// What one member brought to a collective.
struct Publication {
  CommCall call;
  void* out = nullptr;
  const void* in = nullptr;  // may point at a private copy (in-place all_to_all)
  double ready_us = 0;       // simulated time this member's comm stream could start
};

// The rendezvous of the seq-th collective of a group. Members publish their buffers on
// arrival; once all arrived each moves its own share of the data (no locks), then waits until
// every member finished, because peers read and write each other's buffers.
struct Slot {
  explicit Slot(int n)
      : pub(size_t(n)), arrived(size_t(n), 0), started(size_t(n), 0), done(size_t(n), 0), left(size_t(n), 0) {}
  std::vector<Publication> pub;
  std::vector<uint8_t> arrived, started, done, left;
  int n_arrived = 0, n_done = 0, n_left = 0;
  CommPlan plan;           // set by the last member to arrive
  double sim_start_us = 0;
};

struct GroupState {
  GroupState(int64_t id_, std::string name_, std::vector<int> world_ranks_)
      : id(id_), name(std::move(name_)), world_ranks(std::move(world_ranks_)) {}
  const int64_t id;
  const std::string name;
  const std::vector<int> world_ranks;
  std::map<int64_t, Slot> slots;  // by call sequence number
};

// A world's own copy of some bytes (a send's payload, an in-place all_to_all's input), kept in
// the memory its ranks compute in: the compute backend's (device_alloc), so ranks sharing a GPU
// copy device to device, or the heap where no backend is linked.
class StagedBytes {
 public:
  StagedBytes() = default;
  StagedBytes(const ops::ComputeBackend* device, const void* src, int64_t bytes);
  ~StagedBytes();
  StagedBytes(StagedBytes&& o) noexcept;
  StagedBytes& operator=(StagedBytes&& o) noexcept;
  StagedBytes(const StagedBytes&) = delete;
  StagedBytes& operator=(const StagedBytes&) = delete;
  const void* data() const { return data_; }

 private:
  void release();

  const ops::ComputeBackend* device_ = nullptr;  // the backend that allocated data_; null: heap
  void* data_ = nullptr;
};

// A buffered send waiting for its recv.
struct Message {
  StagedBytes payload;
  CommCall call;               // the sender's call (for mismatch messages)
  double depart_us = 0;        // simulated time the data left the sender
  MemoryReservation reservation;  // the sender's comm buffer, released when received
};

// The message of a failure (what() of a std::exception, else "unknown exception").
std::string what_of(const std::exception_ptr& e);

struct World {
  World(const VirtualClusterOptions& options, std::vector<RankAccounting*> accounting);

  const int size;
  const ClusterSpec cluster;
  const ReduceAlgo algo;
  const std::chrono::milliseconds timeout;
  const std::function<void(int, CommOp, int64_t)> fault_hook;
  const std::vector<RankAccounting*> accounting;  // by world rank
  // The compute backend the ranks run on, which moves and reduces their buffers (data_movement.h);
  // null in a program that links none.
  const ops::ComputeBackend* const device;

  std::mutex mu;
  std::condition_variable cv;

  // Abort state: the first failure wins and is what every other rank reports.
  bool aborted = false;
  std::string abort_reason;
  std::exception_ptr first_error;
  std::vector<RankFailure> failures;
  std::vector<uint8_t> exited;  // rank's function returned and its stream drained

  std::shared_ptr<GroupState> world_group;
  // Sub-groups by (parent id, world ranks, k-th creation of that list by each member).
  std::map<std::tuple<int64_t, std::vector<int>, int>, std::shared_ptr<GroupState>> groups;
  std::vector<std::map<std::pair<int64_t, std::vector<int>>, int>> creations;  // per world rank
  int64_t next_group_id = 1;
  // Point-to-point FIFOs by (group id, source, destination, tag), group ranks.
  std::map<std::tuple<int64_t, int, int, int>, std::deque<Message>> channels;

  // Under `mu`: stops the world (first call only), wakes every waiter.
  void abort_locked(const std::string& reason, std::exception_ptr error);
  // A rank's function failed (takes the lock).
  void rank_failed(int rank, std::exception_ptr error);
  void rank_exited(int rank);
};

}  // namespace llama4d::virt
