#pragma once
// The register-blocked micro-kernel of the CPU backend's GEMM (gemm.cpp), and a single-threaded
// product over operands the caller has laid out and padded for it (attention.cpp's blocks).
//
// Every element is summed as gemm.h documents: K in blocks of kGemmDepthBlock, each block from
// zero in a register, one multiply-add per k, k ascending, then stored (the first block, when
// out is overwritten) or added to the element. A product of one or two vectors of columns adds
// the same values in the same order, so neither the kernel's width nor a tile's position
// changes a bit.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_tiling.h"

namespace llama4d::cpu {

template <class T>
struct Kernel {
  typedef T Vec __attribute__((vector_size(kGemmVectorBytes)));
  static constexpr int kLanes = kGemmVectorBytes / int(sizeof(T));
  static constexpr int kRows = kGemmKernelRows, kCols = 2 * kLanes;
};

// out[rows, cols] (rows <= kR, cols <= kVecs * kLanes) = or += the block of a_panel * b_panel
// over kc steps, kR x kVecs vectors of accumulators held in registers for the whole loop.
// b_panel's consecutive k are b_stride apart, each k's kVecs * kLanes values adjacent. a_panel's
// k are a_stride apart with its rows adjacent, or (kRowsApart) its rows a_stride apart with its k
// adjacent. The kernel reads all kR rows and kVecs * kLanes columns whatever rows and cols
// are: the caller makes them readable (packed zeros, padding). kR below kRows serves a last
// panel of few rows (a decode step's one token) without the arithmetic of rows never stored;
// each element's sum is the same whatever kR is.
template <class T, bool kRowsApart, int kVecs = 2, int kR = Kernel<T>::kRows>
[[gnu::always_inline]] inline void micro_kernel(int64_t kc, const T* __restrict a_panel, int64_t a_stride,
                                                const T* __restrict b_panel, int64_t b_stride, T* out, int64_t ldo,
                                                int64_t rows, int64_t cols, bool overwrite) {
  using K = Kernel<T>;
  using Vec = typename K::Vec;
  static_assert(kVecs == 1 || kVecs == 2, "one or two vectors of columns");
  static_assert(kR >= 1 && kR <= K::kRows, "at most the register block's rows");
  Vec acc[kR][kVecs];
  for (int i = 0; i < kR; ++i)
    for (int v = 0; v < kVecs; ++v) acc[i][v] = Vec{};
  for (int64_t k = 0; k < kc; ++k) {
    Vec b[kVecs];
    for (int v = 0; v < kVecs; ++v) std::memcpy(&b[v], b_panel + k * b_stride + v * K::kLanes, sizeof(Vec));
#pragma GCC unroll 16
    for (int i = 0; i < kR; ++i) {
      const T a = kRowsApart ? a_panel[i * a_stride + k] : a_panel[k * a_stride + i];
      for (int v = 0; v < kVecs; ++v) acc[i][v] += a * b[v];
    }
  }
  // Whole vectors of a row are stored as vectors, the rest of an edge row element by element:
  // the same sums either way.
  const int64_t whole = cols / K::kLanes;
#pragma GCC unroll 16
  for (int i = 0; i < kR; ++i) {
    if (i >= rows) break;
    T* o = out + i * ldo;
    for (int v = 0; v < whole; ++v) {
      Vec sum = acc[i][v];
      if (!overwrite) {
        Vec c;
        std::memcpy(&c, o + v * K::kLanes, sizeof(Vec));
        sum = c + sum;
      }
      std::memcpy(o + v * K::kLanes, &sum, sizeof(Vec));
    }
    for (int64_t j = whole * K::kLanes; j < cols; ++j) {
      const T v = acc[i][j / K::kLanes][j % K::kLanes];
      o[j] = overwrite ? v : o[j] + v;
    }
  }
}

// out[M, N] (row-major, rows ldo apart) = or (accumulate) += a[M, K] * b[K, N] on the calling
// thread, for operands already where the kernel reads them: a(i, k) at a[i * a_rows + k *
// a_depth], where a_depth == 1 (each row's k adjacent) or a_rows == 1 (each k's rows adjacent);
// b(k, j) at b[k * ldb + j]. Rows of a up to M rounded up to kRows and columns of b up to N
// rounded up to kLanes must be readable (their products are computed and never stored). A last
// column panel of at most kLanes runs the one-vector kernel, so a head of 48 floats costs 48
// columns, not 64. K > 0.
template <class T>
void padded_product(T* out, int64_t ldo, const T* a, int64_t a_rows, int64_t a_depth, const T* b, int64_t ldb,
                    int64_t M, int64_t N, int64_t K, bool accumulate) {
  using Ker = Kernel<T>;
  for (int64_t k0 = 0; k0 < K; k0 += kGemmDepthBlock) {
    const int64_t kc = std::min(kGemmDepthBlock, K - k0);
    const bool store = !accumulate && k0 == 0;
    for (int64_t j = 0; j < N; j += Ker::kCols) {
      const int64_t cols = std::min<int64_t>(Ker::kCols, N - j);
      const T* b_block = b + k0 * ldb + j;
      for (int64_t i = 0; i < M; i += Ker::kRows) {
        const int64_t rows = std::min<int64_t>(Ker::kRows, M - i);
        const T* a_block = a + i * a_rows + k0 * a_depth;
        T* o = out + i * ldo + j;
        if (a_depth == 1) {
          if (cols > Ker::kLanes) {
            micro_kernel<T, true, 2>(kc, a_block, a_rows, b_block, ldb, o, ldo, rows, cols, store);
          } else {
            micro_kernel<T, true, 1>(kc, a_block, a_rows, b_block, ldb, o, ldo, rows, cols, store);
          }
        } else if (cols > Ker::kLanes) {
          micro_kernel<T, false, 2>(kc, a_block, a_depth, b_block, ldb, o, ldo, rows, cols, store);
        } else {
          micro_kernel<T, false, 1>(kc, a_block, a_depth, b_block, ldb, o, ldo, rows, cols, store);
        }
      }
    }
  }
}

}  // namespace llama4d::cpu
