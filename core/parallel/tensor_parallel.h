#pragma once
// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) with sequence parallelism and the
// vocabulary-parallel embedding and cross-entropy. The whole story, top to bottom, is
// tensor_parallel.cpp.
#include <string_view>
#include <vector>

#include "core/comm/process_group.h"
#include "core/model/block.h"
#include "core/model/config.h"
#include "core/model/tp_layout.h"
#include "core/model/vocabulary.h"

namespace llama4d {

// Which slice of every weight rank `rank` of `tp` holds (the struct: core/model/tp_layout.h).
// InputError naming the constraint when the model cannot be cut that way (tp not dividing the
// heads or the SwiGLU width, more ranks than heads, query heads that would span unequal
// key/value groups, a rank left without vocabulary rows).
TpLayout tp_layout(const LlamaConfig& cfg, int tp, int rank, bool sequence_parallel = false);

// The communication of a rank that holds the slice `layout`: the model's block points
// (BlockComm: f, g and sequence parallelism's halves) and its vocabulary (Vocabulary: the
// embedding and the loss over this rank's rows). Install with Llama::set_block_comm and
// Llama::set_vocabulary. Every call is collective over `tp` (all its ranks make the same calls in
// the same order).
template <class T>
class TensorParallelComm final : public BlockComm<T>, public Vocabulary<T> {
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

  // ---- Vocabulary-parallel embedding ------------------------------------------------------------
  bool split() const override { return true; }
  int64_t sequence_shards() const override { return layout_.sequence_parallel ? layout_.tp : 1; }
  int64_t sequence_rank() const override { return layout_.sequence_parallel ? layout_.rank : 0; }
  void embed(T* x, const int32_t* tokens, const T* table, int64_t BT, int64_t C, int64_t V,
             MemoryTracker* memory) override;
  void embed_backward(T* g_table, const T* dx, const int32_t* tokens, int64_t BT, int64_t C, int64_t V,
                      MemoryTracker* memory) override;

  // ---- Vocabulary-parallel LM head and cross-entropy --------------------------------------------
  void gather_head_input(T* n, int64_t BT, int64_t C) override;
  void cross_entropy(T* losses, T* lse, const T* logits, const int32_t* targets, int64_t BT, int64_t V,
                     MemoryTracker* memory) override;
  void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets, T loss_scale,
                              int64_t BT, int64_t V) override;
  void head_input_grad(T* dn, int64_t BT, int64_t C) override;          // f
  void norm_gain_grad(T* g, int64_t C) override;

  ProcessGroup& group() const { return tp_; }

 private:
  // The collectives over the group, in place, labelled for the traffic log.
  void sum(T* x, int64_t n, std::string_view what);
  void max(T* x, int64_t n, std::string_view what);
  void sum_to_rows(T* x, int64_t BT, int64_t C, std::string_view what);  // reduce-scatter of x[BT, C]
  void gather_rows(T* x, int64_t BT, int64_t C, std::string_view what);  // all-gather of x[BT, C]
  // Elements of each rank's rows of a [BT, C] buffer under sequence parallelism.
  std::vector<int64_t> row_counts(int64_t BT, int64_t C) const;
  bool sequence_parallel() const { return layout_.sequence_parallel && layout_.tp > 1; }

  ProcessGroup& tp_;
  LlamaConfig cfg_;
  TpLayout layout_;
  bool replicated_kv_ = false;
};

extern template class TensorParallelComm<float>;
extern template class TensorParallelComm<double>;

}  // namespace llama4d
