// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019), top to bottom.
//
// The tp ranks of a tensor-parallel group hold different slices of every weight and run every
// layer together on the SAME tokens. Which slice each rank holds is core/model/tp_layout.h; the
// single-rank model (core/model) runs its slice with smaller shapes, and this file supplies the
// communication at the points the model names (BlockComm, VocabComm).
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
// this rank's slice further across its data-parallel group (core/parallel/zero.cpp), as FSDP + TP
// does in torchtitan.
#include "core/parallel/tensor_parallel.h"

#include "core/ops.h"
#include "core/tensor/buffer.h"

namespace llama4d {

template <class T>
TensorParallelComm<T>::TensorParallelComm(ProcessGroup& tp, const LlamaConfig& cfg, const TpLayout& layout)
    : tp_(tp), cfg_(cfg), layout_(layout), replicated_kv_(layout.replicates_kv_heads(cfg)) {
  if (tp.size() != layout.tp || tp.rank() != layout.rank)
    throw Error("TensorParallelComm: group rank " + std::to_string(tp.rank()) + " of " + std::to_string(tp.size()) +
                " does not match the layout (" + layout.describe() + ")");
}

// ---- f and g ----------------------------------------------------------------------------------

template <class T>
void TensorParallelComm<T>::attention_input_backward(T* dn1, const BlockDims& d) {
  if (d.sp > 1) return sum_to_rows(dn1, d.BT(), d.C, "SP backward: attention input gradient reduce-scatter");
  sum(dn1, d.BT() * d.C, "f backward: attention input gradient");
}

template <class T>
void TensorParallelComm<T>::mlp_input_backward(T* dn2, const BlockDims& d) {
  if (d.sp > 1) return sum_to_rows(dn2, d.BT(), d.C, "SP backward: MLP input gradient reduce-scatter");
  sum(dn2, d.BT() * d.C, "f backward: MLP input gradient");
}

template <class T>
void TensorParallelComm<T>::attention_output(T* y, const BlockDims& d) {
  if (d.sp > 1) return sum_to_rows(y, d.BT(), d.C, "SP forward: o_proj reduce-scatter");
  sum(y, d.BT() * d.C, "g forward: o_proj partial sums");
}

template <class T>
void TensorParallelComm<T>::mlp_output(T* y, const BlockDims& d) {
  if (d.sp > 1) return sum_to_rows(y, d.BT(), d.C, "SP forward: down_proj reduce-scatter");
  sum(y, d.BT() * d.C, "g forward: down_proj partial sums");
}

// ---- Sequence parallelism's gathers -----------------------------------------------------------

template <class T>
void TensorParallelComm<T>::attention_input(T* n1, const BlockDims& d) {
  if (d.sp > 1) gather_rows(n1, d.BT(), d.C, "SP forward: attention input all-gather");
}

template <class T>
void TensorParallelComm<T>::mlp_input(T* n2, const BlockDims& d) {
  if (d.sp > 1) gather_rows(n2, d.BT(), d.C, "SP forward: MLP input all-gather");
}

template <class T>
void TensorParallelComm<T>::attention_output_backward(T* dy, const BlockDims& d) {
  if (d.sp > 1) gather_rows(dy, d.BT(), d.C, "SP backward: o_proj output gradient all-gather");
}

template <class T>
void TensorParallelComm<T>::mlp_output_backward(T* dy, const BlockDims& d) {
  if (d.sp > 1) gather_rows(dy, d.BT(), d.C, "SP backward: down_proj output gradient all-gather");
}

template <class T>
void TensorParallelComm<T>::norm_weight_grads(T* g, const BlockDims& d) {
  sum(g, d.C, "sequence-parallel norm gain gradient");
}

// ---- Replicated key/value heads ---------------------------------------------------------------

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
  sum(both.data(), 2 * whole, "key/value replicas: weight gradient sum");
  ops::copy(gk, both.data() + at, mine);
  ops::copy(gv, both.data() + whole + at, mine);
}

// ---- The collectives --------------------------------------------------------------------------

template <class T>
void TensorParallelComm<T>::sum(T* x, int64_t n, const char* what) {
  AllReduceOptions o;
  o.label = what;
  tp_.all_reduce(x, n, dtype_of<T>(), ReduceOp::sum, o)->wait();
}

template <class T>
void TensorParallelComm<T>::max(T* x, int64_t n, const char* what) {
  AllReduceOptions o;
  o.label = what;
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
void TensorParallelComm<T>::sum_to_rows(T* x, int64_t BT, int64_t C, const char* what) {
  ReduceScatterOptions o;
  o.label = what;
  T* mine = x + BlockDims::sequence_row0(BT, layout_.tp, layout_.rank) * C;
  tp_.reduce_scatter_v(mine, x, row_counts(BT, C), dtype_of<T>(), ReduceOp::sum, o)->wait();
}

template <class T>
void TensorParallelComm<T>::gather_rows(T* x, int64_t BT, int64_t C, const char* what) {
  AllGatherOptions o;
  o.label = what;
  const T* mine = x + BlockDims::sequence_row0(BT, layout_.tp, layout_.rank) * C;
  tp_.all_gather_v(x, mine, row_counts(BT, C), dtype_of<T>(), o)->wait();
}

template class TensorParallelComm<float>;
template class TensorParallelComm<double>;

}  // namespace llama4d
