// The CPU backend's own exp and fixed-pattern reductions (backends/cpu/cpu_common.h), which
// every softmax, SiLU and cross-entropy in the backend relies on.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backends/cpu/cpu_common.h"
#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

// Largest error of exp_det over a dense sweep of [lo, hi], in units of the type's epsilon.
template <class T>
double max_exp_error_in_eps(T lo, T hi, int steps) {
  double worst = 0;
  for (int i = 0; i <= steps; ++i) {
    const T x = lo + (hi - lo) * static_cast<T>(i) / static_cast<T>(steps);
    const long double ref = std::exp(static_cast<long double>(x));
    const long double err = std::abs(static_cast<long double>(cpu::exp_det(x)) - ref) / ref;
    worst = std::max(worst, static_cast<double>(err / std::numeric_limits<T>::epsilon()));
  }
  return worst;
}

TEST(CpuMath, ExpIsAccurateToAFewUlps) {
  EXPECT_LT(max_exp_error_in_eps<float>(-87.0f, 88.0f, 200000), 2.0);
  EXPECT_LT(max_exp_error_in_eps<float>(-1.0f, 1.0f, 200000), 2.0);
  EXPECT_LT(max_exp_error_in_eps<double>(-707.0, 709.0, 200000), 2.0);
  EXPECT_LT(max_exp_error_in_eps<double>(-1.0, 1.0, 200000), 2.0);
  EXPECT_EQ(cpu::exp_det(0.0), 1.0);
  EXPECT_EQ(cpu::exp_det(0.0f), 1.0f);
  // Below the smallest normal result: flushed to zero, including -inf (masked scores).
  EXPECT_EQ(cpu::exp_det(-800.0), 0.0);
  EXPECT_EQ(cpu::exp_det(-100.0f), 0.0f);
  EXPECT_EQ(cpu::exp_det(-std::numeric_limits<double>::infinity()), 0.0);
}

TEST(CpuMath, ReductionsMatchLongDoubleAndIgnoreAlignment) {
  const auto a = cast_to<float>(random_vector(1001, 1)), b = cast_to<float>(random_vector(1001, 2));
  for (int64_t n : {1, 7, 16, 17, 1000}) {
    long double dot_ref = 0, sum_ref = 0;
    float max_ref = a[0];
    for (int64_t i = 0; i < n; ++i) {
      dot_ref += static_cast<long double>(a[i]) * b[i];
      sum_ref += a[i];
      max_ref = std::max(max_ref, a[i]);
    }
    EXPECT_NEAR(cpu::reduce_dot(a.data(), b.data(), n), static_cast<double>(dot_ref), 1e-5) << n;
    EXPECT_NEAR(cpu::reduce_sum(a.data(), n), static_cast<double>(sum_ref), 1e-5) << n;
    EXPECT_EQ(cpu::reduce_max(a.data(), n), max_ref) << n;
    // The same values at another address (another alignment) give the same bits.
    std::vector<float> shifted(a.begin(), a.begin() + n);
    shifted.insert(shifted.begin(), 3, 0.0f);
    const float s1 = cpu::reduce_sum(a.data(), n), s2 = cpu::reduce_sum(shifted.data() + 3, n);
    EXPECT_EQ(std::memcmp(&s1, &s2, sizeof(float)), 0) << n;
  }
}

}  // namespace
}  // namespace llama4d::test
