// Collectives of node-local MPI groups that move data between the members' own buffers, with
// no staging copy through a shared segment: after the members exchange the addresses of their
// buffers (which is also the entry barrier), each one reads its peers' inputs and writes their
// outputs directly, by one of two routes per buffer:
//   - symmetric memory (ProcessGroup::allocate_symmetric, mpi_symmetric_memory.cpp): the
//     buffer is mapped into every member, so plain loads and stores reach it, exactly as the
//     virtual backend's threads do;
//   - otherwise Linux cross-memory attach (process_vm_readv / process_vm_writev): one kernel
//     copy between two processes' private memory, as MPI libraries' intra-node transports move
//     large messages (OpenMPI's vader "cma", MPICH's nemesis LMT).
// The algorithms are the virtual backend's:
//   all_reduce      member `me` owns chunk me of the balanced split; tile by tile it reads that
//                   tile of every peer's input (in place when mapped, else into a staging buffer
//                   that stays in L2), reduces the N contributions in the backend's order
//                   (ordered: rank order; ring: me+1, ..., me) with the shared kernel, and writes
//                   the result into that tile of every member's output. Each byte is read once
//                   and written once; the bits equal the message-passing path.
//   reduce_scatter  the same without the writes to peers.
//   all_gather      every member copies each peer's input into its output.
//   broadcast       every non-root copies the root's buffer.
// Member `me` only ever writes chunk me of anyone's output during the collective, so in-place
// calls are safe: nobody reads a byte after someone else may have written it. A closing barrier
// keeps every buffer alive until no peer touches it any more.
//
// Groups probe once, when they are made, that every member can read every other's memory (the
// kernel may forbid it: Yama ptrace_scope, seccomp); without that, only collectives whose
// buffers are all symmetric memory take this path, and the rest use messages.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "backends/mpi/mpi_internal.h"
#include "core/comm/reduce_kernels.h"
#include "core/error.h"

#if defined(__linux__)
#include <sys/uio.h>
#define LLAMA4D_HAVE_CMA 1
#endif

namespace llama4d::mpi_detail {

namespace {

// Staging for the peers' tiles of one step: small enough to stay in L2 while the tile is
// reduced, large enough that a kernel call per peer and tile costs little. (Measured on the
// 2-core development VM, 64 MiB all_reduce on 4 ranks: 256-512 KiB beat 128 KiB and 1-16 MiB.)
constexpr int64_t kStagingBytes = 512 << 10;
constexpr int64_t kMinTileBytes = 16 << 10;

uint64_t address_of(const void* p) { return uint64_t(reinterpret_cast<uintptr_t>(p)); }

// A value every member can check it read correctly from a peer: differs by rank.
uint64_t probe_pattern(int rank) { return 0x6c6c616d61346400ull + uint64_t(rank); }

int64_t total_of(const std::vector<int64_t>& counts) {
  int64_t t = 0;
  for (int64_t c : counts) t += c;
  return t;
}

}  // namespace

void MpiProcessGroup::probe_single_copy(bool same_node) {
  struct Probe {
    int64_t pid;
    uint64_t address;
  };
  probe_value_ = probe_pattern(rank());
  const Probe mine{int64_t(getpid()), address_of(&probe_value_)};
  std::vector<Probe> all(static_cast<size_t>(size()));
  check_mpi(MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine), MPI_BYTE, coll_),
            "MPI_Allgather");
  int ok = same_node && size() > 1 && s_.options.cross_memory_attach ? 1 : 0;
#if defined(LLAMA4D_HAVE_CMA)
  for (int j = 0; ok && j < size(); ++j) {
    uint64_t value = 0;
    iovec local{&value, sizeof value};
    iovec remote{reinterpret_cast<void*>(uintptr_t(all[size_t(j)].address)), sizeof value};
    ok = process_vm_readv(pid_t(all[size_t(j)].pid), &local, 1, &remote, 1, 0) == ssize_t(sizeof value) &&
         value == probe_pattern(j);
  }
#else
  ok = 0;
#endif
  // Everyone agrees, and nobody's probe value goes away before the others read it.
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, coll_), "MPI_Allreduce");
  node_local_ = same_node;
  cma_ = ok != 0;
  if (cma_)
    for (const Probe& p : all) peer_pids_.push_back(p.pid);
}

bool MpiProcessGroup::use_single_copy(const CommCall& call) const {
  if (!node_local_ || size() == 1) return false;
  const int64_t elem = int64_t(dtype_size(call.dtype));
  int64_t bytes = 0;
  switch (call.op) {
    case CommOp::all_reduce:
    case CommOp::broadcast: bytes = call.count * elem; break;
    case CommOp::reduce_scatter:
    case CommOp::all_gather: bytes = total_of(call.counts) * elem; break;
    default: return false;  // all_to_all and barriers stay on messages
  }
  return bytes >= kSingleCopyThreshold;  // the same answer on every member
}

bool MpiProcessGroup::publish_buffers(const CommCall& call, int64_t in_bytes, int64_t out_bytes,
                                      Clock::time_point deadline, const std::string& context) {
  PeerBuffers mine;
  mine.in = address_of(call.in);
  mine.out = address_of(call.out);
  std::tie(mine.in_window, mine.in_offset) = find_symmetric(call.in, in_bytes);
  std::tie(mine.out_window, mine.out_offset) = find_symmetric(call.out, out_bytes);
  peers_.assign(size_t(size()), PeerBuffers{});
  MPI_Request req;
  check_mpi(MPI_Iallgather(&mine, int(sizeof mine), MPI_BYTE, peers_.data(), int(sizeof mine), MPI_BYTE, coll_, &req),
            "MPI_Iallgather");
  std::vector<Request> reqs = {{req, -1}};
  wait(reqs, deadline, context + " (exchanging buffer addresses)");
  // Window indices name the same window on every member: symmetric_ is built collectively.
  mapped_.assign(size_t(size()), Mapped{});
  bool all_mapped = true;
  for (int j = 0; j < size(); ++j) {
    const PeerBuffers& p = peers_[size_t(j)];
    // Only the buffers peers touch matter: inputs (of all but broadcast's non-roots) and, for
    // all_reduce, outputs. Decided from the table alone, so every member decides alike.
    const bool in_needed = call.op != CommOp::broadcast || j == call.root;
    const bool out_needed = call.op == CommOp::all_reduce;
    if ((in_needed && p.in_window < 0) || (out_needed && p.out_window < 0)) all_mapped = false;
    Mapped& m = mapped_[size_t(j)];
    if (j == rank()) {
      m = {static_cast<const char*>(call.in), static_cast<char*>(call.out)};
      continue;
    }
    if (p.in_window >= 0) m.in = symmetric_[size_t(p.in_window)]->segment[size_t(j)] + p.in_offset;
    if (p.out_window >= 0) m.out = symmetric_[size_t(p.out_window)]->segment[size_t(j)] + p.out_offset;
  }
  return cma_ || all_mapped;
}

void MpiProcessGroup::close_single_copy(Clock::time_point deadline, const std::string& context) {
  MPI_Request req;
  check_mpi(MPI_Ibarrier(coll_, &req), "MPI_Ibarrier");
  std::vector<Request> reqs = {{req, -1}};
  wait(reqs, deadline, context + " (waiting for every peer to finish with this rank's buffers)");
}

void MpiProcessGroup::read_peer(int peer, void* local, int64_t at, int64_t bytes, const std::string& context) {
  if (const char* src = mapped_[size_t(peer)].in) {
    if (bytes > 0 && local != src + at) std::memmove(local, src + at, size_t(bytes));
    return;
  }
  cross_memory_copy(false, peer, local, peers_[size_t(peer)].in + uint64_t(at), bytes, context);
}

void MpiProcessGroup::write_peer(int peer, int64_t at, const void* local, int64_t bytes, const std::string& context) {
  if (char* dst = mapped_[size_t(peer)].out) {
    if (bytes > 0 && dst + at != local) std::memmove(dst + at, local, size_t(bytes));
    return;
  }
  cross_memory_copy(true, peer, const_cast<void*>(local), peers_[size_t(peer)].out + uint64_t(at), bytes, context);
}

void MpiProcessGroup::cross_memory_copy(bool write, int peer, void* local, uint64_t remote, int64_t bytes,
                                        const std::string& context) {
#if defined(LLAMA4D_HAVE_CMA)
  char* l = static_cast<char*>(local);
  while (bytes > 0) {  // the kernel may move less than asked: go on from where it stopped
    iovec lv{l, size_t(bytes)};
    iovec rv{reinterpret_cast<void*>(uintptr_t(remote)), size_t(bytes)};
    const pid_t pid = pid_t(peer_pids_[size_t(peer)]);
    const ssize_t moved = write ? process_vm_writev(pid, &lv, 1, &rv, 1, 0) : process_vm_readv(pid, &lv, 1, &rv, 1, 0);
    if (moved <= 0) {
      const int err = moved < 0 ? errno : EIO;
      fail("mpi: " + context + ": " + (write ? "writing to " : "reading from ") + rank_label(peer) + "'s memory failed: " +
           (err == ESRCH ? std::string("its process is gone") : std::string(std::strerror(err))));
    }
    l += moved;
    remote += uint64_t(moved);
    bytes -= moved;
  }
#else
  (void)local, (void)remote, (void)bytes;
  fail("mpi: " + context + ": single-copy transfers are not available on this system");
#endif
}

int64_t MpiProcessGroup::staging_tile(int64_t elem) {
  const int64_t tile = std::max(kMinTileBytes, kStagingBytes / size()) / elem;
  staging_.resize(size_t(size() * tile * elem));  // n-1 peers' tiles and one reduced tile
  return tile;
}

void MpiProcessGroup::read_tile(const std::vector<int>& order, int64_t t0, int64_t m, int64_t elem, int64_t tile,
                                std::vector<const void*>& inputs, const std::string& context) {
  const int64_t at = t0 * elem;
  int slot = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const int from = order[k];
    if (const char* src = mapped_[size_t(from)].in) {
      inputs[k] = src + at;
      continue;
    }
    unsigned char* buf = staging_.data() + slot++ * tile * elem;
    read_peer(from, buf, at, m * elem, context);
    inputs[k] = buf;
  }
}

bool MpiProcessGroup::single_copy_all_reduce(const CommCall& call, Clock::time_point deadline,
                                             const std::string& context) {
  const int n = size(), me = rank();
  const int64_t elem = int64_t(dtype_size(call.dtype));
  if (!publish_buffers(call, call.count * elem, call.count * elem, deadline, context)) return false;
  const std::vector<int64_t> counts = split_counts(call.count, n), off = prefix_offsets(counts);
  const std::vector<int> order = reduction_order(n, me, algo());
  const int64_t tile = staging_tile(elem);
  unsigned char* reduced = staging_.data() + (n - 1) * tile * elem;
  std::vector<const void*> inputs(static_cast<size_t>(n));
  const int64_t end = off[size_t(me)] + counts[size_t(me)];
  for (int64_t t0 = off[size_t(me)]; t0 < end; t0 += tile) {
    const int64_t m = std::min(tile, end - t0);
    read_tile(order, t0, m, elem, tile, inputs, context);
    reduce_sequence(reduced, inputs.data(), n, m, call.dtype, call.reduce, n, algo() == ReduceAlgo::ring);
    for (int j = 0; j < n; ++j) write_peer(j, t0 * elem, reduced, m * elem, context);
  }
  close_single_copy(deadline, context);
  return true;
}

bool MpiProcessGroup::single_copy_reduce_scatter(const CommCall& call, Clock::time_point deadline,
                                                 const std::string& context) {
  const int n = size(), me = rank();
  const int64_t elem = int64_t(dtype_size(call.dtype));
  if (!publish_buffers(call, total_of(call.counts) * elem, call.counts[size_t(me)] * elem, deadline, context))
    return false;
  const std::vector<int> order = reduction_order(n, me, algo());
  const int64_t tile = staging_tile(elem);
  std::vector<const void*> inputs(static_cast<size_t>(n));
  const int64_t begin = prefix_offsets(call.counts)[size_t(me)], end = begin + call.counts[size_t(me)];
  for (int64_t t0 = begin; t0 < end; t0 += tile) {
    const int64_t m = std::min(tile, end - t0);
    read_tile(order, t0, m, elem, tile, inputs, context);
    // The output may be the in-place block of this member's input; reduce_sequence allows that.
    reduce_sequence(static_cast<char*>(call.out) + (t0 - begin) * elem, inputs.data(), n, m, call.dtype, call.reduce,
                    n, algo() == ReduceAlgo::ring);
  }
  close_single_copy(deadline, context);
  return true;
}

bool MpiProcessGroup::single_copy_all_gather(const CommCall& call, Clock::time_point deadline,
                                             const std::string& context) {
  const int64_t elem = int64_t(dtype_size(call.dtype));
  if (!publish_buffers(call, call.counts[size_t(rank())] * elem, total_of(call.counts) * elem, deadline, context))
    return false;
  const std::vector<int64_t> off = prefix_offsets(call.counts);
  char* out = static_cast<char*>(call.out);
  for (int j = 0; j < size(); ++j) read_peer(j, out + off[size_t(j)] * elem, 0, call.counts[size_t(j)] * elem, context);
  close_single_copy(deadline, context);
  return true;
}

bool MpiProcessGroup::single_copy_broadcast(const CommCall& call, Clock::time_point deadline,
                                            const std::string& context) {
  const int64_t bytes = call.count * int64_t(dtype_size(call.dtype));
  if (!publish_buffers(call, bytes, bytes, deadline, context)) return false;
  if (rank() != call.root) read_peer(call.root, call.out, 0, bytes, context);
  close_single_copy(deadline, context);
  return true;
}

}  // namespace llama4d::mpi_detail
