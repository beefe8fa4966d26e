// padded_product (backends/cpu/gemm_kernel.h), the single-threaded product attention's blocks
// run: every element summed in gemm.h's documented order (written out below), bit for bit the
// GEMM's, on every shape and layout it is given, and never storing a product of its padding.
// The padding is NaN here, so a padded row or column that reached the output would show.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_kernel.h"
#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// out (+)= a b in gemm.h's order: K in blocks of 256, each summed from zero with one multiply-add
// per k, k ascending, then stored (the first block when out is overwritten) or added. `fused`:
// the multiply-add rounds once (std::fma), else the product is rounded first (through a volatile,
// so the compiler cannot contract it), as the sanitizer builds compile the kernel.
template <class T>
std::vector<T> documented_order(std::vector<T> out, int64_t ldo, const std::vector<T>& a, const std::vector<T>& b,
                                int64_t M, int64_t N, int64_t K, bool accumulate, bool fused) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k0 = 0; k0 < K; k0 += cpu::kGemmDepthBlock) {
        T block = 0;
        for (int64_t k = k0; k < std::min(K, k0 + cpu::kGemmDepthBlock); ++k) {
          if (fused) {
            block = std::fma(a[i * K + k], b[k * N + j], block);
          } else {
            const volatile T product = a[i * K + k] * b[k * N + j];
            block = block + product;
          }
        }
        T& o = out[i * ldo + j];
        o = (k0 == 0 && !accumulate) ? block : o + block;
      }
  return out;
}

template <class T>
void expect_gemm_bits(int64_t M, int64_t N, int64_t K, bool rows_adjacent, bool accumulate) {
  using Ker = cpu::Kernel<T>;
  const std::string what = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                           (rows_adjacent ? " rows adjacent" : " k adjacent") + (accumulate ? " +=" : " =");
  const T nan = std::numeric_limits<T>::quiet_NaN();
  // a: M rows padded to whole register blocks; b: N columns padded to whole vectors.
  const int64_t Mp = round_up(M, Ker::kRows), ldb = round_up(N, Ker::kLanes);
  const int64_t a_rows = rows_adjacent ? 1 : K, a_depth = rows_adjacent ? Mp : 1;
  std::vector<T> a(Mp * K, nan), b(K * ldb, nan);
  const auto a_values = cast_to<T>(random_vector(M * K, 31)), b_values = cast_to<T>(random_vector(K * N, 32));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) a[i * a_rows + k * a_depth] = a_values[i * K + k];
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < N; ++j) b[k * ldb + j] = b_values[k * N + j];
  // The output has a margin right of every row that must stay untouched.
  const int64_t ldo = N + 3;
  const auto start = cast_to<T>(random_vector(M * ldo, 33));
  std::vector<T> got = start, gemm = start;
  cpu::padded_product(got.data(), ldo, a.data(), a_rows, a_depth, b.data(), ldb, M, N, K, accumulate);
  const auto fused = documented_order(start, ldo, a_values, b_values, M, N, K, accumulate, true);
  const auto unfused = documented_order(start, ldo, a_values, b_values, M, N, K, accumulate, false);
  EXPECT_TRUE(bitwise_equal(got, fused) || bitwise_equal(got, unfused)) << what << ": not in the documented order";
  // The GEMM on the same values, in place (its own packing where it needs any).
  const cpu::GemmOperand<T> a_view{a.data(), a_rows, a_depth}, b_t_view{b.data(), 1, ldb};
  cpu::gemm(gemm.data(), ldo, a_view, b_t_view, M, N, K, accumulate, false, false);
  EXPECT_TRUE(bitwise_equal(got, gemm)) << what << ": not the GEMM's bits";
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = N; j < ldo; ++j) ASSERT_EQ(got[i * ldo + j], start[i * ldo + j]) << what << ": margin written";
}

template <class T>
void expect_gemm_bits_on_every_layout() {
  using Ker = cpu::Kernel<T>;
  const int64_t lanes = Ker::kLanes;
  // Rows: a partial register block, and exactly one. Columns: a last panel of less than one
  // vector (the one-vector kernel), of more than one (two vectors, partly padding), and whole
  // panels. Depth: one partial depth block, and three (the third partial). Lanes are 2 to 16
  // (the sanitizer builds target plain x86-64).
  for (int64_t M : {int64_t(29), int64_t(Ker::kRows)})
    for (int64_t N : {lanes - 1, 2 * lanes + 1, lanes + 1, 4 * lanes})
      for (int64_t K : {int64_t(7), int64_t(600)})
        for (bool rows_adjacent : {false, true})
          for (bool accumulate : {false, true}) expect_gemm_bits<T>(M, N, K, rows_adjacent, accumulate);
}

TEST(GemmKernel, PaddedProductHasTheGemmsBitsFloat) { expect_gemm_bits_on_every_layout<float>(); }

TEST(GemmKernel, PaddedProductHasTheGemmsBitsDouble) { expect_gemm_bits_on_every_layout<double>(); }

}  // namespace
}  // namespace llama4d::test
