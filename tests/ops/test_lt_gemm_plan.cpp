// The CUDA backend's fast products as cuBLASLt sees them (backends/cuda/lt_gemm_plan.h), checked
// on the CPU: a stand-in executes a plan with cuBLASLt's documented semantics (column-major
// D = alpha op(A) op(B) + beta C, element (r, c) of a stored matrix at r + c * ld, ld >= rows)
// through the CPU backend's GEMM, refusing what cuBLASLt refuses and never reading past an
// operand. The plans of the linear layer's three products must give the CPU backend's
// matmul_forward and matmul_backward, and a plan of any strided product (leading dimensions
// larger than the matrix, as a slice of a wider tensor has) the product's definition.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cuda/lt_gemm_plan.h"
#include "core/ops.h"
#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

using cuda::LtGemmPlan;
using cuda::LtMatrix;
using cuda::LtOp;

// The stored matrix's checks cuBLASLt makes (rows, cols of op(X) as the plan's m, n, k say;
// ld >= rows), and that every element it names lies inside the `size` elements given.
void check_matrix(const LtMatrix& x, int64_t op_rows, int64_t op_cols, size_t size, const char* name) {
  const int64_t rows = x.op == LtOp::n ? op_rows : op_cols, cols = x.op == LtOp::n ? op_cols : op_rows;
  if (x.rows != rows || x.cols != cols)
    throw std::invalid_argument(std::string(name) + ": stored " + std::to_string(x.rows) + " x " +
                                std::to_string(x.cols) + " does not fit its op and the plan's m, n, k");
  if (x.ld < x.rows) throw std::invalid_argument(std::string(name) + ": ld below rows");
  if (size_t((x.rows - 1) + (x.cols - 1) * x.ld) >= size)
    throw std::invalid_argument(std::string(name) + ": the layout reaches past the buffer");
}

// cuBLASLt's matmul as its documentation defines it, on the CPU. `left`, `right`: the product's
// operands as gemm.cu passes them; the plan says which one is cuBLASLt's A.
void run_plan_on_cpu(const LtGemmPlan& p, const std::vector<float>& left, const std::vector<float>& right,
                     std::vector<float>& out) {
  const std::vector<float>& A = p.a_is_right ? right : left;
  const std::vector<float>& B = p.a_is_right ? left : right;
  check_matrix(p.a, p.m, p.k, A.size(), "A");
  check_matrix(p.b, p.k, p.n, B.size(), "B");
  check_matrix(p.c, p.m, p.n, out.size(), "C");
  if (p.c.op != LtOp::n) throw std::invalid_argument("C takes no op");
  // The CPU GEMM adds into out or overwrites it, no scaling: what the backend's plans ask.
  if (p.alpha != 1.0f || (p.beta != 0.0f && p.beta != 1.0f)) throw std::invalid_argument("alpha 1, beta 0 or 1");
  // D(r, c) at out[r + c * ldc] is row c, column r of a row-major out with rows ldc apart:
  //   out[c][r] = sum_k opB(k, c) opA(r, k)
  // so the CPU GEMM's left operand (i = c, k) is opB(k, c) and its transposed right one (j = r, k)
  // is opA(r, k).
  const cpu::GemmOperand<float> cpu_left =
      p.b.op == LtOp::n ? cpu::GemmOperand<float>{B.data(), p.b.ld, 1} : cpu::GemmOperand<float>{B.data(), 1, p.b.ld};
  const cpu::GemmOperand<float> cpu_right_t =
      p.a.op == LtOp::n ? cpu::GemmOperand<float>{A.data(), 1, p.a.ld} : cpu::GemmOperand<float>{A.data(), p.a.ld, 1};
  cpu::gemm<float>(out.data(), p.c.ld, cpu_left, cpu_right_t, p.n, p.m, p.k, p.beta == 1.0f, false, false);
}

std::vector<float> random_floats(size_t n, uint64_t seed) { return cast_to<float>(random_vector(n, seed)); }

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << what << " element " << i;
}

// Shapes with BT, C and OC all different, so a swapped dimension or operand cannot go unseen.
constexpr int64_t BT = 6, C = 5, OC = 3;

TEST(LtGemmPlan, ForwardIsTheCpuBackendsMatmulForward) {
  const auto inp = random_floats(BT * C, 1), weight = random_floats(OC * C, 2);
  std::vector<float> want(BT * OC), got(BT * OC, 7.0f);  // got's old values must be overwritten
  ops::matmul_forward(want.data(), inp.data(), weight.data(), BT, C, OC);
  run_plan_on_cpu(cuda::plan_lt_gemm(cuda::forward_layout(C), BT, OC, C, false), inp, weight, got);
  expect_close(got, want, "out");
}

TEST(LtGemmPlan, InputGradientIsTheCpuBackendsInBothWrites) {
  const auto dout = random_floats(BT * OC, 3), weight = random_floats(OC * C, 4), old = random_floats(BT * C, 5);
  for (const bool add : {false, true}) {
    std::vector<float> want = old, got = old;
    ops::matmul_backward(want.data(), static_cast<float*>(nullptr), dout.data(), static_cast<const float*>(nullptr),
                         weight.data(), BT, C, OC, ops::GemmOperands::as_stored,
                         add ? ops::GradWrite::add : ops::GradWrite::overwrite);
    run_plan_on_cpu(cuda::plan_lt_gemm(cuda::input_grad_layout(C, OC), BT, C, OC, add), dout, weight, got);
    expect_close(got, want, add ? "dinp (add)" : "dinp (overwrite)");
  }
}

TEST(LtGemmPlan, WeightGradientAccumulatesLikeTheCpuBackend) {
  const auto dout = random_floats(BT * OC, 6), inp = random_floats(BT * C, 7);
  std::vector<float> want = random_floats(OC * C, 8), got = want;
  ops::matmul_backward(static_cast<float*>(nullptr), want.data(), dout.data(), inp.data(),
                       static_cast<const float*>(nullptr), BT, C, OC);
  run_plan_on_cpu(cuda::plan_lt_gemm(cuda::weight_grad_layout(C, OC), OC, C, BT, true), dout, inp, got);
  expect_close(got, want, "dweight");
}

// Every pair of operand orientations, with strides wider than the matrices (each operand a
// slice of a larger tensor), against the product's definition in lt_gemm_plan.h.
TEST(LtGemmPlan, StridedOperandsOfEveryOrientation) {
  constexpr int64_t M = 4, N = 3, K = 5, pad = 2;
  for (const bool a_t : {false, true})
    for (const bool b_t : {false, true}) {
      const cuda::ProductLayout x{a_t ? 1 : K + pad, a_t ? M + pad : 1, b_t ? 1 : N + pad, b_t ? K + pad : 1};
      const size_t a_size = size_t((M - 1) * x.a_rows + (K - 1) * x.a_depth + 1);
      const size_t b_size = size_t((K - 1) * x.b_depth + (N - 1) * x.b_cols + 1);
      const auto a = random_floats(a_size, 10 + 2 * a_t + b_t), b = random_floats(b_size, 20 + 2 * a_t + b_t);
      for (const bool accumulate : {false, true}) {
        const auto old = random_floats(M * N, 30);
        std::vector<float> want = old, got = old;
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double sum = accumulate ? old[i * N + j] : 0.0;
            for (int64_t k = 0; k < K; ++k)
              sum += double(a[i * x.a_rows + k * x.a_depth]) * b[k * x.b_depth + j * x.b_cols];
            want[i * N + j] = float(sum);
          }
        run_plan_on_cpu(cuda::plan_lt_gemm(x, M, N, K, accumulate), a, b, got);
        expect_close(got, want, std::string("A") + (a_t ? "^T" : "") + " B" + (b_t ? "^T" : "") +
                                    (accumulate ? " +=" : " ="));
      }
    }
}

TEST(LtGemmPlan, RefusesWhatCublasLtCannotExpress) {
  EXPECT_THROW(cuda::plan_lt_gemm({3, 2, 1, 4}, 2, 2, 2, false), std::invalid_argument);  // A strided twice
  EXPECT_THROW(cuda::plan_lt_gemm({2, 1, 3, 4}, 2, 2, 2, false), std::invalid_argument);  // B strided twice
  EXPECT_THROW(cuda::plan_lt_gemm(cuda::forward_layout(2), 0, 2, 2, false), std::invalid_argument);
}

// The alignment promised to cuBLASLt is what the address has, never the default 256 bytes.
TEST(LtGemmPlan, AlignmentIsTheAddresssOwn) {
  EXPECT_EQ(cuda::lt_alignment(0x7f0000001000), 256u);
  EXPECT_EQ(cuda::lt_alignment(0x7f0000001100), 256u);
  EXPECT_EQ(cuda::lt_alignment(0x7f0000001080), 128u);
  EXPECT_EQ(cuda::lt_alignment(0x7f0000001010), 16u);
  EXPECT_EQ(cuda::lt_alignment(0x7f0000001004), 4u);  // a float at an odd index of a 16-byte aligned buffer
}

// The heuristic's cache keeps one choice per distinct descriptor set and preference: any field
// that differs gives another key.
TEST(LtGemmPlan, CacheKeysTellPlansApart) {
  const auto fwd = cuda::plan_lt_gemm(cuda::forward_layout(C), BT, OC, C, false);
  const auto dinp = cuda::plan_lt_gemm(cuda::input_grad_layout(C, OC), BT, C, OC, false);
  const auto dinp_add = cuda::plan_lt_gemm(cuda::input_grad_layout(C, OC), BT, C, OC, true);
  const auto fwd_again = cuda::plan_lt_gemm(cuda::forward_layout(C), BT, OC, C, false);
  EXPECT_EQ(cuda::lt_plan_key(fwd, 0, 256), cuda::lt_plan_key(fwd_again, 0, 256));
  EXPECT_NE(cuda::lt_plan_key(fwd, 0, 256), cuda::lt_plan_key(fwd, 1, 256));
  EXPECT_NE(cuda::lt_plan_key(fwd, 0, 256), cuda::lt_plan_key(fwd, 0, 4));
  EXPECT_NE(cuda::lt_plan_key(dinp, 0, 256), cuda::lt_plan_key(dinp_add, 0, 256));
  EXPECT_NE(cuda::lt_plan_key(fwd, 0, 256), cuda::lt_plan_key(dinp, 0, 256));
}

}  // namespace
}  // namespace llama4d::test
