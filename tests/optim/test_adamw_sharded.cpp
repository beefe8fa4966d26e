// ZeRO's premise: updating the flat buffer shard by shard is BITWISE the same as one full
// update, for params and optimizer state, wherever the shard boundaries fall (inside a tensor,
// inside a no-decay RMSNorm weight) and whatever the thread count.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/optim/adamw.h"
#include "optim_test_util.h"

namespace llama4d {
namespace {

using test::random_grads;
using test::random_vector;
using test::total_numel;

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Runs `steps` AdamW steps over the whole buffer and, separately, over the shards given by
// `cuts` (0 = c0 < c1 < ... < ck = n); compares everything bitwise.
template <class T>
void check_sharded_equals_full(const std::vector<ParamSpec>& specs, const std::vector<int64_t>& cuts,
                               int steps) {
  const int64_t n = total_numel(specs);
  ASSERT_EQ(cuts.front(), 0);
  ASSERT_EQ(cuts.back(), n);

  std::vector<T> full = random_vector<T>(n, 11);
  std::vector<T> sharded = full;
  AdamW<T> whole(AdamWConfig{}, specs);
  std::vector<AdamW<T>> shards;
  for (size_t r = 0; r + 1 < cuts.size(); ++r) shards.emplace_back(AdamWConfig{}, specs, cuts[r], cuts[r + 1]);

  for (int s = 0; s < steps; ++s) {
    const std::vector<T> grads = random_grads<T>(n, 200 + s);
    const double lr = 1e-2 * (1 + s);
    whole.step(full.data(), grads.data(), lr);
    // Each shard sees only its own slice, as a ZeRO rank does (a copy, not a view of the rest).
    for (AdamW<T>& shard : shards) {
      std::vector<T> p(sharded.begin() + shard.begin(), sharded.begin() + shard.end());
      const std::vector<T> g(grads.begin() + shard.begin(), grads.begin() + shard.end());
      shard.step(p.data(), g.data(), lr);
      std::copy(p.begin(), p.end(), sharded.begin() + shard.begin());
    }
  }

  EXPECT_TRUE(bitwise_equal(full, sharded)) << "params differ";
  std::vector<T> m, v;
  for (const AdamW<T>& shard : shards) {
    EXPECT_EQ(shard.step_count(), steps);
    m.insert(m.end(), shard.exp_avg().begin(), shard.exp_avg().end());
    v.insert(v.end(), shard.exp_avg_sq().begin(), shard.exp_avg_sq().end());
  }
  EXPECT_TRUE(bitwise_equal(test::as_vector(whole.exp_avg()), m)) << "exp_avg differs";
  EXPECT_TRUE(bitwise_equal(test::as_vector(whole.exp_avg_sq()), v)) << "exp_avg_sq differs";
}

TEST(AdamWSharded, ThreeShardsSplittingTensorsFloat) {
  // Layout: embed [0,37) decay | norm [37,42) no-decay | q [42,67) | norm [67,72) | down [72,87) |
  // final norm [87,92) | head [92,129). Cut 20 splits the embedding, cut 40 splits a norm weight.
  const auto specs = test::small_llama_like_specs();
  check_sharded_equals_full<float>(specs, {0, 20, 40, 129}, 5);
}

TEST(AdamWSharded, ThreeShardsSplittingTensorsDouble) {
  check_sharded_equals_full<double>(test::small_llama_like_specs(), {0, 20, 40, 129}, 5);
}

TEST(AdamWSharded, ManyShardsIncludingEmptyAndSingleElement) {
  const auto specs = test::small_llama_like_specs();
  check_sharded_equals_full<float>(specs, {0, 1, 1, 38, 69, 70, 88, 128, 129}, 4);
  check_sharded_equals_full<double>(specs, {0, 1, 1, 38, 69, 70, 88, 128, 129}, 4);
}

TEST(AdamWSharded, LargeBufferUsesThreadsAndStillMatches) {
  // Big enough for the OpenMP path; odd shard boundaries so vector loops have ragged tails.
  const auto specs = test::make_specs({{"embed", 70001, true},
                                       {"norm", 3001, false},
                                       {"proj", 50003, true},
                                       {"final_norm", 997, false},
                                       {"head", 40009, true}});
  const int64_t n = total_numel(specs);
  check_sharded_equals_full<float>(specs, {0, 33333, 71500, 123457, n}, 3);
}

TEST(AdamWSharded, SegmentsFollowDecayFlags) {
  const auto specs = test::small_llama_like_specs();
  AdamW<float> shard(AdamWConfig{}, specs, 20, 70);  // embed tail, norm, q, norm head
  const auto& seg = shard.segments();
  ASSERT_EQ(seg.size(), 4u);
  EXPECT_EQ(seg[0].begin, 0);  EXPECT_EQ(seg[0].end, 17); EXPECT_TRUE(seg[0].decay);
  EXPECT_EQ(seg[1].begin, 17); EXPECT_EQ(seg[1].end, 22); EXPECT_FALSE(seg[1].decay);
  EXPECT_EQ(seg[2].begin, 22); EXPECT_EQ(seg[2].end, 47); EXPECT_TRUE(seg[2].decay);
  EXPECT_EQ(seg[3].begin, 47); EXPECT_EQ(seg[3].end, 50); EXPECT_FALSE(seg[3].decay);
  // Neighbouring tensors with the same flag merge into one segment.
  const auto merged = test::make_specs({{"a", 3, true}, {"b", 4, true}, {"c", 2, false}, {"d", 1, false}});
  AdamW<double> whole(AdamWConfig{}, merged);
  ASSERT_EQ(whole.segments().size(), 2u);
  EXPECT_EQ(whole.segments()[0].end, 7);
  EXPECT_EQ(whole.segments()[1].end, 10);
}

#ifdef _OPENMP
TEST(AdamWSharded, ThreadCountDoesNotChangeResults) {
  const auto specs = test::make_specs({{"w", 100003, true}, {"norm", 4099, false}});
  const int64_t n = total_numel(specs);
  const int saved = omp_get_max_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> p = random_vector<float>(n, 5);
    AdamW<float> opt(AdamWConfig{}, specs);
    for (int s = 0; s < 3; ++s) opt.step(p.data(), random_grads<float>(n, 300 + s).data(), 1e-2);
    results.push_back(p);
  }
  omp_set_num_threads(saved);
  EXPECT_TRUE(bitwise_equal(results[0], results[1]));
  EXPECT_TRUE(bitwise_equal(results[0], results[2]));
}
#endif

}  // namespace
}  // namespace llama4d
