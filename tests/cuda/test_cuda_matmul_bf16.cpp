// The linear layer's products with bf16 operands (GemmOperands::bf16, bf16 mixed precision) on
// the tensor cores (backends/cuda/gemm_bf16.cu), against the CPU backend's fp32 GEMM on the same
// bf16 values. Every product of two bf16 values is exact in fp32, so the two differ only in how
// the sums are added: each element is held to fp32 summation's bound relative to the sum of its
// terms' magnitudes, not to the tensor's largest value. Within the GPU the order is fixed by K
// alone: a slice of the rows or columns has the whole product's bits, and a run repeats them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/ops.h"
#include "cuda_test_util.h"

namespace llama4d {
namespace {
// Its own names: the binary is built in batches of files (a unity build), beside the fp32 tests.
namespace matmul_bf16 {

using ops::GemmOperands;
using test::DeviceBuffer;
using test::OnGpu;
using test::bf16_values;

struct Shape {
  int64_t BT, C, OC;
};
// Odd sizes; tile edges on every side (128 rows, 64 columns); K inside one 16-step, past one
// and several 256-blocks, and ending mid-slice; and the weight gradient's depth chunks of 2,048
// (BT = 5000: two whole chunks and a third of 904).
const Shape kShapes[] = {{1, 1, 1},        {7, 33, 65},     {130, 257, 63}, {129, 768, 288},
                         {1000, 96, 513}, {64, 1000, 200}, {5000, 40, 70}};

// |a| @ |b| in double, for the same three products: the scale each element's rounding is held to.
struct Magnitudes {
  std::vector<double> y, dx, dw;  // [BT, OC], [BT, C], [OC, C]
};
Magnitudes magnitudes(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& dy,
                      const Shape& s) {
  Magnitudes m{std::vector<double>(size_t(s.BT * s.OC)), std::vector<double>(size_t(s.BT * s.C)),
               std::vector<double>(size_t(s.OC * s.C))};
  for (int64_t t = 0; t < s.BT; ++t)
    for (int64_t o = 0; o < s.OC; ++o)
      for (int64_t c = 0; c < s.C; ++c) {
        const double xa = std::abs(x[size_t(t * s.C + c)]), wa = std::abs(w[size_t(o * s.C + c)]),
                     da = std::abs(dy[size_t(t * s.OC + o)]);
        m.y[size_t(t * s.OC + o)] += xa * wa;
        m.dx[size_t(t * s.C + c)] += da * wa;
        m.dw[size_t(o * s.C + c)] += da * xa;
      }
  return m;
}

// |got - want| <= bound * (|start| + magnitude) per element: two fp32 sums of the same exact
// terms, each within about (K/256 + 256) units of fp32 rounding of the terms' magnitude
// (the 256-blocks), start the value accumulated into. 2^-14 leaves room for a tensor core that
// keeps fewer bits while it adds; a missing or doubled term of typical size (about 1/K of the
// magnitude) is more than 16 times past it where K <= 1000, 3 times at K = 5000, and a missing
// or doubled depth chunk hundreds of times.
void expect_within_rounding(const std::vector<float>& got, const std::vector<float>& want,
                            const std::vector<double>& magnitude, const std::vector<float>& start,
                            const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  const double bound = std::ldexp(1.0, -14);
  for (size_t i = 0; i < want.size(); ++i) {
    const double scale = magnitude[i] + (start.empty() ? 0.0 : std::abs(double(start[i])));
    const double diff = std::abs(double(got[i]) - double(want[i]));
    if (!(diff <= bound * scale + 1e-30)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", the CPU backend gives " << want[i]
                    << " (sum of the terms' magnitudes " << scale << ")";
      return;
    }
  }
}

TEST(CudaMatmulBf16, TensorCoreProductsAgreeWithTheCpuToRounding) {
  LLAMA4D_REQUIRE_GPU();
  for (const Shape& s : kShapes) {
    const std::string name = std::to_string(s.BT) + "x" + std::to_string(s.C) + "x" + std::to_string(s.OC);
    const auto x = bf16_values(size_t(s.BT * s.C), 1), w = bf16_values(size_t(s.OC * s.C), 2),
               dy = bf16_values(size_t(s.BT * s.OC), 3), dx0 = test::random_values<float>(size_t(s.BT * s.C), 4),
               dw0 = test::random_values<float>(size_t(s.OC * s.C), 5);
    std::vector<float> y(size_t(s.BT * s.OC)), dx = dx0, dw = dw0;
    ops::matmul_forward(y.data(), x.data(), w.data(), s.BT, s.C, s.OC);
    ops::matmul_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), s.BT, s.C, s.OC);
    const Magnitudes m = magnitudes(x, w, dy, s);

    OnGpu gpu;
    DeviceBuffer<float> gx(x), gw(w), gdy(dy), gy(s.BT * s.OC), gdx(dx0), gdw(dw0);
    const cuda::UnitCalls before = cuda::gemm_unit_calls();
    ops::matmul_forward(gy.data(), gx.data(), gw.data(), s.BT, s.C, s.OC, GemmOperands::bf16);
    ops::matmul_backward(gdx.data(), gdw.data(), gdy.data(), gx.data(), gw.data(), s.BT, s.C, s.OC,
                         GemmOperands::bf16);
    expect_within_rounding(gy.host(), y, m.y, {}, "forward " + name);
    expect_within_rounding(gdx.host(), dx, m.dx, dx0, "dinp " + name);
    expect_within_rounding(gdw.host(), dw, m.dw, dw0, "dweight " + name);

    // Run to run: the same bits.
    const std::vector<float> first = gy.host();
    ops::matmul_forward(gy.data(), gx.data(), gw.data(), s.BT, s.C, s.OC, GemmOperands::bf16);
    test::expect_bitwise(gy.host(), first, "repeat " + name);
    // Four products (the backward's two, the forward twice), on the tensor cores from sm_80 on;
    // operands as stored go to CUDA cores.
    const cuda::UnitCalls bf16_calls = cuda::gemm_unit_calls();
    test::expect_unit_calls(before, bf16_calls, 4, test::gpu_major() >= 8, "bf16 " + name);
    ops::matmul_forward(gy.data(), gx.data(), gw.data(), s.BT, s.C, s.OC, GemmOperands::as_stored);
    test::expect_unit_calls(bf16_calls, cuda::gemm_unit_calls(), 1, false, "as stored " + name);
  }
}

// What data and tensor parallelism rely on: rows [r0, r1) of the input (a data rank's tokens)
// give those rows of the whole product, bit for bit; rows [o0, o1) of the weight (a tensor rank's
// output columns) give those columns; and the weight gradient of that slice is those rows of the
// whole weight gradient.
void expect_slices_have_the_whole_bits(int64_t BT, int64_t C, int64_t OC, int64_t r0, int64_t r1, int64_t o0,
                                       int64_t o1) {
  const auto x = bf16_values(size_t(BT * C), 6), w = bf16_values(size_t(OC * C), 7),
             dy = bf16_values(size_t(BT * OC), 8);
  OnGpu gpu;
  DeviceBuffer<float> gx(x), gw(w), gdy(dy), gy(BT * OC), gdw(OC * C);
  ops::matmul_forward(gy.data(), gx.data(), gw.data(), BT, C, OC, GemmOperands::bf16);
  ops::matmul_backward<float>(nullptr, gdw.data(), gdy.data(), gx.data(), nullptr, BT, C, OC, GemmOperands::bf16);
  const std::vector<float> y = gy.host(), dw = gdw.host();

  const std::vector<float> x_rows(x.begin() + r0 * C, x.begin() + r1 * C);
  DeviceBuffer<float> gx_rows(x_rows), gy_rows((r1 - r0) * OC);
  ops::matmul_forward(gy_rows.data(), gx_rows.data(), gw.data(), r1 - r0, C, OC, GemmOperands::bf16);
  test::expect_bitwise(gy_rows.host(), std::vector<float>(y.begin() + r0 * OC, y.begin() + r1 * OC), "rows of the input");

  const int64_t cols = o1 - o0;
  const std::vector<float> w_rows(w.begin() + o0 * C, w.begin() + o1 * C);
  std::vector<float> dy_cols(size_t(BT * cols)), y_cols(size_t(BT * cols));
  for (int64_t t = 0; t < BT; ++t)
    for (int64_t o = 0; o < cols; ++o) {
      dy_cols[size_t(t * cols + o)] = dy[size_t(t * OC + o0 + o)];
      y_cols[size_t(t * cols + o)] = y[size_t(t * OC + o0 + o)];
    }
  DeviceBuffer<float> gw_rows(w_rows), gy_cols(BT * cols), gdy_cols(dy_cols), gdw_rows(cols * C);
  ops::matmul_forward(gy_cols.data(), gx.data(), gw_rows.data(), BT, C, cols, GemmOperands::bf16);
  test::expect_bitwise(gy_cols.host(), y_cols, "output columns");
  ops::matmul_backward<float>(nullptr, gdw_rows.data(), gdy_cols.data(), gx.data(), nullptr, BT, C, cols,
                              GemmOperands::bf16);
  test::expect_bitwise(gdw_rows.host(), std::vector<float>(dw.begin() + o0 * C, dw.begin() + o1 * C),
                       "weight gradient of the output columns");
}

TEST(CudaMatmulBf16, SlicesHaveTheBitsOfTheWholeProduct) {
  LLAMA4D_REQUIRE_GPU();
  expect_slices_have_the_whole_bits(300, 520, 200, 77, 211, 40, 139);
}

// The weight gradient over K = 4,500 tokens: depth chunks of 2,048, 2,048 and 404, the same for
// the whole product and its slices (they depend on K alone).
TEST(CudaMatmulBf16, SlicesHaveTheBitsOfTheWholeProductWithDepthChunks) {
  LLAMA4D_REQUIRE_GPU();
  expect_slices_have_the_whole_bits(4500, 200, 130, 1000, 3333, 3, 70);
}

// A weight gradient of 8,192 x 8,192 (256 MiB of fp32 partial sums per depth chunk: the GEMM
// holds one at a time) runs its three chunks in two launches; a slice of 64 of its rows runs
// them in one. The bits must not tell the two apart.
TEST(CudaMatmulBf16, PartialSumsInSeveralLaunchesKeepTheBits) {
  LLAMA4D_REQUIRE_GPU();
  expect_slices_have_the_whole_bits(4200, 8192, 8192, 0, 8, 4000, 4064);
}

TEST(CudaMatmulBf16, PeakRateIsMeasured) {
  LLAMA4D_REQUIRE_GPU();
  OnGpu gpu;
  const double flops = ops::measure_peak_gemm_flops(1024, 0.05, GemmOperands::bf16);
  EXPECT_GT(flops, 1e9) << "an H100-class GPU does far more than a GFLOP/s";
  std::printf("cuda GEMM (bf16 operands, 1024^3, the three products): %.1f TFLOP/s\n", flops / 1e12);
}

}  // namespace matmul_bf16
}  // namespace
}  // namespace llama4d
