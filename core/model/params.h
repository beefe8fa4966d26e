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
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/model/config.h"
#include "core/model/tp_layout.h"

namespace llama4d {

struct ParamSpec {
  std::string name;             // Hugging Face tensor name
  std::vector<int64_t> shape;   // e.g. {nh*hd, C}: what this rank holds
  int64_t offset = 0;           // element offset into the flat buffer
  int64_t numel = 0;
  int layer = -1;               // transformer layer index, -1 for embedding / final norm / head
  bool weight_decay = true;     // false for RMSNorm weights (AdamW skips them)
  // Mixture of experts: the expert whose w1/w2/w3 this is (block_sparse_moe.experts.N), -1 for
  // every other tensor. Under expert parallelism a rank holds only its shard's experts.
  int64_t expert = -1;
  // Tensor parallelism (core/model/tp_layout.h): this rank holds the block of rows
  // [row_begin, row_begin + shape[0]) and columns [col_begin, col_begin + shape[1]) of the whole
  // tensor, whose shape is whole_shape. Without slicing whole_shape == shape.
  std::vector<int64_t> whole_shape{};  // empty: not sliced
  int64_t row_begin = 0, col_begin = 0;
  // Elements [counted_begin, counted_end) of the slice are this rank's to count: in the global
  // gradient norm and when writing checkpoints. The rest are replicas another tensor-parallel
  // rank counts (the RMSNorm gains on ranks > 0, key/value heads held by several ranks).
  int64_t counted_begin = 0, counted_end = -1;  // -1: to the end
  // Initialisation: element j of the whole tensor takes normal draw first_draw + j of the
  // model's stream (core/model/initialization.h), wherever the spec lands in a rank's buffer.
  int64_t first_draw = 0;

  bool sliced() const { return !whole_shape.empty() && whole_shape != shape; }
  const std::vector<int64_t>& full_shape() const { return whole_shape.empty() ? shape : whole_shape; }
  int64_t whole_numel() const;
  int64_t counted_hi() const { return counted_end < 0 ? numel : counted_end; }
};

// The specs in flat-buffer order; the last spec's offset + numel is the total count.
std::vector<ParamSpec> llama_param_specs(const LlamaConfig& cfg);
// The specs of tensor-parallel rank layout.rank: the same tensors in the same order, each cut to
// that rank's slice.
std::vector<ParamSpec> llama_param_specs(const LlamaConfig& cfg, const TpLayout& layout);

// Elements [lo, hi) of spec p's slice (row-major in its own shape) as runs that are contiguous
// in the whole tensor too: fn(slice_index, whole_index, count), in order.
template <class Fn>
void for_each_whole_run(const ParamSpec& p, int64_t lo, int64_t hi, Fn&& fn) {
  if (!p.sliced() || p.shape.size() == 1 || p.shape[1] == p.whole_shape[1]) {
    const int64_t cols = p.full_shape().size() > 1 ? p.full_shape()[1] : 1;
    if (lo < hi) fn(lo, p.row_begin * cols + lo, hi - lo);  // rows slice: one run
    return;
  }
  const int64_t cols = p.shape[1], whole_cols = p.whole_shape[1];
  for (int64_t i = lo; i < hi;) {
    const int64_t row = i / cols, col = i % cols, n = std::min(hi - i, cols - col);
    fn(i, (p.row_begin + row) * whole_cols + p.col_begin + col, n);
    i += n;
  }
}

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
