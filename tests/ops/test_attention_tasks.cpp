// Attention's cut into independent tasks (backends/cpu/attention_tasks.h), stated for the shapes
// the model runs: `small` and `medium` at bench's batch (8 sequences of 256) give the forward and
// the backward at least 4 x 16 tasks each, so 16 threads have four each; the backward's runs
// cover every query block once. The cut takes no thread count; test_thread_counts.cpp checks the
// bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "backends/cpu/attention_tasks.h"
#include "core/model/config.h"

namespace llama4d::test {
namespace {

constexpr int64_t kWantedTasks = 4 * 16;

TEST(AttentionTasks, SmallAndMediumHaveFourTasksPerThreadOfSixteen) {
  const int64_t B = 8, T = 256;
  for (const std::string preset : {"small", "medium"}) {
    const LlamaConfig cfg = LlamaConfig::preset(preset);
    const int64_t pairs = B * cfg.num_key_value_heads;  // (batch, KV head) pairs
    const cpu::AttentionTasks t = cpu::attention_tasks(T);
    EXPECT_EQ(t.blocks, T / 32) << preset;
    EXPECT_GE(pairs * t.blocks, kWantedTasks) << preset << " forward";
    EXPECT_GE(pairs * t.runs, kWantedTasks) << preset << " backward";
  }
}

TEST(AttentionTasks, BackwardRunsCoverEveryBlockOnce) {
  for (int64_t Tq : {0, 1, 31, 32, 33, 64, 100, 128, 129, 256, 301, 1000, 4096}) {
    const cpu::AttentionTasks t = cpu::attention_tasks(Tq);
    EXPECT_EQ(t.blocks, (Tq + 31) / 32) << Tq;
    EXPECT_LE(t.runs, cpu::kAttentionBackwardRuns) << Tq;
    EXPECT_GE(t.runs, std::min<int64_t>(t.blocks, 3)) << Tq;  // 5 blocks: runs of 2, 2 and 1
    int64_t covered = 0;
    for (int64_t run = 0; run < t.runs; ++run) {
      const int64_t first = run * t.blocks_per_run, last = std::min(t.blocks, first + t.blocks_per_run);
      EXPECT_EQ(first, covered) << Tq << " run " << run;
      EXPECT_GT(last, first) << Tq << " run " << run << " is empty";
      covered = last;
    }
    EXPECT_EQ(covered, t.blocks) << Tq;
  }
}

}  // namespace
}  // namespace llama4d::test
