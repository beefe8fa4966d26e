// The GPU's linear layer against the CPU backend. Both sum every element of the forward and
// input-gradient products in the same order (backends/cpu/gemm.h): with fused multiply-adds on
// both sides they agree bit for bit. The weight gradient agrees to rounding (the CPU cuts its
// sum over tokens into depth chunks for its threads).
#include <gtest/gtest.h>

#include <vector>

#include "core/ops.h"
#include "cuda_test_util.h"

namespace llama4d {
namespace {

using test::DeviceBuffer;
using test::OnGpu;

template <class T>
class CudaMatmul : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CudaMatmul, Types);

struct Shape {
  int64_t BT, C, OC;
};
// Odd sizes, a tile edge on every side, and K past one and several 256-blocks.
const Shape kShapes[] = {{1, 1, 1}, {7, 33, 65}, {130, 257, 63}, {256, 768, 288}, {1000, 96, 513}};

template <class T>
void check_shape(const Shape& s) {
  const std::string name = std::to_string(s.BT) + "x" + std::to_string(s.C) + "x" + std::to_string(s.OC);
  const auto x = test::random_values<T>(size_t(s.BT * s.C), 1), w = test::random_values<T>(size_t(s.OC * s.C), 2),
             dy = test::random_values<T>(size_t(s.BT * s.OC), 3), dx0 = test::random_values<T>(size_t(s.BT * s.C), 4),
             dw0 = test::random_values<T>(size_t(s.OC * s.C), 5);
  std::vector<T> y(size_t(s.BT * s.OC)), dx = dx0, dw = dw0;
  ops::matmul_forward(y.data(), x.data(), w.data(), s.BT, s.C, s.OC);
  ops::matmul_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), s.BT, s.C, s.OC);

  OnGpu gpu;
  DeviceBuffer<T> gx(x), gw(w), gdy(dy), gy(s.BT * s.OC), gdx(dx0), gdw(dw0);
  ops::matmul_forward(gy.data(), gx.data(), gw.data(), s.BT, s.C, s.OC);
  ops::matmul_backward(gdx.data(), gdw.data(), gdy.data(), gx.data(), gw.data(), s.BT, s.C, s.OC);
#if defined(__FMA__)
  test::expect_bitwise(gy.host(), y, "forward " + name);
  test::expect_bitwise(gdx.host(), dx, "dinp " + name);
#else
  test::expect_close(gy.host(), y, "forward " + name);
  test::expect_close(gdx.host(), dx, "dinp " + name);
#endif
  test::expect_close(gdw.host(), dw, "dweight " + name);

  // Run to run on the GPU: the same bits.
  const std::vector<T> first = gy.host();
  ops::matmul_forward(gy.data(), gx.data(), gw.data(), s.BT, s.C, s.OC);
  test::expect_bitwise(gy.host(), first, "repeat " + name);
}

TYPED_TEST(CudaMatmul, EveryProductMatchesTheCpu) {
  LLAMA4D_REQUIRE_GPU();
  for (const Shape& s : kShapes) check_shape<TypeParam>(s);
}

// A null dinp or dweight skips that product and leaves the other's buffer as it was.
TYPED_TEST(CudaMatmul, SkippedProductsTouchNothing) {
  using T = TypeParam;
  LLAMA4D_REQUIRE_GPU();
  const int64_t BT = 9, C = 17, OC = 5;
  const auto x = test::random_values<T>(BT * C, 1), w = test::random_values<T>(OC * C, 2),
             dy = test::random_values<T>(BT * OC, 3), dw0 = test::random_values<T>(OC * C, 4);
  std::vector<T> dw = dw0;
  ops::matmul_backward<T>(nullptr, dw.data(), dy.data(), x.data(), w.data(), BT, C, OC);
  OnGpu gpu;
  DeviceBuffer<T> gx(x), gw(w), gdy(dy), gdw(dw0);
  ops::matmul_backward<T>(nullptr, gdw.data(), gdy.data(), gx.data(), gw.data(), BT, C, OC);
  test::expect_close(gdw.host(), dw, "dweight alone");
  const std::vector<T> kept = gdw.host();
  ops::matmul_backward<T>(nullptr, nullptr, gdy.data(), gx.data(), gw.data(), BT, C, OC);
  test::expect_bitwise(gdw.host(), kept, "nothing requested");
}

}  // namespace
}  // namespace llama4d
