// rmsnorm_forward / rmsnorm_backward: out = inp / sqrt(mean(inp^2) + eps) * weight.
#include <gtest/gtest.h>

#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

TEST(RmsNorm, ForwardMatchesNaiveLoops) {
  const int64_t BT = 7, C = 37;
  const double eps = 1e-5;
  auto x = random_vector(BT * C, 1), w = random_vector(C, 2, 0.5, 1.5);
  std::vector<double> y(BT * C), rstd(BT);
  ops::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), BT, C, eps);
  std::vector<double> y_ref(BT * C), rstd_ref(BT);
  for (int64_t r = 0; r < BT; ++r) {
    long double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<long double>(x[r * C + c]) * x[r * C + c];
    rstd_ref[r] = static_cast<double>(1.0L / std::sqrt(ss / C + eps));
    for (int64_t c = 0; c < C; ++c) y_ref[r * C + c] = x[r * C + c] * rstd_ref[r] * w[c];
  }
  EXPECT_LT(max_rel_error(y, y_ref), 1e-14);
  EXPECT_LT(max_rel_error(rstd, rstd_ref), 1e-14);
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  // C = 70 crosses the 64-column blocks of the dweight reduction.
  const int64_t BT = 5, C = 70;
  const double eps = 1e-5;
  auto x = random_vector(BT * C, 3), w = random_vector(C, 4, 0.5, 1.5),
       dout = random_vector(BT * C, 5);
  std::vector<double> y(BT * C), rstd(BT);
  auto objective = [&] {
    ops::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), BT, C, eps);
    return dot(y, dout);
  };
  objective();  // fills rstd for the backward
  std::vector<double> dx(BT * C, 0.0), dw(C, 0.0);
  ops::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), BT, C);
  EXPECT_LT(max_rel_error(dx, fd_gradient(objective, x)), 1e-6);
  EXPECT_LT(max_rel_error(dw, fd_gradient(objective, w)), 1e-6);

  // Accumulates: a second call doubles the gradients.
  std::vector<double> dx2 = dx, dw2 = dw;
  ops::rmsnorm_backward(dx2.data(), dw2.data(), dout.data(), x.data(), w.data(), rstd.data(), BT,
                        C);
  for (double& v : dx) v *= 2;
  for (double& v : dw) v *= 2;
  EXPECT_LT(max_rel_error(dx2, dx), 1e-15);
  EXPECT_LT(max_rel_error(dw2, dw), 1e-15);
}

// Either gradient may be skipped (null), and the other keeps its bits: the split backward of
// zero-bubble pipeline schedules computes dx in one call and dweight (no weight read) in another.
TEST(RmsNorm, BackwardSkipsANullGradientAndKeepsTheOthersBits) {
  const int64_t BT = 300, C = 70;
  auto x = random_vector(BT * C, 9), w = random_vector(C, 10, 0.5, 1.5), dout = random_vector(BT * C, 11);
  std::vector<double> y(BT * C), rstd(BT);
  ops::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), BT, C, 1e-5);
  std::vector<double> dx(BT * C, 0.5), dw(C, 0.25), dx_only(dx), dw_only(dw);
  ops::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), BT, C);
  ops::rmsnorm_backward<double>(dx_only.data(), nullptr, dout.data(), x.data(), w.data(), rstd.data(), BT, C);
  ops::rmsnorm_backward<double>(nullptr, dw_only.data(), dout.data(), x.data(), nullptr, rstd.data(), BT, C);
  EXPECT_TRUE(bitwise_equal(dx_only, dx));
  EXPECT_TRUE(bitwise_equal(dw_only, dw));
}

TEST(RmsNorm, FloatAgreesWithDoubleAndThreadCountDoesNotChangeBits) {
  const int64_t BT = 300, C = 288;  // large enough to run in parallel
  auto x = random_vector(BT * C, 6), w = random_vector(C, 7, 0.5, 1.5),
       dout = random_vector(BT * C, 8);
  std::vector<double> y(BT * C), rstd(BT), dx(BT * C, 0.0), dw(C, 0.0);
  ops::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), BT, C, 1e-5);
  ops::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), BT, C);

  auto run_float = [&](int threads) {
    std::vector<float> yf(BT * C), rf(BT), dxf(BT * C, 0.0f), dwf(C, 0.0f);
    auto xf = cast_to<float>(x), wf = cast_to<float>(w), df = cast_to<float>(dout);
    with_threads(threads, [&] {
      ops::rmsnorm_forward(yf.data(), rf.data(), xf.data(), wf.data(), BT, C, 1e-5f);
      ops::rmsnorm_backward(dxf.data(), dwf.data(), df.data(), xf.data(), wf.data(), rf.data(), BT,
                            C);
    });
    return std::vector<std::vector<float>>{yf, dxf, dwf};
  };
  const auto one = run_float(1), two = run_float(2);
  EXPECT_LT(max_rel_error(one[0], y), 1e-5);
  EXPECT_LT(max_rel_error(one[1], dx), 1e-5);
  EXPECT_LT(max_rel_error(one[2], dw), 1e-5);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(bitwise_equal(one[i], two[i])) << "tensor " << i;
}

}  // namespace
}  // namespace llama4d::test
