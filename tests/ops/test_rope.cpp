// rope_forward / rope_backward: rotate-half rotary embedding at positions pos_start + t.
#include <gtest/gtest.h>

#include <complex>

#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

constexpr double kTheta = 10000.0;

// Tables [max_pos, hd/2] with the usual frequencies theta^(-2i/hd).
void make_tables(std::vector<double>& cos, std::vector<double>& sin, int64_t max_pos, int64_t hd) {
  const int64_t half = hd / 2;
  cos.resize(max_pos * half);
  sin.resize(max_pos * half);
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = p * std::pow(kTheta, -2.0 * i / hd);
      cos[p * half + i] = std::cos(angle);
      sin[p * half + i] = std::sin(angle);
    }
}

TEST(Rope, ForwardRotatesHalvesByPositionAngles) {
  const int64_t B = 2, T = 5, nh = 3, hd = 8, pos_start = 4, max_pos = 16;
  std::vector<double> cos, sin;
  make_tables(cos, sin, max_pos, hd);
  const auto x0 = random_vector(B * T * nh * hd, 1);
  auto x = x0;
  ops::rope_forward(x.data(), cos.data(), sin.data(), B, T, nh, hd, pos_start);
  // Reference: the pair (x[i], x[i + hd/2]) as a complex number times e^{i * angle}, with the
  // angle computed here from the position, not read from the tables.
  std::vector<double> ref(x0.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        const double* in = x0.data() + ((b * T + t) * nh + h) * hd;
        double* out = ref.data() + ((b * T + t) * nh + h) * hd;
        for (int64_t i = 0; i < hd / 2; ++i) {
          const double angle = (pos_start + t) * std::pow(kTheta, -2.0 * i / hd);
          const std::complex<double> z(in[i], in[i + hd / 2]);
          const std::complex<double> rotated = z * std::polar(1.0, angle);
          out[i] = rotated.real();
          out[i + hd / 2] = rotated.imag();
        }
      }
  EXPECT_LT(max_rel_error(x, ref), 1e-14);
}

TEST(Rope, BackwardMatchesFiniteDifferencesAndInvertsForward) {
  const int64_t B = 2, T = 4, nh = 2, hd = 6, pos_start = 3, max_pos = 8;
  std::vector<double> cos, sin;
  make_tables(cos, sin, max_pos, hd);
  auto x = random_vector(B * T * nh * hd, 2), dout = random_vector(x.size(), 3);
  auto objective = [&] {
    auto y = x;
    ops::rope_forward(y.data(), cos.data(), sin.data(), B, T, nh, hd, pos_start);
    return dot(y, dout);
  };
  auto dx = dout;  // rope_backward transforms the incoming gradient in place
  ops::rope_backward(dx.data(), cos.data(), sin.data(), B, T, nh, hd, pos_start);
  EXPECT_LT(max_rel_error(dx, fd_gradient(objective, x)), 1e-6);

  // A rotation's transpose is its inverse: backward undoes forward.
  auto y = x;
  ops::rope_forward(y.data(), cos.data(), sin.data(), B, T, nh, hd, pos_start);
  ops::rope_backward(y.data(), cos.data(), sin.data(), B, T, nh, hd, pos_start);
  EXPECT_LT(max_rel_error(y, x), 1e-14);
}

TEST(Rope, FloatAgreesWithDouble) {
  const int64_t B = 4, T = 64, nh = 6, hd = 48, max_pos = 64;  // large enough to run in parallel
  std::vector<double> cos, sin;
  make_tables(cos, sin, max_pos, hd);
  auto x = random_vector(B * T * nh * hd, 4);
  auto xf = cast_to<float>(x), cf = cast_to<float>(cos), sf = cast_to<float>(sin);
  ops::rope_forward(x.data(), cos.data(), sin.data(), B, T, nh, hd, 0);
  ops::rope_forward(xf.data(), cf.data(), sf.data(), B, T, nh, hd, 0);
  EXPECT_LT(max_rel_error(xf, x), 1e-5);
}

}  // namespace
}  // namespace llama4d::test
