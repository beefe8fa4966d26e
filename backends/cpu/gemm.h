#pragma once
// The CPU backend's GEMM: out[M, N] (+)= a[M, K] * b[K, N] on strided operands, threaded over
// the tasks of gemm_tiling.h. Private to backends/cpu (matmul.cpp is its caller).
//
// Each element of out is summed in one fixed order: K in blocks of kGemmDepthBlock, each block
// accumulated from zero in a register (one multiply-add per k, k ascending: fused where the
// compiler contracts it, as the release build does for FMA hardware; the sanitizer builds at -O1
// round the product first) and then added to out (or stored, for the first block when out is
// overwritten). Nothing else (tile, thread count, position of the element in its tile, M, N)
// changes a bit.
#include <cstdint>

namespace llama4d::cpu {

// Element (i, k) of an operand at data[i * row_stride + k * depth_stride]: any transpose of a
// row-major matrix without a copy.
template <class T>
struct GemmOperand {
  const T* data;
  int64_t row_stride, depth_stride;
};

inline constexpr int64_t kGemmDepthBlock = 256;

// out[M, N] (row-major, rows ldo apart) = or += a[M, K] * b[K, N], with `b_t` viewing b's
// transpose (element (j, k) = b[k, j]). With `split_depth` (accumulate only), K may be cut into
// depth chunks added in chunk order (gemm_tiling.h). `parallel`: use the thread team.
template <class T>
void gemm(T* out, int64_t ldo, GemmOperand<T> a, GemmOperand<T> b_t, int64_t M, int64_t N, int64_t K,
          bool accumulate, bool split_depth, bool parallel);

}  // namespace llama4d::cpu
