// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019), top to bottom.
//
// The tp ranks of a tensor-parallel group hold different slices of every weight and run every
// layer together on the SAME tokens. The steps, and where each is in this file:
//
//   1. The cut (tp_layout): rank r holds query heads [r·nh/tp, (r+1)·nh/tp), the key/value heads
//      they read, SwiGLU columns [r·I/tp, (r+1)·I/tp) and ceil(V/tp) vocabulary rows; RMSNorm gains
//      whole. Llama's constructor (core/model/llama.cpp) allocates only that slice, and its
//      block_dims() hands the block the slice's shapes (nh/tp heads, I/tp columns), so
//      core/model/block.cpp runs its unchanged code as the column- and row-parallel products:
//        q/k/v_proj, gate/up_proj   column-parallel: [BT, C] @ W_r^T -> this rank's heads/columns
//        o_proj, down_proj          row-parallel:    this rank's columns of W -> a PARTIAL [BT, C]
//   2. f and g (attention_input_backward ... mlp_output): the two communication points around
//      those products, below.
//   3. Sequence parallelism (attention_input ... norm_weight_grads): f and g split in their halves.
//   4. Replicated key/value heads (key_value_weight_grads).
//   5. The vocabulary-parallel embedding (embed, embed_backward).
//   6. The vocabulary-parallel LM head and cross-entropy (gather_head_input, cross_entropy,
//      cross_entropy_backward, head_input_grad, norm_gain_grad).
//   7. The collectives (sum, max, sum_to_rows, gather_rows).
//
// One transformer block, with C the hidden size, nh/nkv the heads, I the SwiGLU width:
//
//   attention:  n1 [BT, C] --f--> q/k/v_proj (column-parallel: rank r computes its nh/tp query
//               heads and the key/value heads they read, [BT, (nh/tp)·hd] ...) --> attention on
//               those heads (heads never interact, so no communication) --> o_proj (row-parallel:
//               rank r multiplies its heads' columns of W_o, [C, (nh/tp)·hd], giving a PARTIAL
//               [BT, C]) --g--> residual
//   MLP:        n2 [BT, C] --f--> gate/up_proj (column-parallel, [BT, I/tp]) --> SwiGLU (elementwise,
//               local) --> down_proj (row-parallel, partial [BT, C]) --g--> residual
//
//   f = identity in forward; all-reduce of the input gradient in backward (each rank's column
//       slice contributes a partial dn = dq·W_q,r + dk·W_k,r + dv·W_v,r).
//   g = all-reduce in forward (sum of the partial products); identity in backward (every rank
//       needs the whole output gradient, which it already has).
//
// So per layer: 2 all-reduces of BT·C elements in forward (g, g) and 2 in backward (f, f); with
// activation checkpointing the recomputed forward repeats its g's. RMSNorm, RoPE, the residual
// stream and the loss statistics are computed redundantly on every rank (sequence parallelism
// removes that redundancy).
//
// Embedding and LM head are split by vocabulary rows (ceil(V/tp) per rank):
//   embedding: rank r looks up the tokens in its rows and writes zeros for the others; an
//              all-reduce (sum) of [BT, C] gives every rank the full embedding output. Backward:
//              each rank scatter-adds into its own rows, no communication.
//   LM head:   column-parallel over the vocabulary: rank r computes logits for its rows only,
//              [BT, V/tp]. Cross-entropy needs per token the max over ALL columns, the sum of
//              exp(logit - max) and the target's logit: three all-reduces of BT numbers
//              (max, sum, sum), so the full [BT, V] logits exist nowhere. Its input gradient
//              [BT, C] is partial per rank: f's all-reduce.
//
// Key/value heads: with GQA there are fewer key/value heads than query heads. When tp divides
// nkv each rank holds nkv/tp of them. When tp is larger (Llama 3 70B: 8 KV heads), a key/value
// head is held by several ranks, its replicas; each replica's weight gradient covers only its
// own query heads, so the replicas' gradients are summed (key_value_weight_grads below).
//
// Sequence parallelism (Korthikanti et al. 2022). Between the tensor-parallel regions every
// rank above repeats the same work on all B*T rows: the RMSNorms and the residual adds, and it
// keeps the same [BT, C] residual stream. SP cuts those rows instead: rank r holds rows
// [BT·r/tp, BT·(r+1)/tp) of x, h and the norms, and the all-reduces split in their two halves:
//
//   n1 (this rank's rows) --all-gather--> n1 [BT, C] --> column-parallel ... row-parallel -->
//   partial [BT, C] --reduce-scatter--> this rank's rows of the sum --> + x (this rank's rows)
//
//   backward: the gradient of the rows --all-gather--> [BT, C] for the row-parallel layer;
//             the column-parallel input gradient [BT, C], partial --reduce-scatter--> this rank's rows
//
// An all-reduce moves the same bytes as a reduce-scatter plus an all-gather (ring: 2(tp-1)/tp
// of the buffer), so SP communicates exactly what TP does, while the residual stream, the norms'
// saved statistics and the block outputs take 1/tp of the memory. The gathered n1 and n2 are
// kept for the weight gradients (Megatron-LM instead keeps only its rows and gathers them again
// in backward: one more all-gather per norm, for 2·BT·C less memory per layer). The RMSNorm gains'
// gradients now come from each rank's rows only and are summed over the group (C numbers).
// The embedding reduce-scatters its partial lookups instead of all-reducing them; the head
// gathers the normed rows before the vocabulary-parallel LM head.
//
// Memory per rank: every matrix / tp (the vocabulary rows rounded up); RMSNorm gains whole.
// Gradients and AdamW moments follow the weights, and data parallelism (ZeRO included) shards
// this rank's slice further across its data-parallel group (core/parallel/zero.cpp, fsdp.cpp), as FSDP + TP
// does in torchtitan.
#include "core/parallel/tensor_parallel.h"

#include <algorithm>

#include "core/error.h"
#include "core/ops.h"
#include "core/tensor/buffer.h"
#include "core/comm/traffic_labels.h"

namespace llama4d {

// ---- 1. The cut ---------------------------------------------------------------------------------

TpLayout tp_layout(const LlamaConfig& cfg, int tp, int rank, bool sequence_parallel) {
  cfg.validate();
  const int64_t nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads, I = cfg.intermediate_size,
                V = cfg.vocab_size;
  const std::string what = "tensor parallelism tp=" + std::to_string(tp) + ": ";
  if (tp < 1) throw InputError(what + "tp must be >= 1");
  if (rank < 0 || rank >= tp) throw Error(what + "rank " + std::to_string(rank) + " is outside the group");
  if (tp > nh)
    throw InputError(what + "more ranks than the " + std::to_string(nh) + " attention heads (a head is never split)");
  if (nh % tp != 0)
    throw InputError(what + "tp must divide num_attention_heads (" + std::to_string(nh) + ")");
  if (I % tp != 0) throw InputError(what + "tp must divide intermediate_size (" + std::to_string(I) + ")");
  TpLayout t;
  t.tp = tp, t.rank = rank;
  t.sequence_parallel = sequence_parallel && tp > 1;
  t.heads = nh / tp;
  t.heads_begin = rank * t.heads;
  const int64_t group = nh / nkv;  // query heads per key/value head
  const int64_t first_kv = t.heads_begin / group, last_kv = (t.heads_begin + t.heads - 1) / group;
  t.kv_heads_begin = first_kv;
  t.kv_heads = last_kv - first_kv + 1;
  // The kernel maps local query head j to local key/value head j / (heads / kv_heads): that must
  // be the head it reads in the whole model.
  bool equal_groups = t.heads % t.kv_heads == 0;
  for (int64_t j = 0; equal_groups && j < t.heads; ++j)
    equal_groups = (t.heads_begin + j) / group - first_kv == j / (t.heads / t.kv_heads);
  if (!equal_groups)
    throw InputError(what + "rank " + std::to_string(rank) + "'s query heads split key/value groups unequally (" +
                     std::to_string(nh) + " heads, " + std::to_string(nkv) + " key/value heads)");
  t.ffn = I / tp;
  t.ffn_begin = rank * t.ffn;
  t.vocab_padded_rows = (V + tp - 1) / tp;
  t.vocab_begin = std::min<int64_t>(V, rank * t.vocab_padded_rows);
  t.vocab_rows = std::min<int64_t>(V, t.vocab_begin + t.vocab_padded_rows) - t.vocab_begin;
  if (t.vocab_rows < 1)
    throw InputError(what + "rank " + std::to_string(rank) + " would hold no vocabulary rows (vocab_size " +
                     std::to_string(V) + ", " + std::to_string(t.vocab_padded_rows) + " rows per rank)");
  return t;
}


template <class T>
TensorParallelComm<T>::TensorParallelComm(ProcessGroup& tp, const LlamaConfig& cfg, const TpLayout& layout)
    : tp_(tp), cfg_(cfg), layout_(layout), replicated_kv_(layout.replicates_kv_heads(cfg)) {
  if (tp.size() != layout.tp || tp.rank() != layout.rank)
    throw Error("TensorParallelComm: group rank " + std::to_string(tp.rank()) + " of " + std::to_string(tp.size()) +
                " does not match the layout (" + layout.describe() + ")");
}

// ---- 2. f and g -------------------------------------------------------------------------------

template <class T>
void TensorParallelComm<T>::attention_input_backward(T* dn1, const BlockDims& d) {
  if (d.sp > 1) return sum_to_rows(dn1, d.BT(), d.C, label::kSpAttentionInputGrad);
  sum(dn1, d.BT() * d.C, label::kFAttention);
}

template <class T>
void TensorParallelComm<T>::mlp_input_backward(T* dn2, const BlockDims& d) {
  if (d.sp > 1) return sum_to_rows(dn2, d.BT(), d.C, label::kSpMlpInputGrad);
  sum(dn2, d.BT() * d.C, label::kFMlp);
}

template <class T>
void TensorParallelComm<T>::attention_output(T* y, const BlockDims& d) {
  if (d.sp > 1) return sum_to_rows(y, d.BT(), d.C, label::kSpAttentionOutput);
  sum(y, d.BT() * d.C, label::kGAttention);
}

template <class T>
void TensorParallelComm<T>::mlp_output(T* y, const BlockDims& d) {
  if (d.sp > 1) return sum_to_rows(y, d.BT(), d.C, label::kSpMlpOutput);
  sum(y, d.BT() * d.C, label::kGMlp);
}

// ---- 3. Sequence parallelism's gathers --------------------------------------------------------

template <class T>
void TensorParallelComm<T>::attention_input(T* n1, const BlockDims& d) {
  if (d.sp > 1) gather_rows(n1, d.BT(), d.C, label::kSpAttentionInput);
}

template <class T>
void TensorParallelComm<T>::mlp_input(T* n2, const BlockDims& d) {
  if (d.sp > 1) gather_rows(n2, d.BT(), d.C, label::kSpMlpInput);
}

template <class T>
void TensorParallelComm<T>::attention_output_backward(T* dy, const BlockDims& d) {
  if (d.sp > 1) gather_rows(dy, d.BT(), d.C, label::kSpAttentionOutputGrad);
}

template <class T>
void TensorParallelComm<T>::mlp_output_backward(T* dy, const BlockDims& d) {
  if (d.sp > 1) gather_rows(dy, d.BT(), d.C, label::kSpMlpOutputGrad);
}

template <class T>
void TensorParallelComm<T>::norm_weight_grads(T* g, const BlockDims& d) {
  sum(g, d.C, label::kNormGainGrad);
}

// ---- 4. Replicated key/value heads ------------------------------------------------------------

// Each rank places its heads' gradients at their place in a zeroed [2, nkv·hd, C] buffer (k, then
// v) and the group sums it: a head's entry is then the sum over exactly the ranks holding it
// (the others added zeros, which changes no bits). Costs one all-reduce of 2·nkv·hd·C elements
// per layer and micro-batch; a sub-group per head would move less, at the price of one group
// per head.
template <class T>
void TensorParallelComm<T>::key_value_weight_grads(T* gk, T* gv, const BlockDims& d) {
  const int64_t C = cfg_.hidden_size, hd = cfg_.head_dim, whole = cfg_.kv_dim() * C;
  const int64_t mine = d.nkv * hd * C, at = layout_.kv_heads_begin * hd * C;
  Buffer<T> both(&tp_.memory(), MemoryCategory::scratch, 2 * whole, "replicated key/value head gradients");
  ops::fill(both.data(), T(0), 2 * whole);
  ops::copy(both.data() + at, gk, mine);
  ops::copy(both.data() + whole + at, gv, mine);
  sum(both.data(), 2 * whole, label::kKeyValueReplicas);
  ops::copy(gk, both.data() + at, mine);
  ops::copy(gv, both.data() + whole + at, mine);
}

// ---- 5. The vocabulary-parallel embedding ------------------------------------------------------

// x[rows, C]: this rank's vocabulary rows [vocab_begin, vocab_begin + V) looked up for every token
// (zeros for the tokens another rank holds), summed over the ranks: the whole lookup. Under
// sequence parallelism the partial lookups of every row are reduce-scattered, so each rank keeps
// the sum for its rows.
template <class T>
void TensorParallelComm<T>::embed(T* x, const int32_t* tokens, const T* table, int64_t BT, int64_t C, int64_t V,
                                  MemoryTracker* memory) {
  if (!sequence_parallel()) {
    ops::embedding_forward_rows(x, tokens, table, BT, C, layout_.vocab_begin, V);
    return sum(x, BT * C, label::kVocabEmbedding);
  }
  Buffer<T> all(memory, MemoryCategory::scratch, BT * C, "embedding partial lookups (all rows)");
  ops::embedding_forward_rows(all.data(), tokens, table, BT, C, layout_.vocab_begin, V);
  sum_to_rows(all.data(), BT, C, label::kVocabEmbeddingSp);
  const int64_t row0 = BlockDims::sequence_row0(BT, layout_.tp, layout_.rank);
  const int64_t rows = BlockDims::sequence_row0(BT, layout_.tp, layout_.rank + 1) - row0;
  ops::copy(x, all.data() + row0 * C, rows * C);
}

// Each rank adds every token's gradient into its own rows; no communication, except that under
// sequence parallelism a rank's rows take gradients from every token, so the rows are gathered.
template <class T>
void TensorParallelComm<T>::embed_backward(T* g_table, const T* dx, const int32_t* tokens, int64_t BT, int64_t C,
                                           int64_t V, MemoryTracker* memory) {
  if (!sequence_parallel()) return ops::embedding_backward_rows(g_table, dx, tokens, BT, C, layout_.vocab_begin, V);
  Buffer<T> all(memory, MemoryCategory::scratch, BT * C, "embedding output gradient (all rows)");
  const int64_t row0 = BlockDims::sequence_row0(BT, layout_.tp, layout_.rank);
  const int64_t rows = BlockDims::sequence_row0(BT, layout_.tp, layout_.rank + 1) - row0;
  ops::copy(all.data() + row0 * C, dx, rows * C);
  gather_rows(all.data(), BT, C, label::kSpEmbeddingGrad);
  ops::embedding_backward_rows(g_table, all.data(), tokens, BT, C, layout_.vocab_begin, V);
}

// ---- 6. The vocabulary-parallel LM head and cross-entropy -----------------------------------------

// Sequence parallelism: the final norm's rows of every rank, before the column-parallel LM head.
template <class T>
void TensorParallelComm<T>::gather_head_input(T* n, int64_t BT, int64_t C) {
  if (sequence_parallel()) gather_rows(n, BT, C, label::kSpHeadInputGather);
}

// Per token: the max over all columns, then the sum of exp(logit - max) over all columns, and the
// target's logit (from the one rank holding it): three all-reduces of BT numbers, never [BT, V].
// lse[BT] keeps max + log(sum) for the backward.
template <class T>
void TensorParallelComm<T>::cross_entropy(T* losses, T* lse, const T* logits, const int32_t* targets, int64_t BT,
                                          int64_t V, MemoryTracker* memory) {
  Buffer<T> row_max(memory, MemoryCategory::scratch, BT, "vocab-parallel row max");
  Buffer<T> sum_exp(memory, MemoryCategory::scratch, BT, "vocab-parallel sum of exp");
  Buffer<T> target(memory, MemoryCategory::scratch, BT, "vocab-parallel target logit");
  ops::vocab_slice_max_and_target(row_max.data(), target.data(), logits, targets, BT, V, layout_.vocab_begin);
  max(row_max.data(), BT, label::kVocabLossMax);
  ops::vocab_slice_sum_exp(sum_exp.data(), logits, row_max.data(), BT, V);
  sum(sum_exp.data(), BT, label::kVocabLossSumExp);
  sum(target.data(), BT, label::kVocabLossTarget);
  ops::cross_entropy_from_stats(losses, lse, row_max.data(), sum_exp.data(), target.data(), targets, BT);
}

// softmax - onehot for this rank's columns, from the whole row's log-sum-exp: no communication.
template <class T>
void TensorParallelComm<T>::cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets,
                                                   T loss_scale, int64_t BT, int64_t V) {
  ops::cross_entropy_backward_slice(dlogits, logits, lse, targets, loss_scale, BT, V, layout_.vocab_begin);
}

// f before the LM head: each rank's dlogits @ W_r is a partial dn [BT, C]; summed over the ranks,
// or under sequence parallelism reduce-scattered to the rows' owners.
template <class T>
void TensorParallelComm<T>::head_input_grad(T* dn, int64_t BT, int64_t C) {
  if (sequence_parallel()) return sum_to_rows(dn, BT, C, label::kSpHeadInputGrad);
  sum(dn, BT * C, label::kFHead);
}

template <class T>
void TensorParallelComm<T>::norm_gain_grad(T* g, int64_t C) {
  sum(g, C, label::kNormGainGrad);
}

// ---- 7. The collectives ------------------------------------------------------------------------

template <class T>
void TensorParallelComm<T>::sum(T* x, int64_t n, std::string_view what) {
  AllReduceOptions o{.label = std::string(what)};
  tp_.all_reduce(x, n, dtype_of<T>(), ReduceOp::sum, o)->wait();
}

template <class T>
void TensorParallelComm<T>::max(T* x, int64_t n, std::string_view what) {
  AllReduceOptions o{.label = std::string(what)};
  tp_.all_reduce(x, n, dtype_of<T>(), ReduceOp::max, o)->wait();
}

// In place on x[BT, C]: rank r's rows are [BT·r/tp, BT·(r+1)/tp) (BlockDims::sequence_row0), where
// ProcessGroup's in-place reduce-scatter and all-gather put (and take) rank r's block. Any BT
// splits: the blocks differ by at most one row.
template <class T>
std::vector<int64_t> TensorParallelComm<T>::row_counts(int64_t BT, int64_t C) const {
  std::vector<int64_t> counts(size_t(layout_.tp));
  for (int r = 0; r < layout_.tp; ++r)
    counts[size_t(r)] = (BlockDims::sequence_row0(BT, layout_.tp, r + 1) - BlockDims::sequence_row0(BT, layout_.tp, r)) * C;
  return counts;
}

template <class T>
void TensorParallelComm<T>::sum_to_rows(T* x, int64_t BT, int64_t C, std::string_view what) {
  ReduceScatterOptions o{.label = std::string(what)};
  T* mine = x + BlockDims::sequence_row0(BT, layout_.tp, layout_.rank) * C;
  tp_.reduce_scatter_v(mine, x, row_counts(BT, C), dtype_of<T>(), ReduceOp::sum, o)->wait();
}

template <class T>
void TensorParallelComm<T>::gather_rows(T* x, int64_t BT, int64_t C, std::string_view what) {
  AllGatherOptions o{.label = std::string(what)};
  const T* mine = x + BlockDims::sequence_row0(BT, layout_.tp, layout_.rank) * C;
  tp_.all_gather_v(x, mine, row_counts(BT, C), dtype_of<T>(), o)->wait();
}

template class TensorParallelComm<float>;
template class TensorParallelComm<double>;

}  // namespace llama4d
