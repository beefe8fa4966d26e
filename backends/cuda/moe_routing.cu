// Mixtral's router and the rows the token dispatch moves, on the GPU (backends/cpu/moe_routing.cpp
// computes the same formulas): the router one thread per token (E is small: 8 for Mixtral), the
// row moves one thread per element in grid-stride loops, the combine's weight gradients one thread
// per (token, choice) summing its C products in column order. No two threads write one element.
#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"

namespace llama4d::cuda {
namespace {

template <class T>
__global__ void router_topk_kernel(T* probs, T* weights, int32_t* experts, const T* logits, int64_t BT, int64_t E,
                                   int64_t k) {
  for (int64_t t = first_index(); t < BT; t += index_stride()) {
    const T* z = logits + t * E;
    T* p = probs + t * E;
    T m = z[0];
    for (int64_t e = 1; e < E; ++e) m = z[e] > m ? z[e] : m;
    T sum = T(0);
    for (int64_t e = 0; e < E; ++e) p[e] = exp(z[e] - m), sum += p[e];
    const T inv = T(1) / sum;
    for (int64_t e = 0; e < E; ++e) p[e] *= inv;
    int32_t* ids = experts + t * k;
    T picked = T(0);
    for (int64_t j = 0; j < k; ++j) {  // the largest not picked yet; strict > keeps the lower id
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || ids[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      ids[j] = int32_t(best);
      picked += p[best];
    }
    for (int64_t j = 0; j < k; ++j) weights[t * k + j] = p[ids[j]] / picked;
  }
}

template <class T>
__global__ void router_backward_kernel(T* dlogits, const T* dweights, const T* dprobs, const T* probs,
                                       const T* weights, const int32_t* experts, int64_t BT, int64_t E, int64_t k) {
  for (int64_t t = first_index(); t < BT; t += index_stride()) {
    const T* p = probs + t * E;
    const T* dw = dweights + t * k;
    const T* w = weights + t * k;
    const int32_t* ids = experts + t * k;
    T* dz = dlogits + t * E;
    for (int64_t e = 0; e < E; ++e) dz[e] = dprobs ? dprobs[e] : T(0);
    T S = T(0), D = T(0);
    for (int64_t j = 0; j < k; ++j) S += p[ids[j]], D += dw[j] * w[j];
    for (int64_t j = 0; j < k; ++j) dz[ids[j]] += (dw[j] - D) / S;
    T dot = T(0);
    for (int64_t e = 0; e < E; ++e) dot += p[e] * dz[e];
    for (int64_t e = 0; e < E; ++e) dz[e] = p[e] * (dz[e] - dot);
  }
}

template <class T>
__global__ void gather_rows_kernel(T* out, const T* src, const int32_t* index, int64_t n, int64_t C) {
  for (int64_t i = first_index(); i < n; i += index_stride()) out[i] = src[int64_t(index[i / C]) * C + i % C];
}

template <class T>
__global__ void combine_rows_kernel(T* out, const T* src, const int32_t* slot, const T* weights, int64_t n,
                                    int64_t k, int64_t C) {
  for (int64_t i = first_index(); i < n; i += index_stride()) {
    const int64_t t = i / C, c = i % C;
    T acc = T(0);
    for (int64_t j = 0; j < k; ++j) {
      const T w = weights ? weights[t * k + j] : T(1);
      const T term = w * src[int64_t(slot[t * k + j]) * C + c];
      acc = j == 0 ? term : acc + term;
    }
    out[i] = acc;
  }
}

template <class T>
__global__ void combine_scatter_kernel(T* dsrc, const T* dout, const int32_t* slot, const T* weights, int64_t n,
                                       int64_t k, int64_t C) {
  for (int64_t i = first_index(); i < n; i += index_stride()) {  // i over (token, choice, column)
    const int64_t tj = i / C, c = i % C;
    dsrc[int64_t(slot[tj]) * C + c] = weights[tj] * dout[(tj / k) * C + c];
  }
}

template <class T>
__global__ void combine_weight_grad_kernel(T* dweights, const T* dout, const T* src, const int32_t* slot, int64_t n,
                                           int64_t k, int64_t C) {
  for (int64_t tj = first_index(); tj < n; tj += index_stride()) {
    const T* g = dout + (tj / k) * C;
    const T* s = src + int64_t(slot[tj]) * C;
    T acc = T(0);
    for (int64_t c = 0; c < C; ++c) acc += g[c] * s[c];
    dweights[tj] = acc;
  }
}

}  // namespace

template <class T>
void router_topk(T* probs, T* weights, int32_t* experts, const T* logits, int64_t BT, int64_t E, int64_t k) {
  if (BT <= 0) return;
  router_topk_kernel<<<grid_for(BT), kThreads, 0, stream()>>>(probs, weights, experts, logits, BT, E, k);
  finish_op("router_topk");
}

template <class T>
void router_backward(T* dlogits, const T* dweights, const T* dprobs, const T* probs, const T* weights,
                     const int32_t* experts, int64_t BT, int64_t E, int64_t k) {
  if (BT <= 0) return;
  router_backward_kernel<<<grid_for(BT), kThreads, 0, stream()>>>(dlogits, dweights, dprobs, probs, weights, experts,
                                                                  BT, E, k);
  finish_op("router_backward");
}

template <class T>
void gather_rows(T* out, const T* src, const int32_t* index, int64_t N, int64_t C) {
  if (N * C <= 0) return;
  gather_rows_kernel<<<grid_for(N * C), kThreads, 0, stream()>>>(out, src, index, N * C, C);
  finish_op("gather_rows");
}

template <class T>
void combine_rows(T* out, const T* src, const int32_t* slot, const T* weights, int64_t BT, int64_t k, int64_t C) {
  if (BT * C <= 0) return;
  combine_rows_kernel<<<grid_for(BT * C), kThreads, 0, stream()>>>(out, src, slot, weights, BT * C, k, C);
  finish_op("combine_rows");
}

template <class T>
void combine_rows_backward(T* dsrc, T* dweights, const T* dout, const T* src, const int32_t* slot, const T* weights,
                           int64_t BT, int64_t k, int64_t C) {
  if (BT * k <= 0) return;
  if (C > 0)
    combine_scatter_kernel<<<grid_for(BT * k * C), kThreads, 0, stream()>>>(dsrc, dout, slot, weights, BT * k * C, k, C);
  combine_weight_grad_kernel<<<grid_for(BT * k), kThreads, 0, stream()>>>(dweights, dout, src, slot, BT * k, k, C);
  finish_op("combine_rows_backward");
}

#define LLAMA4D_INSTANTIATE(T)                                                                                      \
  template void router_topk<T>(T*, T*, int32_t*, const T*, int64_t, int64_t, int64_t);                              \
  template void router_backward<T>(T*, const T*, const T*, const T*, const T*, const int32_t*, int64_t, int64_t,    \
                                   int64_t);                                                                        \
  template void gather_rows<T>(T*, const T*, const int32_t*, int64_t, int64_t);                                     \
  template void combine_rows<T>(T*, const T*, const int32_t*, const T*, int64_t, int64_t, int64_t);                 \
  template void combine_rows_backward<T>(T*, T*, const T*, const T*, const int32_t*, const T*, int64_t, int64_t,    \
                                         int64_t);
LLAMA4D_INSTANTIATE(float)
LLAMA4D_INSTANTIATE(double)
#undef LLAMA4D_INSTANTIATE

}  // namespace llama4d::cuda
