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

}  // namespace
}  // namespace llama4d::test
