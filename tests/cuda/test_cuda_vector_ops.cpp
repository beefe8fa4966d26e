// Element-wise ops, SwiGLU, the vector ops and AdamW on the GPU against the CPU backend. The
// ops both backends compute without fused multiply-adds (add_scaled, the sums of squares, the
// loss sum, AdamW; see backends/cuda/CMakeLists.txt) and the rounding to bf16 must agree bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/tensor/dtype.h"
#include "cuda_test_util.h"

namespace llama4d {
namespace {

using test::DeviceBuffer;
using test::OnGpu;

template <class T>
class CudaVectorOps : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CudaVectorOps, Types);

constexpr int64_t kN = 100003;  // odd, several blocks, a grid-stride remainder

TYPED_TEST(CudaVectorOps, ElementwiseAndSwiGluMatchTheCpu) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  const auto a = test::random_values<T>(kN, 1, -4, 4), b = test::random_values<T>(kN, 2), c = test::random_values<T>(kN, 3);
  // CPU references.
  std::vector<T> add(kN), acc = c, scaled = a, swi(kN), dgate = b, dup = c;
  ops::add_forward(add.data(), a.data(), b.data(), kN);
  ops::accumulate(acc.data(), a.data(), kN);
  ops::scale(scaled.data(), T(0.37), kN);
  ops::swiglu_forward(swi.data(), a.data(), b.data(), kN);
  ops::swiglu_backward(dgate.data(), dup.data(), c.data(), a.data(), b.data(), kN);

  OnGpu gpu;
  DeviceBuffer<T> da(a), db(b), dc(c), out(kN), dacc(c), dscaled(a), dg(b), du(c);
  ops::add_forward(out.data(), da.data(), db.data(), kN);
  test::expect_bitwise(out.host(), add, "add_forward");
  ops::accumulate(dacc.data(), da.data(), kN);
  test::expect_bitwise(dacc.host(), acc, "accumulate");
  ops::scale(dscaled.data(), T(0.37), kN);
  test::expect_bitwise(dscaled.host(), scaled, "scale");
  ops::swiglu_forward(out.data(), da.data(), db.data(), kN);
  test::expect_close(out.host(), swi, "swiglu_forward");
  ops::swiglu_backward(dg.data(), du.data(), dc.data(), da.data(), db.data(), kN);
  test::expect_close(dg.host(), dgate, "swiglu_backward dgate");
  test::expect_close(du.host(), dup, "swiglu_backward dup");
}

TYPED_TEST(CudaVectorOps, FillCopyAndAxpyAreBitwise) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  const auto x = test::random_values<T>(kN, 4), y = test::random_values<T>(kN, 5);
  std::vector<T> axpy = y;
  for (int64_t i = 0; i < kN; ++i) axpy[size_t(i)] += T(-1.7) * x[size_t(i)];  // rounded twice (-ffp-contract=off)
  OnGpu gpu;
  DeviceBuffer<T> dx(x), dy(y), d(kN);
  ops::add_scaled(dy.data(), dx.data(), T(-1.7), kN);
  test::expect_bitwise(dy.host(), axpy, "add_scaled");
  ops::fill(d.data(), T(2.5), kN);
  test::expect_bitwise(d.host(), std::vector<T>(kN, T(2.5)), "fill");
  ops::copy(d.data(), dx.data(), kN);
  test::expect_bitwise(d.host(), x, "copy");
}

TYPED_TEST(CudaVectorOps, SumsOfSquaresAndLossesAreBitwise) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  const auto x = test::random_values<T>(kN, 6, -3, 3);
  // A chunk of odd length, the gradient norm's 512, and one shorter than the 8 accumulators.
  const int64_t chunk_lengths[] = {4099, 512, 5};
  std::vector<std::vector<double>> want;
  for (int64_t chunk : chunk_lengths) {
    want.emplace_back(size_t((kN + chunk - 1) / chunk));
    ops::sum_squares_chunks(want.back().data(), x.data(), kN, chunk);
  }
  const int64_t BT = 777;
  const auto losses = test::random_values<T>(BT, 7, 0, 10);
  std::vector<int32_t> targets(BT);
  for (int64_t i = 0; i < BT; ++i) targets[size_t(i)] = i % 5 == 0 ? -1 : int32_t(i % 31);
  double want_sum = 0, got_sum = 0;
  int64_t want_count = 0, got_count = 0;
  ops::sum_losses(&want_sum, &want_count, losses.data(), targets.data(), BT);

  OnGpu gpu;
  DeviceBuffer<T> dx(x), dl(losses);
  DeviceBuffer<int32_t> dt(targets);
  for (size_t c = 0; c < want.size(); ++c) {
    std::vector<double> got(want[c].size());
    ops::sum_squares_chunks(got.data(), dx.data(), kN, chunk_lengths[c]);  // partials are host memory
    test::expect_bitwise(got, want[c], "sum_squares_chunks of " + std::to_string(chunk_lengths[c]));
  }
  ops::sum_losses(&got_sum, &got_count, dl.data(), dt.data(), BT);
  EXPECT_EQ(std::memcmp(&got_sum, &want_sum, sizeof(double)), 0) << got_sum << " vs " << want_sum;
  EXPECT_EQ(got_count, want_count);
  std::vector<double> none(1);
  EXPECT_THROW(ops::sum_squares_chunks(none.data(), dx.data(), kN, 0), InputError);
}

// The same rounding function on both sides (core/tensor/bf16_rounding.h), compiled by nvcc here.
TYPED_TEST(CudaVectorOps, RoundToBf16IsBitwiseTheCpuRounding) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  auto x = test::random_values<T>(kN, 13, -1, 1);
  for (int64_t i = 0; i < kN; ++i) x[size_t(i)] = std::ldexp(x[size_t(i)], int(i % 301) - 150);  // subnormals to huge
  x[0] = std::numeric_limits<T>::quiet_NaN(), x[1] = -std::numeric_limits<T>::infinity(), x[2] = T(-0.0);
  std::vector<T> want = x;
  ops::round_to_bf16(want.data(), kN);
  OnGpu gpu;
  DeviceBuffer<T> d(x);
  ops::round_to_bf16(d.data(), kN);
  const std::vector<T> got = d.host();
  EXPECT_TRUE(std::isnan(got[0]));
  EXPECT_EQ(std::memcmp(got.data() + 1, want.data() + 1, size_t(kN - 1) * sizeof(T)), 0);
}

// The bf16 wire of a gradient reduction: to_bf16 and from_bf16 (both ways of the latter) give
// the CPU backend's bits.
TYPED_TEST(CudaVectorOps, Bf16ConversionsAreBitwiseTheCpus) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  auto x = test::random_values<T>(kN, 17, -1, 1);
  for (int64_t i = 0; i < kN; ++i) x[size_t(i)] = std::ldexp(x[size_t(i)], int(i % 301) - 150);  // subnormals to huge
  x[0] = std::numeric_limits<T>::quiet_NaN(), x[1] = -std::numeric_limits<T>::infinity(), x[2] = T(-0.0);
  const auto y0 = test::random_values<T>(kN, 18, -1, 1);
  std::vector<bf16> want_wire(static_cast<size_t>(kN));
  ops::to_bf16(want_wire.data(), x.data(), kN);
  std::vector<T> want_set(static_cast<size_t>(kN)), want_added = y0;
  ops::from_bf16(want_set.data(), want_wire.data(), kN, false);
  ops::from_bf16(want_added.data(), want_wire.data(), kN, true);
  OnGpu gpu;
  DeviceBuffer<T> d(x), set(kN), added(y0);
  DeviceBuffer<bf16> wire(kN);
  ops::to_bf16(wire.data(), d.data(), kN);
  ops::from_bf16(set.data(), wire.data(), kN, false);
  ops::from_bf16(added.data(), wire.data(), kN, true);
  const std::vector<bf16> got_wire = wire.host();
  // A NaN stays a NaN (exponent all ones, mantissa not zero); its payload may differ: a double
  // NaN narrowed on the GPU is CUDA's canonical NaN.
  EXPECT_EQ(got_wire[0].bits & 0x7F80, 0x7F80);
  EXPECT_NE(got_wire[0].bits & 0x007F, 0);
  EXPECT_EQ(std::memcmp(got_wire.data() + 1, want_wire.data() + 1, size_t(kN - 1) * sizeof(bf16)), 0);
  const std::vector<T> got_set = set.host(), got_added = added.host();
  EXPECT_TRUE(std::isnan(got_set[0]) && std::isnan(got_added[0]));
  EXPECT_EQ(std::memcmp(got_set.data() + 1, want_set.data() + 1, size_t(kN - 1) * sizeof(T)), 0);
  EXPECT_EQ(std::memcmp(got_added.data() + 1, want_added.data() + 1, size_t(kN - 1) * sizeof(T)), 0);
}

TYPED_TEST(CudaVectorOps, AllFiniteFindsOneBadElement) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  auto x = test::random_values<T>(kN, 8);
  OnGpu gpu;
  {
    DeviceBuffer<T> d(x);
    EXPECT_TRUE(ops::all_finite(d.data(), kN));
  }
  for (T bad : {std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()}) {
    x[kN - 1] = bad;  // the very last element: the grid-stride remainder
    DeviceBuffer<T> d(x);
    EXPECT_FALSE(ops::all_finite(d.data(), kN)) << bad;
  }
  EXPECT_TRUE(ops::all_finite<T>(nullptr, 0));
}

// AdamW<T>::step's expressions, element by element, as the update must compute them.
TYPED_TEST(CudaVectorOps, AdamWIsBitwiseTheCpuUpdate) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  auto w = test::random_values<T>(kN, 9), m = test::random_values<T>(kN, 10, -0.1, 0.1),
       v = test::random_values<T>(kN, 11, 0, 0.01), g = test::random_values<T>(kN, 12);
  const ops::AdamWStep<T> s = ops::adamw_step_scalars<T>(3e-4, 0.9, 0.95, 1e-8, 0.1, 7, true);
  auto w_cpu = w, m_cpu = m, v_cpu = v;
  ops::adamw_update(w_cpu.data(), m_cpu.data(), v_cpu.data(), g.data(), kN, s);
  OnGpu gpu;
  DeviceBuffer<T> dw(w), dm(m), dv(v), dg(g);
  ops::adamw_update(dw.data(), dm.data(), dv.data(), dg.data(), kN, s);
  test::expect_bitwise(dw.host(), w_cpu, "adamw w");
  test::expect_bitwise(dm.host(), m_cpu, "adamw m");
  test::expect_bitwise(dv.host(), v_cpu, "adamw v");
}

}  // namespace
}  // namespace llama4d
