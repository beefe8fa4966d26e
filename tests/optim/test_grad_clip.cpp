// Gradient-norm clipping: the sum of squares against direct computations (and its documented
// fixed order, bit for bit), the coefficient against PyTorch's formula, and the clipped norm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/error.h"
#include "core/ops.h"
#include "core/optim/grad_clip.h"
#include "core/optim/segmented_norm.h"
#include "optim_test_util.h"

namespace llama4d {
namespace {

using test::random_grads;

template <class T>
long double naive_sum_squares(const std::vector<T>& g) {
  long double s = 0;
  for (T x : g) s += static_cast<long double>(x) * static_cast<long double>(x);
  return s;
}

// The order segmented_norm.h promises for one segment, written out independently:
// 512-element chunks, 8 lanes per chunk (element i to lane i % 8) added lane 0 first, chunk
// sums added in chunk order.
template <class T>
double documented_order_sum_squares(const std::vector<T>& g) {
  const int64_t n = static_cast<int64_t>(g.size());
  double total = 0;
  for (int64_t lo = 0; lo < n; lo += 512) {
    double lane[8] = {};
    for (int64_t i = lo; i < std::min<int64_t>(lo + 512, n); ++i) {
      const double x = static_cast<double>(g[static_cast<size_t>(i)]);
      lane[(i - lo) % 8] += x * x;
    }
    double chunk = 0;
    for (double l : lane) chunk += l;
    total += chunk;
  }
  return total;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

// One segment's sum of squares the way every strategy computes it: chunk partials, in order.
template <class T>
double local_grad_sum_squares(const T* g, int64_t n) {
  std::vector<double> partials(static_cast<size_t>(num_chunk_partials(n)));
  ops::sum_squares_chunks(partials.data(), g, n, kNormChunk);
  return combine_chunk_sums(partials.data(), static_cast<int64_t>(partials.size()));
}

template <class T>
double clip_grad_norm(T* g, int64_t n, double max_norm) {
  const double sum_sq = local_grad_sum_squares(g, n);
  apply_grad_clip(g, n, clip_coefficient(sum_sq, max_norm));
  return std::sqrt(sum_sq);
}

TEST(GradClip, SumSquaresMatchesDirectComputation) {
  for (int64_t n : {0, 1, 7, 512, 513, 4096, 100003}) {
    const auto gf = random_grads<float>(n, 1 + n);
    const auto gd = random_grads<double>(n, 2 + n);
    const double sf = local_grad_sum_squares(gf.data(), n);
    const double sd = local_grad_sum_squares(gd.data(), n);
    EXPECT_NEAR(sf, static_cast<double>(naive_sum_squares(gf)), 1e-13 * sf + 1e-300) << n;
    EXPECT_NEAR(sd, static_cast<double>(naive_sum_squares(gd)), 1e-13 * sd + 1e-300) << n;
    EXPECT_TRUE(same_bits(sf, documented_order_sum_squares(gf))) << n;
    EXPECT_TRUE(same_bits(sd, documented_order_sum_squares(gd))) << n;
  }
}

TEST(GradClip, SumSquaresIsDeterministic) {
  const int64_t n = 300007;
  const auto g = random_grads<float>(n, 9);
  const double first = local_grad_sum_squares(g.data(), n);
  const double second = local_grad_sum_squares(g.data(), n);
  EXPECT_TRUE(same_bits(first, second));
#ifdef _OPENMP
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    EXPECT_TRUE(same_bits(first, local_grad_sum_squares(g.data(), n))) << threads << " threads";
  }
  omp_set_num_threads(saved);
#endif
}

TEST(GradClip, ChunkAlignedShardsGatherToTheFullSumBitwise) {
  // Three "ranks" holding chunk-aligned slices; gathering their chunk partials in flat order and
  // combining them reproduces the single-rank sum exactly. Adding the per-rank sums instead
  // (what a plain all-reduce does) is only close.
  const int64_t n = 5 * kNormChunk + 123;
  const auto g = random_grads<double>(n, 17);
  const int64_t cuts[] = {0, 2 * kNormChunk, 3 * kNormChunk, n};
  std::vector<double> gathered;
  double allreduced = 0;
  for (int r = 0; r < 3; ++r) {
    const int64_t len = cuts[r + 1] - cuts[r];
    std::vector<double> partials(static_cast<size_t>(num_chunk_partials(len)));
    ops::sum_squares_chunks(partials.data(), g.data() + cuts[r], len, kNormChunk);
    gathered.insert(gathered.end(), partials.begin(), partials.end());
    allreduced += local_grad_sum_squares(g.data() + cuts[r], len);
  }
  const double full = local_grad_sum_squares(g.data(), n);
  ASSERT_EQ(gathered.size(), static_cast<size_t>(num_chunk_partials(n)));
  EXPECT_TRUE(same_bits(full, combine_chunk_sums(gathered.data(), static_cast<int64_t>(gathered.size()))));
  EXPECT_NEAR(allreduced, full, 1e-14 * full);
}

TEST(GradClip, CoefficientFollowsPyTorchFormula) {
  EXPECT_DOUBLE_EQ(clip_coefficient(16.0, 1.0), 1.0 / (4.0 + 1e-6));
  EXPECT_DOUBLE_EQ(clip_coefficient(16.0, 2.5), 2.5 / (4.0 + 1e-6));
  EXPECT_EQ(clip_coefficient(16.0, 10.0), 1.0);  // below the threshold: never scaled up
  EXPECT_EQ(clip_coefficient(0.0, 1.0), 1.0);
  EXPECT_EQ(clip_coefficient(16.0, 4.0), 4.0 / (4.0 + 1e-6));  // just above: < 1 by the 1e-6
  EXPECT_TRUE(std::isnan(clip_coefficient(std::nan(""), 1.0)));
  EXPECT_EQ(clip_coefficient(INFINITY, 1.0), 0.0);
  EXPECT_THROW(clip_coefficient(1.0, 0.0), InputError);
  EXPECT_THROW(clip_coefficient(1.0, -1.0), InputError);
  EXPECT_THROW(clip_coefficient(1.0, std::nan("")), InputError);
  EXPECT_THROW(clip_coefficient(-1.0, 1.0), InputError);
}

TEST(GradClip, SumSquaresOfHandComputableGradients) {
  const std::vector<float> g34 = {3.0f, 4.0f};
  EXPECT_EQ(local_grad_sum_squares(g34.data(), 2), 25.0);
  // g[i] = (i mod 7) - 3 over 1000 elements, crossing a chunk boundary at 512: one period of 7
  // squares is 9+4+1+0+1+4+9 = 28; 1000 = 142*7 + 6, so 142*28 + (9+4+1+0+1+4) = 3976 + 19 = 3995.
  // Integers, so every order of addition gives it exactly.
  std::vector<float> gf(1000);
  std::vector<double> gd(1000);
  for (size_t i = 0; i < 1000; ++i) gf[i] = float(int(i % 7) - 3), gd[i] = double(int(i % 7) - 3);
  EXPECT_EQ(local_grad_sum_squares(gf.data(), 1000), 3995.0);
  EXPECT_EQ(local_grad_sum_squares(gd.data(), 1000), 3995.0);
  EXPECT_EQ(num_chunk_partials(1000), 2);
  EXPECT_EQ(num_chunk_partials(1024), 2);
  EXPECT_EQ(num_chunk_partials(1025), 3);
  EXPECT_EQ(num_chunk_partials(0), 0);
  // The two chunk partials: elements 0..511 hold 73 whole periods (2044) plus i mod 7 = 0 (9);
  // 512..999 the rest: 3995 - 2053 = 1942.
  double partials[2] = {};
  ops::sum_squares_chunks(partials, gd.data(), 1000, kNormChunk);
  EXPECT_EQ(partials[0], 2053.0);
  EXPECT_EQ(partials[1], 1942.0);
}

TEST(GradClip, CombineChunkSumsAddsInIndexOrder) {
  const double none[1] = {42.0};
  EXPECT_EQ(combine_chunk_sums(none, 0), 0.0);
  const double three[] = {1.0, 2.0, 4.0};
  EXPECT_EQ(combine_chunk_sums(three, 3), 7.0);
  EXPECT_EQ(combine_chunk_sums(three, 2), 3.0);  // only `count` partials
  // Order is visible in floating point: 1e16 + 1 rounds back to 1e16 (its ulp is 2), so
  // ((1e16 + 1) - 1e16) is 0 while ((1e16 - 1e16) + 1) is 1.
  const double big_first[] = {1e16, 1.0, -1e16};
  const double cancel_first[] = {1e16, -1e16, 1.0};
  EXPECT_EQ(combine_chunk_sums(big_first, 3), 0.0);
  EXPECT_EQ(combine_chunk_sums(cancel_first, 3), 1.0);
  // (0.1 + 0.2) + 0.3 = 0.6000000000000001 but (0.3 + 0.2) + 0.1 = 0.6.
  const double up[] = {0.1, 0.2, 0.3};
  const double down[] = {0.3, 0.2, 0.1};
  EXPECT_EQ(combine_chunk_sums(up, 3), 0.6000000000000001);
  EXPECT_EQ(combine_chunk_sums(down, 3), 0.6);
}

TEST(GradClip, CoefficientLiterals) {
  // sqrt(25) = 5; 1 / (5 + 1e-6) = 0.199999960000008 (correctly rounded, computed by hand / Python).
  EXPECT_EQ(clip_coefficient(25.0, 1.0), 0.199999960000008);
  EXPECT_EQ(clip_coefficient(16.0, 1.0), 0.24999993750001562);  // 1 / 4.000001
  EXPECT_EQ(clip_coefficient(16.0, 2.5), 0.624999843750039);     // 2.5 / 4.000001
  EXPECT_EQ(clip_coefficient(25.0, 5.0), 0.99999980000004);      // norm == max_norm still clips, by the 1e-6
  EXPECT_EQ(clip_coefficient(25.0, 5.00001), 1.0);               // 5.00001 / 5.000001 > 1: exactly 1
  EXPECT_EQ(clip_coefficient(25.0, 1e9), 1.0);
  EXPECT_EQ(clip_coefficient(0.0, 1.0), 1.0);                    // 1 / 1e-6 = 1e6, capped at 1
  // The 1e-6 guard dominates for tiny norms: a zero gradient with a tiny max_norm still gets a
  // coefficient below 1 (harmless: it scales zeros).
  EXPECT_EQ(clip_coefficient(0.0, 1e-9), 0.001);                        // 1e-9 / 1e-6
  EXPECT_EQ(clip_coefficient(1e-20, 1e-9), 0.0009999000099990003);      // 1e-9 / (1e-10 + 1e-6)
}

TEST(GradClip, ApplyGradClipLiterals) {
  // Double: each element times 0.199999960000008, rounded once.
  std::vector<double> d = {3.0, -4.0, 0.0};
  apply_grad_clip(d.data(), 3, 0.199999960000008);
  EXPECT_EQ(d, (std::vector<double>{0.599999880000024, -0.799999840000032, 0.0}));
  // Float: the coefficient is first rounded to float (0x1.999994p-3 = 0.19999995827674866), then
  // the product is rounded to float: 3 * c -> 0x1.33333p-1, -4 * c -> -0x1.999994p-1.
  std::vector<float> f = {3.0f, -4.0f, 0.0f};
  apply_grad_clip(f.data(), 3, 0.199999960000008);
  EXPECT_EQ(f, (std::vector<float>{0x1.33333p-1f, -0x1.999994p-1f, 0.0f}));
  // An exact coefficient gives exact halves.
  f = {3.0f, -4.0f, 0.25f};
  apply_grad_clip(f.data(), 3, 0.5);
  EXPECT_EQ(f, (std::vector<float>{1.5f, -2.0f, 0.125f}));
  // Coefficient 0 (an infinite norm) zeroes the gradient.
  d = {3.0, -4.0};
  apply_grad_clip(d.data(), 2, 0.0);
  EXPECT_EQ(d, (std::vector<double>{0.0, 0.0}));
  // 1 or more: untouched (never scaled up).
  d = {3.0, -4.0};
  apply_grad_clip(d.data(), 2, 1.0);
  EXPECT_EQ(d, (std::vector<double>{3.0, -4.0}));
  apply_grad_clip(d.data(), 2, 1.5);
  EXPECT_EQ(d, (std::vector<double>{3.0, -4.0}));
  // Only the first n elements.
  d = {3.0, -4.0};
  apply_grad_clip(d.data(), 1, 0.5);
  EXPECT_EQ(d, (std::vector<double>{1.5, -4.0}));
  // NaN is not hidden: it poisons every element.
  d = {3.0, -4.0};
  apply_grad_clip(d.data(), 2, std::nan(""));
  EXPECT_TRUE(std::isnan(d[0]));
  EXPECT_TRUE(std::isnan(d[1]));
}

TEST(GradClip, ClipsHandComputedGradientEndToEnd) {
  // g = {3, 4}: norm 5; max_norm 1 -> coefficient 1 / 5.000001 -> {0.599999880000024, 0.799999840000032}.
  std::vector<double> g = {3.0, 4.0};
  EXPECT_EQ(clip_grad_norm(g.data(), 2, 1.0), 5.0);  // returns the pre-clip norm
  EXPECT_EQ(g, (std::vector<double>{0.599999880000024, 0.799999840000032}));
  g = {3.0, 4.0};
  EXPECT_EQ(clip_grad_norm(g.data(), 2, 6.0), 5.0);  // under the threshold: untouched
  EXPECT_EQ(g, (std::vector<double>{3.0, 4.0}));
}

template <class T>
void check_clip(double tol) {
  const int64_t n = 50021;
  const auto g0 = random_grads<T>(n, 33);
  const double norm0 = std::sqrt(static_cast<double>(naive_sum_squares(g0)));
  ASSERT_GT(norm0, 1.0);

  // Clipped: the returned norm is the pre-clip norm; afterwards the norm is max_norm up to the
  // 1e-6 guard, and every element was scaled by the same coefficient.
  const double max_norm = 0.5;
  auto g = g0;
  EXPECT_NEAR(clip_grad_norm(g.data(), n, max_norm), norm0, 1e-12 * norm0);
  const double coef = max_norm / (norm0 + 1e-6);
  EXPECT_NEAR(std::sqrt(static_cast<double>(naive_sum_squares(g))), max_norm * norm0 / (norm0 + 1e-6),
              tol * max_norm);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(g[static_cast<size_t>(i)], g0[static_cast<size_t>(i)] * coef,
                tol * std::abs(g0[static_cast<size_t>(i)]))
        << i;
  }

  // Not clipped: bitwise untouched.
  g = g0;
  EXPECT_NEAR(clip_grad_norm(g.data(), n, 10.0 * norm0), norm0, 1e-12 * norm0);
  EXPECT_EQ(std::memcmp(g.data(), g0.data(), g.size() * sizeof(T)), 0);
}
TEST(GradClip, ClipsToMaxNormFloat) { check_clip<float>(1e-6); }
TEST(GradClip, ClipsToMaxNormDouble) { check_clip<double>(1e-13); }

}  // namespace
}  // namespace llama4d
