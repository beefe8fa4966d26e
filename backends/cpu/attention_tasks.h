#pragma once
// How attention (attention.cpp) is cut into independent tasks: from the shape alone, never from
// the thread count, so the bits do not depend on it.
//
// Query positions are cut into blocks of kAttentionBlockRows. The forward's task is one block of
// one (batch, KV head) pair. The backward's task is a run of consecutive blocks of one pair: its
// dk and dv sum over every query row of the pair, so one task per pair would leave 16 threads
// with B * nkv tasks (16 on `small` at bench's batch of 8, as few as 2 at batch 1); cutting each
// pair's blocks into up to kAttentionBackwardRuns runs gives four times as many. Run 0 adds into
// dk and dv as it goes, runs 1.. into partial buffers that are then added in run order. The runs
// depend on Tq alone, so a rank holding some of the heads (tensor parallelism) or some of the
// batch rows (data parallelism) cuts each pair as one device does.
#include <algorithm>
#include <cstdint>

namespace llama4d::cpu {

inline constexpr int64_t kAttentionBlockRows = 32;
inline constexpr int64_t kAttentionBackwardRuns = 4;

struct AttentionTasks {
  int64_t blocks = 0;          // query blocks per (batch, KV head) pair
  int64_t blocks_per_run = 0;  // consecutive blocks in one backward run (the last may have fewer)
  int64_t runs = 0;            // backward runs per pair
};

inline AttentionTasks attention_tasks(int64_t Tq) {
  AttentionTasks t;
  t.blocks = (Tq + kAttentionBlockRows - 1) / kAttentionBlockRows;
  if (t.blocks == 0) return t;
  t.blocks_per_run = (t.blocks + kAttentionBackwardRuns - 1) / kAttentionBackwardRuns;
  t.runs = (t.blocks + t.blocks_per_run - 1) / t.blocks_per_run;
  return t;
}

}  // namespace llama4d::cpu
