#pragma once
// The model's last unit: final RMSNorm, LM head, cross-entropy against next-token targets.
//   n = rmsnorm(x) [BT, C];  logits = n @ W^T [BT, V];  loss_i = logsumexp(logits_i) - logits_i[target_i]
// W is lm_head.weight, or the embedding matrix when the embeddings are tied.
#include <array>
#include <cstdint>

#include "core/model/bf16_parking.h"
#include "core/model/vocabulary.h"
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
  Buffer<T> n, rstd;        // [BT, C], [rows] kept for backward (rows: this rank's under sequence parallelism)
  Buffer<T> logits, losses; // [BT, V], [BT]   kept for backward (softmax is recomputed from logits)
  Buffer<T> lse;            // [BT] vocabulary-parallel only: the log-sum-exp over all ranks' columns
  // bf16 mixed precision (BlockDims::bf16): n, logits and the backward's dlogits, dn and dx are
  // rounded to bf16 when complete; rstd, losses and lse stay in T.
  bool bf16 = false;
  void allocate(MemoryTracker* memory, int64_t BT, int64_t C, int64_t V, bool vocab_parallel = false,
                int64_t rows = -1);  // rows: -1 for BT
  void reset();
  int64_t bytes() const;
};

// targets may be null (inference: logits only, LossSum{}). lm_w is the [V, C] of the LM head this
// rank holds, and `vocab` (core/model/vocabulary.h) computes the loss over its columns: whole on
// one device, combined across tensor-parallel ranks when split. Under sequence parallelism x (and
// dx) hold this rank's rows only; the normed rows are gathered for the head.
template <class T>
LossSum head_forward(HeadActivations<T>& a, const T* x, const T* norm_w, const T* lm_w, const int32_t* targets,
                     int64_t BT, int64_t C, int64_t V, double eps, Vocabulary<T>& vocab);

// dx[BT, C] OVERWRITTEN; dnorm_w[C] and dlm_w[V, C] ACCUMULATE. loss_scale = d(objective)/d(loss_i).
// Temporaries dlogits [BT, V] and dn [BT, C] are allocated on `memory` as scratch for the call.
// With a split vocabulary dn is the sum over ranks of each slice's dlogits @ lm_w (Megatron's f
// operator in backward: an all-reduce, Vocabulary::head_input_grad).
template <class T>
void head_backward(T* dx, T* dnorm_w, T* dlm_w, const HeadActivations<T>& a, const T* x, const T* norm_w,
                   const T* lm_w, const int32_t* targets, T loss_scale, int64_t BT, int64_t C, int64_t V,
                   MemoryTracker* memory, Vocabulary<T>& vocab);

// What the head's weight gradients are computed from, kept from its input-gradient pass to its
// weight-gradient pass (zero-bubble pipeline schedules): the gradients of the LM head's output
// and of the final norm's output, and their inputs. Activations on the rank's tracker. Under
// sequence parallelism the weight pass reads this rank's rows of dn only.
template <class T>
struct HeadWeightGradInputs {
  Buffer<T> dlogits;  // [BT, V] (this rank's vocabulary slice)
  Buffer<T> dn;       // [rows, C] d(final norm output), summed over the vocabulary slices: this rank's rows
  Buffer<T> n;        // [BT, C] the LM head's input (moved from HeadActivations)
  Buffer<T> x, rstd;  // [rows, C], [rows] the final norm's input and 1/rms
  // bf16 mixed precision: between the input and the weight pass all but rstd wait as bf16, in
  // the order of bf16_valued() (core/model/bf16_parking.h).
  std::array<Buffer<bf16>, 4> parked;
  bool bf16_compute = false;  // bf16 mixed precision: the weight pass's product reads bf16 operands
  void allocate(MemoryTracker* memory, int64_t BT, int64_t rows, int64_t C, int64_t V);  // dlogits, dn
  // Moves the LM head's and the norm's inputs out of a (whose other tensors the caller frees) and x.
  void take_inputs(HeadActivations<T>& a, Buffer<T>& x);
  void park_bf16(MemoryTracker* memory) { park_all_bf16(bf16_valued(), parked, memory); }
  void unpark_bf16(MemoryTracker* memory) { unpark_all_bf16(bf16_valued(), parked, memory); }
  void reset();
  int64_t bytes() const;  // in T and parked

 private:
  std::array<NamedTensor<T>, 4> bf16_valued() {
    return {{{&dlogits, "dlogits"}, {&dn, "d(final norm out)"}, {&n, "n"}, {&x, "x_L"}}};
  }
};

// head_backward split in two. The input pass: dx as head_backward (the same bits), no gradient
// touched; dlogits and dn are left in keep (allocated). It makes the vocabulary-parallel calls
// the input gradient needs. Then keep.take_inputs.
template <class T>
void head_backward_input(T* dx, HeadWeightGradInputs<T>& keep, const HeadActivations<T>& a, const T* x,
                         const T* norm_w, const T* lm_w, const int32_t* targets, T loss_scale, int64_t BT,
                         int64_t C, int64_t V, Vocabulary<T>& vocab);
// The weight pass: dnorm_w and dlm_w ACCUMULATE what head_backward adds, by the same op calls, so
// input then weight is bitwise head_backward. Under sequence parallelism it sums the gain's
// gradient over the ranks (Vocabulary::norm_gain_grad). Reads no parameter.
template <class T>
void head_backward_weight(T* dnorm_w, T* dlm_w, const HeadWeightGradInputs<T>& in, int64_t BT, int64_t C,
                          int64_t V, MemoryTracker* memory, Vocabulary<T>& vocab);

}  // namespace llama4d
