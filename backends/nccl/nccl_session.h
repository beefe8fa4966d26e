#pragma once
// The NCCL backend: one process per GPU, the same ProcessGroup as the virtual and MPI backends,
// its buffers in GPU memory (the CUDA compute backend's, --device cuda).
//
//   NcclSession nccl(options, bootstrap_from_store(rdzv));   // torchrun-style launch
//   NcclSession nccl(options, bootstrap_from_group(mpi.world()));  // under mpirun
//   nccl.world().all_reduce(grads, n, DType::f32, ReduceOp::sum);
//
// Same bits as the other backends. Every collective moves data with grouped ncclSend/ncclRecv
// (the "direct" algorithm of core/comm/comm_model.h: each rank pulls its chunk from every peer)
// and adds the contributions on the GPU in the order the group's algorithm names
// (core/comm/reduce_kernels.h's reduction_order; backends/nccl/device_reduce.h), so `ordered` and
// `ring` give exactly the virtual backend's results. NCCL's own all-reduce would be faster and
// add in an order NCCL picks (ring, tree or NVLS, by size and topology): not used, for that reason.
// The traffic log and simulated clock count the modelled algorithm, as in the MPI backend.
//
// Point to point. NCCL has no tags and no eager sends: a message is delivered when the receiver
// posts its recv, and a pair's messages match in the order they were issued. What keeps the
// ProcessGroup contract:
//   - send copies header (tag, size) and payload into a buffer of its own and completes when
//     that copy is done; the transfer runs behind it on the GPU;
//   - a receiver takes the pair's next message; one with another tag waits in an inbox for the
//     recv that names it, so messages are taken by tag as the contract says;
//   - messages travel on one of two communicators, chosen by the receiver's parity (each with a
//     stream): in a pipeline (r to r+1 and back) and in a ring shift (r to r+1), a rank's sends
//     and its receives are then never queued behind one another. A rank's receives from
//     different peers do run in the order it issued them, so a program that receives from
//     several peers in another order than they send (rank 2 takes rank 1's message first, while
//     rank 0 waits for rank 2 before sending to rank 1) can wait until the timeout; the
//     strategies of this project do not;
//   - every pair is connected when a group is made (NCCL would otherwise connect it on the first
//     message, and on a non-blocking communicator that first send waits for the receiver).
// Failures. Communicators are non-blocking (ncclConfig_t.blocking = 0): every wait polls the
// stream and ncclCommGetAsyncError up to the group timeout, then aborts every communicator of
// the session and throws a CommError naming the call. After it the session is broken (later
// calls fail at once); the process should exit. NCCL cannot tell which peer is missing; the
// message says so.
//
// Buffers may be GPU memory (cudaMalloc or managed, as the CUDA compute backend allocates) or
// host memory, which is copied through a device buffer. All NCCL and CUDA calls of a session run
// on its communication thread, which is also the rank's comm stream (async operations overlap
// compute). Groups must not be used once their session is destroyed.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/comm/cluster.h"
#include "core/comm/comm_types.h"
#include "core/comm/process_group.h"

namespace llama4d {

namespace store {
class Rendezvous;
}

// How the processes of a job find each other: their places, and one broadcast of a few bytes
// (NCCL's unique id, made by rank 0) to every rank.
struct NcclBootstrap {
  int rank = 0;
  int size = 1;
  int local_rank = -1;  // the GPU this process takes; -1: rank modulo the GPUs it sees
  std::function<std::vector<uint8_t>(const std::vector<uint8_t>& bytes_on_rank0)> broadcast;
};

// A torchrun-style job (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): the id travels
// through the rendezvous store. The rendezvous must outlive the session's construction.
NcclBootstrap bootstrap_from_store(store::Rendezvous& rdzv, std::optional<int> local_rank);
// Processes that already share a process group on the host (mpirun: MpiSession's world): the id
// is broadcast over it. local_rank: the process's index on its node, when the launcher says.
NcclBootstrap bootstrap_from_group(ProcessGroup& host_group, std::optional<int> local_rank);

struct NcclOptions {
  ReduceAlgo algo = ReduceAlgo::ordered;
  std::chrono::milliseconds timeout{60000};
  // Links and HBM of the modelled cluster (traffic and simulated time); nodes derived from the
  // world size.
  ClusterSpec cluster;
};

class NcclSession {
 public:
  // Picks the GPU (and makes it the calling thread's current device, for its compute), exchanges
  // the unique id and creates the world communicators (collective: every rank constructs its
  // session). CommError when NCCL cannot be loaded, no GPU is usable,
  // or a peer does not join within the timeout.
  NcclSession(NcclOptions options, NcclBootstrap bootstrap);
  // Destroys the communicators (after a failure: aborts them).
  ~NcclSession();
  NcclSession(const NcclSession&) = delete;
  NcclSession& operator=(const NcclSession&) = delete;

  int rank() const;
  int size() const;
  int device() const;  // the CUDA device ordinal in use
  ProcessGroup& world();
  RankAccounting& accounting();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Why NcclSession cannot run in this process ("nccl: cannot load libnccl.so.2 ...", "no usable
// CUDA GPU here ..."), or "" when it can. Starts no communicator.
std::string nccl_unusable_reason();

// NCCL's unique id as bytes (ncclGetUniqueId: it opens the bootstrap listener of this process,
// so only the process that will be rank 0 calls it).
std::vector<uint8_t> make_nccl_unique_id();

}  // namespace llama4d
