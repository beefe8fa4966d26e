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
#include <utility>
#include <vector>

#include "backends/mpi/mpi_session.h"
#include "core/comm/comm_model.h"
#include "core/comm/comm_stream.h"

namespace llama4d {

namespace mpi_detail {

using Clock = std::chrono::steady_clock;

// MPI counts are ints: larger messages travel as several pieces of at most 1 GiB.
constexpr int64_t kMaxPiece = int64_t(1) << 30;
constexpr int64_t kBroadcastSegment = int64_t(1) << 20;  // pipelining unit of the chain broadcast
// From this many bytes on, groups living on one node move data by single-copy transfers.
constexpr int64_t kSingleCopyThreshold = 64 << 10;
enum Tag : int { kTagReduceScatter = 1, kTagAllGather = 2, kTagBroadcast = 3, kTagAllToAll = 4, kTagPresent = 5 };

std::string mpi_error_text(int code);
void check_mpi(int rc, const std::string& what);  // CommError naming `what` on failure
inline int mod(int a, int n) { return ((a % n) + n) % n; }
uint64_t hash_counts(const std::vector<int64_t>& counts);

// Symmetric memory of a node-local group: one MPI-3 shared-memory window, each member's
// segment mapped into every member's address space. Made collectively; a member dropping its
// pointer only marks it unused, and the group frees or reuses it once every member has.
struct SymmetricWindow {
  MPI_Win win = MPI_WIN_NULL;
  int64_t bytes = 0;               // of each member's segment
  std::vector<char*> segment;      // by group rank
  std::atomic<bool> in_use{true};  // this member still holds the pointer
  void free();                     // collective over the window's members
};

}  // namespace mpi_detail

struct MpiSession::Impl {
  MpiOptions options;
  CommStream stream{"mpi comm", /*allow_inline=*/false};  // MPI_THREAD_FUNNELED: one thread calls MPI
  int rank = 0, size = 1;
  int node_size = 1;  // processes of the job on this node (MPI_COMM_TYPE_SHARED)
  std::unique_ptr<RankAccounting> accounting;
  std::shared_ptr<ProcessGroup> world;
  std::atomic<bool> broken{false};  // a failure left MPI in an unknown state: do not finalise

  // Comm thread only:
  std::vector<MPI_Comm> comms;  // every communicator created, freed before MPI_Finalize
  // Every symmetric window still allocated, in creation order, freed before MPI_Finalize.
  std::vector<std::shared_ptr<mpi_detail::SymmetricWindow>> windows;
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

// One rank's handle on one group: a communicator for collectives, one for point-to-point, and,
// when every member is on this node and may access the others' memory, their process ids.
class MpiProcessGroup final : public ProcessGroup, public std::enable_shared_from_this<MpiProcessGroup> {
 public:
  // Collective over the members (comm thread): finds out whether single-copy transfers work.
  MpiProcessGroup(Info info, MpiSession::Impl& session, MPI_Comm coll, MPI_Comm p2p);
  std::string_view backend() const override { return "mpi"; }

 protected:
  std::shared_ptr<Work> submit(CommCall call) override;
  std::shared_ptr<ProcessGroup> make_group(const std::vector<int>& world_ranks, const std::string& name) override;
  std::shared_ptr<void> make_symmetric(int64_t bytes) override;

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
  // After a collective request timed out: the members that did not reach it (see the .cpp).
  std::vector<int> absent_members();

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

  // Node-local algorithms (mpi_single_copy.cpp): every member reads its peers' buffers and
  // writes their results in place, through symmetric memory where the buffers lie in it and by
  // single-copy kernel transfers otherwise. They add in the same order as the message-passing
  // ones, so the bits do not depend on the transport.
  struct PeerBuffers {
    uint64_t in = 0, out = 0;               // addresses in that member's process
    int32_t in_window = -1, out_window = -1;  // index in symmetric_, -1: not symmetric memory
    int64_t in_offset = 0, out_offset = 0;    // within that member's segment
  };
  struct Mapped {
    const char* in = nullptr;  // a peer's buffers as this process sees them; null: not mapped
    char* out = nullptr;
  };
  void probe_single_copy(bool same_node);  // collective; sets cma_ when every pair works
  bool use_single_copy(const CommCall& call) const;
  // Exchanges every member's buffers (also the entry barrier of the collective) and maps those
  // in symmetric memory. False, on every member alike, when some buffer is reachable neither way.
  bool publish_buffers(const CommCall& call, int64_t in_bytes, int64_t out_bytes, Clock::time_point deadline,
                       const std::string& context);
  // The closing barrier: no peer reads or writes this member's buffers after it.
  void close_single_copy(Clock::time_point deadline, const std::string& context);
  // Copies `bytes` from offset `at` of member `peer`'s input into `local`, or from `local` to
  // offset `at` of its output.
  void read_peer(int peer, void* local, int64_t at, int64_t bytes, const std::string& context);
  void write_peer(int peer, int64_t at, const void* local, int64_t bytes, const std::string& context);
  void cross_memory_copy(bool write, int peer, void* local, uint64_t remote, int64_t bytes, const std::string& context);
  int64_t staging_tile(int64_t elem);  // elements per staged tile; sizes staging_
  // Points inputs[k] at tile [t0, t0 + m) of contribution order[k]: in place where mapped,
  // otherwise read into a staging slot.
  void read_tile(const std::vector<int>& order, int64_t t0, int64_t m, int64_t elem, int64_t tile,
                 std::vector<const void*>& inputs, const std::string& context);
  bool single_copy_all_reduce(const CommCall& call, Clock::time_point deadline, const std::string& context);
  bool single_copy_reduce_scatter(const CommCall& call, Clock::time_point deadline, const std::string& context);
  bool single_copy_all_gather(const CommCall& call, Clock::time_point deadline, const std::string& context);
  bool single_copy_broadcast(const CommCall& call, Clock::time_point deadline, const std::string& context);
  // Where [p, p + bytes) lies in this group's symmetric memory: (window, offset), or (-1, 0).
  std::pair<int32_t, int64_t> find_symmetric(const void* p, int64_t bytes) const;

  [[noreturn]] void fail(const std::string& message);

  MpiSession::Impl& s_;
  const MPI_Comm coll_, p2p_;  // collectives and point-to-point never share a message queue
  bool node_local_ = false;          // every member on this node
  bool cma_ = false;                 // and each can read and write the others' memory
  std::vector<int64_t> peer_pids_;   // by group rank, when cma_
  uint64_t probe_value_ = 0;         // read by the peers while probing
  // Comm thread only:
  std::vector<std::shared_ptr<SymmetricWindow>> symmetric_;  // identical list on every member
  std::vector<PeerBuffers> peers_;   // the current node-local collective's buffers, by group rank
  std::vector<Mapped> mapped_;
  std::vector<unsigned char> staging_;
  std::map<std::vector<int>, int> creations_;               // comm thread only
};

}  // namespace mpi_detail
}  // namespace llama4d
