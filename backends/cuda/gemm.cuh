#pragma once
// What the CUDA backend's two GEMMs share (gemm.cu: fp32 and f64 on CUDA cores, and the
// dispatch; gemm_bf16.cu: bf16 operands on tensor cores): the strided view of their operands.
#include <cstdint>

namespace llama4d::cuda {

// Element (i, k) of the left operand at a[i * a_rows + k * a_depth]; element (k, j) of the right
// one at b[k * b_depth + j * b_cols]: every transpose the linear layer needs, without copies.
template <class T>
struct Operands {
  const T* a;
  int64_t a_rows, a_depth;
  const T* b;
  int64_t b_depth, b_cols;
};

// Queues out[M, N] (row-major) = or += A[M, K] * B[K, N] on the tensor cores, for operands that
// hold bf16 values (GemmOperands::bf16). M, N, K > 0; gemm.cu checks and waits. split_depth: the
// weight gradient's depth chunks (a long K into a small output, gemm_bf16.cu).
void launch_gemm_bf16(float* out, const Operands<float>& x, int64_t M, int64_t N, int64_t K, bool accumulate,
                      bool split_depth);

}  // namespace llama4d::cuda
