#pragma once
// Where every parameter lives. All parameters of a model sit in ONE flat buffer, in this order:
//   model.embed_tokens.weight            [V, C]
//   for each layer i:
//     model.layers.i.input_layernorm.weight            [C]
//     model.layers.i.self_attn.q_proj.weight           [nh*hd, C]
//     model.layers.i.self_attn.k_proj.weight           [nkv*hd, C]
//     model.layers.i.self_attn.v_proj.weight           [nkv*hd, C]
//     model.layers.i.self_attn.o_proj.weight           [C, nh*hd]
//     model.layers.i.post_attention_layernorm.weight   [C]
//     model.layers.i.mlp.gate_proj.weight              [I, C]
//     model.layers.i.mlp.up_proj.weight                [I, C]
//     model.layers.i.mlp.down_proj.weight              [C, I]
//   model.norm.weight                    [C]
//   lm_head.weight                       [V, C]   (absent when tie_word_embeddings)
// Names and [out, in] layouts are Hugging Face Llama's, so checkpoints need no renaming, and
// q/k use the rotate-half RoPE convention natively (no permutation of Meta's interleaved rows).
// One flat buffer is what gradient buckets and ZeRO / FSDP shards slice later.
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/config.h"

namespace llama4d {

struct ParamSpec {
  std::string name;             // Hugging Face tensor name
  std::vector<int64_t> shape;   // e.g. {nh*hd, C}
  int64_t offset = 0;           // element offset into the flat buffer
  int64_t numel = 0;
  int layer = -1;               // transformer layer index, -1 for embedding / final norm / head
  bool weight_decay = true;     // false for RMSNorm weights (AdamW skips them)
};

// The specs in flat-buffer order; the last spec's offset + numel is the total count.
std::vector<ParamSpec> llama_param_specs(const LlamaConfig& cfg);

// [begin, end) element range in the flat buffer of layer `layer`'s parameters.
struct ParamRange {
  int64_t begin = 0, end = 0;
};
ParamRange layer_param_range(const std::vector<ParamSpec>& specs, int layer);

// Elements in the flat buffer `specs` describe: the largest end, so specs need not be sorted.
int64_t flat_numel(const std::vector<ParamSpec>& specs);

// The part of one spec inside a flat range [begin, end): flat elements [lo, hi), lo < hi.
struct SpecOverlap {
  const ParamSpec* spec = nullptr;
  int64_t lo = 0, hi = 0;
};
// Every spec overlapping [begin, end), in the order of `specs` (a sharded rank's pieces of it).
std::vector<SpecOverlap> overlapping_specs(const std::vector<ParamSpec>& specs, int64_t begin, int64_t end);

// Finds a spec by name; throws InputError if absent.
const ParamSpec& find_param(const std::vector<ParamSpec>& specs, const std::string& name);

}  // namespace llama4d
