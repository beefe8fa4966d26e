#pragma once
// How one product of the CUDA backend becomes a cuBLASLt matmul (the fast kernels, --kernels
// fast): plain C++ with no CUDA header, so the CPU tests check it (tests/ops/test_lt_gemm_plan.cpp
// runs a plan with the CPU backend's GEMM and holds it to the CPU backend's linear layer), and
// lt_gemm.cu copies its fields into cuBLASLt's descriptors one for one.
//
// The product is the one gemm.cu's exact kernel takes: out[M, N] (row-major) = or += A[M, K] B[K, N]
// with element (i, k) of A at a[i * a_rows + k * a_depth] and element (k, j) of B at
// b[k * b_depth + j * b_cols] (one of each pair of strides is 1: a row-major matrix or its
// transpose). cuBLASLt is column-major: it computes D[m, n] = alpha op(A)[m, k] op(B)[k, n] + beta C,
// where a stored matrix of `rows` x `cols` has element (r, c) at r + c * ld. A row-major out[M, N]
// is the column-major out^T[N, M], and out^T = B^T A^T, so cuBLASLt's A is our right operand and
// its B our left one (the operand swap), with m = N, n = M, k = K, ldc = N.
#include <cstdint>
#include <stdexcept>
#include <string>

namespace llama4d::cuda {

enum class LtOp { n, t };  // CUBLAS_OP_N, CUBLAS_OP_T

// One column-major matrix as cuBLASLt's layout describes it (CUBLASLT_MATRIX_LAYOUT_ROWS/COLS/LD)
// and the op applied to it (CUBLASLT_MATMUL_DESC_TRANSA/TRANSB).
struct LtMatrix {
  LtOp op;
  int64_t rows, cols, ld;
};

struct LtGemmPlan {
  int64_t m, n, k;
  LtMatrix a, b, c;     // c is also D: written in place
  bool a_is_right;      // cuBLASLt's A is the product's right operand (always, by the swap)
  float alpha, beta;    // 1, and 1 to accumulate into out or 0 to overwrite it
};

// The product's operand strides, as gemm.cu's Operands holds them (without the pointers).
struct ProductLayout {
  int64_t a_rows, a_depth;
  int64_t b_depth, b_cols;
};

// The linear layer's three products (core/ops.h's matmul_forward and matmul_backward), which
// gemm.cu runs with either kernel:
//   forward      out[BT, OC] = inp[BT, C] weight[OC, C]^T   (M = BT, N = OC, K = C)
//   input grad   dinp[BT, C] = dout[BT, OC] weight[OC, C]   (M = BT, N = C, K = OC)
//   weight grad  dweight[OC, C] += dout[BT, OC]^T inp[BT, C] (M = OC, N = C, K = BT)
inline ProductLayout forward_layout(int64_t C) { return {C, 1, 1, C}; }
inline ProductLayout input_grad_layout(int64_t C, int64_t OC) { return {OC, 1, C, 1}; }
inline ProductLayout weight_grad_layout(int64_t C, int64_t OC) { return {1, OC, C, 1}; }

inline LtGemmPlan plan_lt_gemm(const ProductLayout& x, int64_t M, int64_t N, int64_t K, bool accumulate) {
  if (M <= 0 || N <= 0 || K <= 0) throw std::invalid_argument("plan_lt_gemm: M, N, K must be > 0");
  LtGemmPlan p{};
  p.m = N;
  p.n = M;
  p.k = K;
  p.a_is_right = true;
  // cuBLASLt's A is op(A)[m = N, k = K] with element (j, k) = B(k, j) = b[j * b_cols + k * b_depth].
  // Contiguous along j (b_cols == 1): stored N x K with ld b_depth, no op. Contiguous along k
  // (b_depth == 1): stored K x N with ld b_cols, transposed.
  if (x.b_cols == 1)
    p.a = {LtOp::n, N, K, x.b_depth};
  else if (x.b_depth == 1)
    p.a = {LtOp::t, K, N, x.b_cols};
  else
    throw std::invalid_argument("plan_lt_gemm: the right operand is strided along both dimensions");
  // cuBLASLt's B is op(B)[k = K, n = M] with element (k, i) = A(i, k) = a[k * a_depth + i * a_rows].
  if (x.a_depth == 1)
    p.b = {LtOp::n, K, M, x.a_rows};
  else if (x.a_rows == 1)
    p.b = {LtOp::t, M, K, x.a_depth};
  else
    throw std::invalid_argument("plan_lt_gemm: the left operand is strided along both dimensions");
  p.c = {LtOp::n, N, M, N};
  p.alpha = 1.0f;
  p.beta = accumulate ? 1.0f : 0.0f;
  return p;
}

// The alignment in bytes lt_gemm.cu promises cuBLASLt for a buffer at `address`
// (CUDA's CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, whose default of 256 lets the heuristic pick
// an algorithm that needs 256-byte aligned operands): the largest power of two dividing the
// address, at most 256. A weight in the flat parameter buffer, or a rank's slice, may start at any
// element, so the promise is made per call from the pointers, never assumed.
inline uint32_t lt_alignment(uintptr_t address) {
  uint32_t a = 256;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// The key of lt_gemm.cu's cache of heuristic choices: everything the plan and the preference give
// cuBLASLt (`compute`: the compute type; `alignment`: the smallest of the operands' lt_alignment).
inline std::string lt_plan_key(const LtGemmPlan& p, int compute, uint32_t alignment) {
  auto matrix = [](const LtMatrix& x) {
    return std::string(x.op == LtOp::t ? "T" : "N") + std::to_string(x.rows) + "x" + std::to_string(x.cols) + "/" +
           std::to_string(x.ld);
  };
  return std::to_string(compute) + ":" + std::to_string(p.m) + "," + std::to_string(p.n) + "," + std::to_string(p.k) +
         ":" + matrix(p.a) + ":" + matrix(p.b) + ":" + matrix(p.c) + ":" + (p.beta != 0 ? "acc" : "set") + ":" +
         std::to_string(alignment);
}

}  // namespace llama4d::cuda
