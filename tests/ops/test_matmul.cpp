// matmul_forward / matmul_backward: out[BT, OC] = inp[BT, C] @ weight[OC, C]^T.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

// Naive reference with a long double accumulator.
std::vector<double> matmul_reference(const std::vector<double>& x, const std::vector<double>& w,
                                     int64_t BT, int64_t C, int64_t OC) {
  std::vector<double> y(BT * OC);
  for (int64_t r = 0; r < BT; ++r)
    for (int64_t o = 0; o < OC; ++o) {
      long double s = 0;
      for (int64_t c = 0; c < C; ++c) s += static_cast<long double>(x[r * C + c]) * w[o * C + c];
      y[r * OC + o] = static_cast<double>(s);
    }
  return y;
}

TEST(Matmul, ForwardMatchesNaiveLoops) {
  // Sizes from below one register block to several tiles, odd on purpose.
  for (auto [BT, C, OC] :
       {std::tuple<int64_t, int64_t, int64_t>{3, 5, 4}, {37, 29, 41}, {130, 72, 96}}) {
    auto x = random_vector(BT * C, 1), w = random_vector(OC * C, 2);
    std::vector<double> y(BT * OC);
    ops::matmul_forward(y.data(), x.data(), w.data(), BT, C, OC);
    EXPECT_LT(max_rel_error(y, matmul_reference(x, w, BT, C, OC)), 1e-13)
        << BT << "x" << C << "x" << OC;
  }
}

// Each element in the order backends/cpu/gemm.h documents: K in blocks of 256, a block summed
// from zero with one multiply-add per k (fused, or the product rounded first: as the build
// compiles the kernel), then stored (the first block of an overwritten output) or added. a(i, k)
// and b(k, j) read the operands however they are laid out. This file is compiled without
// contraction (CMakeLists.txt), so the unfused reference stays unfused.
template <class T, class A, class B>
void documented_order(std::vector<T>& out, int64_t M, int64_t N, int64_t K, bool accumulate, bool fused, A a, B b) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k0 = 0; k0 < K; k0 += 256) {
        T block = 0;
        for (int64_t k = k0; k < std::min<int64_t>(K, k0 + 256); ++k)
          block = fused ? std::fma(a(i, k), b(k, j), block) : block + a(i, k) * b(k, j);
        T& o = out[i * N + j];
        o = (k0 == 0 && !accumulate) ? block : o + block;
      }
}

// The forward and the input gradient, bit for bit in that order, on shapes with partial register
// blocks (101 rows is 8 blocks of 12 and 5 rows; 45 columns) and K over three depth blocks, large
// enough to be threaded, on 1 and 2 threads: the left operand read in place (whole blocks) and
// packed (the last, partial one). The release build fuses (FMA); the sanitizer builds at -O1 do
// not contract, so either is accepted, the same for both products. The input gradient written
// over its buffer (GradWrite::overwrite) stores its first block whatever the buffer held (NaN).
void expect_documented_order(int64_t BT, int64_t C, int64_t OC) {
  SCOPED_TRACE(std::to_string(BT) + " x " + std::to_string(C) + " x " + std::to_string(OC));
  const auto x = cast_to<float>(random_vector(BT * C, 21)), w = cast_to<float>(random_vector(OC * C, 22));
  const auto dout = cast_to<float>(random_vector(BT * OC, 23)), dx0 = cast_to<float>(random_vector(BT * C, 24));
  std::vector<float> y_ref[2] = {std::vector<float>(BT * OC), std::vector<float>(BT * OC)}, dx_ref[2] = {dx0, dx0},
                     dx_over_ref[2] = {dx0, dx0};
  for (bool fused : {false, true}) {
    documented_order(y_ref[fused], BT, OC, C, false, fused, [&](int64_t i, int64_t k) { return x[i * C + k]; },
                     [&](int64_t k, int64_t j) { return w[j * C + k]; });
    for (bool accumulate : {true, false})
      documented_order(accumulate ? dx_ref[fused] : dx_over_ref[fused], BT, C, OC, accumulate, fused,
                       [&](int64_t i, int64_t k) { return dout[i * OC + k]; },
                       [&](int64_t k, int64_t j) { return w[k * C + j]; });
  }
  ASSERT_FALSE(bitwise_equal(y_ref[0], y_ref[1])) << "the two references must differ to tell the builds apart";
  const int saved = ops::backend_threads();
  for (int threads : {1, 2}) {
    ops::set_backend_threads(threads);
    std::vector<float> y(BT * OC), dx = dx0;
    ops::matmul_forward(y.data(), x.data(), w.data(), BT, C, OC);
    ops::matmul_backward(dx.data(), static_cast<float*>(nullptr), dout.data(), x.data(), w.data(), BT, C, OC);
    const bool fused = bitwise_equal(y, y_ref[1]);
    EXPECT_TRUE(fused || bitwise_equal(y, y_ref[0])) << threads << " threads: the forward in neither order";
    EXPECT_TRUE(bitwise_equal(dx, dx_ref[fused])) << threads << " threads";
    std::vector<float> dx_over(BT * C, std::nanf(""));
    ops::matmul_backward(dx_over.data(), static_cast<float*>(nullptr), dout.data(), x.data(), w.data(), BT, C, OC,
                         ops::GemmOperands::as_stored, ops::GradWrite::overwrite);
    EXPECT_TRUE(bitwise_equal(dx_over, dx_over_ref[fused])) << threads << " threads, written over";
  }
  ops::set_backend_threads(saved);
}

TEST(Matmul, SumsInTheDocumentedOrder) { expect_documented_order(101, 600, 45); }

// A decode step's few rows: one row tile, so each task packs the weight's slices as it reads them
// (gemm.cpp's stream_b), with the one- and four-row kernels and a partial column panel (77 = 2 x 32
// + 13 columns with AVX-512, other splits elsewhere).
TEST(Matmul, FewRowsSumInTheDocumentedOrder) {
  for (int64_t rows : {1, 3, 4, 7}) expect_documented_order(rows, 600, 77);
}

TEST(Matmul, BackwardMatchesFiniteDifferences) {
  const int64_t BT = 6, C = 5, OC = 7;
  auto x = random_vector(BT * C, 3), w = random_vector(OC * C, 4), dout = random_vector(BT * OC, 5);
  auto objective = [&] {
    std::vector<double> y(BT * OC);
    ops::matmul_forward(y.data(), x.data(), w.data(), BT, C, OC);
    return dot(y, dout);
  };
  std::vector<double> dx(BT * C, 0.0), dw(OC * C, 0.0);
  ops::matmul_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), BT, C, OC);
  EXPECT_LT(max_rel_error(dx, fd_gradient(objective, x)), 1e-6);
  EXPECT_LT(max_rel_error(dw, fd_gradient(objective, w)), 1e-6);
}

TEST(Matmul, BackwardMatchesNaiveLoopsOnTiledShapes) {
  // BT = 1100 spans three BT chunks of the weight gradient; OC = 530 two row tiles.
  const int64_t BT = 1100, C = 20, OC = 530;
  auto x = random_vector(BT * C, 15), w = random_vector(OC * C, 16),
       dout = random_vector(BT * OC, 17);
  auto dx = random_vector(BT * C, 18), dw = random_vector(OC * C, 19);  // accumulated onto
  auto dx_ref = dx, dw_ref = dw;
  ops::matmul_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), BT, C, OC);
  for (int64_t r = 0; r < BT; ++r)
    for (int64_t c = 0; c < C; ++c) {
      long double s = 0;
      for (int64_t o = 0; o < OC; ++o)
        s += static_cast<long double>(dout[r * OC + o]) * w[o * C + c];
      dx_ref[r * C + c] += static_cast<double>(s);
    }
  for (int64_t o = 0; o < OC; ++o)
    for (int64_t c = 0; c < C; ++c) {
      long double s = 0;
      for (int64_t r = 0; r < BT; ++r)
        s += static_cast<long double>(dout[r * OC + o]) * x[r * C + c];
      dw_ref[o * C + c] += static_cast<double>(s);
    }
  EXPECT_LT(max_rel_error(dx, dx_ref), 1e-13);
  EXPECT_LT(max_rel_error(dw, dw_ref), 1e-13);
}

TEST(Matmul, BackwardAccumulatesAndSkipsNullOutputs) {
  const int64_t BT = 40, C = 24, OC = 36;
  auto x = random_vector(BT * C, 6), w = random_vector(OC * C, 7), dout = random_vector(BT * OC, 8);
  std::vector<double> dx(BT * C, 0.0), dw(OC * C, 0.0);
  ops::matmul_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), BT, C, OC);
  std::vector<double> dx2 = dx, dw2 = dw;
  ops::matmul_backward(dx2.data(), dw2.data(), dout.data(), x.data(), w.data(), BT, C, OC);
  for (double& v : dx) v *= 2;
  for (double& v : dw) v *= 2;
  EXPECT_LT(max_rel_error(dx2, dx), 1e-14);
  EXPECT_LT(max_rel_error(dw2, dw), 1e-14);

  // A null gradient output is skipped; the other one is still produced.
  std::vector<double> only_dx(BT * C, 0.0), only_dw(OC * C, 0.0);
  ops::matmul_backward(only_dx.data(), static_cast<double*>(nullptr), dout.data(), x.data(),
                       w.data(), BT, C, OC);
  ops::matmul_backward(static_cast<double*>(nullptr), only_dw.data(), dout.data(), x.data(),
                       w.data(), BT, C, OC);
  for (double& v : dx) v /= 2;
  for (double& v : dw) v /= 2;
  EXPECT_LT(max_rel_error(only_dx, dx), 1e-14);
  EXPECT_LT(max_rel_error(only_dw, dw), 1e-14);
}

TEST(Matmul, FloatAgreesWithDouble) {
  const int64_t BT = 64, C = 96, OC = 80;
  auto x = random_vector(BT * C, 9), w = random_vector(OC * C, 10),
       dout = random_vector(BT * OC, 11);
  std::vector<double> y(BT * OC), dx(BT * C, 0.0), dw(OC * C, 0.0);
  ops::matmul_forward(y.data(), x.data(), w.data(), BT, C, OC);
  ops::matmul_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), BT, C, OC);
  auto xf = cast_to<float>(x), wf = cast_to<float>(w), doutf = cast_to<float>(dout);
  std::vector<float> yf(BT * OC), dxf(BT * C, 0.0f), dwf(OC * C, 0.0f);
  ops::matmul_forward(yf.data(), xf.data(), wf.data(), BT, C, OC);
  ops::matmul_backward(dxf.data(), dwf.data(), doutf.data(), xf.data(), wf.data(), BT, C, OC);
  EXPECT_LT(max_rel_error(yf, y), 1e-5);
  EXPECT_LT(max_rel_error(dxf, dx), 1e-5);
  EXPECT_LT(max_rel_error(dwf, dw), 1e-5);
}

TEST(Matmul, BitwiseIdenticalAcrossRunsAndThreadCounts) {
  // Ragged, with several output tiles and two BT chunks of the weight gradient.
  const int64_t BT = 600, C = 96, OC = 530;
  auto x = cast_to<float>(random_vector(BT * C, 12)), w = cast_to<float>(random_vector(OC * C, 13));
  auto dout = cast_to<float>(random_vector(BT * OC, 14));
  auto run = [&](int threads) {
    std::vector<float> y(BT * OC), dx(BT * C, 0.0f), dw(OC * C, 0.0f);
    with_threads(threads, [&] {
      ops::matmul_forward(y.data(), x.data(), w.data(), BT, C, OC);
      ops::matmul_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), BT, C, OC);
    });
    return std::vector<std::vector<float>>{y, dx, dw};
  };
  const auto one = run(1), one_again = run(1), two = run(2), three = run(3);
  for (int t = 0; t < 3; ++t) {
    EXPECT_TRUE(bitwise_equal(one[t], one_again[t])) << "tensor " << t;
    EXPECT_TRUE(bitwise_equal(one[t], two[t])) << "tensor " << t;
    EXPECT_TRUE(bitwise_equal(one[t], three[t])) << "tensor " << t;
  }
}

}  // namespace
}  // namespace llama4d::test
