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
