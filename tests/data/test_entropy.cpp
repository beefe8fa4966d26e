// Unigram entropy and cross-entropy against closed forms.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/data/entropy.h"
#include "core/error.h"

namespace llama4d {
namespace {

TEST(UnigramEntropy, ClosedForms) {
  const std::vector<int32_t> four = {'a', 'b', 'c', 'd', 'd', 'c', 'b', 'a'};
  const UnigramEntropy h = unigram_entropy(four);
  EXPECT_NEAR(h.nats, std::log(4.0), 1e-12);
  EXPECT_NEAR(h.bits, 2.0, 1e-12);
  EXPECT_EQ(h.tokens, 8);
  EXPECT_EQ(h.distinct, 4);

  EXPECT_EQ(unigram_entropy(std::vector<int32_t>(10, 'z')).nats, 0.0);
  EXPECT_EQ(unigram_entropy(std::vector<int32_t>{}).tokens, 0);

  // p = (3/4, 1/4): H = -(3/4 ln 3/4 + 1/4 ln 1/4).
  const UnigramEntropy skew = unigram_entropy(std::vector<int32_t>{1, 1, 1, 2});
  EXPECT_NEAR(skew.nats, -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)), 1e-12);
  EXPECT_NEAR(skew.bits, 0.8112781244591328, 1e-12);

  // All 256 bytes once each: 8 bits exactly. Specials count too.
  std::vector<int32_t> bytes(256);
  for (int i = 0; i < 256; ++i) bytes[size_t(i)] = i;
  EXPECT_NEAR(unigram_entropy(bytes).bits, 8.0, 1e-12);
  EXPECT_EQ(unigram_entropy(std::vector<int32_t>{256, 257}).distinct, 2);
}

TEST(UnigramEntropy, CrossEntropyWithAddOneSmoothing) {
  const std::vector<int32_t> fit = {'a', 'a', 'b'};
  const std::vector<int32_t> eval = {'a', 'b', 'c'};
  // Over the 264 ids of the byte vocabulary: q_a = (2+1)/(3+264), q_b = 2/267, q_c = 1/267 (never seen in fit).
  const double expected = -(std::log(3.0 / 267) + std::log(2.0 / 267) + std::log(1.0 / 267)) / 3;
  const UnigramEntropy h = unigram_cross_entropy(fit, eval);
  EXPECT_NEAR(h.nats, expected, 1e-12);
  EXPECT_NEAR(h.bits, expected / std::log(2.0), 1e-12);
  EXPECT_EQ(h.tokens, 3);

  // alpha = 0.5 over a 4-id vocabulary.
  const std::vector<int32_t> small = {0, 1, 1, 3};
  const double q0 = 1.5 / 6, q1 = 2.5 / 6, q2 = 0.5 / 6;
  EXPECT_NEAR(unigram_cross_entropy(small, std::vector<int32_t>{0, 1, 2}, 4, 0.5).nats,
              -(std::log(q0) + std::log(q1) + std::log(q2)) / 3, 1e-12);
}

TEST(UnigramEntropy, RejectsBadIdsAndOptions) {
  EXPECT_THROW(unigram_entropy(std::vector<int32_t>{264}), InputError);
  EXPECT_THROW(unigram_entropy(std::vector<int32_t>{-1}), InputError);
  EXPECT_THROW(unigram_cross_entropy(std::vector<int32_t>{1}, std::vector<int32_t>{300}), InputError);
  EXPECT_THROW(unigram_cross_entropy(std::vector<int32_t>{1}, std::vector<int32_t>{1}, 256, 0.0), InputError);
  EXPECT_THROW(unigram_cross_entropy(std::vector<int32_t>{5}, std::vector<int32_t>{1}, 4), InputError);
}

}  // namespace
}  // namespace llama4d
