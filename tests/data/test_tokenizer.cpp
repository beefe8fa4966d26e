// Byte tokenizer: ids are bytes, specials only on request, decode inverts encode.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/data/tokenizer.h"
#include "core/error.h"

namespace llama4d {
namespace {

TEST(Tokenizer, EveryByteRoundTripsToItsOwnId) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  ByteTokenizer tok;
  const std::vector<int32_t> ids = tok.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[size_t(b)], b) << "byte " << b;
  EXPECT_EQ(tok.decode(ids), all);
}

TEST(Tokenizer, MultiByteUtf8IsSplitIntoItsBytes) {
  // "é" U+00E9 = C3 A9, "€" U+20AC = E2 82 AC, "𝄞" U+1D11E = F0 9D 84 9E (hand-encoded).
  const std::string text = "h\xC3\xA9 \xE2\x82\xAC\xF0\x9D\x84\x9E";
  ByteTokenizer tok;
  const std::vector<int32_t> expected = {'h', 0xC3, 0xA9, ' ', 0xE2, 0x82, 0xAC, 0xF0, 0x9D, 0x84, 0x9E};
  EXPECT_EQ(tok.encode(text), expected);
  EXPECT_EQ(tok.decode(expected), text);
}

TEST(Tokenizer, RandomBytesRoundTripAndNeverProduceSpecials) {
  ByteTokenizer tok;
  uint64_t state = 12345;
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    for (int i = 0; i < trial; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;  // Knuth's MMIX LCG
      s.push_back(static_cast<char>(state >> 56));
    }
    const std::vector<int32_t> ids = tok.encode(s);
    ASSERT_EQ(ids.size(), s.size());
    for (int32_t id : ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, 256);
      ASSERT_FALSE(ByteTokenizer::is_special(id));
    }
    ASSERT_EQ(tok.decode(ids), s);
  }
}

TEST(Tokenizer, SpecialTokenTextIsEncodedAsPlainBytes) {
  ByteTokenizer tok;
  const std::string text = "<|end_of_text|>";
  const std::vector<int32_t> ids = tok.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i], int32_t(static_cast<unsigned char>(text[i])));
}

TEST(Tokenizer, BosAndEosOnlyWhenAsked) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.encode("ab", {.add_bos = true}), (std::vector<int32_t>{256, 'a', 'b'}));
  EXPECT_EQ(tok.encode("ab", {.add_bos = true, .add_eos = true}), (std::vector<int32_t>{256, 'a', 'b', 257}));
  EXPECT_EQ(tok.encode(""), std::vector<int32_t>{});
}

TEST(Tokenizer, DecodeSkipsOrRendersSpecials) {
  ByteTokenizer tok;
  const std::vector<int32_t> ids = {256, 'h', 'i', 257, 258, 263};
  EXPECT_EQ(tok.decode(ids), "hi");
  EXPECT_EQ(tok.decode(ids, {.render_specials = true}),
            "<|begin_of_text|>hi<|end_of_text|><|reserved_special_token_0|><|reserved_special_token_5|>");
}

TEST(Tokenizer, VocabularyLayout) {
  EXPECT_EQ(ByteTokenizer::vocab_size(), 264);
  EXPECT_FALSE(ByteTokenizer::is_special(255));
  EXPECT_TRUE(ByteTokenizer::is_special(256));
  EXPECT_TRUE(ByteTokenizer::is_special(263));
  EXPECT_FALSE(ByteTokenizer::is_special(264));
  EXPECT_EQ(ByteTokenizer::special_name(256), "<|begin_of_text|>");
  EXPECT_EQ(ByteTokenizer::special_name(257), "<|end_of_text|>");
  EXPECT_THROW(ByteTokenizer::special_name(65), InputError);
}

TEST(Tokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  ByteTokenizer tok;
  EXPECT_THROW(tok.decode(std::vector<int32_t>{'a', 264}), InputError);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{-1}), InputError);
  try {
    tok.decode(std::vector<int32_t>{999});
    FAIL() << "no throw";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("999"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace llama4d
