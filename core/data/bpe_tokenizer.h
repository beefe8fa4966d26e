#pragma once
// Llama 3's tokenizer: byte-level BPE with special tokens, exact to Hugging Face's `tokenizers`
// on a tokenizer.json and to Meta's tiktoken on a tokenizer.model.
//
// encode(text):
//   1. added tokens (tokenizer.json's "added_tokens"; Meta's 256 specials) are cut out of the
//      text first, leftmost and longest first, as Hugging Face's AddedVocabulary does: tokens
//      with normalized=false on the text, then those with normalized=true on the pieces between
//      (there is no normalizer, so both see the same text). A special token is cut out only with
//      EncodeOptions::allow_special; otherwise its text stays ordinary text.
//   2. each stretch of text between them is pre-tokenized (pretokenize.h: Llama 3's regex),
//   3. each piece's bytes are merged by the BPE model (bpe_model.h),
//   4. add_bos adds what the post-processor's template adds (Llama 3: <|begin_of_text|> first).
// decode(ids) writes each token's bytes; tokenizer.json spells a token in GPT-2's byte
// alphabet (byte_level.h), and a token whose spelling has a character outside it decodes to the
// spelling's own UTF-8, as Hugging Face's ByteLevel decoder does.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/bpe_model.h"
#include "core/data/pretokenize.h"
#include "core/data/tokenizer.h"

namespace llama4d {

// A token matched in the text before pre-tokenization (tokenizer.json's "added_tokens").
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;     // counted as special: skipped by decode, matched only with allow_special
  bool normalized = false;  // matched in the second pass (see above)
};

// Everything a BpeTokenizer is made of; the loaders below fill it in.
struct BpeTokenizerParts {
  std::string source;  // where it was read from, for describe() and error messages
  BpeModel model;
  std::vector<RegexSplitter> splits;  // applied in order, each to the pieces of the one before
  std::vector<AddedToken> added;
  // Every id's spelling: tokenizer.json's key for a BPE token (byte-level), the content of an
  // added token. An id with no token (a gap) has none.
  std::vector<std::optional<std::string>> spelling;
  std::vector<int32_t> prefix, suffix;  // what add_bos puts around the ids (the post-processor's)
  std::vector<int32_t> eos;             // eos_ids(); empty: the Llama 3 names the vocabulary has
};

class BpeTokenizer final : public Tokenizer {
 public:
  // InputError when parts do not fit together (an added token's id clashing with a BPE token of
  // other spelling, a template id outside the vocabulary, ...).
  explicit BpeTokenizer(BpeTokenizerParts parts);

  const std::vector<AddedToken>& added_tokens() const { return added_; }

 private:
  std::string do_describe() const override;
  int32_t do_vocab_size() const override { return int32_t(spelling_.size()); }
  std::vector<int32_t> do_encode(std::string_view text, const EncodeOptions& opt) const override;
  std::string do_decode(std::span<const int32_t> ids, const DecodeOptions& opt) const override;
  int32_t do_bos_id() const override { return bos_; }
  std::vector<int32_t> do_eos_ids() const override { return eos_; }
  std::optional<int32_t> do_token_to_id(std::string_view token) const override;
  std::string do_id_to_token(int32_t id) const override;
  bool do_is_special(int32_t id) const override;
  uint64_t do_fingerprint() const override { return fingerprint_; }

  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void check_id(int32_t id) const;

  std::string source_;
  BpeModel model_;
  std::vector<RegexSplitter> splits_;
  std::vector<AddedToken> added_;
  std::vector<std::optional<std::string>> spelling_;
  std::vector<std::string> bytes_;  // decode's bytes of each id
  std::vector<bool> special_;
  std::vector<int32_t> prefix_, suffix_, eos_;
  int32_t bos_ = -1;
  uint64_t fingerprint_ = 0;
  struct Matcher;
  std::shared_ptr<const Matcher> raw_matcher_, normalized_matcher_;
};

// tokenizer.json (tokenizer_json.cpp). Accepted: model BPE (byte_fallback false, no dropout,
// no subword prefix or suffix), normalizer null, pre_tokenizer ByteLevel (add_prefix_space
// false) alone or after Split pre-tokenizers (Regex or String pattern, behavior Isolated, invert
// false), post_processor null, ByteLevel, TemplateProcessing or a Sequence of them, decoder
// ByteLevel, truncation and padding null, added tokens without lstrip, rstrip or single_word.
// Anything else is an InputError naming it: no silent fallback. Merges may be "a b" strings
// or [a, b] arrays.
BpeTokenizer parse_tokenizer_json(std::string_view json_text, const std::string& source = "<memory>");
BpeTokenizer load_tokenizer_json(const std::string& path);

// Meta's special tokens, which follow the 128,000 BPE ranks of Llama 3's tokenizer.model (ids
// 128000..128255). Meta's lists (source: Meta's tokenizer.py files):
//   kLlama3_0: meta-llama/llama3 at the Llama 3 release (llama/tokenizer.py): <|begin_of_text|>,
//              <|end_of_text|>, <|reserved_special_token_0..3|>, <|start_header_id|>,
//              <|end_header_id|>, <|reserved_special_token_4|>, <|eot_id|>, then
//              <|reserved_special_token_5..250|>;
//   kLlama3_1: meta-llama/llama-models models/llama3_1/api/tokenizer.py: <|begin_of_text|>,
//              <|end_of_text|>, <|reserved_special_token_0|>, <|reserved_special_token_1|>,
//              <|finetune_right_pad_id|>, <|step_id|>, <|start_header_id|>, <|end_header_id|>,
//              <|eom_id|>, <|eot_id|>, <|python_tag|>, then <|reserved_special_token_2..246|>;
//   kLlama3_2: meta-llama/llama-models models/llama3/tokenizer.py (3.1 to 3.3 since the vision
//              models): as kLlama3_1 with <|image|> at 128011, then <|reserved_special_token_2..245|>.
// (Hugging Face's tokenizer.json for 3.1 and 3.2 names 128005 <|reserved_special_token_2|>
// where Meta's code says <|step_id|>; a tokenizer_config.json beside the file settles it, see
// tokenizer_loader.h.)
enum class Llama3Specials { kLlama3_0, kLlama3_1, kLlama3_2 };
std::vector<std::string> llama3_special_tokens(Llama3Specials layout);

struct TiktokenOptions {
  // The special tokens, in id order after the ranks; empty: `layout`'s.
  std::vector<std::string> specials;
  Llama3Specials layout = Llama3Specials::kLlama3_1;
  std::string pattern = std::string(kLlama3Pattern);
};

// Meta's tokenizer.model (tiktoken_file.cpp): one "base64-of-the-token's-bytes rank" per line;
// ranks are the ids and the merge priority. InputError naming the line for a malformed one.
BpeTokenizer parse_tiktoken(std::string_view text, const TiktokenOptions& opt = {},
                            const std::string& source = "<memory>");
BpeTokenizer load_tiktoken(const std::string& path, const TiktokenOptions& opt = {});

}  // namespace llama4d
