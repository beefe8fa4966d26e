// RMSNorm (Zhang & Sennrich 2019) on the GPU, as backends/cpu/rmsnorm.cpp computes it: no mean
// subtraction, no bias, every sum in T.
//
// Row reductions (the mean square of a row, sum(dout * weight * x) of a row) take one block per
// row and block_reduce's fixed tree. The weight gradient sums over the BT rows instead: one
// thread per column adds the rows in order, as the CPU's column blocks do, so no two threads
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

// dweight[C] += sum over rows r of dout[r, c] * inp[r, c] * rstd[r]: thread c sums its column in
// row order into a zeroed accumulator and adds that to dweight once, as the CPU does. Neighbouring
// threads read neighbouring columns of a row, so the loads coalesce.
template <class T>
__global__ void rmsnorm_dweight_kernel(T* dweight, const T* dout, const T* inp, const T* rstd, int64_t BT, int64_t C) {
  for (int64_t c = first_index(); c < C; c += index_stride()) {
    T acc = T(0);
    for (int64_t r = 0; r < BT; ++r) acc += dout[r * C + c] * inp[r * C + c] * rstd[r];
    dweight[c] += acc;
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
  if (dweight) rmsnorm_dweight_kernel<<<grid_for(C), kThreads, 0, stream()>>>(dweight, dout, inp, rstd, BT, C);
  finish_op("rmsnorm_backward");
}

#define LLAMA4D_INSTANTIATE(T)                                                                                   \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, int64_t, int64_t, T);                             \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t);
LLAMA4D_INSTANTIATE(float)
LLAMA4D_INSTANTIATE(double)
#undef LLAMA4D_INSTANTIATE

}  // namespace llama4d::cuda
