// A GEMM in the BLIS style (Van Zee & van de Geijn, "BLIS: A Framework for Rapidly
// Instantiating BLAS Functionality", 2015): the operands are cut into panels the micro-kernel
// reads with a fixed stride per k (read in place where the layout allows, else copied once),
// then every task of gemm_tiling.h runs the micro-kernel over its tile, K block by K block.
// The summation order per element is documented in gemm.h.
//
// The left operand is read in place in both of a matrix's layouts: the micro-kernel broadcasts
// its values one at a time, so it needs them neither adjacent across rows nor across k. Copying
// it would cost a pass over [M, K] at memory speed on the calling threads (measured on 2 cores
// for `small`'s [2048, 288] inputs: about 140 us of a 0.6 ms product on one thread, and more, not
// less, on two), which the products' arithmetic, split over the cores, does not hide.
#include "backends/cpu/gemm.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/gemm_kernel.h"
#include "backends/cpu/gemm_tiling.h"

namespace llama4d::cpu {
namespace {

// One stage of an in-register transpose of L vectors of L lanes (r[i] lane p: element (i, p)):
// pairs of vectors S apart swap their blocks of S lanes; stages S = L/2, ..., 1 leave r[p] lane
// i holding element (i, p). Indices into the pair's 2L lanes, a's first.
template <class Vec, int L, int S, size_t... P>
Vec low_blocks(Vec a, Vec b, std::index_sequence<P...>) {
  return __builtin_shufflevector(a, b, ((P & S) ? L + P - S : P)...);
}
template <class Vec, int L, int S, size_t... P>
Vec high_blocks(Vec a, Vec b, std::index_sequence<P...>) {
  return __builtin_shufflevector(a, b, ((P & S) ? L + P : P + S)...);
}
template <class Vec, int L, int S>
void transpose_stages(Vec* r) {
  for (int i = 0; i < L; ++i) {
    if (i & S) continue;
    const Vec a = r[i], b = r[i + S];
    r[i] = low_blocks<Vec, L, S>(a, b, std::make_index_sequence<L>{});
    r[i + S] = high_blocks<Vec, L, S>(a, b, std::make_index_sequence<L>{});
  }
  if constexpr (S > 1) transpose_stages<Vec, L, S / 2>(r);
}

// W rows (row_stride apart) x L consecutive k of a row-major operand into dst[L][W] (k-major), as
// W / L transposes of L x L blocks in registers; W a multiple of L, the vector's lanes.
template <class T, int W>
void pack_transposed(T* dst, const T* src, int64_t row_stride) {
  using Vec = typename Kernel<T>::Vec;
  constexpr int L = Kernel<T>::kLanes;
  for (int g = 0; g < W / L; ++g) {
    Vec r[L];
    for (int i = 0; i < L; ++i) std::memcpy(&r[i], src + (g * L + i) * row_stride, sizeof(Vec));
    if constexpr (L > 1) transpose_stages<Vec, L, L / 2>(r);
    for (int k = 0; k < L; ++k) std::memcpy(dst + k * W + g * L, &r[k], sizeof(Vec));
  }
}

// Copies rows [i0, i0 + W) x depth [0, K) of `v` into panel[K][W], k-major, so the kernel reads
// W consecutive values per k. Rows past n are zeros (they compute rows that are never stored).
template <class T, int W>
void pack_panel(T* panel, const GemmOperand<T>& v, int64_t i0, int64_t n, int64_t K) {
  const int64_t rows = std::min<int64_t>(W, n - i0);
  if (v.depth_stride == 1) {
    // Each row's k are adjacent (the forward's weight, [N, K]): copy a cache line of one row at a
    // time into the panel's columns. Walking k outermost instead read one value from each of W
    // rows per k, rows that are 4 KiB apart at K = 1,024 and so share one L1 set: 1.3 ms of a
    // 1024^3 product's 7 ms on 2 cores here, against 0.55 ms this way.
    // A whole panel's full runs are transposed in registers: a decode step packs each slice of a
    // weight as it reads it (stream_b), where the element by element copy cost more than the
    // product's arithmetic.
    constexpr int64_t kRun = 64 / int64_t(sizeof(T));
    constexpr int L = Kernel<T>::kLanes;
    for (int64_t k0 = 0; k0 < K; k0 += kRun) {
      const int64_t run = std::min(kRun, K - k0);
      T* dst = panel + k0 * W;
      if constexpr (W % L == 0) {
        if (rows == W && run == kRun) {
          for (int64_t k = 0; k < kRun; k += L) pack_transposed<T, W>(dst + k * W, v.data + i0 * v.row_stride + k0 + k, v.row_stride);
          continue;
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        const T* src = v.data + (i0 + r) * v.row_stride + k0;
        for (int64_t k = 0; k < run; ++k) dst[k * W + r] = src[k];
      }
      for (int64_t k = 0; k < run; ++k) std::fill(dst + k * W + rows, dst + (k + 1) * W, T(0));
    }
    return;
  }
  for (int64_t k = 0; k < K; ++k) {
    const T* src = v.data + k * v.depth_stride + i0 * v.row_stride;
    T* dst = panel + k * W;
    for (int64_t r = 0; r < rows; ++r) dst[r] = src[r * v.row_stride];
    for (int64_t r = rows; r < W; ++r) dst[r] = T(0);
  }
}

// Where the kernel reads one panel of an operand: element (i, k) at data[i * row_stride + k *
// depth_stride]. Either the W values of one k are adjacent (row_stride 1: a packed panel, or an
// operand whose rows are adjacent) or, for the left operand only, the K values of one row are
// (depth_stride 1: a row-major matrix in place). `pack_into` is where a packed panel is copied
// (null when read in place).
template <class T>
struct Panel {
  const T* data;
  int64_t row_stride, depth_stride;
  T* pack_into;
  int64_t first_row;
};

// Whether a whole panel of operand v is read in place: its rows are adjacent, or (rows_in_place,
// the left operand) each row's k are.
template <class T>
bool in_place(const GemmOperand<T>& v, bool rows_in_place) {
  return v.row_stride == 1 || (rows_in_place && v.depth_stride == 1);
}

// The panels of operand v that are packed: all ceil(n / W) of them, or only a partial last one
// (its missing rows are zeros, which an in-place read would take from past the matrix).
template <int W, class T>
int64_t packed_panels(const GemmOperand<T>& v, int64_t n, bool rows_in_place) {
  return in_place(v, rows_in_place) ? int64_t(n % W != 0) : (n + W - 1) / W;
}

// Appends the ceil(n / W) panels of operand v (n rows, depth K); packed ones take consecutive
// W x K pieces from `buffer` on.
template <class T, int W>
void plan_panels(std::vector<Panel<T>>& panels, const GemmOperand<T>& v, int64_t n, int64_t K, bool rows_in_place,
                 T*& buffer) {
  for (int64_t i0 = 0; i0 < n; i0 += W) {
    if (in_place(v, rows_in_place) && i0 + W <= n) {
      panels.push_back({v.data + i0 * v.row_stride, v.row_stride, v.depth_stride, nullptr, i0});
    } else {
      panels.push_back({buffer, 1, W, buffer, i0});
      buffer += W * K;
    }
  }
}

// The micro-kernel over a panel of `rows` rows: the whole register block, or for a last panel
// of at most 4 rows (a decode step's tokens) a block of 1 or 4, so rows that are never stored
// cost no arithmetic. Every element's sum is the same either way (gemm_kernel.h).
template <class T, bool kRowsApart>
void kernel_for_rows(int64_t kc, const T* a, int64_t a_stride, const T* b, int64_t b_stride, T* o, int64_t ldo,
                     int64_t rows, int64_t cols, bool store) {
  if (rows == 1) {
    micro_kernel<T, kRowsApart, 2, 1>(kc, a, a_stride, b, b_stride, o, ldo, rows, cols, store);
  } else if (rows <= 4) {
    micro_kernel<T, kRowsApart, 2, 4>(kc, a, a_stride, b, b_stride, o, ldo, rows, cols, store);
  } else {
    micro_kernel<T, kRowsApart>(kc, a, a_stride, b, b_stride, o, ldo, rows, cols, store);
  }
}

// One tile of out over depth [k_begin, k_end): kc blocks outermost, then a column panel (kept
// in L1), then the row panels of the tile (kept in L2). With `stream_b` the right operand's
// panels were not packed beforehand: each [kc, kCols] slice is packed here into this thread's
// buffer right before the row panels read it.
template <class T>
void run_tile(T* out, int64_t ldo, const Panel<T>* a_panels, const Panel<T>* b_panels, int64_t M, int64_t N,
              int64_t r0, int64_t nr, int64_t c0, int64_t nc, int64_t k_begin, int64_t k_end, bool overwrite,
              const GemmOperand<T>* stream_b) {
  using Ker = Kernel<T>;
  T* slice = stream_b ? scratch<T>(5, Ker::kCols * kGemmDepthBlock) : nullptr;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kGemmDepthBlock) {
    const int64_t kc = std::min(kGemmDepthBlock, k_end - k0);
    const bool store = overwrite && k0 == k_begin;
    for (int64_t j = c0; j < c0 + nc; j += Ker::kCols) {
      const Panel<T>& b = b_panels[j / Ker::kCols];
      const T* b_block = b.data + k0 * b.depth_stride;
      int64_t b_stride = b.depth_stride;
      if (stream_b) {
        const GemmOperand<T> from_k0{stream_b->data + k0 * stream_b->depth_stride, stream_b->row_stride,
                                     stream_b->depth_stride};
        pack_panel<T, Ker::kCols>(slice, from_k0, j, N, kc);
        b_block = slice, b_stride = Ker::kCols;
      }
      for (int64_t i = r0; i < r0 + nr; i += Ker::kRows) {
        const Panel<T>& a = a_panels[i / Ker::kRows];
        const T* a_block = a.data + k0 * a.depth_stride;
        T* o = out + i * ldo + j;
        const int64_t rows = std::min<int64_t>(Ker::kRows, M - i), cols = std::min<int64_t>(Ker::kCols, N - j);
        if (a.row_stride == 1) {
          kernel_for_rows<T, false>(kc, a_block, a.depth_stride, b_block, b_stride, o, ldo, rows, cols, store);
        } else {
          kernel_for_rows<T, true>(kc, a_block, a.row_stride, b_block, b_stride, o, ldo, rows, cols, store);
        }
      }
    }
  }
}

}  // namespace

template <class T>
void gemm(T* out, int64_t ldo, GemmOperand<T> a, GemmOperand<T> b_t, int64_t M, int64_t N, int64_t K,
          bool accumulate, bool split_depth, bool parallel) {
  using Ker = Kernel<T>;
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill(out + i * ldo, out + i * ldo + N, T(0));
    return;
  }
  // One row tile (a few rows: a decode step's tokens) reads each panel of b once per tile anyway:
  // then each task packs the slices it reads as it goes (stream_b) instead of all of b being
  // copied first, which for a [1, K] x [K, N] product wrote and read back the whole weight matrix.
  const GemmTiling tiling = gemm_tiling<T>(M, N, K, accumulate && split_depth);
  const bool stream_b = tiling.rows.count == 1 && !in_place(b_t, false);
  // Panels of kRows rows of a, then of kCols columns of b (rows of b_t).
  // The right operand's kCols values of one k are read as vectors: in place only where adjacent.
  const int64_t packed = (packed_panels<Ker::kRows>(a, M, true) * Ker::kRows +
                          (stream_b ? 0 : packed_panels<Ker::kCols>(b_t, N, false) * Ker::kCols)) * K;
  T* buffer = packed > 0 ? scratch<T>(6, packed) : nullptr;
  std::vector<Panel<T>> panels;
  plan_panels<T, Ker::kRows>(panels, a, M, K, true, buffer);
  if (stream_b) {
    for (int64_t j = 0; j < N; j += Ker::kCols) panels.push_back({nullptr, 1, Ker::kCols, nullptr, j});
  } else {
    plan_panels<T, Ker::kCols>(panels, b_t, N, K, false, buffer);
  }
  const int64_t a_count = (M + Ker::kRows - 1) / Ker::kRows;
  const Panel<T>* a_panels = panels.data();
  const Panel<T>* b_panels = panels.data() + a_count;
  // Only the packed panels are handed out: the in-place ones come first, so a static split of all
  // of them gave every packed panel of the right operand to the last thread.
  std::vector<int64_t> to_pack;
  for (int64_t p = 0; p < int64_t(panels.size()); ++p)
    if (panels[size_t(p)].pack_into != nullptr) to_pack.push_back(p);
  parallel_for(int64_t(to_pack.size()), parallel, [&](int64_t i) {
    const int64_t p = to_pack[size_t(i)];
    const Panel<T>& panel = panels[size_t(p)];
    if (p < a_count) {
      pack_panel<T, Ker::kRows>(panel.pack_into, a, panel.first_row, M, K);
    } else {
      pack_panel<T, Ker::kCols>(panel.pack_into, b_t, panel.first_row, N, K);
    }
  });
  // Tasks = (depth chunk, tile). Chunk 0 goes straight into out; chunks 1.. into partial
  // buffers [M, N] that are then added in chunk order.
  const Split &rows = tiling.rows, &cols = tiling.cols, &depth = tiling.depth;
  T* partial = depth.count > 1 ? scratch<T>(7, (depth.count - 1) * M * N) : nullptr;
  parallel_for_dynamic(tiling.tasks(), parallel, [&](int64_t t) {
    const int64_t chunk = t / tiling.tiles(), tile = t % tiling.tiles();
    const int64_t r = tile / cols.count, c = tile % cols.count;
    const int64_t k0 = depth.begin(chunk), k1 = k0 + depth.length(chunk);
    if (chunk == 0) {
      run_tile<T>(out, ldo, a_panels, b_panels, M, N, rows.begin(r), rows.length(r), cols.begin(c), cols.length(c),
                  k0, k1, !accumulate, stream_b ? &b_t : nullptr);
    } else {
      run_tile<T>(partial + (chunk - 1) * M * N, N, a_panels, b_panels, M, N, rows.begin(r), rows.length(r),
                  cols.begin(c), cols.length(c), k0, k1, true, stream_b ? &b_t : nullptr);
    }
  });
  if (depth.count > 1) {
    parallel_for(M, parallel, [&](int64_t i) {
      for (int64_t chunk = 1; chunk < depth.count; ++chunk) {
        const T* p = partial + (chunk - 1) * M * N + i * N;
        for (int64_t j = 0; j < N; ++j) out[i * ldo + j] += p[j];
      }
    });
  }
}

template void gemm<float>(float*, int64_t, GemmOperand<float>, GemmOperand<float>, int64_t, int64_t, int64_t, bool,
                          bool, bool);
template void gemm<double>(double*, int64_t, GemmOperand<double>, GemmOperand<double>, int64_t, int64_t, int64_t,
                           bool, bool, bool);

}  // namespace llama4d::cpu
