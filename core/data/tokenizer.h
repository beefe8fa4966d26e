#pragma once
// Tokenizers: text <-> token ids.
//
// `Tokenizer` is what the rest of the code holds as "the model's tokenizer", whichever kind it
// is: ByteTokenizer below (ids are bytes; no file, nothing to train) or BpeTokenizer
// (bpe_tokenizer.h: Llama 3's byte-level BPE, from a tokenizer.json or Meta's tokenizer.model).
// load_tokenizer() (tokenizer_loader.h) picks one for a model directory.
//
// Byte tokenizer layout: ids 256 and up are special tokens, laid out like Llama 3's (which puts
// 256 specials after its 128,000 BPE tokens, starting with <|begin_of_text|> = 128000,
// <|end_of_text|> = 128001):
//   0..255   raw bytes
//   256      <|begin_of_text|>
//   257      <|end_of_text|>
//   258..263 <|reserved_special_token_0|> .. <|reserved_special_token_5|>
// vocab = 264 (a multiple of 8, which keeps the LM-head matmul tidy).
#include <cstdint>
#include <optional>
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

// What encode() does with bytes that are not UTF-8 (a BPE tokenizer's pre-tokenizer reads
// characters; the byte tokenizer takes any bytes and ignores this).
enum class InvalidUtf8 {
  kError,    // InputError naming the byte offset of the first bad sequence (the default)
  kReplace,  // each ill-formed part becomes U+FFFD first, as Python's decode("utf-8", "replace")
};

struct EncodeOptions {
  // Prepend <|begin_of_text|>. For a BPE tokenizer: add what its post-processor adds (Llama 3's
  // TemplateProcessing prepends <|begin_of_text|>; none adds nothing), like Hugging Face's
  // add_special_tokens=True.
  bool add_bos = false;
  bool add_eos = false;  // append the first end-of-sequence id (eos_ids()[0])
  // false (the default, safe for user text): the text "<|eot_id|>" is ordinary text, split into
  // ordinary tokens, so no input can inject a control token; Hugging Face's encode with
  // encode_special_tokens=True (transformers' split_special_tokens=True).
  // true: special tokens written in the text become their ids, as Hugging Face's default encode
  // does (added tokens matched first, leftmost and longest).
  bool allow_special = false;
  InvalidUtf8 invalid_utf8 = InvalidUtf8::kError;
};

struct DecodeOptions {
  // false: special tokens produce no bytes (Hugging Face's skip_special_tokens=True). true:
  // they are written by name, e.g. "<|end_of_text|>", which is what you want when debugging a
  // sample.
  bool render_specials = false;
};

// The common interface. Public functions are non-virtual and call the private virtual ones
// (so ByteTokenizer can keep its static vocab_size() and is_special(), which hide these when
// called on a ByteTokenizer directly and give the same answers). Every const function may run on
// many threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "bytes", "bpe"; with where it came from, e.g. "bpe (data/tokenizer/tokenizer.json)".
  std::string describe() const { return do_describe(); }
  // One more than the largest id: the size an embedding table needs.
  int32_t vocab_size() const { return do_vocab_size(); }
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opt = {}) const { return do_encode(text, opt); }
  // The bytes of the ids, one after another. InputError for an id outside the vocabulary. Not
  // necessarily valid UTF-8: a token can hold part of a character (replace_invalid_utf8 in
  // utf8.h makes it valid the way Hugging Face's decode does; StreamDecoder holds the part back).
  std::string decode(std::span<const int32_t> ids, const DecodeOptions& opt = {}) const { return do_decode(ids, opt); }
  // <|begin_of_text|>'s id; -1 when there is none.
  int32_t bos_id() const { return do_bos_id(); }
  // Ids that end a sequence when generated (Llama 3: <|end_of_text|>, <|eom_id|>, <|eot_id|>,
  // those of them the vocabulary has), the first being the one add_eos appends.
  std::vector<int32_t> eos_ids() const { return do_eos_ids(); }
  // The id of the token written `token` (a special token by name, a BPE token in its
  // tokenizer.json spelling, a byte token as its one byte).
  std::optional<int32_t> token_to_id(std::string_view token) const { return do_token_to_id(token); }
  // The inverse of token_to_id; InputError for an id outside the vocabulary.
  std::string id_to_token(int32_t id) const { return do_id_to_token(id); }
  // Whether `id` is a special token (false for ids outside the vocabulary).
  bool is_special(int32_t id) const { return do_is_special(id); }
  // A hash of everything that decides encode()'s ids (vocabulary, merges, specials, pattern):
  // two tokenizers with the same fingerprint encode alike. Token caches are keyed by it.
  uint64_t fingerprint() const { return do_fingerprint(); }

 private:
  virtual std::string do_describe() const = 0;
  virtual int32_t do_vocab_size() const = 0;
  virtual std::vector<int32_t> do_encode(std::string_view text, const EncodeOptions& opt) const = 0;
  virtual std::string do_decode(std::span<const int32_t> ids, const DecodeOptions& opt) const = 0;
  virtual int32_t do_bos_id() const = 0;
  virtual std::vector<int32_t> do_eos_ids() const = 0;
  virtual std::optional<int32_t> do_token_to_id(std::string_view token) const = 0;
  virtual std::string do_id_to_token(int32_t id) const = 0;
  virtual bool do_is_special(int32_t id) const = 0;
  virtual uint64_t do_fingerprint() const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t vocab_size() { return kByteVocabSize; }
  static bool is_special(int32_t id) { return id >= kNumByteTokens && id < kByteVocabSize; }
  // "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_K|>"; InputError for a
  // byte id or an id outside the vocabulary.
  static std::string special_name(int32_t id);

  // One id per byte of `text` (bytes are taken as unsigned, so 0xE2 -> 226). Never emits a
  // special token unless the options ask for BOS/EOS or allow_special: by default the text
  // "<|end_of_text|>" encodes to its 15 bytes, not to id 257, so user text cannot inject control
  // tokens. With allow_special the eight names above become their ids.
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opt = {}) const;

  // The bytes of ids[n]. Throws InputError for an id outside [0, vocab_size()).
  // The result is not necessarily valid UTF-8: a model can emit half a multi-byte character.
  std::string decode(std::span<const int32_t> ids, const DecodeOptions& opt = {}) const;

 private:
  std::string do_describe() const override { return "bytes"; }
  int32_t do_vocab_size() const override { return kByteVocabSize; }
  std::vector<int32_t> do_encode(std::string_view text, const EncodeOptions& opt) const override {
    return encode(text, opt);
  }
  std::string do_decode(std::span<const int32_t> ids, const DecodeOptions& opt) const override {
    return decode(ids, opt);
  }
  int32_t do_bos_id() const override { return kBeginOfTextToken; }
  std::vector<int32_t> do_eos_ids() const override { return {kEndOfTextToken}; }
  std::optional<int32_t> do_token_to_id(std::string_view token) const override;
  std::string do_id_to_token(int32_t id) const override;
  bool do_is_special(int32_t id) const override { return is_special(id); }
  uint64_t do_fingerprint() const override;
};

}  // namespace llama4d
