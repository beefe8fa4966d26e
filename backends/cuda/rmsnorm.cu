// RMSNorm (Zhang & Sennrich 2019) on the GPU, as backends/cpu/rmsnorm.cpp computes it: no mean
// subtraction, no bias, every sum in T.
//
// Row reductions (the mean square of a row, sum(dout * weight * x) of a row) take one block per
// row and block_reduce's fixed tree. The weight gradient sums over the BT rows instead, in fixed
// chunks of rows whose sums are added in order (rmsnorm_dweight_chunks_kernel): no two threads
// write the same element and no atomics are needed.
#include <algorithm>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace llama4d::cuda {
namespace {

// out[BT, C] = inp * rstd * weight, rstd[BT] = 1 / sqrt(mean(inp^2) + eps): one block per row.
template <class T>
__global__ void rmsnorm_forward_kernel(T* out, T* rstd, const T* inp, const T* weight, int64_t BT, int64_t C, T eps) {
  T* scratch = shared_scratch<T>();
  for (int64_t r = blockIdx.x; r < BT; r += gridDim.x) {
    const T* x = inp + r * C;
    T* y = out + r * C;
    T partial = T(0);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) partial += x[c] * x[c];
    const T ms = block_reduce(partial, scratch, SumOp{}) / static_cast<T>(C);
    // 1 / sqrt, not rsqrt: IEEE division and square root give the CPU's rounding.
    const T s = T(1) / sqrt(ms + eps);
    if (threadIdx.x == 0) rstd[r] = s;
    // (x * s) * weight, the CPU's order of the two products.
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) y[c] = x[c] * s * weight[c];
  }
}

// dinp[BT, C] += s * dout * weight - s^3 / C * x * sum(dout * weight * x), s = rstd[r]: one
// block per row (the sum is a row reduction).
template <class T>
__global__ void rmsnorm_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight, const T* rstd, int64_t BT,
                                    int64_t C) {
  T* scratch = shared_scratch<T>();
  for (int64_t r = blockIdx.x; r < BT; r += gridDim.x) {
    const T* x = inp + r * C;
    const T* dy = dout + r * C;
    T* dx = dinp + r * C;
    const T s = rstd[r];
    T partial = T(0);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) partial += dy[c] * weight[c] * x[c];
    const T gx = block_reduce(partial, scratch, SumOp{});
    const T k = s * s * s * gx / static_cast<T>(C);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dx[c] += s * dy[c] * weight[c] - k * x[c];
  }
}

// dweight[C] += sum over rows r of dout[r, c] * inp[r, c] * rstd[r], in two passes so that the
// BT rows (16k tokens on the 124M benchmark) spread over the GPU instead of one thread per
// column walking all of them (25 norms took 150 ms of an 854 ms H200 step that way):
//   1. a block per (32 columns, chunk of kNormRowChunk rows); thread (x, y) sums the chunk's rows
//      y, y + kNormLanes, ... of column x in row order, then lane 0 adds the kNormLanes sums in
//      lane order into partial[chunk, c];
//   2. thread c adds its column's chunk sums in chunk order and adds that to dweight once.
// Every sum's order depends on BT alone: a repeated run, and a slice of rows computed as a call
// of its own (how the equivalence harness replays data and sequence parallelism), keep their
// bits. The CPU sums each column in plain row order, so the two agree to rounding.
constexpr int kNormColumns = 32, kNormLanes = 8;
constexpr int64_t kNormRowChunk = 128;

template <class T>
__global__ void __launch_bounds__(kNormColumns * kNormLanes)
    rmsnorm_dweight_chunks_kernel(T* partial, const T* dout, const T* inp, const T* rstd, int64_t BT, int64_t C) {
  __shared__ T sums[kNormLanes][kNormColumns + 1];
  const int x = int(threadIdx.x) % kNormColumns, y = int(threadIdx.x) / kNormColumns;
  const int64_t c = int64_t(blockIdx.x) * kNormColumns + x, chunk = blockIdx.y;
  const int64_t r1 = BT < (chunk + 1) * kNormRowChunk ? BT : (chunk + 1) * kNormRowChunk;
  T acc = T(0);
  if (c < C)
    for (int64_t r = chunk * kNormRowChunk + y; r < r1; r += kNormLanes) acc += dout[r * C + c] * inp[r * C + c] * rstd[r];
  sums[y][x] = acc;
  __syncthreads();
  if (y != 0 || c >= C) return;
  T total = sums[0][x];
  for (int l = 1; l < kNormLanes; ++l) total += sums[l][x];
  partial[chunk * C + c] = total;
}

template <class T>
__global__ void rmsnorm_dweight_total_kernel(T* dweight, const T* partial, int64_t chunks, int64_t C) {
  for (int64_t c = first_index(); c < C; c += index_stride()) {
    T total = partial[c];
    for (int64_t k = 1; k < chunks; ++k) total += partial[k * C + c];
    dweight[c] += total;
  }
}

}  // namespace

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int64_t BT, int64_t C, T eps) {
  if (BT <= 0) return;
  rmsnorm_forward_kernel<<<row_grid(BT), kThreads, kThreads * sizeof(T), stream()>>>(out, rstd, inp, weight, BT, C,
                                                                                       eps);
  finish_op("rmsnorm_forward");
}

// Either gradient may be null (ops.h): the two kernels read only the inputs, never each other's
// output, so skipping one leaves the other's bits unchanged.
template <class T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const T* rstd, int64_t BT,
                      int64_t C) {
  if (BT <= 0 || C <= 0) return;
  if (dinp)
    rmsnorm_dinp_kernel<<<row_grid(BT), kThreads, kThreads * sizeof(T), stream()>>>(dinp, dout, inp, weight, rstd,
                                                                                      BT, C);
  if (dweight) {
    const int64_t chunks = (BT + kNormRowChunk - 1) / kNormRowChunk;
    if (chunks > 65535) throw InputError("rmsnorm_backward on cuda: more than 8 million rows");
    const StreamScratch<T> partial(chunks * C, "rmsnorm_backward: chunk sums");  // [chunks, C]
    const dim3 grid(unsigned((C + kNormColumns - 1) / kNormColumns), unsigned(chunks));
    rmsnorm_dweight_chunks_kernel<<<grid, kNormColumns * kNormLanes, 0, stream()>>>(partial.get(), dout, inp, rstd,
                                                                                      BT, C);
    rmsnorm_dweight_total_kernel<<<grid_for(C), kThreads, 0, stream()>>>(dweight, partial.get(), chunks, C);
  }
  finish_op("rmsnorm_backward");
}

#define LLAMA4D_INSTANTIATE(T)                                                                                   \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, T);                             \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t);
LLAMA4D_INSTANTIATE(float)
LLAMA4D_INSTANTIATE(double)
#undef LLAMA4D_INSTANTIATE

}  // namespace llama4d::cuda
