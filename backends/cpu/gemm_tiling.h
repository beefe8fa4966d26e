#pragma once
// How a GEMM is cut into independent tasks: from its shape alone, never from the thread count.
//
// out[M, N] (+)= sum over K of a[M, K] * b[K, N] (gemm.h) is cut into
// - output tiles: a split of the rows and a split of the columns, in whole micro-tiles (the
//   register block the kernel computes at once); each tile is one task over the whole of K, and
// - for the weight gradient only (K = tokens, a long sum into a small output), depth chunks: K
//   cut into consecutive ranges whose partial products are added in chunk order afterwards.
// Tiles shrink from 256 x 256 until there are kTargetTasks of them (or they reach 32 x 32), so
// a 16-core machine has four tasks per thread on `small`'s shapes (M = 2,048 tokens, N and K
// from 96 to 768) while a large product keeps tiles big enough to reuse what sits in cache.
// Tile boundaries never change a bit of the result (every element is summed in the kernel's
// fixed K order); depth chunks do, and they depend on (M, N, K) and the build's vector width
// only.
#include <algorithm>
#include <cstdint>

namespace llama4d::cpu {

// The micro-kernel's register block (gemm.cpp): kRows x 2 vectors of out. Sized to the vector
// registers the build targets: 32 of 64 bytes with AVX-512 (24 accumulators), 16 of 32 bytes
// with AVX (12), else 16 of 16 bytes (8).
#if defined(__AVX512F__)
inline constexpr int kGemmVectorBytes = 64, kGemmKernelRows = 12;
#elif defined(__AVX__)
inline constexpr int kGemmVectorBytes = 32, kGemmKernelRows = 6;
#else
inline constexpr int kGemmVectorBytes = 16, kGemmKernelRows = 4;
#endif
template <class T>
inline constexpr int64_t kGemmKernelCols = 2 * kGemmVectorBytes / int64_t(sizeof(T));

// A split of [0, n) into equal parts of at most about `tile`, each a multiple of `granule`
// (the last one shorter). Depends on its arguments only.
struct Split {
  Split(int64_t n, int64_t tile, int64_t granule, int64_t max_parts = INT64_MAX) : n(n) {
    const int64_t parts = std::clamp<int64_t>((n + tile - 1) / tile, 1, max_parts);
    size = std::max<int64_t>(granule, ((n + parts - 1) / parts + granule - 1) / granule * granule);
    count = n == 0 ? 0 : (n + size - 1) / size;
  }
  int64_t begin(int64_t i) const { return i * size; }
  int64_t length(int64_t i) const { return std::min(size, n - i * size); }
  int64_t n, size, count;
};

// Four tasks per thread on 16 threads: dynamic scheduling then evens out the tiles at the edges
// and a thread that is late (a busy machine).
inline constexpr int64_t kTargetTasks = 64;
inline constexpr int64_t kLargestTile = 256, kSmallestTile = 32;
// Depth chunks are at least this long (shorter ones would spend more on the partial sums than
// they save), at most this many, and only while the partial buffers stay small.
inline constexpr int64_t kSmallestDepthChunk = 256, kMaxDepthChunks = 8;
inline constexpr int64_t kMaxPartialElements = int64_t(1) << 22;

struct GemmTiling {
  Split rows, cols, depth;
  int64_t tiles() const { return rows.count * cols.count; }
  int64_t tasks() const { return tiles() * depth.count; }
};

// Tiling of out[M, N] over K for elements of type T; `split_depth` allows depth chunks.
template <class T>
GemmTiling gemm_tiling(int64_t M, int64_t N, int64_t K, bool split_depth) {
  const int64_t row_granule = kGemmKernelRows, col_granule = kGemmKernelCols<T>;
  int64_t tile_rows = kLargestTile, tile_cols = kLargestTile;
  auto tiles = [&] { return Split(M, tile_rows, row_granule).count * Split(N, tile_cols, col_granule).count; };
  // Halve the longer side (rows first on a tie: a row-major output keeps its long rows).
  while (tiles() < kTargetTasks && (tile_rows > kSmallestTile || tile_cols > kSmallestTile)) {
    if (tile_cols <= kSmallestTile || (tile_rows >= tile_cols && tile_rows > kSmallestTile)) {
      tile_rows /= 2;
    } else {
      tile_cols /= 2;
    }
  }
  int64_t chunks = 1;
  if (split_depth && M * N <= kMaxPartialElements) {
    const int64_t wanted = (kTargetTasks + tiles() - 1) / tiles();
    chunks = std::clamp<int64_t>(std::min(wanted, K / kSmallestDepthChunk), 1, kMaxDepthChunks);
  }
  const int64_t chunk = std::max<int64_t>(1, (K + chunks - 1) / chunks);
  return {Split(M, tile_rows, row_granule), Split(N, tile_cols, col_granule), Split(K, chunk, 16, chunks)};
}

}  // namespace llama4d::cpu
