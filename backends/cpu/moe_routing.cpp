// Mixtral's router (softmax, top-k, renormalised weights) and the rows the token dispatch moves:
// one token (or one dispatched row) per loop index, so any thread split gives the same bits.
#include <cmath>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_kernels.h"
#include "core/ops.h"

namespace llama4d::cpu {

namespace {

// Work below this many elements stays on the calling thread (the expert counts are small).
bool worth_threads(int64_t rows, int64_t cols) { return rows * cols >= kParallelElements; }

}  // namespace

template <class T>
void router_topk(T* probs, T* weights, int32_t* experts, const T* logits, int64_t BT, int64_t E, int64_t k) {
  parallel_for(BT, worth_threads(BT, E), [&](int64_t t) {
    const T* z = logits + t * E;
    T* p = probs + t * E;
    const T m = reduce_max(z, E);
    for (int64_t e = 0; e < E; ++e) p[e] = exp_det(z[e] - m);
    const T inv = T(1) / reduce_sum(p, E);
    for (int64_t e = 0; e < E; ++e) p[e] *= inv;
    // Selection: the j-th pick is the largest probability not picked yet; the strict > keeps the
    // lower id of an equal pair.
    int32_t* ids = experts + t * k;
    T sum = T(0);
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || ids[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      ids[j] = int32_t(best);
      sum += p[best];
    }
    for (int64_t j = 0; j < k; ++j) weights[t * k + j] = p[ids[j]] / sum;
  });
}

template <class T>
void router_backward(T* dlogits, const T* dweights, const T* dprobs, const T* probs, const T* weights,
                     const int32_t* experts, int64_t BT, int64_t E, int64_t k) {
  parallel_for(BT, worth_threads(BT, E), [&](int64_t t) {
    const T* p = probs + t * E;
    const T* dw = dweights + t * k;
    const T* w = weights + t * k;
    const int32_t* ids = experts + t * k;
    T* dz = dlogits + t * E;  // holds dp first, then the logits' gradient
    for (int64_t e = 0; e < E; ++e) dz[e] = dprobs ? dprobs[e] : T(0);
    T S = T(0), D = T(0);
    for (int64_t j = 0; j < k; ++j) S += p[ids[j]], D += dw[j] * w[j];
    for (int64_t j = 0; j < k; ++j) dz[ids[j]] += (dw[j] - D) / S;
    T dot = T(0);
    for (int64_t e = 0; e < E; ++e) dot += p[e] * dz[e];
    for (int64_t e = 0; e < E; ++e) dz[e] = p[e] * (dz[e] - dot);
  });
}

template <class T>
void gather_rows(T* out, const T* src, const int32_t* index, int64_t N, int64_t C) {
  parallel_for(N, worth_threads(N, C), [&](int64_t i) {
    const T* s = src + int64_t(index[i]) * C;
    T* o = out + i * C;
    for (int64_t c = 0; c < C; ++c) o[c] = s[c];
  });
}

template <class T>
void combine_rows(T* out, const T* src, const int32_t* slot, const T* weights, int64_t BT, int64_t k, int64_t C) {
  parallel_for(BT, worth_threads(BT * k, C), [&](int64_t t) {
    T* o = out + t * C;
    for (int64_t j = 0; j < k; ++j) {
      const T* s = src + int64_t(slot[t * k + j]) * C;
      const T w = weights ? weights[t * k + j] : T(1);
      if (j == 0)
        for (int64_t c = 0; c < C; ++c) o[c] = w * s[c];
      else
        for (int64_t c = 0; c < C; ++c) o[c] += w * s[c];
    }
  });
}

template <class T>
void combine_rows_backward(T* dsrc, T* dweights, const T* dout, const T* src, const int32_t* slot, const T* weights,
                           int64_t BT, int64_t k, int64_t C) {
  parallel_for(BT, worth_threads(BT * k, C), [&](int64_t t) {
    const T* g = dout + t * C;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t row = slot[t * k + j];
      const T w = weights[t * k + j];
      T* d = dsrc + row * C;
      for (int64_t c = 0; c < C; ++c) d[c] = w * g[c];
      dweights[t * k + j] = reduce_dot(g, src + row * C, C);
    }
  });
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

}  // namespace llama4d::cpu
