// The BPE tokenizer's parts, each against hand-worked answers: GPT-2's byte alphabet, U+FFFD
// replacement, Llama 3's pre-tokenizer (Oniguruma's \s, the lookahead, contractions, digit
// triples), merge priority and ignore_merges, special-token modes, the long-word merge, streaming
// decode, and the Tokenizer interface over both tokenizers.
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <map>
#include <random>
#include <set>

#include "core/data/bpe_tokenizer.h"
#include "core/data/byte_level.h"
#include "core/data/pretokenize.h"
#include "core/data/stream_decoder.h"
#include "core/data/utf8.h"
#include "core/error.h"
#include "tests/tokenizer/test_util.h"
#include "tests/tokenizer/tiny_json.h"

namespace llama4d {
namespace {

using test::printable;

TEST(ByteLevel, IsGpt2sTableABijectionOfTheBytes) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t c = byte_level_char(uint8_t(b));
    EXPECT_TRUE(seen.insert(c).second) << "byte " << b;
    EXPECT_EQ(byte_level_byte(c), std::optional<uint8_t>(uint8_t(b)));
  }
  EXPECT_EQ(byte_level_char(' '), U'\u0120');   // 'Ġ'
  EXPECT_EQ(byte_level_char('\n'), U'\u010A');  // 'Ċ'
  EXPECT_EQ(byte_level_char(0), U'\u0100');
  EXPECT_EQ(byte_level_char('A'), U'A');
  EXPECT_EQ(byte_level_char(0xAD), U'\u0143');  // the last of the 68 moved bytes
  EXPECT_EQ(byte_level_char(0xE9), U'\u00E9');
  EXPECT_EQ(to_byte_level(" the"), "\xC4\xA0the");
  EXPECT_EQ(from_byte_level("\xC4\xA0the"), std::optional<std::string>(" the"));
  EXPECT_EQ(from_byte_level("hi there"), std::nullopt);  // ' ' is not in the alphabet
}

TEST(Utf8, InvalidPartsBecomeOneReplacementEachAsPythonDoes) {
  const std::string R = "\xEF\xBF\xBD";
  // Answers of Python's bytes.decode("utf-8", "replace"), worked out by hand.
  EXPECT_EQ(replace_invalid_utf8("abc"), "abc");
  EXPECT_EQ(replace_invalid_utf8("\xE2\x82"), R);                   // a cut-short 3-byte sequence: one
  EXPECT_EQ(replace_invalid_utf8("\xE2\x82 x"), R + " x");
  EXPECT_EQ(replace_invalid_utf8("\xED\xA0\x80"), R + R + R);       // a surrogate: ED cannot take A0
  EXPECT_EQ(replace_invalid_utf8("\xC0\xAF"), R + R);               // overlong lead, stray continuation
  EXPECT_EQ(replace_invalid_utf8("\xF0\x9F\x98" "a"), R + "a");
  EXPECT_EQ(replace_invalid_utf8("\xF4\x90\x80\x80"), R + R + R + R);  // above U+10FFFF
  EXPECT_EQ(replace_invalid_utf8("caf\xE9"), "caf" + R);
  EXPECT_EQ(replace_invalid_utf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  size_t used = 0;
  EXPECT_EQ(replace_invalid_utf8("ab\xF0\x9F\x98", true, &used), "ab");
  EXPECT_EQ(used, 2u);
  EXPECT_EQ(replace_invalid_utf8("ab\xF0\x9F" "c", true, &used), "ab" + R + "c");
  EXPECT_EQ(used, 5u);
}

std::vector<std::string> pieces(std::string_view pattern, std::string_view text) {
  RegexSplitter s(pattern);
  std::vector<std::pair<size_t, size_t>> p;
  s.split(text, p);
  std::vector<std::string> out;
  for (auto [b, e] : p) out.emplace_back(text.substr(b, e - b));
  return out;
}

using V = std::vector<std::string>;

TEST(Llama3PreTokenizer, SplitsAsItsRegexSays) {
  const auto L = kLlama3Pattern;
  EXPECT_EQ(pieces(L, "Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces(L, "I'm HERE'S"), (V{"I", "'m", " HERE", "'S"}));
  EXPECT_EQ(pieces(L, "it'\xC5\xBF"), (V{"it", "'\xC5\xBF"}));  // 'ſ' folds to 's' in Unicode case folding
  EXPECT_EQ(pieces(L, "1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(pieces(L, "a   b"), (V{"a", "  ", " b"}));         // \s+(?!\S) leaves the last space to the word
  EXPECT_EQ(pieces(L, "a   "), (V{"a", "   "}));
  EXPECT_EQ(pieces(L, "x\n\n  y"), (V{"x", "\n\n", " ", " y"}));
  EXPECT_EQ(pieces(L, "a\r\nb"), (V{"a", "\r\n", "b"}));
  EXPECT_EQ(pieces(L, "hi!!\n"), (V{"hi", "!!\n"}));
  EXPECT_EQ(pieces(L, "$foo"), (V{"$foo"}));
  EXPECT_EQ(pieces(L, ""), V{});
  // U+0085 (NEL) is whitespace for Oniguruma (Hugging Face's engine), not for PCRE2's own \s:
  // with the rewrite, two NELs before a letter are a space run and a NEL-led word.
  EXPECT_EQ(pieces(L, "a\xC2\x85\xC2\x85" "b"), (V{"a", "\xC2\x85", "\xC2\x85" "b"}));
  EXPECT_EQ(oniguruma_to_pcre2(R"([^\s\p{L}]\s+(?!\S))"), R"([^\t-\r\x{85}\p{Z}\p{L}][\t-\r\x{85}\p{Z}]+(?![^\t-\r\x{85}\p{Z}]))");
}

TEST(Llama3PreTokenizer, RefusesWhatOnigurumaAndPcre2ReadDifferently) {
  for (const char* p : {R"(\w+)", R"(\bx)", R"([\S])"}) {
    try {
      RegexSplitter s(p);
      ADD_FAILURE() << "accepted " << p;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(RegexSplitter("(unclosed"), InputError);
}

BpeTokenizer tiny(const test::TinySpec& s) { return parse_tokenizer_json(test::tiny_tokenizer_json(s).dump(), "tiny"); }

std::vector<int32_t> ids_of(const BpeTokenizer& t, std::initializer_list<const char*> tokens) {
  std::vector<int32_t> out;
  for (const char* tk : tokens) out.push_back(*t.token_to_id(to_byte_level(tk)));
  return out;
}

TEST(BpeMerges, LowestMergeIndexFirst) {
  // "abc": with "b c" ranked before "a b" the word becomes a + bc, then abc by "a bc".
  const BpeTokenizer t1 = tiny({.extra = {"ab", "bc", "abc"}, .merges = {{"b", "c"}, {"a", "b"}, {"a", "bc"}}, .ignore_merges = false});
  EXPECT_EQ(t1.encode("abc"), ids_of(t1, {"abc"}));
  // "abcab": bc (rank 0), then the second ab (rank 1), then a + bc (rank 2).
  EXPECT_EQ(t1.encode("abcab"), ids_of(t1, {"abc", "ab"}));
  // With "a b" first, the word becomes ab + c, and nothing merges those.
  const BpeTokenizer t2 = tiny({.extra = {"ab", "bc", "abc"}, .merges = {{"a", "b"}, {"b", "c"}, {"a", "bc"}}, .ignore_merges = false});
  EXPECT_EQ(t2.encode("abc"), ids_of(t2, {"ab", "c"}));
  // Equal ranks: the leftmost pair first ("aaa" -> aa + a, not a + aa).
  const BpeTokenizer t3 = tiny({.extra = {"aa"}, .merges = {{"a", "a"}}, .ignore_merges = false});
  EXPECT_EQ(t3.encode("aaa"), ids_of(t3, {"aa", "a"}));
  EXPECT_EQ(t3.encode("aaaaa"), ids_of(t3, {"aa", "aa", "a"}));
}

TEST(BpeMerges, IgnoreMergesTakesAWordInTheVocabularyWhole) {
  // "abc" is a token no merge reaches: whole with ignore_merges, merged otherwise.
  const test::TinySpec spec{.extra = {"ab", "abc"}, .merges = {{"a", "b"}}, .ignore_merges = true};
  EXPECT_EQ(tiny(spec).encode("abc"), ids_of(tiny(spec), {"abc"}));
  test::TinySpec off = spec;
  off.ignore_merges = false;
  EXPECT_EQ(tiny(off).encode("abc"), ids_of(tiny(off), {"ab", "c"}));
  // The whole word is the pre-token: " abc" (with its space) is not in the vocabulary.
  EXPECT_EQ(tiny(spec).encode(" abc"), ids_of(tiny(spec), {" ", "ab", "c"}));
}

// The heap merge of long words (over 64 bytes) against a plain loop written here from the
// file's merges list: repeatedly merge the adjacent pair of lowest rank, leftmost first.
TEST(BpeMerges, LongWordsMergeAsThePlainLoopDoes) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  const nlohmann::json spec = nlohmann::json::parse(test::read_file(test::project_tokenizer_path()));
  std::map<std::pair<int32_t, int32_t>, std::pair<int32_t, int32_t>> rank;  // pair -> (rank, merged)
  const auto& vocab = spec["model"]["vocab"];
  int32_t k = 0;
  for (const auto& m : spec["model"]["merges"]) {
    const std::string a = m[0], b = m[1];
    rank[{vocab[a].get<int32_t>(), vocab[b].get<int32_t>()}] = {k++, vocab[a + b].get<int32_t>()};
  }
  std::mt19937 rng(3);
  const std::string letters = "etaoinshrdlucmfwypvbgkqjxz";
  for (int trial = 0; trial < 60; ++trial) {
    std::string word;
    const size_t n = 65 + rng() % 300;
    for (size_t i = 0; i < n; ++i) word += letters[std::min<size_t>(rng() % 40, letters.size() - 1)];
    std::vector<int32_t> ids;
    for (char c : word) ids.push_back(vocab[to_byte_level(std::string(1, c))].get<int32_t>());
    while (ids.size() > 1) {
      int32_t best = INT32_MAX, merged = -1;
      size_t at = 0;
      for (size_t i = 0; i + 1 < ids.size(); ++i) {
        const auto it = rank.find({ids[i], ids[i + 1]});
        if (it != rank.end() && it->second.first < best) best = it->second.first, merged = it->second.second, at = i;
      }
      if (merged < 0) break;
      ids[at] = merged;
      ids.erase(ids.begin() + std::ptrdiff_t(at) + 1);
    }
    EXPECT_EQ(tok.encode(word), ids) << printable(word);
  }
}

TEST(BpeMerges, AHundredThousandLettersWithoutASpaceEncodeFast) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  for (const std::string& s : {std::string(100000, 'a'), std::string(100000, ' '), std::string(100000, '!')}) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = tok.encode(s);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(sec, 2.0) << printable(s, 8) << " took " << sec << " s";
    EXPECT_EQ(tok.decode(ids), s);
  }
}

TEST(SpecialTokens, TextNamingThemIsOrdinaryUnlessAllowed) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  const int32_t eot = *tok.token_to_id("<|eot_id|>");
  EXPECT_EQ(eot, 3849);
  EXPECT_EQ(tok.encode("<|eot_id|>", {.allow_special = true}), std::vector<int32_t>{eot});
  const std::vector<int32_t> plain = tok.encode("<|eot_id|>");
  EXPECT_GT(plain.size(), 1u);
  for (int32_t id : plain) EXPECT_FALSE(tok.is_special(id)) << id;
  EXPECT_EQ(tok.decode(plain), "<|eot_id|>");
  const std::vector<int32_t> mixed = tok.encode("hi<|eot_id|>there", {.allow_special = true});
  EXPECT_EQ(std::count(mixed.begin(), mixed.end(), eot), 1);
  EXPECT_EQ(tok.decode(mixed), "hithere");
  EXPECT_EQ(tok.decode(mixed, {.render_specials = true}), "hi<|eot_id|>there");
  EXPECT_EQ(tok.encode("x", {.add_bos = true}).front(), tok.bos_id());
  EXPECT_EQ(tok.bos_id(), 3840);
  EXPECT_EQ(tok.eos_ids(), (std::vector<int32_t>{3841, 3848, 3849}));
  EXPECT_EQ(tok.encode("x", {.add_eos = true}).back(), 3841);
  EXPECT_EQ(tok.vocab_size(), 4096);
}

TEST(SpecialTokens, LeftmostLongestAmongAddedTokens) {
  const BpeTokenizer tok = tiny({.specials = {"<s>", "<s>x", "s>x"}});
  const int32_t s = 256, sx = 257;
  EXPECT_EQ(tok.encode("<s>x", {.allow_special = true}), std::vector<int32_t>{sx});
  EXPECT_EQ(tok.encode("<s>y", {.allow_special = true}), (std::vector<int32_t>{s, 'y'}));
  EXPECT_EQ(tok.encode("<s>x", {.add_bos = true, .allow_special = true}), (std::vector<int32_t>{s, sx}));
}

TEST(Decode, InvertsEncodeOnValidUtf8) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  for (const std::string& s : test::multilingual_strings()) EXPECT_EQ(tok.decode(tok.encode(s)), s) << printable(s);
  for (const std::string& s : test::corpus_documents()) EXPECT_EQ(tok.decode(tok.encode(s)), s);
}

TEST(StreamDecode, GivesTheOneShotTextWhereverTheIdsAreCut) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> sequences;
  for (const std::string& s : test::multilingual_strings()) sequences.push_back(tok.encode(s, {.allow_special = true}));
  for (int i = 0; i < 300; ++i) {  // random ids: broken characters anywhere
    std::vector<int32_t> ids;
    for (int k = 0; k < int(rng() % 16); ++k) ids.push_back(int32_t(rng() % 4096));
    sequences.push_back(ids);
  }
  for (const auto& ids : sequences) {
    const std::string whole = replace_invalid_utf8(tok.decode(ids));
    // Streamed one id at a time: only valid UTF-8 comes out, at most 3 bytes wait, and the
    // pieces add up to the one-shot text.
    StreamDecoder d(tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string part = d.push(id);
      ASSERT_EQ(find_invalid_utf8(part), -1) << "invalid UTF-8 streamed for " << test::ids_text(ids);
      ASSERT_LE(d.pending(), 3u);
      streamed += part;
      ASSERT_EQ(whole.compare(0, streamed.size(), streamed), 0) << "not a prefix: " << test::ids_text(ids);
    }
    streamed += d.finish();
    ASSERT_EQ(streamed, whole) << test::ids_text(ids);
    // Cut anywhere and flushed there: the one-shot decode of that prefix.
    for (size_t cut = 0; cut <= ids.size(); ++cut) {
      StreamDecoder p(tok);
      std::string text;
      for (size_t i = 0; i < cut; ++i) text += p.push(ids[i]);
      text += p.finish();
      const std::vector<int32_t> prefix(ids.begin(), ids.begin() + std::ptrdiff_t(cut));
      ASSERT_EQ(text, replace_invalid_utf8(tok.decode(prefix))) << test::ids_text(prefix);
    }
  }
  // A 4-byte emoji split over single-byte tokens comes out only when complete.
  StreamDecoder d(tok);
  std::vector<int32_t> single;
  for (unsigned char c : std::string("\xF0\x9F\x98\x80")) single.push_back(*tok.token_to_id(to_byte_level(std::string(1, char(c)))));
  EXPECT_EQ(d.push(single[0]), "");
  EXPECT_EQ(d.push(single[1]), "");
  EXPECT_EQ(d.push(single[2]), "");
  EXPECT_EQ(d.push(single[3]), "\xF0\x9F\x98\x80");
  EXPECT_EQ(d.push(single[0]), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");
}

TEST(TokenizerInterface, HoldsEitherKind) {
  const ByteTokenizer bytes;
  const BpeTokenizer bpe = load_tokenizer_json(test::project_tokenizer_path());
  for (const Tokenizer* t : {static_cast<const Tokenizer*>(&bytes), static_cast<const Tokenizer*>(&bpe)}) {
    const std::string text = "Data parallelism \xE2\x82\xAC";
    EXPECT_EQ(t->decode(t->encode(text)), text) << t->describe();
    const std::vector<int32_t> with = t->encode(text, {.add_bos = true});
    EXPECT_EQ(with.front(), t->bos_id());
    EXPECT_TRUE(t->is_special(t->bos_id()));
    EXPECT_EQ(t->token_to_id("<|begin_of_text|>"), std::optional<int32_t>(t->bos_id()));
    EXPECT_EQ(t->id_to_token(t->bos_id()), "<|begin_of_text|>");
    EXPECT_FALSE(t->eos_ids().empty());
    EXPECT_NE(t->fingerprint(), 0u);
  }
  EXPECT_EQ(static_cast<const Tokenizer&>(bytes).vocab_size(), 264);
  EXPECT_EQ(bytes.encode("<|end_of_text|>", {.allow_special = true}), std::vector<int32_t>{kEndOfTextToken});
  EXPECT_EQ(bytes.encode("<|end_of_text|>").size(), 15u);
  EXPECT_NE(bytes.fingerprint(), bpe.fingerprint());
}

}  // namespace
}  // namespace llama4d
