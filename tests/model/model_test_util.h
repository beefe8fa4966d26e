#pragma once
// Shared helpers of the model tests: tiny configs, deterministic token/target batches,
// parameter perturbation, and relative-error measures. Everything here is independent of the
// code under test except the public Llama interface.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/model/config.h"
#include "core/model/llama.h"

namespace llama4d::test {

// The shape the brief asks for: small enough for finite differences over every tensor, large
// enough to have GQA (nh=4 over nkv=2), two layers, and more than one batch row.
inline LlamaConfig tiny_config(bool tied, bool rope_scaling) {
  LlamaConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.max_position_embeddings = 16;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = tied;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  if (rope_scaling) {
    // head_dim 8 (q_dim 32 != hidden 16, as HF allows) gives inverse frequencies
    // 1, 0.1, 0.01, 0.001 -> wavelengths 6.3, 63, 628, 6283. With original length 1024,
    // low factor 1 and high factor 8 the bands are: < 128 kept, > 1024 divided by `factor`,
    // and 628 in the interpolated band, so all three branches of llama3 scaling are used.
    c.head_dim = 8;
    c.rope_scaling = RopeScaling{.rope_type = "llama3", .factor = 8.0, .low_freq_factor = 1.0,
                                 .high_freq_factor = 8.0, .original_max_position_embeddings = 1024};
  }
  return c;
}

// splitmix64, written here again so the tests do not depend on the model's generator.
inline uint64_t next_u64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline double next_uniform(uint64_t& s) {  // [0, 1)
  return double(next_u64(s) >> 11) * 0x1.0p-53;
}
inline int64_t next_index(uint64_t& s, int64_t n) {
  return int64_t(next_u64(s) % uint64_t(n));
}

// tokens[B*T] uniform over the vocabulary; targets are the next token, with a few set to -1
// (ignored) when `ignore_some` is true.
struct Batch {
  int64_t B = 0, seq = 0;
  std::vector<int32_t> tokens, targets;
};
inline Batch make_batch(int64_t B, int64_t T, int64_t V, uint64_t seed, bool ignore_some) {
  Batch b{B, T, std::vector<int32_t>(size_t(B * T)), std::vector<int32_t>(size_t(B * T))};
  uint64_t s = seed;
  for (auto& t : b.tokens) t = int32_t(next_index(s, V));
  for (int64_t i = 0; i < B * T; ++i) b.targets[size_t(i)] = int32_t(next_index(s, V));
  if (ignore_some) {
    b.targets[1] = -1;
    b.targets[size_t(B * T - 1)] = -1;
    b.targets[size_t(T + 2)] = -1;
  }
  return b;
}

// Moves the model away from its N(0, 0.02) / ones initialisation so every nonlinearity is
// exercised with non-trivial inputs: matrices get std ~0.3, RMSNorm gains land in [0.5, 1.5].
template <class T>
void perturb_params(Llama<T>& m, uint64_t seed) {
  uint64_t s = seed;
  for (const ParamSpec& p : m.param_specs()) {
    T* w = m.params() + p.offset;
    for (int64_t i = 0; i < p.numel; ++i) {
      const double u = next_uniform(s) - 0.5;
      w[i] = p.shape.size() == 1 ? T(1.0 + u) : T(u);
    }
  }
}

// max|a-b| / max(max|b|, tiny): the per-tensor relative error used by every comparison.
// A NaN or infinity anywhere gives +inf (std::max would silently skip a NaN).
template <class A, class B>
double rel_error(const A* a, const B* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::abs(double(a[i]) - double(b[i]));
    if (!std::isfinite(d)) return HUGE_VAL;
    num = std::max(num, d);
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / std::max(den, 1e-300);
}

// Every gradient of a whole-residency model, as one flat vector.
template <class T>
std::vector<T> flat_grads(Llama<T>& m) {
  return std::vector<T>(m.grads(), m.grads() + m.num_params());
}

// The same bits (two empty vectors are equal; memcmp must not see their null data).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace llama4d::test
