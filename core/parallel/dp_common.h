#pragma once
// Small pieces every data-parallel strategy shares: summing losses across ranks, accounting
// activations, timing stages for the trace, and reading memory peaks.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dist/memory_tracker.h"
#include "core/dist/process_group.h"
#include "core/dist/trace.h"
#include "core/model/head.h"
#include "core/parallel/data_parallel.h"

namespace llama4d {

// (loss_sum, tokens) summed over `group` in rank order, in fp64: every rank gets the same bits,
// equal to a single device adding the ranks' sums in that order.
LossSum all_reduce_loss(ProcessGroup& group, const LossSum& local);

// A rank's memory tracker by category: the peaks so far, or what is live now.
DataParallelMemory memory_peaks(const MemoryTracker& tracker);
DataParallelMemory memory_live(const MemoryTracker& tracker);
// [{"rank": r, "params": ..., "grads": ..., ...}] for reports.
nlohmann::json memory_json(const std::vector<DataParallelMemory>& per_rank);

// Records one compute span per model stage on the rank's trace ("forward layer 3"), so the
// Chrome trace shows gradient reductions overlapping the backward of earlier layers.
class StageTracer {
 public:
  explicit StageTracer(RankTrace& trace) : trace_(trace) {}
  void begin() { start_us_ = trace_.wall_now_us(); }
  void end(const char* phase, int layer);

 private:
  RankTrace& trace_;
  double start_us_ = 0;
};

// Fills [begin, end) of a buffer with NaN: "this memory is freed" made observable.
template <class T>
void poison(T* data, int64_t begin, int64_t end);

}  // namespace llama4d
