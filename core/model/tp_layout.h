#pragma once
// What tensor parallelism cuts one model into for the `tp` ranks of a tensor-parallel group
// (Megatron-LM, Shoeybi et al. 2019): which query heads, key/value heads, SwiGLU columns and
// vocabulary rows tensor-parallel rank `rank` holds. The cut itself is tp_layout() in
// core/parallel/tensor_parallel.cpp, the strategy's file; the model only reads the result.
// Everything else (the RMSNorm gains) is replicated. The single-rank model built with a layout
// holds only its slices (core/model/params.h maps each slice to its place in the whole Hugging
// Face tensor).
//
//   query heads     nh / tp consecutive heads per rank (tp must divide nh)
//   key/value heads the heads those queries read: with GQA group g = nh / nkv, query head j reads
//                   key/value head j / g. When tp divides nkv, each rank holds nkv / tp of them;
//                   when tp is larger (Llama 3 70B and 405B have 8 KV heads and up to tp = 8 here,
//                   `small` has 2), a head is held by several ranks (its replicas), whose
//                   gradients are summed. Every rank's query heads must fall into equal groups per
//                   key/value head, so the attention kernel sees a plain GQA shape.
//   SwiGLU          I / tp consecutive columns of gate_proj / up_proj (rows of the [I, C] weights)
//                   and the matching columns of down_proj
//   vocabulary      ceil(V / tp) consecutive rows of the embedding and the LM head per rank; the
//                   last rank holds what is left (the vocabulary is padded to tp * ceil(V / tp)
//                   rows, and the padding rows are neither stored nor scored).
#include <cstdint>
#include <string>

#include "core/model/config.h"

namespace llama4d {

struct TpLayout {
  int tp = 1, rank = 0;
  int64_t heads_begin = 0, heads = 0;        // query heads [heads_begin, heads_begin + heads)
  int64_t kv_heads_begin = 0, kv_heads = 0;  // key/value heads
  int64_t ffn_begin = 0, ffn = 0;            // SwiGLU columns
  int64_t vocab_begin = 0, vocab_rows = 0;   // embedding / LM head rows
  int64_t vocab_padded_rows = 0;             // ceil(V / tp): every rank's share of the padded vocabulary
  // Sequence parallelism (Korthikanti et al. 2022): between the tensor-parallel regions the
  // residual stream and the RMSNorms hold only this rank's 1/tp of the B*T token rows.
  bool sequence_parallel = false;

  bool sliced() const { return tp > 1; }
  // Key/value head k (global index) is counted (in norms, in checkpoint writes) by the first
  // rank holding it: the rank of query head k * g.
  int first_holder_of_kv_head(int64_t k, const LlamaConfig& cfg) const;
  // Some key/value head lives on more than one rank (gradients need summing across replicas).
  bool replicates_kv_heads(const LlamaConfig& cfg) const { return cfg.num_key_value_heads < tp; }
  std::string describe() const;  // "tp rank 1 of 3: heads 2-3, kv heads 0-1, ffn 256-511, vocab 86-171"
};

}  // namespace llama4d
