#pragma once
// The model's last unit: final RMSNorm, LM head, cross-entropy against next-token targets.
//   n = rmsnorm(x) [BT, C];  logits = n @ W^T [BT, V];  loss_i = logsumexp(logits_i) - logits_i[target_i]
// W is lm_head.weight, or the embedding matrix when the embeddings are tied.
#include <cstdint>

#include "core/tensor/buffer.h"

namespace llama4d {

// The sum of per-token losses over counted targets and how many counted (targets < 0 are
// ignored). Sums, not means, so micro-batches and ranks combine exactly.
struct LossSum {
  double loss_sum = 0;
  int64_t tokens = 0;
  double mean() const { return tokens ? loss_sum / double(tokens) : 0.0; }
};

template <class T>
struct HeadActivations {
  Buffer<T> n, rstd;        // [BT, C], [BT]   kept for backward
  Buffer<T> logits, losses; // [BT, V], [BT]   kept for backward (softmax is recomputed from logits)
  void allocate(MemoryTracker* memory, int64_t BT, int64_t C, int64_t V);
  void reset();
  int64_t bytes() const;
};

// targets may be null (inference: logits only, LossSum{}).
template <class T>
LossSum head_forward(HeadActivations<T>& a, const T* x, const T* norm_w, const T* lm_w, const int32_t* targets,
                     int64_t BT, int64_t C, int64_t V, double eps);

// dx[BT, C] OVERWRITTEN; dnorm_w[C] and dlm_w[V, C] ACCUMULATE. loss_scale = d(objective)/d(loss_i).
// Temporaries dlogits [BT, V] and dn [BT, C] are allocated on `memory` as scratch for the call.
template <class T>
void head_backward(T* dx, T* dnorm_w, T* dlm_w, const HeadActivations<T>& a, const T* x, const T* norm_w,
                   const T* lm_w, const int32_t* targets, T loss_scale, int64_t BT, int64_t C, int64_t V,
                   MemoryTracker* memory);

}  // namespace llama4d
