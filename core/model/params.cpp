// The flat parameter layout: names, shapes and offsets in Hugging Face order (see params.h).
#include "core/model/params.h"

#include <algorithm>

#include "core/error.h"

namespace llama4d {

std::vector<ParamSpec> llama_param_specs(const LlamaConfig& cfg) {
  cfg.validate();
  const int64_t V = cfg.vocab_size, C = cfg.hidden_size, I = cfg.intermediate_size;
  const int64_t q = cfg.q_dim(), kv = cfg.kv_dim();

  std::vector<ParamSpec> specs;
  specs.reserve(size_t(3 + 9 * cfg.num_hidden_layers));
  int64_t offset = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape, int layer, bool decay) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    specs.push_back(ParamSpec{std::move(name), std::move(shape), offset, numel, layer, decay});
    offset += numel;
  };

  add("model.embed_tokens.weight", {V, C}, -1, true);
  for (int l = 0; l < int(cfg.num_hidden_layers); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {C}, l, false);
    add(p + "self_attn.q_proj.weight", {q, C}, l, true);
    add(p + "self_attn.k_proj.weight", {kv, C}, l, true);
    add(p + "self_attn.v_proj.weight", {kv, C}, l, true);
    add(p + "self_attn.o_proj.weight", {C, q}, l, true);
    add(p + "post_attention_layernorm.weight", {C}, l, false);
    add(p + "mlp.gate_proj.weight", {I, C}, l, true);
    add(p + "mlp.up_proj.weight", {I, C}, l, true);
    add(p + "mlp.down_proj.weight", {C, I}, l, true);
  }
  add("model.norm.weight", {C}, -1, false);
  if (!cfg.tie_word_embeddings) add("lm_head.weight", {V, C}, -1, true);
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
