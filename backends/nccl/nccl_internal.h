#pragma once
// Internals of the NCCL backend, shared by its .cpp files. Everything here runs on the session's
// communication thread (the only thread that calls NCCL or touches these members).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <tuple>
#include <memory>
#include <string>
#include <vector>

#include "backends/nccl/nccl_library.h"
#include "backends/nccl/nccl_session.h"
#include "core/comm/comm_model.h"
#include "core/comm/comm_stream.h"

namespace llama4d {

namespace nccl_detail {

using Clock = std::chrono::steady_clock;

// Device memory owned by the backend, allocated and freed in the order of a stream, from the
// session's pool (comm_pool()). Not cudaMalloc/cudaFree: cudaFree waits for the whole device, and
// with a transfer on it that waits for a peer, that wait could be for this very process. Not the
// device's default pool either: it may hand out a block still promised to another stream's
// pending work and make the new stream wait for it (cudaMemPoolReuseAllowInternalDependencies),
// a wait with no deadline behind a send that waits for a peer. The session's pool forbids that.
class DeviceBytes {
 public:
  explicit DeviceBytes(cudaStream_t stream = nullptr) : stream_(stream) {}
  DeviceBytes(int64_t bytes, cudaStream_t stream) : stream_(stream) { reserve(bytes); }
  ~DeviceBytes() { release(); }
  DeviceBytes(DeviceBytes&& o) noexcept : p_(o.p_), bytes_(o.bytes_), stream_(o.stream_) { o.p_ = nullptr, o.bytes_ = 0; }
  DeviceBytes& operator=(DeviceBytes&& o) noexcept;
  char* get() const { return p_; }
  // Grows (never shrinks) to at least `bytes`; the old contents are not kept.
  char* reserve(int64_t bytes);
  // Frees the memory once the work queued on `stream` so far is done.
  void release_after(cudaStream_t stream);

 private:
  void release() { release_after(stream_); }
  char* p_ = nullptr;
  int64_t bytes_ = 0;
  cudaStream_t stream_ = nullptr;
};

// The pool DeviceBytes allocate from, made by the session for its GPU (see DeviceBytes).
cudaMemPool_t comm_pool();
void make_comm_pool(int device);

void check_cuda(cudaError_t e, const std::string& what);  // CommError naming `what`
// Whether the GPU can address p directly (device or managed memory); host memory cannot.
bool device_accessible(const void* p);

// A group's three communicators over the same members, each with its stream: collectives, and
// point-to-point messages to even and to odd group ranks (nccl_session.h says why).
struct GroupComms {
  ncclComm_t coll = nullptr, to_even = nullptr, to_odd = nullptr;
  cudaStream_t coll_stream = nullptr, to_even_stream = nullptr, to_odd_stream = nullptr;
};

// The unique ids a group's communicators start from, as bytes: coll, to_even, to_odd.
constexpr size_t kIdBytes = sizeof(ncclUniqueId);
constexpr size_t kGroupIdBytes = 3 * kIdBytes;

}  // namespace nccl_detail

struct NcclSession::Impl {
  NcclOptions options;
  CommStream stream{"nccl comm", /*allow_inline=*/false};  // the one thread that calls NCCL
  int rank = 0, size = 1, device = 0;
  std::unique_ptr<RankAccounting> accounting;
  std::shared_ptr<ProcessGroup> world;
  std::atomic<bool> broken{false};  // a failure aborted the communicators

  // Comm thread only:
  std::vector<ncclComm_t> comms;       // every communicator, destroyed (or aborted) at the end
  cudaStream_t copy_stream = nullptr;  // payload copies of sends (never behind a transfer)
  struct PendingSend {
    cudaEvent_t delivered = nullptr;    // recorded behind the transfer
    nccl_detail::DeviceBytes buffer;    // header and payload, freed once delivered
  };
  std::deque<PendingSend> pending_sends;  // still on the wire

  // Frees what the sends that arrived held.
  void progress_sends();
  // Creates this process's member of the communicators of `ids` (kGroupIdBytes), `n` members,
  // this one `rank`, and connects the point-to-point pairs; waits for every member up to the
  // deadline.
  nccl_detail::GroupComms make_comms(const std::vector<uint8_t>& ids, int n, int rank,
                                     nccl_detail::Clock::time_point deadline, const std::string& what);
  // Polls until `comm` has finished its last call (non-blocking communicators may return
  // ncclInProgress); CommError on an error or past the deadline.
  void settle(ncclComm_t comm, nccl_detail::Clock::time_point deadline, const std::string& what);
  // Checks an NCCL call's result: fails on an error, settles on ncclInProgress.
  void check(ncclResult_t r, ncclComm_t comm, nccl_detail::Clock::time_point deadline, const std::string& what);
  // Polls `event` until it completed; fails when one of `comms` reports an error or past the
  // deadline.
  void wait_event(cudaEvent_t event, const std::vector<ncclComm_t>& comms, nccl_detail::Clock::time_point deadline,
                  const std::string& what);
  // Aborts every communicator (peers blocked on this rank then fail too), marks the session
  // broken and throws CommError(message).
  [[noreturn]] void fail(const std::string& message);
};

namespace nccl_detail {

class NcclProcessGroup final : public ProcessGroup, public std::enable_shared_from_this<NcclProcessGroup> {
 public:
  NcclProcessGroup(Info info, NcclSession::Impl& session, GroupComms comms);
  std::string_view backend() const override { return "nccl"; }

 protected:
  std::shared_ptr<Work> submit(CommCall call) override;
  std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& world_ranks, const std::string& name) override;
  // GPU memory the host can address too (managed, as the CUDA compute backend allocates): the
  // collectives use it where it lies, without staging. Freeing it (cudaFree) waits for the
  // device: drop it when no transfer of this process is in flight.
  std::shared_ptr<void> make_symmetric(int64_t bytes) override;

 private:
  double run_collective(const CommCall& call, int64_t seq, double issue_us);
  double run_send(const CommCall& call, double issue_us);
  double run_recv(const CommCall& call, double issue_us);

  // Point to point. Every message is a 16-byte header (tag, payload bytes) and then the payload,
  // so that a receiver can take messages by tag as the contract says, although NCCL delivers a
  // pair's messages in order only: one that arrives before its recv waits in the inbox.
  // (ProcessGroup refuses messages to oneself, so every message crosses NCCL.)
  struct Message {
    int64_t bytes = 0;
    DeviceBytes payload;
  };
  struct Header {
    int64_t tag = 0;
    int64_t bytes = 0;
  };
  // The communicator and stream of a message between this rank and `peer`: chosen by the
  // receiver's parity.
  std::pair<ncclComm_t, cudaStream_t> link_to(int peer, bool sending) const;
  // Receives the next message `peer` sent (its header, then its payload into `into` when the tag
  // and size are the caller's, else into a buffer of its own); returns its header.
  Header receive_next(int peer, int want_tag, int64_t want_bytes, void* into, Message& other,
                      Clock::time_point deadline, const std::string& context);

  // Each rank sends block j of `in` (counts[j] elements at prefix offset j) to rank j and
  // receives its own block from every rank; the owner adds the n contributions in the order of
  // the group's algorithm into out[counts[me]]. out may be this rank's block of in.
  void reduce_scatter(void* out, const void* in, const std::vector<int64_t>& counts, DType dtype, ReduceOp op,
                      Clock::time_point deadline, const std::string& context);
  // out holds every rank's block (counts, prefix offsets); this rank's is already in place.
  void all_gather(void* out, const std::vector<int64_t>& counts, int64_t elem, Clock::time_point deadline,
                  const std::string& context);
  void broadcast(void* buf, int64_t bytes, int root, Clock::time_point deadline, const std::string& context);
  // Returns the bytes each rank sends each rank (every member's send counts), after checking
  // that this rank's recv counts match what its peers send.
  std::vector<std::vector<int64_t>> all_to_all(const CommCall& call, Clock::time_point deadline,
                                               const std::string& context);
  void barrier(Clock::time_point deadline, const std::string& context);
  // Runs one ncclGroupStart/End of sends and receives on the collective communicator and waits
  // for it.
  struct Transfer {
    const void* send = nullptr;  // null: a receive
    void* recv = nullptr;
    int64_t bytes = 0;
    int peer = 0;
  };
  void exchange(const std::vector<Transfer>& transfers, Clock::time_point deadline, const std::string& context);

  // A device address for a caller's buffer: the buffer itself where the GPU reaches it,
  // otherwise `staging` (filled from the buffer when copy_in).
  char* on_device(const void* p, int64_t bytes, DeviceBytes& staging, bool copy_in);

  NcclSession::Impl& s_;
  GroupComms comms_;
  DeviceBytes scratch_, in_staging_, out_staging_;  // comm thread only, on the collective stream
  std::map<std::pair<int, int64_t>, std::deque<Message>> inbox_;  // (peer, tag): arrived, not yet received
};

}  // namespace nccl_detail
}  // namespace llama4d
