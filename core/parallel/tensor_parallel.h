#pragma once
// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): the communication of one
// tensor-parallel rank. See tensor_parallel.cpp for the whole story, top to bottom.
#include <vector>

#include "core/comm/process_group.h"
#include "core/model/block.h"
#include "core/model/config.h"
#include "core/model/head.h"
#include "core/model/tp_layout.h"

namespace llama4d {

// Fills in the model's communication points for a rank that holds the slice `layout` of every
// weight (core/model/tp_layout.h). Install on the model with set_block_comm and set_vocab_comm.
// Every call is collective over `tp` (all its ranks make the same calls in the same order).
template <class T>
class TensorParallelComm final : public BlockComm<T>, public VocabComm<T> {
 public:
  TensorParallelComm(ProcessGroup& tp, const LlamaConfig& cfg, const TpLayout& layout);

  // ---- Megatron's two conjugate operators -------------------------------------------------
  // f: identity in forward, all-reduce of the input gradient in backward. It stands before a
  //    column-parallel layer (q/k/v, gate/up, the LM head), whose input every rank reads whole.
  // g: all-reduce in forward, identity in backward. It stands after a row-parallel layer
  //    (o_proj, down_proj), where each rank holds a partial sum of the output.
  void attention_input_backward(T* dn1, const BlockDims& d) override;  // f
  void mlp_input_backward(T* dn2, const BlockDims& d) override;        // f
  void attention_output(T* y, const BlockDims& d) override;            // g
  void mlp_output(T* y, const BlockDims& d) override;                  // g

  // ---- Sequence parallelism: the same points, with all-gathers and reduce-scatters -----------
  void attention_input(T* n1, const BlockDims& d) override;            // all-gather (SP only)
  void mlp_input(T* n2, const BlockDims& d) override;                  // all-gather (SP only)
  void attention_output_backward(T* dy, const BlockDims& d) override;  // all-gather (SP only)
  void mlp_output_backward(T* dy, const BlockDims& d) override;        // all-gather (SP only)
  void norm_weight_grads(T* g, const BlockDims& d) override;

  // ---- Key/value heads replicated on several ranks (tp > num_key_value_heads) ---------------
  bool sums_key_value_weight_grads() const override { return replicated_kv_; }
  void key_value_weight_grads(T* gk, T* gv, const BlockDims& d) override;

  // ---- Vocabulary-parallel embedding and loss ----------------------------------------------
  int64_t vocab_begin() const override { return layout_.vocab_begin; }
  void sum(T* x, int64_t n, const char* what) override;
  void max(T* x, int64_t n, const char* what) override;
  int64_t sequence_shards() const override { return layout_.sequence_parallel ? layout_.tp : 1; }
  int64_t sequence_rank() const override { return layout_.sequence_parallel ? layout_.rank : 0; }
  void sum_to_rows(T* x, int64_t BT, int64_t C, const char* what) override;
  void gather_rows(T* x, int64_t BT, int64_t C, const char* what) override;

  ProcessGroup& group() const { return tp_; }

 private:
  // Elements of each rank's rows of a [BT, C] buffer under sequence parallelism.
  std::vector<int64_t> row_counts(int64_t BT, int64_t C) const;

  ProcessGroup& tp_;
  LlamaConfig cfg_;
  TpLayout layout_;
  bool replicated_kv_ = false;
};

extern template class TensorParallelComm<float>;
extern template class TensorParallelComm<double>;

}  // namespace llama4d
