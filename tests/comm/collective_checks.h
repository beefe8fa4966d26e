#pragma once
// Backend-agnostic checks of every collective, run on every rank of a group. Each check builds
// its inputs from a formula every rank can evaluate for every other rank, computes the expected
// result with naive loops written here (never with the code under test), and compares:
//   - exactly, on integer-valued data, for every dtype (sums of small integers are exact even
//     in bf16);
//   - bit for bit, on float data of mixed magnitudes, against the documented summation order
//     of the group's algorithm (ordered: rank 0, 1, ..., N-1; ring: chunk k starts at rank k+1);
//   - the bytes this rank's traffic record counts, against the textbook volumes.
// Failures are reported with ADD_FAILURE naming the rank, so they work from any thread.
#include <cstdint>
#include <functional>

#include "core/comm/process_group.h"

namespace llama4d::test {

void check_all_reduce(ProcessGroup& pg);
void check_reduce_scatter(ProcessGroup& pg);
void check_all_gather(ProcessGroup& pg);
void check_broadcast(ProcessGroup& pg);
void check_send_recv(ProcessGroup& pg);
void check_all_to_all(ProcessGroup& pg);
void check_barrier_and_async(ProcessGroup& pg);
// Runs `check` with every buffer it makes in pg's symmetric memory (ProcessGroup::
// allocate_symmetric), the route MPI groups on one node take without staging copies.
void with_symmetric_buffers(ProcessGroup& pg, const std::function<void(ProcessGroup&)>& check);
// Runs `check` with every buffer it makes in the active compute backend's memory (device_alloc):
// with the CUDA backend, virtual GPUs over one real GPU whose process group moves device memory.
void with_backend_buffers(ProcessGroup& pg, const std::function<void(ProcessGroup&)>& check);
// allocate_symmetric itself: alignment, sizes that differ by member, memory one member keeps
// while the others dropped it, and recycling of memory everyone dropped.
void check_symmetric_allocation(ProcessGroup& pg);

inline void check_everything(ProcessGroup& pg) {
  check_all_reduce(pg);
  check_reduce_scatter(pg);
  check_all_gather(pg);
  check_broadcast(pg);
  check_send_recv(pg);
  check_all_to_all(pg);
  check_barrier_and_async(pg);
}

}  // namespace llama4d::test
