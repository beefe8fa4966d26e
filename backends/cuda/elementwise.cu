// Residual add, gradient accumulation, scaling and the SwiGLU gate: one thread per element in
// grid-stride loops (element i depends on element i of the inputs only).
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace llama4d::cuda {
namespace {

template <class T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride()) out[i] = a[i] + b[i];
}

template <class T>
__global__ void accumulate_kernel(T* y, const T* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride()) y[i] += x[i];
}

template <class T>
__global__ void scale_kernel(T* x, T a, int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride()) x[i] *= a;
}

// sigmoid(g) from e = exp(-|g|) <= 1, which never overflows for large |g| (as the CPU computes it).
template <class T>
__device__ T sigmoid(T g) {
  const T e = exp(-abs(g));
  const T inv = T(1) / (T(1) + e);
  return g >= T(0) ? inv : e * inv;
}

// out = silu(gate) * up, silu(g) = g * sigmoid(g) (Shazeer 2020).
template <class T>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride()) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

// d silu(g)/dg = sig + g * sig * (1 - sig); both gradients are written over, as ops.h specifies.
template <class T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n) {
  for (int64_t i = first_index(); i < n; i += index_stride()) {
    const T g = gate[i];
    const T sig = sigmoid(g);
    const T silu = g * sig;
    dgate[i] = dout[i] * up[i] * (sig + silu * (T(1) - sig));
    dup[i] = dout[i] * silu;
  }
}

}  // namespace

template <class T>
void add_forward(T* out, const T* a, const T* b, int64_t N) {
  if (N <= 0) return;
  add_kernel<<<grid_for(N), kThreads, 0, stream()>>>(out, a, b, N);
  finish_op("add_forward");
}

template <class T>
void accumulate(T* y, const T* x, int64_t N) {
  if (N <= 0) return;
  accumulate_kernel<<<grid_for(N), kThreads, 0, stream()>>>(y, x, N);
  finish_op("accumulate");
}

template <class T>
void scale(T* x, T a, int64_t N) {
  if (N <= 0) return;
  scale_kernel<<<grid_for(N), kThreads, 0, stream()>>>(x, a, N);
  finish_op("scale");
}

template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t N) {
  if (N <= 0) return;
  swiglu_forward_kernel<<<grid_for(N), kThreads, 0, stream()>>>(out, gate, up, N);
  finish_op("swiglu_forward");
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t N) {
  if (N <= 0) return;
  swiglu_backward_kernel<<<grid_for(N), kThreads, 0, stream()>>>(dgate, dup, dout, gate, up, N);
  finish_op("swiglu_backward");
}

#define LLAMA4D_INSTANTIATE(T)                                                          \
  template void add_forward<T>(T*, const T*, const T*, int64_t);                        \
  template void accumulate<T>(T*, const T*, int64_t);                                   \
  template void scale<T>(T*, T, int64_t);                                               \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t);                     \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);
LLAMA4D_INSTANTIATE(float)
LLAMA4D_INSTANTIATE(double)
#undef LLAMA4D_INSTANTIATE

}  // namespace llama4d::cuda
