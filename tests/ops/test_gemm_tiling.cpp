// The GEMM's cut into independent tasks (backends/cpu/gemm_tiling.h), stated for the shapes
// the model runs: every linear layer of `small` and `medium` at bench's batch (8 x 256 = 2,048
// tokens), forward, input gradient and weight gradient, has at least 4 x 16 tasks, so 16
// threads have four each. The tiles cover every output element exactly once, and the cut is a
// function of the shape alone (the function takes no thread count; test_thread_counts.cpp
// checks the bits).
#include <gtest/gtest.h>

#include <string>

#include "backends/cpu/gemm_tiling.h"
#include "core/model/config.h"

namespace llama4d::test {
namespace {

constexpr int64_t kTokens = 8 * 256;
constexpr int64_t kWantedTasks = 4 * 16;

// The sum of a split's part lengths is n, and no part is empty.
void expect_partition(const cpu::Split& split, int64_t n, const std::string& what) {
  int64_t covered = 0;
  for (int64_t i = 0; i < split.count; ++i) {
    EXPECT_GT(split.length(i), 0) << what << " part " << i;
    EXPECT_EQ(split.begin(i), covered) << what << " part " << i;
    covered += split.length(i);
  }
  EXPECT_EQ(covered, n) << what;
}

struct Linear {
  std::string name;
  int64_t in, out;  // weight [out, in]
};

std::vector<Linear> linears(const LlamaConfig& c) {
  const int64_t qd = c.q_dim(), kvd = c.kv_dim();
  return {{"wq", c.hidden_size, qd},
          {"wk/wv", c.hidden_size, kvd},
          {"wo", qd, c.hidden_size},
          {"wgate/wup", c.hidden_size, c.intermediate_size},
          {"wdown", c.intermediate_size, c.hidden_size},
          {"lm_head", c.hidden_size, c.vocab_size}};
}

TEST(GemmTiling, EveryLinearOfSmallAndMediumHasFourTasksPerThreadOfSixteen) {
  for (const std::string preset : {"small", "medium"}) {
    const LlamaConfig cfg = LlamaConfig::preset(preset);
    for (const Linear& l : linears(cfg)) {
      const std::string at = preset + " " + l.name;
      // forward y[BT, out] = x[BT, in] W^T: depth in, no depth split
      const cpu::GemmTiling fwd = cpu::gemm_tiling<float>(kTokens, l.out, l.in, false);
      EXPECT_GE(fwd.tiles(), kWantedTasks) << at << " forward";
      EXPECT_EQ(fwd.depth.count, 1) << at << " forward";
      expect_partition(fwd.rows, kTokens, at + " forward rows");
      expect_partition(fwd.cols, l.out, at + " forward cols");
      // input gradient dx[BT, in] = dy[BT, out] W
      const cpu::GemmTiling dx = cpu::gemm_tiling<float>(kTokens, l.in, l.out, false);
      EXPECT_GE(dx.tiles(), kWantedTasks) << at << " input gradient";
      expect_partition(dx.cols, l.in, at + " input gradient cols");
      // weight gradient dW[out, in] = dy^T x over the tokens: tiles x depth chunks
      const cpu::GemmTiling dw = cpu::gemm_tiling<float>(l.out, l.in, kTokens, true);
      EXPECT_GE(dw.tasks(), kWantedTasks) << at << " weight gradient";
      expect_partition(dw.rows, l.out, at + " weight gradient rows");
      expect_partition(dw.cols, l.in, at + " weight gradient cols");
      expect_partition(dw.depth, kTokens, at + " weight gradient depth");
    }
  }
}

// A tile of about `n` rows or columns, in whole micro-tiles of `granule`.
int64_t whole(int64_t n, int64_t granule) { return (n + granule - 1) / granule * granule; }

TEST(GemmTiling, LargeProductsKeepLargeTilesAndSmallOnesStayWhole) {
  const int64_t kr = cpu::kGemmKernelRows, kc = cpu::kGemmKernelCols<float>;
  // bench's peak probe, 1024^3: 8 x 8 tiles of about 128 x 128, each a full-depth product.
  const cpu::GemmTiling peak = cpu::gemm_tiling<float>(1024, 1024, 1024, false);
  EXPECT_EQ(peak.rows.size, whole(128, kr));
  EXPECT_EQ(peak.cols.size, whole(128, kc));
  EXPECT_EQ(peak.tiles(), 64);
  // Llama 3 8B's MLP on 2,048 tokens: tiles stay at the 256 x 256 maximum.
  const cpu::GemmTiling mlp = cpu::gemm_tiling<float>(kTokens, 14336, 4096, false);
  EXPECT_EQ(mlp.rows.size, whole(256, kr));
  EXPECT_EQ(mlp.cols.size, whole(256, kc));
  // Tiles never go below 32 x 32 (in whole micro-tiles): one token's product is one row of tiles.
  const cpu::GemmTiling decode = cpu::gemm_tiling<float>(1, 288, 288, false);
  EXPECT_EQ(decode.rows.count, 1);
  EXPECT_EQ(decode.cols.size, whole(32, kc));
  // Depth chunks: never shorter than 256 rows, never more than 8, and none when the partial
  // buffers would be large (a 128K-entry vocabulary's head).
  EXPECT_EQ(cpu::gemm_tiling<float>(96, 288, 300, true).depth.count, 1);
  EXPECT_LE(cpu::gemm_tiling<float>(32, 32, 1 << 20, true).depth.count, 8);
  EXPECT_EQ(cpu::gemm_tiling<float>(128256, 4096, kTokens, true).depth.count, 1);
}

}  // namespace
}  // namespace llama4d::test
