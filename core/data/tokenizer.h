#pragma once
// Byte-level tokenizer: token id = byte value. No merges, no vocabulary file, nothing to train,
// so every string round-trips exactly and any model can be fed any text.
//
// Ids 256 and up are special tokens, laid out like Llama 3's (which puts 256 specials after its
// 128,000 BPE tokens, starting with <|begin_of_text|> = 128000, <|end_of_text|> = 128001):
//   0..255   raw bytes
//   256      <|begin_of_text|>
//   257      <|end_of_text|>
//   258..263 <|reserved_special_token_0|> .. <|reserved_special_token_5|>
// vocab = 264 (a multiple of 8, which keeps the LM-head matmul tidy).
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace llama4d {

inline constexpr int32_t kNumByteTokens = 256;
inline constexpr int32_t kBeginOfTextToken = 256;
inline constexpr int32_t kEndOfTextToken = 257;
inline constexpr int32_t kFirstReservedToken = 258;
inline constexpr int32_t kByteVocabSize = 264;

// A read-only run of token ids, e.g. the training or validation split of a corpus.
using TokenSpan = std::span<const int32_t>;

struct EncodeOptions {
  bool add_bos = false;  // prepend <|begin_of_text|>
  bool add_eos = false;  // append <|end_of_text|>
};

struct DecodeOptions {
  // false: special tokens produce no bytes. true: they are written by name, e.g.
  // "<|end_of_text|>", which is what you want when debugging a sample.
  bool render_specials = false;
};

class ByteTokenizer {
 public:
  static constexpr int32_t vocab_size() { return kByteVocabSize; }
  static bool is_special(int32_t id) { return id >= kNumByteTokens && id < kByteVocabSize; }
  // "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_K|>"; InputError for a
  // byte id or an id outside the vocabulary.
  static std::string special_name(int32_t id);

  // One id per byte of `text` (bytes are taken as unsigned, so 0xE2 -> 226). Never emits a
  // special token unless the options ask for BOS/EOS: the text "<|end_of_text|>" encodes to
  // its 15 bytes, not to id 257, so user text cannot inject control tokens.
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opt = {}) const;

  // The bytes of ids[n]. Throws InputError for an id outside [0, vocab_size()).
  // The result is not necessarily valid UTF-8: a model can emit half a multi-byte character.
  std::string decode(std::span<const int32_t> ids, const DecodeOptions& opt = {}) const;
};

}  // namespace llama4d
