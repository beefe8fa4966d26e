#pragma once
// The MPI backend: one OS process per rank (launched by mpirun), the same ProcessGroup as the
// virtual backend. Collectives are built from MPI point-to-point messages following the same
// algorithms (ordered = direct reduce-scatter in rank order + all-gather; ring = NCCL's ring),
// with the same reduction kernels, so a run gives the virtual backend's bits exactly.
//
//   MpiSession mpi;                    // MPI_Init (once per process)
//   ProcessGroup& world = mpi.world();
//   world.all_reduce(buf, n, DType::f32, ReduceOp::sum);
//                                      // ~MpiSession: MPI_Finalize
//
// Every MPI call runs on one communication thread per process (MPI_THREAD_FUNNELED is all
// it needs); that thread is also the rank's comm stream, so async operations overlap compute.
// Waits poll with the group timeout: a peer that never answers is named in a CommError instead
// of hanging. After such an error the session is broken: MPI is not finalised, and the process
// should exit (mpirun then stops the other ranks). Groups must not be used once their session
// is destroyed.
//
// Transport: groups whose members share one node move large buffers (>= 64 KiB) straight
// between the members' buffers: with plain loads and stores where they lie in symmetric memory
// (ProcessGroup::allocate_symmetric), otherwise by single kernel copies (Linux cross-memory
// attach, when the kernel allows it). Others, and small messages, use point-to-point messages.
// The traffic log counts the modelled algorithm's bytes either way. Symmetric memory, like the
// groups, must not be used once its session is destroyed.
#include <chrono>
#include <memory>

#include "core/comm/cluster.h"
#include "core/comm/comm_types.h"
#include "core/comm/process_group.h"

namespace llama4d {

struct MpiOptions {
  ReduceAlgo algo = ReduceAlgo::ordered;
  std::chrono::milliseconds timeout{60000};
  // Links and HBM of the modelled cluster (for traffic and simulated time); nodes derived from
  // the world size.
  ClusterSpec cluster;
  // Exchange a small signature of every collective first, to report mismatched calls (rank 0 in
  // all_reduce while rank 1 is in all_gather) with both calls instead of corrupting memory.
  bool check_calls = true;
  // Node-local collectives on private buffers read and write peers' memory with single kernel
  // copies (process_vm_readv/writev) where the kernel allows it. Off: only buffers in symmetric
  // memory take the node-local path; the rest travel as messages.
  bool cross_memory_attach = true;
};

class MpiSession {
 public:
  // Initialises MPI. One session per process; a second one throws InputError.
  explicit MpiSession(MpiOptions options = {});
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const;
  int size() const;
  // Processes of this job on this node, this one included (they share its cores).
  int node_size() const;
  ProcessGroup& world();
  // A fresh world group (its own communicator) with another reduction algorithm. Collective:
  // every process calls it.
  std::shared_ptr<ProcessGroup> new_world(ReduceAlgo algo);
  RankAccounting& accounting();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace llama4d
