// Collectives of node-local MPI groups through a shared-memory window: every member copies its
// contribution into its own segment, and after a node barrier reads its peers' segments
// directly, as NCCL's and MPI libraries' intra-node transports do. A member reduces its chunk
// of all segments in the virtual backend's order (ordered: rank order; ring: k+1, ..., k), with
// the same kernel, so the bits equal the message-passing path and the virtual backend.
#include <algorithm>
#include <cstring>

#include "backends/mpi/mpi_internal.h"
#include "core/dist/reduce_kernels.h"
#include "core/error.h"

namespace llama4d::mpi_detail {

namespace {

constexpr int64_t kTileBytes = 32 * 1024;  // reduced in L1, then written where it belongs

std::vector<int> reduction_order(int n, int me, ReduceAlgo algo) {
  std::vector<int> order;
  for (int k = 0; k < n; ++k) order.push_back(algo == ReduceAlgo::ring ? (me + 1 + k) % n : k);
  return order;
}

void copy(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, size_t(bytes));
}

}  // namespace

void SharedWindow::free() {
  if (win == MPI_WIN_NULL) return;
  MPI_Win_unlock_all(win);
  MPI_Win_free(&win);
  win = MPI_WIN_NULL;
  bytes_per_rank = 0;
  segment.clear();
}

bool MpiProcessGroup::use_shared_memory(const CommCall& call) const {
  if (node_ == MPI_COMM_NULL || size() == 1) return false;
  const int64_t elem = int64_t(dtype_size(call.dtype));
  int64_t bytes = 0;
  switch (call.op) {
    case CommOp::all_reduce:
    case CommOp::broadcast: bytes = call.count * elem; break;
    case CommOp::reduce_scatter:
    case CommOp::all_gather:
      for (int64_t c : call.counts) bytes += c * elem;
      break;
    default: return false;  // all_to_all and barriers stay on messages
  }
  return bytes >= kSharedMemoryThreshold;  // the same answer on every member
}

void MpiProcessGroup::ensure_window(int64_t bytes_per_rank) {
  SharedWindow& w = *window_;
  if (w.win != MPI_WIN_NULL && w.bytes_per_rank >= bytes_per_rank) return;
  w.free();
  // Grow geometrically in whole MiB, so a sweep of sizes reallocates rarely.
  const int64_t mib = int64_t(1) << 20;
  const int64_t want = std::max(bytes_per_rank + bytes_per_rank / 2, mib) / mib * mib + mib;
  char* base = nullptr;
  check_mpi(MPI_Win_allocate_shared(MPI_Aint(want), 1, MPI_INFO_NULL, node_, &base, &w.win),
            "MPI_Win_allocate_shared of " + std::to_string(want) + " bytes");
  w.bytes_per_rank = want;
  w.segment.assign(size_t(size()), nullptr);
  for (int r = 0; r < size(); ++r) {
    MPI_Aint seg_size = 0;
    int disp = 0;
    check_mpi(MPI_Win_shared_query(w.win, r, &seg_size, &disp, &w.segment[size_t(r)]), "MPI_Win_shared_query");
  }
  // A passive-target epoch for the window's lifetime; MPI_Win_sync orders loads and stores.
  check_mpi(MPI_Win_lock_all(MPI_MODE_NOCHECK, w.win), "MPI_Win_lock_all");
}

void MpiProcessGroup::node_barrier(Clock::time_point deadline, const std::string& context) {
  MPI_Win_sync(window_->win);  // my stores to my segment become visible ...
  MPI_Request req;
  check_mpi(MPI_Ibarrier(node_, &req), "MPI_Ibarrier");
  std::vector<Request> reqs = {{req, -1}};
  wait(reqs, deadline, context);
  MPI_Win_sync(window_->win);  // ... and I see everyone's
}

// Member k owns chunk k of the balanced split, as in the virtual backend. Everyone copies the
// chunks it does not own into its segment; each owner reduces its chunk (tile by tile, its own
// contribution read straight from its input) into its output and into its segment; everyone
// copies the other owners' results out.
void MpiProcessGroup::shared_all_reduce(const CommCall& call, Clock::time_point deadline, const std::string& context) {
  const int n = size(), me = rank();
  const int64_t elem = int64_t(dtype_size(call.dtype)), bytes = call.count * elem;
  const std::vector<int64_t> counts = split_counts(call.count, n), off = prefix_offsets(counts);
  ensure_window(bytes);
  const std::vector<char*>& seg = window_->segment;
  const char* in = static_cast<const char*>(call.in);
  char* out = static_cast<char*>(call.out);
  for (int k = 0; k < n; ++k)
    if (k != me) copy(seg[size_t(me)] + off[size_t(k)] * elem, in + off[size_t(k)] * elem, counts[size_t(k)] * elem);
  node_barrier(deadline, context);
  const std::vector<int> order = reduction_order(n, me, algo());
  const int64_t tile = std::max<int64_t>(1, kTileBytes / elem);
  alignas(64) unsigned char reduced[kTileBytes];
  std::vector<const void*> inputs(static_cast<size_t>(n));
  const int64_t end = off[size_t(me)] + counts[size_t(me)];
  for (int64_t t0 = off[size_t(me)]; t0 < end; t0 += tile) {
    const int64_t m = std::min(tile, end - t0);
    for (int k = 0; k < n; ++k) {
      const int from = order[size_t(k)];
      inputs[size_t(k)] = (from == me ? in : seg[size_t(from)]) + t0 * elem;
    }
    reduce_sequence(reduced, inputs.data(), n, m, call.dtype, call.reduce, n, algo() == ReduceAlgo::ring);
    std::memcpy(out + t0 * elem, reduced, size_t(m * elem));  // in place: this tile of `in` was read above
    std::memcpy(seg[size_t(me)] + t0 * elem, reduced, size_t(m * elem));
  }
  node_barrier(deadline, context);
  for (int k = 0; k < n; ++k)
    if (k != me) copy(out + off[size_t(k)] * elem, seg[size_t(k)] + off[size_t(k)] * elem, counts[size_t(k)] * elem);
  node_barrier(deadline, context);  // segments are free for the next collective
}

void MpiProcessGroup::shared_reduce_scatter(const CommCall& call, Clock::time_point deadline,
                                            const std::string& context) {
  const int n = size(), me = rank();
  const int64_t elem = int64_t(dtype_size(call.dtype));
  const std::vector<int64_t> off = prefix_offsets(call.counts);
  const int64_t total = (off.back() + call.counts.back()) * elem;
  ensure_window(total);
  const std::vector<char*>& seg = window_->segment;
  copy(seg[size_t(me)], call.in, total);
  node_barrier(deadline, context);
  const std::vector<int> order = reduction_order(n, me, algo());
  std::vector<const void*> inputs(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) inputs[size_t(k)] = seg[size_t(order[size_t(k)])] + off[size_t(me)] * elem;
  reduce_sequence(call.out, inputs.data(), n, call.counts[size_t(me)], call.dtype, call.reduce, n,
                  algo() == ReduceAlgo::ring);
  node_barrier(deadline, context);
}

void MpiProcessGroup::shared_all_gather(const CommCall& call, Clock::time_point deadline, const std::string& context) {
  const int n = size(), me = rank();
  const int64_t elem = int64_t(dtype_size(call.dtype));
  const std::vector<int64_t> off = prefix_offsets(call.counts);
  ensure_window(*std::max_element(call.counts.begin(), call.counts.end()) * elem);
  const std::vector<char*>& seg = window_->segment;
  copy(seg[size_t(me)], call.in, call.counts[size_t(me)] * elem);
  node_barrier(deadline, context);
  char* out = static_cast<char*>(call.out);
  for (int j = 0; j < n; ++j) copy(out + off[size_t(j)] * elem, seg[size_t(j)], call.counts[size_t(j)] * elem);
  node_barrier(deadline, context);
}

void MpiProcessGroup::shared_broadcast(const CommCall& call, Clock::time_point deadline, const std::string& context) {
  const int64_t bytes = call.count * int64_t(dtype_size(call.dtype));
  ensure_window(bytes);
  const std::vector<char*>& seg = window_->segment;
  if (rank() == call.root) copy(seg[size_t(call.root)], call.in, bytes);
  node_barrier(deadline, context);
  if (rank() != call.root) copy(call.out, seg[size_t(call.root)], bytes);
  node_barrier(deadline, context);
}

}  // namespace llama4d::mpi_detail
