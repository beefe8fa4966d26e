#pragma once
// Picking the next token from logits: greedy, or temperature + nucleus (top-p) sampling with a
// seeded, platform-independent generator.
#include <cstdint>
#include <span>

namespace llama4d {

struct SamplerOptions {
  double temperature = 0.0;  // 0: greedy (argmax)
  double top_p = 1.0;        // keep the smallest set of tokens whose probability mass >= top_p
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& opt);
  // logits[V] -> token id. Token ids >= allowed_vocab are never picked (e.g. special tokens).
  int32_t next(std::span<const float> logits, int64_t allowed_vocab);

 private:
  double uniform();  // [0, 1)
  SamplerOptions opt_;
  uint64_t state_;
};

}  // namespace llama4d
