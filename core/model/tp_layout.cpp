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

}  // namespace llama4d
