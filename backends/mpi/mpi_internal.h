#pragma once
// Internals of the MPI backend, shared by its .cpp files. Everything declared here runs on the
// session's communication thread (the only thread that calls MPI).
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backends/mpi/mpi_session.h"
#include "core/dist/comm_model.h"
#include "core/dist/comm_stream.h"

namespace llama4d {

namespace mpi_detail {

using Clock = std::chrono::steady_clock;

// MPI counts are ints: larger messages travel as several pieces of at most 1 GiB.
constexpr int64_t kMaxPiece = int64_t(1) << 30;
constexpr int64_t kBroadcastSegment = int64_t(1) << 20;  // pipelining unit of the chain broadcast
// From this many bytes on, groups living on one node move data through a shared-memory window.
constexpr int64_t kSharedMemoryThreshold = 64 << 10;
enum Tag : int { kTagReduceScatter = 1, kTagAllGather = 2, kTagBroadcast = 3, kTagAllToAll = 4 };

std::string mpi_error_text(int code);
void check_mpi(int rc, const std::string& what);  // CommError naming `what` on failure
inline int mod(int a, int n) { return ((a % n) + n) % n; }
uint64_t hash_counts(const std::vector<int64_t>& counts);

// A shared-memory window: one segment per member of a node-local group, all mapped into every
// member's address space. Owned jointly by its group and the session (which frees what is left
// before MPI_Finalize).
struct SharedWindow {
  MPI_Win win = MPI_WIN_NULL;
  int64_t bytes_per_rank = 0;
  std::vector<char*> segment;  // by group rank
  void free();
};

}  // namespace mpi_detail

struct MpiSession::Impl {
  MpiOptions options;
  CommStream stream{"mpi comm", /*allow_inline=*/false};  // MPI_THREAD_FUNNELED: one thread calls MPI
  int rank = 0, size = 1;
  std::unique_ptr<RankAccounting> accounting;
  std::shared_ptr<ProcessGroup> world;
  std::atomic<bool> broken{false};  // a failure left MPI in an unknown state: do not finalise

  // Comm thread only:
  std::vector<MPI_Comm> comms;  // every communicator created, freed before MPI_Finalize
  std::vector<std::shared_ptr<mpi_detail::SharedWindow>> windows;
  struct PendingSend {
    std::vector<MPI_Request> requests;
    std::vector<unsigned char> payload;
  };
  std::deque<PendingSend> pending_sends;  // eager sends still on the wire

  // Lets buffered sends complete; called while waiting for anything.
  void progress_sends();
  std::shared_ptr<ProcessGroup> make_world(ReduceAlgo algo);
  // Registers a communicator for freeing at the end, with errors returned instead of aborting.
  void adopt(MPI_Comm comm);
};

namespace mpi_detail {

// One rank's handle on one group: a communicator for collectives, one for point-to-point,
// and, when every member is on this node, a node communicator and a shared-memory window.
class MpiProcessGroup final : public ProcessGroup, public std::enable_shared_from_this<MpiProcessGroup> {
 public:
  // Collective over the members (comm thread): finds out whether they share this node's memory.
  MpiProcessGroup(Info info, MpiSession::Impl& session, MPI_Comm coll, MPI_Comm p2p);
  std::string_view backend() const override { return "mpi"; }

 protected:
  std::shared_ptr<Work> submit(CommCall call) override;
  std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& world_ranks, const std::string& name) override;

 private:
  struct Request {
    MPI_Request request;
    int peer;  // group rank, -1 for a collective request
  };

  double run_collective(const CommCall& call, int64_t seq, double issue_us);
  double run_send(const CommCall& call, double issue_us);
  double run_recv(const CommCall& call, double issue_us);

  void isend(std::vector<Request>& reqs, const void* buf, int64_t bytes, int peer, int tag, MPI_Comm comm);
  void irecv(std::vector<Request>& reqs, void* buf, int64_t bytes, int peer, int tag, MPI_Comm comm);
  // Polls until every request completed; past the deadline, a CommError names the peers still out.
  std::vector<MPI_Status> wait(std::vector<Request>& reqs, Clock::time_point deadline, const std::string& context);

  double exchange_signatures(const CommCall& call, int64_t seq, double ready, Clock::time_point deadline,
                             const std::string& context, std::vector<std::vector<int64_t>>* a2a_counts);

  // Message-passing algorithms (any placement of ranks).
  void ring_reduce_scatter(char* work, const std::vector<int64_t>& counts, DType dtype, ReduceOp op,
                           Clock::time_point deadline, const std::string& context);
  void ring_all_gather(char* work, const std::vector<int64_t>& counts, int64_t elem, Clock::time_point deadline,
                       const std::string& context);
  void direct_reduce_scatter(void* out, const char* in, const std::vector<int64_t>& counts, DType dtype, ReduceOp op,
                             Clock::time_point deadline, const std::string& context);
  void direct_all_gather(char* work, const std::vector<int64_t>& counts, int64_t elem, Clock::time_point deadline,
                         const std::string& context);
  void chain_broadcast(char* buf, int64_t bytes, int root, Clock::time_point deadline, const std::string& context);
  void all_to_all(const CommCall& call, Clock::time_point deadline, const std::string& context);

  // Shared-memory algorithms (all members on one node; mpi_shared_memory.cpp). They add in the
  // same order as the message-passing ones, so the bits do not depend on the transport.
  bool use_shared_memory(const CommCall& call) const;
  void ensure_window(int64_t bytes_per_rank);  // collective; grows the window when needed
  void node_barrier(Clock::time_point deadline, const std::string& context);
  void shared_all_reduce(const CommCall& call, Clock::time_point deadline, const std::string& context);
  void shared_reduce_scatter(const CommCall& call, Clock::time_point deadline, const std::string& context);
  void shared_all_gather(const CommCall& call, Clock::time_point deadline, const std::string& context);
  void shared_broadcast(const CommCall& call, Clock::time_point deadline, const std::string& context);

  std::string where(const CommCall& call, int64_t seq) const;
  [[noreturn]] void fail(const std::string& message);

  MpiSession::Impl& s_;
  const MPI_Comm coll_, p2p_;  // collectives and point-to-point never share a message queue
  MPI_Comm node_ = MPI_COMM_NULL;  // the same members, when they all share this node's memory
  std::shared_ptr<SharedWindow> window_;
  std::atomic<int64_t> next_seq_{0};
  std::map<std::vector<int>, int> creations_;               // comm thread only
  std::map<std::tuple<int, int, bool>, int64_t> p2p_seq_;  // comm thread only
};

}  // namespace mpi_detail
}  // namespace llama4d
