// add_forward, accumulate, scale and sum_squares.
#include <gtest/gtest.h>

#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

TEST(Elementwise, AddAccumulateScale) {
  const int64_t N = 70001;  // several parallel chunks plus a ragged tail
  auto a = random_vector(N, 1), b = random_vector(N, 2);
  std::vector<double> out(N);
  ops::add_forward(out.data(), a.data(), b.data(), N);
  for (int64_t i = 0; i < N; ++i) ASSERT_EQ(out[i], a[i] + b[i]);

  auto aliased = a;  // out may alias a
  ops::add_forward(aliased.data(), aliased.data(), b.data(), N);
  EXPECT_EQ(aliased, out);

  auto y = a;
  ops::accumulate(y.data(), b.data(), N);
  EXPECT_EQ(y, out);

  ops::scale(y.data(), 0.5, N);
  for (int64_t i = 0; i < N; ++i) ASSERT_EQ(y[i], out[i] * 0.5);
}

TEST(Elementwise, SumSquaresIsAccurateAndBitwiseStable) {
  const int64_t N = 1000003;
  const auto x = random_vector(N, 3);
  const auto xf = cast_to<float>(x);
  long double ref = 0, ref_f = 0;
  for (int64_t i = 0; i < N; ++i) {
    ref += static_cast<long double>(x[i]) * x[i];
    ref_f += static_cast<long double>(xf[i]) * xf[i];
  }
  EXPECT_NEAR(ops::sum_squares(x.data(), N), static_cast<double>(ref),
              1e-12 * static_cast<double>(ref));
  // fp32 input is squared and summed in double: as accurate as the double path.
  EXPECT_NEAR(ops::sum_squares(xf.data(), N), static_cast<double>(ref_f),
              1e-12 * static_cast<double>(ref_f));

  double one = 0, one_again = 0, two = 0;
  with_threads(1, [&] {
    one = ops::sum_squares(xf.data(), N);
    one_again = ops::sum_squares(xf.data(), N);
  });
  with_threads(2, [&] { two = ops::sum_squares(xf.data(), N); });
  EXPECT_EQ(std::memcmp(&one, &one_again, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&one, &two, sizeof(double)), 0);

  EXPECT_EQ(ops::sum_squares(x.data(), 0), 0.0);
  const float small[3] = {1.0f, -2.0f, 3.0f};
  EXPECT_EQ(ops::sum_squares(small, 3), 14.0);
}

}  // namespace
}  // namespace llama4d::test
