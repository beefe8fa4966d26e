#pragma once
// Helpers shared by the optimizer tests: hand-made parameter layouts and random buffers.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <span>
#include <vector>

#include "core/model/params.h"

namespace llama4d::test {

// An optimizer's state (a span over its buffer) as a vector, for comparisons.
template <class T>
std::vector<T> as_vector(std::span<const T> s) {
  return std::vector<T>(s.begin(), s.end());
}

struct TensorDesc {
  std::string name;
  int64_t numel;
  bool decay;
};

// Specs tiling the flat buffer in the given order (what llama_param_specs produces).
inline std::vector<ParamSpec> make_specs(const std::vector<TensorDesc>& tensors) {
  std::vector<ParamSpec> specs;
  int64_t offset = 0;
  for (const TensorDesc& t : tensors) {
    ParamSpec s;
    s.name = t.name;
    s.shape = {t.numel};
    s.offset = offset;
    s.numel = t.numel;
    s.weight_decay = t.decay;
    specs.push_back(s);
    offset += t.numel;
  }
  return specs;
}

// A small Llama-like layout: decayed matrices with no-decay RMSNorm weights between them.
inline std::vector<ParamSpec> small_llama_like_specs() {
  return make_specs({{"model.embed_tokens.weight", 37, true},
                     {"model.layers.0.input_layernorm.weight", 5, false},
                     {"model.layers.0.self_attn.q_proj.weight", 25, true},
                     {"model.layers.0.post_attention_layernorm.weight", 5, false},
                     {"model.layers.0.mlp.down_proj.weight", 15, true},
                     {"model.norm.weight", 5, false},
                     {"lm_head.weight", 37, true}});
}

inline int64_t total_numel(const std::vector<ParamSpec>& specs) {
  return specs.empty() ? 0 : specs.back().offset + specs.back().numel;
}

// Per-element decay flags, written straight from the specs (the reference's view of the mask).
inline std::vector<bool> decay_flags(const std::vector<ParamSpec>& specs) {
  std::vector<bool> flags(static_cast<size_t>(total_numel(specs)));
  for (const ParamSpec& s : specs) {
    for (int64_t i = s.offset; i < s.offset + s.numel; ++i) flags[static_cast<size_t>(i)] = s.weight_decay;
  }
  return flags;
}

// Uniform values in [lo, hi), reproducible from the seed.
template <class T>
std::vector<T> random_vector(int64_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = static_cast<T>(dist(rng));
  return v;
}

// Gradients with magnitudes spread over several decades, as real gradients are.
template <class T>
std::vector<T> random_grads(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::uniform_real_distribution<double> decade(-4.0, 0.0);
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = static_cast<T>(unit(rng) * std::pow(10.0, decade(rng)));
  return v;
}

}  // namespace llama4d::test
