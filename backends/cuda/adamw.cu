// The AdamW element update on the GPU. Compiled with --fmad=false (CMakeLists.txt), as the CPU's
// adamw_kernel.cpp is with -ffp-contract=off, and CUDA's sqrt and division are correctly
// rounded by default: every element goes through the same IEEE operations as
// AdamW<T>::step in core/optim, so the update is bitwise the CPU backend's.
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace llama4d::cuda {
namespace {

// The scalars come by value: one copy per thread, never aliased with the buffers.
template <class T>
__global__ void adamw_kernel(T* w, T* m, T* v, const T* g, int64_t n, ops::AdamWStep<T> s) {
  for (int64_t i = first_index(); i < n; i += index_stride()) {
    const T gi = g[i];
    T p = w[i] * s.decay;
    const T mi = s.beta1 * m[i] + s.one_minus_beta1 * gi;
    const T vi = s.beta2 * v[i] + s.one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const T denom = sqrt(vi) / s.bc2_sqrt + s.eps;
    p = p - s.step_size * (mi / denom);
    w[i] = p;
  }
}

}  // namespace

template <class T>
void adamw_update(T* w, T* m, T* v, const T* g, int64_t N, const AdamWStep<T>& s) {
  if (N <= 0) return;
  adamw_kernel<<<grid_for(N), kThreads, 0, stream()>>>(w, m, v, g, N, s);
  finish_op("adamw_update");
}

template void adamw_update<float>(float*, float*, float*, const float*, int64_t, const AdamWStep<float>&);
template void adamw_update<double>(double*, double*, double*, const double*, int64_t, const AdamWStep<double>&);

}  // namespace llama4d::cuda
