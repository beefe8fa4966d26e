// Token embedding lookup and its scatter-add backward on the GPU, for the whole table and for the
// slice of rows one rank holds under vocabulary parallelism (backends/cpu/embedding.cpp).
//
// The forward copies: one thread per output element in a grid-stride loop. The backward adds
// rows sharing a token, which must happen in row order for reproducible bits: the block of the
// first row with a given id finds the rows with that id, 256 at a time and in row order, and its
// threads, one per column, add dout[t, c] into their columns of the id's table row. No two
// threads touch the same element (no atomics), and neighbouring threads read and write
// neighbouring columns (coalesced). The results are the CPU's bits: a copy, and the same additions
// in the same order. (A thread per column walking all BT rows runs 768 threads on the 124M
// benchmark: 5.8 ms of its 390 ms H200 step. Here each block reads up to BT ids to learn whether
// it comes first and which rows follow: 64 KB there, from L1 and L2.)
//
// Token ids are not validated, as on the CPU (ops.h requires ids in [0, V) for the whole-table
// forward); the backward and the row variants skip ids outside their range. A negative id, an
// out-of-bounds read on the CPU, gives a zero row here rather than a fault.
#include <limits>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace llama4d::cuda {
namespace {

// out[BT, C] row i = wte_rows[tokens[i] - row_begin] when that is in [0, rows), zeros otherwise.
// The whole-table forward is row_begin = 0, rows = the maximum: every (valid) id is in range.
// Zeros are written, not skipped: the forward overwrites, and the all-reduce over the ranks then
// adds exactly one nonzero per row.
template <class T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte_rows, int64_t n, int64_t C,
                                         int64_t row_begin, int64_t rows) {
  for (int64_t i = first_index(); i < n; i += index_stride()) {
    const int64_t r = i / C, c = i % C;
    const int64_t local = static_cast<int64_t>(tokens[r]) - row_begin;
    out[i] = local >= 0 && local < rows ? wte_rows[local * C + c] : T(0);
  }
}

// dwte_rows[rows, C] += dout[BT, C] rows scattered by token, skipping ids outside
// [row_begin, row_begin + rows) (see the header). Block b takes dout row b when b is the first
// row with its id: it then adds that row and every later one with the same id, in row order, into
// the id's table row, kThreads rows of ids at a time. kThreads threads a block.
template <class T>
__global__ void __launch_bounds__(kThreads)
    embedding_backward_kernel(T* dwte_rows, const T* dout, const int32_t* tokens, int64_t BT, int64_t C,
                              int64_t row_begin, int64_t rows) {
  constexpr int kWarps = kThreads / 32, kColumnsPerThread = 8;
  __shared__ int32_t hits[kThreads];  // the rows of one piece with the block's id, ascending
  __shared__ int warp_hits[kWarps];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  for (int64_t first = blockIdx.x; first < BT; first += gridDim.x) {
    const int32_t id = tokens[first];
    const int64_t local = static_cast<int64_t>(id) - row_begin;
    if (local < 0 || local >= rows) continue;  // the same for every thread of the block
    bool earlier = false;                      // an earlier row has this id: that row's block adds it
    for (int64_t t0 = 0; t0 < first && !earlier; t0 += kThreads) {
      const int64_t t = t0 + threadIdx.x;
      earlier = __syncthreads_or(t < first && tokens[t] == id) != 0;
    }
    if (earlier) continue;
    T* row = dwte_rows + local * C;
    // The row's columns kThreads * kColumnsPerThread at a time, each thread's in registers from
    // the old value through every hit: a frequent id (a space in byte-level text: thousands of
    // rows) then costs loads of dout, not a round trip to memory per row and column.
    for (int64_t c0 = 0; c0 < C; c0 += kThreads * kColumnsPerThread) {
      T sum[kColumnsPerThread];
#pragma unroll
      for (int u = 0; u < kColumnsPerThread; ++u) {
        const int64_t c = c0 + threadIdx.x + u * kThreads;
        sum[u] = c < C ? row[c] : T(0);
      }
      for (int64_t t0 = first; t0 < BT; t0 += kThreads) {
        const int64_t t = t0 + threadIdx.x;
        const bool hit = t < BT && tokens[t] == id;
        const unsigned ballot = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) warp_hits[warp] = __popc(ballot);
        __syncthreads();
        int before = 0, count = 0;  // hits in earlier warps, and in all
        for (int w = 0; w < kWarps; ++w) {
          before += w < warp ? warp_hits[w] : 0;
          count += warp_hits[w];
        }
        if (hit) hits[before + __popc(ballot & ((1u << lane) - 1u))] = int32_t(t);
        __syncthreads();
#pragma unroll 4
        for (int h = 0; h < count; ++h) {
          const T* d = dout + int64_t(hits[h]) * C;
#pragma unroll
          for (int u = 0; u < kColumnsPerThread; ++u) {
            const int64_t c = c0 + threadIdx.x + u * kThreads;
            if (c < C) sum[u] += d[c];
          }
        }
        __syncthreads();  // hits and warp_hits are written again for the next piece
      }
#pragma unroll
      for (int u = 0; u < kColumnsPerThread; ++u) {
        const int64_t c = c0 + threadIdx.x + u * kThreads;
        if (c < C) row[c] = sum[u];
      }
    }
  }
}

}  // namespace

template <class T>
void embedding_forward_rows(T* out, const int32_t* tokens, const T* wte_rows, int64_t BT, int64_t C,
                            int64_t row_begin, int64_t rows) {
  const int64_t n = BT * C;
  if (n <= 0) return;
  embedding_forward_kernel<<<grid_for(n), kThreads, 0, stream()>>>(out, tokens, wte_rows, n, C, row_begin, rows);
  finish_op("embedding_forward_rows");
}

template <class T>
void embedding_backward_rows(T* dwte_rows, const T* dout, const int32_t* tokens, int64_t BT, int64_t C,
                             int64_t row_begin, int64_t rows) {
  if (BT <= 0 || C <= 0) return;
  embedding_backward_kernel<<<row_grid(BT), kThreads, 0, stream()>>>(dwte_rows, dout, tokens, BT, C, row_begin, rows);
  finish_op("embedding_backward_rows");
}

template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, int64_t BT, int64_t C) {
  const int64_t n = BT * C;
  if (n <= 0) return;
  embedding_forward_kernel<<<grid_for(n), kThreads, 0, stream()>>>(out, tokens, wte, n, C, 0,
                                                                   std::numeric_limits<int64_t>::max());
  finish_op("embedding_forward");
}

// As the CPU: the whole table is the row range [0, max), so ids < 0 are skipped.
template <class T>
void embedding_backward(T* dwte, const T* dout, const int32_t* tokens, int64_t BT, int64_t C) {
  if (BT <= 0 || C <= 0) return;
  embedding_backward_kernel<<<row_grid(BT), kThreads, 0, stream()>>>(dwte, dout, tokens, BT, C, 0,
                                                                      std::numeric_limits<int64_t>::max());
  finish_op("embedding_backward");
}

#define LLAMA4D_INSTANTIATE(T)                                                                                    \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t);                             \
  template void embedding_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t);                            \
  template void embedding_forward_rows<T>(T*, const int32_t*, const T*, int64_t, int64_t, int64_t, int64_t);      \
  template void embedding_backward_rows<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t);
LLAMA4D_INSTANTIATE(float)
LLAMA4D_INSTANTIATE(double)
#undef LLAMA4D_INSTANTIATE

}  // namespace llama4d::cuda
