// swiglu_forward / swiglu_backward: out = silu(gate) * up.
#include <gtest/gtest.h>

#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

TEST(SwiGLU, ForwardMatchesFormula) {
  // Includes large |gate| where exp(-gate) would overflow a naive sigmoid.
  auto gate = random_vector(1000, 1, -8, 8), up = random_vector(1000, 2);
  gate[0] = 120.0, gate[1] = -120.0, gate[2] = 0.0, gate[3] = -700.0, gate[4] = 700.0;
  std::vector<double> out(gate.size());
  ops::swiglu_forward(out.data(), gate.data(), up.data(), static_cast<int64_t>(gate.size()));
  std::vector<double> ref(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const long double g = gate[i];
    ref[i] = static_cast<double>(g / (1.0L + std::exp(-g)) * up[i]);
  }
  for (size_t i = 0; i < gate.size(); ++i)
    EXPECT_NEAR(out[i], ref[i], 1e-14 * std::max(1.0, std::abs(ref[i]))) << "gate " << gate[i];
}

TEST(SwiGLU, BackwardMatchesFiniteDifferencesAndWritesOver) {
  const int64_t N = 50;
  auto gate = random_vector(N, 3, -5, 5), up = random_vector(N, 4), dout = random_vector(N, 5);
  auto objective = [&] {
    std::vector<double> out(N);
    ops::swiglu_forward(out.data(), gate.data(), up.data(), N);
    return dot(out, dout);
  };
  // Whatever the buffers held (here NaN) is written over: gate and up have no other source.
  std::vector<double> dgate(N, std::nan("")), dup(N, std::nan(""));
  ops::swiglu_backward(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), N);
  EXPECT_LT(max_rel_error(dgate, fd_gradient(objective, gate)), 1e-6);
  EXPECT_LT(max_rel_error(dup, fd_gradient(objective, up)), 1e-6);

  auto dgate2 = dgate, dup2 = dup;
  ops::swiglu_backward(dgate2.data(), dup2.data(), dout.data(), gate.data(), up.data(), N);
  EXPECT_TRUE(bitwise_equal(dgate2, dgate));
  EXPECT_TRUE(bitwise_equal(dup2, dup));
}

TEST(SwiGLU, FloatAgreesWithDoubleAndBitsDoNotDependOnOffsetOrThreads) {
  // 100003 elements: several parallel chunks and a ragged tail.
  const int64_t N = 100003;
  auto gate = random_vector(N + 1, 6, -6, 6), up = random_vector(N + 1, 7),
       dout = random_vector(N + 1, 8);
  std::vector<double> out(N);
  ops::swiglu_forward(out.data(), gate.data(), up.data(), N);
  auto gf = cast_to<float>(gate), uf = cast_to<float>(up), df = cast_to<float>(dout);
  auto run = [&](int threads, int64_t offset) {
    std::vector<float> o(N), dg(N, 0.0f), du(N, 0.0f);
    with_threads(threads, [&] {
      ops::swiglu_forward(o.data(), gf.data() + offset, uf.data() + offset, N);
      ops::swiglu_backward(dg.data(), du.data(), df.data() + offset, gf.data() + offset,
                           uf.data() + offset, N);
    });
    return std::vector<std::vector<float>>{o, dg, du};
  };
  const auto base = run(1, 0);
  EXPECT_LT(max_rel_error(base[0], out), 1e-5);
  EXPECT_EQ(run(2, 0), base);  // thread count does not change bits
  // Elements shifted by one position land in other SIMD lanes / the scalar tail: each value
  // must still be bitwise the same function of its inputs.
  gf.insert(gf.begin(), 0.5f), uf.insert(uf.begin(), 0.5f), df.insert(df.begin(), 0.5f);
  const auto shifted = run(2, 1);
  for (int t = 0; t < 3; ++t) EXPECT_TRUE(bitwise_equal(shifted[t], base[t])) << "tensor " << t;
}

}  // namespace
}  // namespace llama4d::test
