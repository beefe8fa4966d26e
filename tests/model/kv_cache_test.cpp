// KV-cache decoding must produce the logits a full forward over the same prefix produces at
// its last position: a prompt fed in one decode call, a chunk of two, then one token at a
// time, every step compared, for a batch of two different sequences.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "core/error.h"
#include "core/model/decode.h"
#include "core/model/llama.h"
#include "tests/ops/operand_log.h"
#include "tests/model/model_test_util.h"

namespace llama4d {
namespace {

template <class T>
void check_decode_matches_forward(bool tied, bool rope_scaling, double tol) {
  const LlamaConfig cfg = test::tiny_config(tied, rope_scaling);
  const int64_t B = 2, total = 9, V = cfg.vocab_size;
  Llama<T> m(cfg);
  m.init_weights(17);
  test::perturb_params(m, 18);
  const test::Batch seq = test::make_batch(B, total, V, 19, false);

  // Decode calls: prompt of 3 in one call, then 2 at once, then single tokens.
  const std::vector<int64_t> chunks = {3, 2, 1, 1, 1, 1};
  Decoder<T> decoder(m, B, total);
  std::vector<T> step_logits(size_t(B * V));
  int64_t len = 0;
  double worst = 0;
  for (int64_t n : chunks) {
    std::vector<int32_t> chunk(size_t(B * n));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < n; ++t) chunk[size_t(b * n + t)] = seq.tokens[size_t(b * total + len + t)];
    decoder.feed(chunk.data(), n, step_logits.data());
    len += n;
    ASSERT_EQ(decoder.len(), len);

    // Reference: a fresh training forward over the prefix [0, len) of each row.
    std::vector<int32_t> prefix(size_t(B * len));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < len; ++t) prefix[size_t(b * len + t)] = seq.tokens[size_t(b * total + t)];
    m.forward(prefix.data(), nullptr, B, len);
    for (int64_t b = 0; b < B; ++b) {
      const T* ref = m.logits() + (b * len + len - 1) * V;
      const double rel = test::rel_error(step_logits.data() + b * V, ref, V);
      EXPECT_LE(rel, tol) << "row " << b << " after " << len << " tokens";
      worst = std::max(worst, rel);
    }
  }
  ASSERT_EQ(len, total);
  std::printf("decode vs forward (%s, tied=%d, rope_scaling=%d): worst rel error %.3g\n",
              sizeof(T) == 8 ? "fp64" : "fp32", int(tied), int(rope_scaling), worst);
  // The cache is full now: one more token must be refused, not written past the end.
  std::vector<int32_t> one(size_t(B), 0);
  EXPECT_THROW(decoder.feed(one.data(), 1, step_logits.data()), InputError);
}

TEST(KvCache, DecodeMatchesForwardFp64) {
  check_decode_matches_forward<double>(false, false, 1e-12);
  check_decode_matches_forward<double>(true, true, 1e-12);
}

TEST(KvCache, DecodeMatchesForwardFp32) {
  check_decode_matches_forward<float>(false, false, 1e-5);
  check_decode_matches_forward<float>(true, true, 1e-5);
}

// Rows of a batch decode independently: row 1's logits do not depend on row 0's tokens.
TEST(KvCache, BatchRowsAreIndependent) {
  const LlamaConfig cfg = test::tiny_config(false, false);
  const int64_t V = cfg.vocab_size;
  Llama<double> m(cfg);
  m.init_weights(23);
  test::perturb_params(m, 24);
  std::vector<int32_t> a = {1, 2, 3, 4, 5, 6}, c = {9, 8, 7, 4, 5, 6};  // [2, 3] each
  std::vector<double> la(size_t(2 * V)), lc(size_t(2 * V));
  Decoder<double> da(m, 2, 3), dc(m, 2, 3);
  da.feed(a.data(), 3, la.data());
  dc.feed(c.data(), 3, lc.data());
  for (int64_t v = 0; v < V; ++v) EXPECT_EQ(la[size_t(V + v)], lc[size_t(V + v)]);
  EXPECT_GT(test::rel_error(la.data(), lc.data(), V), 1e-6);  // row 0 did change
}

// Decoding, as `generate` runs it on a GPU: every kernel takes the backend's memory (the
// prompt's ids and the returned logits are the host's; decode moves them).
TEST(KvCache, DecodeTakesBackendMemory) {
  test::LoggingOperands logging;
  const LlamaConfig cfg = test::tiny_config(false, true);
  Llama<float> m(cfg);
  m.init_weights(17);
  Decoder<float> decoder(m, 2, 4);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
  std::vector<float> logits(size_t(2 * cfg.vocab_size));
  decoder.feed(prompt.data(), 3, logits.data());
  decoder.feed(prompt.data(), 1, logits.data());
  const test::OperandLog log = logging.log();
  EXPECT_GT(log.products_as_stored, 0);
  EXPECT_TRUE(log.not_backend_memory.empty()) << log.not_backend_memory.front();
}

TEST(KvCache, RejectsBadInput) {
  const LlamaConfig cfg = test::tiny_config(false, false);
  Llama<double> m(cfg);
  m.init_weights(1);
  EXPECT_THROW(Decoder<double>(m, 1, cfg.max_position_embeddings + 1), InputError);
  Decoder<double> decoder(m, 2, 4);
  std::vector<double> logits(size_t(2 * cfg.vocab_size));
  std::vector<int32_t> bad = {0, int32_t(cfg.vocab_size)};
  EXPECT_THROW(decoder.feed(bad.data(), 1, logits.data()), InputError);
  std::vector<int32_t> neg = {-1, 0};
  EXPECT_THROW(decoder.feed(neg.data(), 1, logits.data()), InputError);
  std::vector<int32_t> five(10, 1);
  EXPECT_THROW(decoder.feed(five.data(), 5, logits.data()), InputError);  // longer than the cache
  EXPECT_EQ(decoder.len(), 0);
}

// A chat turn whose ids differ from what was generated: rewinding to the common prefix and
// feeding the rest gives the logits of a fresh cache fed the whole new sequence.
TEST(KvCache, RewindThenFeedEqualsAFreshCache) {
  const LlamaConfig cfg = test::tiny_config(false, true);
  Llama<double> m(cfg);
  m.init_weights(3);
  test::perturb_params(m, 4);
  const int64_t V = cfg.vocab_size;
  const std::vector<int32_t> first = {5, 9, 2, 7, 7, 1}, second = {5, 9, 2, 4, 8};
  Decoder<double> reused(m, 1, 8), fresh(m, 1, 8);
  std::vector<double> a(static_cast<size_t>(V)), b(static_cast<size_t>(V));
  reused.feed(first.data(), int64_t(first.size()), a.data());
  reused.rewind(3);
  EXPECT_EQ(reused.len(), 3);
  reused.feed(second.data() + 3, 2, a.data());
  fresh.feed(second.data(), int64_t(second.size()), b.data());
  for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(a[size_t(v)], b[size_t(v)], 1e-12) << "logit " << v;
  EXPECT_THROW(reused.rewind(6), InputError);  // past what the cache holds
  EXPECT_THROW(reused.rewind(-1), InputError);
}

}  // namespace
}  // namespace llama4d
