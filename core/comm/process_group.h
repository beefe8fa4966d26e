#pragma once
// ProcessGroup: how every parallel strategy talks, whatever runs the ranks (threads of the
// virtual backend, MPI processes, later NCCL). Shaped after PyTorch c10d and NCCL:
//   - flat signatures (buffer, count, dtype, op), outputs first;
//   - options structs with defaults (core/comm/options.h);
//   - every call returns a Work; synchronous calls return it already completed, async ones
//     (options.async_op) run on the rank's communication stream until wait();
//   - groups are passed explicitly; new_group() makes sub-groups. There is no global group.
// Buffers are the caller's; they must stay alive and untouched until the Work completes.
// Ranks are group ranks 0..size()-1 unless a name says "world".
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/comm/cluster.h"
#include "core/comm/comm_model.h"
#include "core/comm/comm_stream.h"
#include "core/comm/comm_types.h"
#include "core/comm/options.h"
#include "core/comm/rank_accounting.h"
#include "core/comm/work.h"
#include "core/tensor/dtype.h"

namespace llama4d {

// One operation as a backend receives it, normalised: reduce_scatter / all_gather carry one
// count per group rank, all_to_all the per-peer counts in both directions.
struct CommCall {
  CommOp op = CommOp::barrier;
  void* out = nullptr;            // where results land (in-place ops: the buffer; recv: the buffer)
  const void* in = nullptr;       // what this rank contributes (in-place ops: the buffer; send)
  int64_t count = 0;              // all_reduce, broadcast, send, recv: elements of the buffer
  std::vector<int64_t> counts;    // reduce_scatter, all_gather: elements of each rank's chunk;
                                  // all_to_all: elements this rank sends to each peer
  std::vector<int64_t> recv_counts;  // all_to_all: elements this rank receives from each peer
  DType dtype = DType::f32;
  ReduceOp reduce = ReduceOp::sum;
  int root = 0;                   // broadcast
  int peer = -1;                  // send: destination, recv: source (group ranks)
  int tag = 0;                    // send / recv
  std::chrono::milliseconds timeout{0};  // resolved by the group: never 0 when a backend sees it
  bool async_op = false;
  bool uneven = false;            // the caller used a _v variant (messages name it so)
  std::string label;
};

// "all_reduce(count=1000, F32, sum)", "all_gather_v(counts=[3,4,4], BF16)", "send(count=8, F32, to 2, tag 0)".
std::string describe(const CommCall& call);

class ProcessGroup {
 public:
  // What a backend knows about one member's view of a group.
  struct Info {
    std::string name;              // "world", "tp", "dp", ... (names the group in logs)
    int rank = 0;                  // this member's group rank
    std::vector<int> world_ranks;  // world rank of every group rank
    ReduceAlgo algo = ReduceAlgo::ordered;
    std::chrono::milliseconds timeout{60000};
    ClusterSpec cluster;
    RankAccounting* accounting = nullptr;  // this rank's memory, trace and traffic log
  };

  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return info_.rank; }
  int size() const { return int(info_.world_ranks.size()); }
  const std::string& name() const { return info_.name; }
  virtual std::string_view backend() const = 0;  // "virtual", "mpi"
  const std::vector<int>& world_ranks() const { return info_.world_ranks; }
  int world_rank() const { return info_.world_ranks[size_t(info_.rank)]; }
  ReduceAlgo algo() const { return info_.algo; }
  std::chrono::milliseconds timeout() const { return info_.timeout; }
  const ClusterSpec& cluster() const { return info_.cluster; }
  RankAccounting& accounting() const { return *info_.accounting; }
  MemoryTracker& memory() const { return info_.accounting->memory; }
  RankTrace& trace() const { return info_.accounting->trace; }
  TrafficLog& traffic() const { return info_.accounting->traffic; }

  // buf[count] on every rank becomes the element-wise reduction of all ranks' buf.
  std::shared_ptr<Work> all_reduce(void* buf, int64_t count, DType dtype, ReduceOp op,
                                   const AllReduceOptions& opts = {});
  // out[count] = reduction of every rank's in[count]; out may equal in.
  std::shared_ptr<Work> all_reduce(void* out, const void* in, int64_t count, DType dtype, ReduceOp op,
                                   const AllReduceOptions& opts = {});
  // in[size() * count]; out[count] = reduction over ranks of block rank() of in.
  // In place when out == in + rank() * count (elements).
  std::shared_ptr<Work> reduce_scatter(void* out, const void* in, int64_t count, DType dtype, ReduceOp op,
                                       const ReduceScatterOptions& opts = {});
  // Uneven blocks: counts[size()], in[sum(counts)], out[counts[rank()]]; every rank passes the
  // same counts. In place when out == in + (sum of counts before rank()).
  std::shared_ptr<Work> reduce_scatter_v(void* out, const void* in, const std::vector<int64_t>& counts, DType dtype,
                                         ReduceOp op, const ReduceScatterOptions& opts = {});
  // in[count]; out[size() * count] holds every rank's in, in rank order.
  // In place when in == out + rank() * count.
  std::shared_ptr<Work> all_gather(void* out, const void* in, int64_t count, DType dtype,
                                   const AllGatherOptions& opts = {});
  // Uneven: counts[size()], in[counts[rank()]], out[sum(counts)]; every rank passes the same counts.
  std::shared_ptr<Work> all_gather_v(void* out, const void* in, const std::vector<int64_t>& counts, DType dtype,
                                     const AllGatherOptions& opts = {});
  // buf[count] of opts.root is copied to every rank's buf.
  std::shared_ptr<Work> broadcast(void* buf, int64_t count, DType dtype, const BroadcastOptions& opts = {});
  // Point to point. A send completes once its data is buffered (it never waits for the receiver);
  // recv completes when the matching send (same source and tag, in order) arrived.
  std::shared_ptr<Work> send(const void* buf, int64_t count, DType dtype, int dst, const SendOptions& opts = {});
  std::shared_ptr<Work> recv(void* buf, int64_t count, DType dtype, int src, const RecvOptions& opts = {});
  // in[size() * count]: block j goes to rank j; out[size() * count]: block i came from rank i.
  // out may equal in.
  std::shared_ptr<Work> all_to_all(void* out, const void* in, int64_t count, DType dtype,
                                   const AllToAllOptions& opts = {});
  // Uneven: in holds send_counts[j] elements for each rank j back to back; out receives
  // recv_counts[i] elements from each rank i back to back. recv_counts[i] on this rank must
  // equal send_counts[rank()] on rank i.
  std::shared_ptr<Work> all_to_all_v(void* out, const std::vector<int64_t>& recv_counts, const void* in,
                                     const std::vector<int64_t>& send_counts, DType dtype,
                                     const AllToAllOptions& opts = {});
  std::shared_ptr<Work> barrier(const BarrierOptions& opts = {});

  // The sub-group of `ranks` (ranks of this group, listed in the new group's rank order). Every
  // listed rank calls it with the same list; others do not. Calling it twice with the same list
  // makes two distinct groups (matched by call order). `name` labels it in logs (default: this
  // group's name and the list).
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks, const std::string& name = "");

  // Memory every member of this group can address directly, for buffers communicated often
  // (gradients, parameter shards, benchmark buffers): NCCL's ncclMemAlloc + buffer
  // registration, NVSHMEM, PyTorch's SymmetricMemory. Where ranks are separate processes on one
  // node (MPI), a collective whose buffers all lie in this group's symmetric memory reads and
  // writes the peers' buffers in place, with no staging copy; elsewhere it is ordinary memory.
  // Collective: every member calls it, in the same order (sizes may differ). The memory is
  // 64-byte aligned and lives while the returned pointer does; drop it only when no operation
  // uses it any more.
  std::shared_ptr<void> allocate_symmetric(int64_t bytes);

  // "rank 3" in the world group, "rank 1 (world rank 5)" elsewhere: how messages name members.
  std::string rank_label(int group_rank) const;

 protected:
  explicit ProcessGroup(Info info);
  // Runs (or queues, for async) one validated call; the returned Work completes when it is done.
  virtual std::shared_ptr<Work> submit(CommCall call) = 0;
  // Creates this member's handle of the sub-group of `world_ranks`.
  virtual std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& world_ranks, const std::string& name) = 0;
  // allocate_symmetric once `bytes` is validated; the default is private aligned heap memory.
  virtual std::shared_ptr<void> make_symmetric(int64_t bytes);
  const Info& info() const { return info_; }
  // Backends call this when an operation finished: appends this rank's traffic record (bytes
  // from `plan`) and a comm span to its trace. seq: the call's index on this group. ready_us:
  // when this rank's comm stream was ready for the call (a later sim_start_us is waiting for peers).
  void record_comm(const CommCall& call, const CommPlan& plan, int64_t seq, double wall_start_us, double ready_us,
                   double sim_start_us, double sim_end_us);
  // How the backends submit (each member runs its operations in order on its comm stream):
  // queues run(call, seq, issue_us), which performs the call on the stream and returns its
  // simulated end; waiting for the Work joins this rank's compute clock with that end. seq: the
  // call's index among this group's collectives, -1 for send and recv; issue_us: the simulated
  // time it was issued at.
  using Runner = std::function<double(const CommCall& call, int64_t seq, double issue_us)>;
  std::shared_ptr<Work> submit_on(CommStream& stream, CommCall call, Runner run);
  // "all_reduce(count=8, F32, sum) #3 on group 'dp'": how error messages name a call.
  std::string where(const CommCall& call, int64_t seq) const;
  // A send's or recv's index among this member's messages with the same peer, tag and direction
  // (the traffic log pairs a send with its recv by it). From the comm stream only.
  int64_t next_message_index(const CommCall& call);
  // The group ranks of members given by world rank.
  std::vector<int> group_ranks_of(const std::vector<int>& world_ranks) const;

 private:
  std::shared_ptr<Work> run(CommCall call);
  void check_buffer(const void* p, int64_t count, const char* what) const;
  void check_counts(const std::vector<int64_t>& counts, const char* what) const;  // one per rank, none negative
  void check_rank(int r, const char* what) const;

  Info info_;
  std::atomic<int64_t> next_seq_{0};                                 // collectives submitted
  std::map<std::tuple<int, int, bool>, int64_t> message_index_;      // (peer, tag, is_send) -> messages so far
};

}  // namespace llama4d
