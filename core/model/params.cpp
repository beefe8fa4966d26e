// The flat parameter layout: names, shapes and offsets in Hugging Face order (see params.h).
#include "core/model/params.h"

#include <algorithm>

#include "core/error.h"

namespace llama4d {

int64_t ParamSpec::whole_numel() const {
  int64_t n = 1;
  for (int64_t d : full_shape()) n *= d;
  return n;
}

std::vector<ParamSpec> llama_param_specs(const LlamaConfig& cfg) { return llama_param_specs(cfg, TpLayout{}); }

std::vector<ParamSpec> llama_param_specs(const LlamaConfig& cfg, const TpLayout& t) {
  cfg.validate();
  const int64_t V = cfg.vocab_size, C = cfg.hidden_size, I = cfg.intermediate_size, hd = cfg.head_dim;
  const int64_t q = cfg.q_dim(), kv = cfg.kv_dim();
  const bool sliced = t.sliced();
  // Without tensor parallelism the one "slice" is everything.
  const int64_t heads_begin = sliced ? t.heads_begin : 0, heads = sliced ? t.heads : cfg.num_attention_heads;
  const int64_t kv_begin = sliced ? t.kv_heads_begin : 0, kv_heads = sliced ? t.kv_heads : cfg.num_key_value_heads;
  const int64_t ffn_begin = sliced ? t.ffn_begin : 0, ffn = sliced ? t.ffn : I;
  const int64_t vocab_begin = sliced ? t.vocab_begin : 0, vocab_rows = sliced ? t.vocab_rows : V;
  // Replicated tensors are counted by tensor-parallel rank 0; a key/value head by its first holder.
  const bool counts_replicas = t.rank == 0;
  int64_t counted_kv_begin = kv_heads, counted_kv_end = kv_heads;  // local head indices
  for (int64_t k = 0; k < kv_heads; ++k)
    if (!sliced || t.first_holder_of_kv_head(kv_begin + k, cfg) == t.rank) {
      counted_kv_begin = std::min(counted_kv_begin, k);
      counted_kv_end = k + 1;
    }

  std::vector<ParamSpec> specs;
  specs.reserve(size_t(3 + 9 * cfg.num_hidden_layers));
  int64_t offset = 0, draws = 0;
  // A slice of rows [row_begin, +shape[0]) and columns [col_begin, +shape[1]) of the whole tensor.
  auto add = [&](std::string name, std::vector<int64_t> shape, std::vector<int64_t> whole, int64_t row_begin,
                 int64_t col_begin, int layer, bool decay) {
    ParamSpec p;
    p.name = std::move(name);
    p.numel = 1;
    for (int64_t d : shape) p.numel *= d;
    p.shape = std::move(shape);
    p.offset = offset;
    p.layer = layer;
    p.weight_decay = decay;
    p.whole_shape = std::move(whole);
    p.row_begin = row_begin, p.col_begin = col_begin;
    const bool replicated = p.shape.size() == 1;
    p.counted_begin = 0;
    p.counted_end = replicated && !counts_replicas ? 0 : p.numel;
    p.first_draw = draws;
    if (!replicated) draws += p.whole_numel();  // RMSNorm gains start at 1 and draw nothing
    specs.push_back(std::move(p));
    offset += specs.back().numel;
  };

  add("model.embed_tokens.weight", {vocab_rows, C}, {V, C}, vocab_begin, 0, -1, true);
  for (int l = 0; l < int(cfg.num_hidden_layers); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {C}, {C}, 0, 0, l, false);
    add(p + "self_attn.q_proj.weight", {heads * hd, C}, {q, C}, heads_begin * hd, 0, l, true);
    for (const char* proj : {"self_attn.k_proj.weight", "self_attn.v_proj.weight"}) {
      add(p + proj, {kv_heads * hd, C}, {kv, C}, kv_begin * hd, 0, l, true);
      specs.back().counted_begin = counted_kv_begin * hd * C;
      specs.back().counted_end = counted_kv_end * hd * C;
    }
    add(p + "self_attn.o_proj.weight", {C, heads * hd}, {C, q}, 0, heads_begin * hd, l, true);
    add(p + "post_attention_layernorm.weight", {C}, {C}, 0, 0, l, false);
    if (cfg.moe()) {  // Hugging Face Mixtral's names, in MoeWeights' order (core/model/moe.h)
      if (sliced) throw InputError("tensor parallelism of mixture-of-experts layers is not supported");
      const int64_t E = cfg.num_local_experts;
      add(p + "block_sparse_moe.gate.weight", {E, C}, {E, C}, 0, 0, l, true);
      for (int64_t e = 0; e < E; ++e) {
        const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
        add(x + "w1.weight", {I, C}, {I, C}, 0, 0, l, true);
        specs.back().expert = e;
        add(x + "w2.weight", {C, I}, {C, I}, 0, 0, l, true);
        specs.back().expert = e;
        add(x + "w3.weight", {I, C}, {I, C}, 0, 0, l, true);
        specs.back().expert = e;
      }
      continue;
    }
    add(p + "mlp.gate_proj.weight", {ffn, C}, {I, C}, ffn_begin, 0, l, true);
    add(p + "mlp.up_proj.weight", {ffn, C}, {I, C}, ffn_begin, 0, l, true);
    add(p + "mlp.down_proj.weight", {C, ffn}, {C, I}, 0, ffn_begin, l, true);
  }
  add("model.norm.weight", {C}, {C}, 0, 0, -1, false);
  if (!cfg.tie_word_embeddings) add("lm_head.weight", {vocab_rows, C}, {V, C}, vocab_begin, 0, -1, true);
  return specs;
}

ParamRange layer_param_range(const std::vector<ParamSpec>& specs, int layer) {
  ParamRange r;
  bool found = false;
  for (const ParamSpec& s : specs) {
    if (s.layer != layer) continue;
    if (!found) r.begin = s.offset;
    r.end = s.offset + s.numel;
    found = true;
  }
  if (!found || layer < 0) throw InputError("no parameters for layer " + std::to_string(layer));
  return r;
}

int64_t flat_numel(const std::vector<ParamSpec>& specs) {
  int64_t total = 0;
  for (const ParamSpec& s : specs) total = std::max(total, s.offset + s.numel);
  return total;
}

std::vector<SpecOverlap> overlapping_specs(const std::vector<ParamSpec>& specs, int64_t begin, int64_t end) {
  std::vector<SpecOverlap> out;
  for (const ParamSpec& s : specs) {
    const int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
    if (lo < hi) out.push_back({&s, lo, hi});
  }
  return out;
}

const ParamSpec& find_param(const std::vector<ParamSpec>& specs, const std::string& name) {
  for (const ParamSpec& s : specs)
    if (s.name == name) return s;
  throw InputError("no parameter named '" + name + "'");
}

}  // namespace llama4d
