#include "core/data/entropy.h"

#include <array>
#include <cmath>
#include <string>

#include "core/error.h"

namespace llama4d {

namespace {

using Counts = std::array<int64_t, kByteVocabSize>;

Counts count_ids(TokenSpan tokens, int64_t vocab_size) {
  Counts counts{};
  for (int32_t id : tokens) {
    if (id < 0 || id >= vocab_size) {
      throw InputError("token id " + std::to_string(id) + " is outside [0, " + std::to_string(vocab_size) +
                       ") in a unigram count");
    }
    ++counts[size_t(id)];
  }
  return counts;
}

int64_t num_distinct(const Counts& counts) {
  int64_t d = 0;
  for (int64_t c : counts) d += c > 0;
  return d;
}

}  // namespace

UnigramEntropy unigram_entropy(TokenSpan tokens) {
  UnigramEntropy h;
  const Counts counts = count_ids(tokens, kByteVocabSize);
  h.tokens = int64_t(tokens.size());
  h.distinct = num_distinct(counts);
  if (h.tokens == 0) return h;
  const double n = double(h.tokens);
  for (int64_t c : counts) {
    if (c == 0) continue;  // 0 ln 0 = 0
    const double p = double(c) / n;
    h.nats -= p * std::log(p);
  }
  h.bits = h.nats / std::log(2.0);
  return h;
}

UnigramEntropy unigram_cross_entropy(TokenSpan fit, TokenSpan eval, int64_t vocab_size, double alpha) {
  if (vocab_size < 1 || vocab_size > kByteVocabSize) {
    throw InputError("unigram vocab_size must be in [1, " + std::to_string(kByteVocabSize) + "], got " +
                     std::to_string(vocab_size));
  }
  if (!(alpha > 0.0)) throw InputError("unigram smoothing alpha must be positive, got " + std::to_string(alpha));
  const Counts fit_counts = count_ids(fit, vocab_size);
  const Counts eval_counts = count_ids(eval, vocab_size);
  UnigramEntropy h;
  h.tokens = int64_t(eval.size());
  h.distinct = num_distinct(eval_counts);
  if (h.tokens == 0) return h;
  const double denom = double(fit.size()) + alpha * double(vocab_size);
  double sum = 0;  // grouped by id: sum_v count_eval_v * -ln q_v
  for (int64_t v = 0; v < vocab_size; ++v) {
    if (eval_counts[size_t(v)] == 0) continue;
    const double q = (double(fit_counts[size_t(v)]) + alpha) / denom;
    sum -= double(eval_counts[size_t(v)]) * std::log(q);
  }
  h.nats = sum / double(h.tokens);
  h.bits = h.nats / std::log(2.0);
  return h;
}

}  // namespace llama4d
