#include "core/model/tp_layout.h"

#include <algorithm>

#include "core/error.h"

namespace llama4d {

int TpLayout::first_holder_of_kv_head(int64_t k, const LlamaConfig& cfg) const {
  const int64_t group = cfg.num_attention_heads / cfg.num_key_value_heads;
  return int(k * group / heads);
}

std::string TpLayout::describe() const {
  auto span = [](int64_t b, int64_t n) { return std::to_string(b) + "-" + std::to_string(b + n - 1); };
  return "tp rank " + std::to_string(rank) + " of " + std::to_string(tp) + ": heads " + span(heads_begin, heads) +
         ", kv heads " + span(kv_heads_begin, kv_heads) + ", ffn " + span(ffn_begin, ffn) + ", vocab " +
         span(vocab_begin, vocab_rows) + (sequence_parallel ? ", sequence-parallel" : "");
}

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

}  // namespace llama4d
