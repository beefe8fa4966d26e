#pragma once
// One rank's handle on one group of the virtual backend. Collectives rendezvous in the group's
// slot for their sequence number; send/recv go through buffered FIFOs. Everything runs on
// the rank's CommStream, in issue order.
#include <atomic>
#include <map>
#include <memory>

#include "backends/virtual/virtual_world.h"
#include "core/comm/comm_stream.h"
#include "core/comm/process_group.h"

namespace llama4d::virt {

class VirtualProcessGroup final : public ProcessGroup, public std::enable_shared_from_this<VirtualProcessGroup> {
 public:
  VirtualProcessGroup(Info info, std::shared_ptr<World> world, std::shared_ptr<GroupState> group, CommStream& stream);
  std::string_view backend() const override { return "virtual"; }

 protected:
  std::shared_ptr<Work> submit(CommCall call) override;
  std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& world_ranks, const std::string& name) override;

 private:
  // Each returns the simulated time the operation ended.
  double run_collective(const CommCall& call, int64_t seq, double issue_us);
  double run_send(const CommCall& call, double issue_us);
  double run_recv(const CommCall& call, double issue_us);

  std::string missing(const std::vector<uint8_t>& flags) const;  // "rank 2, rank 5"
  [[noreturn]] void throw_aborted(std::unique_lock<std::mutex>& lock, const std::string& context);
  void leave_slot(std::unique_lock<std::mutex>& lock, int64_t seq, Slot& s);

  std::shared_ptr<World> world_;
  std::shared_ptr<GroupState> group_;
  CommStream& stream_;
};

}  // namespace llama4d::virt
