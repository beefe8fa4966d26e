#pragma once
// Where the model's vocabulary lives, at the few points the embedding and the LM head touch it.
//
// One device (and every data-parallel rank) holds all V rows of the embedding and of the LM head:
// this class, whose methods are the plain ops. Tensor parallelism gives each rank a slice of the
// rows (Megatron's vocabulary-parallel embedding and cross-entropy): TensorParallelComm in
// core/parallel/tensor_parallel.cpp overrides every method with the split version, so the model
// (llama.cpp, head.cpp) runs the same code whichever holds the rows.
//
// Shapes: BT tokens of the micro-batch, C hidden, V the rows this rank holds. Under sequence
// parallelism the residual stream holds only this rank's rows of the BT tokens
// (sequence_shards() > 1): the embedding's output and the head's input are those rows.
#include <cstdint>

#include "core/tensor/memory_tracker.h"

namespace llama4d {

template <class T>
class Vocabulary {
 public:
  virtual ~Vocabulary() = default;

  // True when this rank holds a slice of the rows (the loss then keeps each token's log-sum-exp
  // over all ranks' columns, HeadActivations::lse).
  virtual bool split() const { return false; }
  // Sequence parallelism: the residual stream holds rows [BT·r/s, BT·(r+1)/s) of the BT tokens,
  // r = sequence_rank(), s = sequence_shards().
  virtual int64_t sequence_shards() const { return 1; }
  virtual int64_t sequence_rank() const { return 0; }

  // ---- Embedding ------------------------------------------------------------------------------
  // x[rows, C] = table[tokens] for this rank's rows; tokens[BT] are every row's, table [V, C].
  // Scratch comes from `memory`.
  virtual void embed(T* x, const int32_t* tokens, const T* table, int64_t BT, int64_t C, int64_t V,
                     MemoryTracker* memory);
  // g_table[V, C] += dx[rows, C] added into the rows of their tokens.
  virtual void embed_backward(T* g_table, const T* dx, const int32_t* tokens, int64_t BT, int64_t C, int64_t V,
                              MemoryTracker* memory);

  // ---- LM head and loss -------------------------------------------------------------------------
  // n[BT, C] with this rank's rows filled (the final norm's output): every row, in place.
  virtual void gather_head_input(T* n, int64_t BT, int64_t C) {}
  // losses[BT] = logsumexp(logits[i]) - logits[i][targets[i]] over all V columns of the model;
  // logits[BT, V] are this rank's columns. lse[BT] (split only) keeps each token's log-sum-exp.
  virtual void cross_entropy(T* losses, T* lse, const T* logits, const int32_t* targets, int64_t BT, int64_t V,
                             MemoryTracker* memory);
  // dlogits[BT, V] (zeroed by the caller) = loss_scale * (softmax - onehot) of this rank's columns.
  virtual void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets, T loss_scale,
                                      int64_t BT, int64_t V);
  // dn[BT, C]: the head input's gradient from this rank's columns. Afterwards this rank's rows of
  // dn hold the sum over every rank's columns (an all-reduce, or a reduce-scatter to the rows under
  // sequence parallelism); nothing to add here.
  virtual void head_input_grad(T* dn, int64_t BT, int64_t C) {}
  // Sequence parallelism: the final norm's gain gradient g[C] from this rank's rows, summed over
  // the ranks' rows in place.
  virtual void norm_gain_grad(T* g, int64_t C) {}
};

extern template class Vocabulary<float>;
extern template class Vocabulary<double>;

}  // namespace llama4d
