// Meta's tokenizer.model: tiktoken's format, one "<base64 of the token's bytes> <rank>" per
// line. The ranks are the ids and the merge priority (bpe_model.h); Meta's tokenizer.py adds 256
// special tokens after the last rank and always uses Llama 3's pattern.

#include "core/data/bpe_tokenizer.h"
#include "core/data/byte_level.h"
#include "core/error.h"
#include "core/regular_file.h"

namespace llama4d {

namespace {

// RFC 4648 base64 (with '=' padding, as tiktoken writes it); nullopt for anything else.
std::optional<std::string> decode_base64(std::string_view s) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (s.empty() || s.size() % 4 != 0) return std::nullopt;
  size_t pad = 0;
  while (pad < 2 && s[s.size() - 1 - pad] == '=') ++pad;
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < s.size() - pad; ++i) {
    const int v = value(s[i]);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return out;
}

std::vector<std::string> reserved_from(std::vector<std::string> named, int first_reserved) {
  for (int k = first_reserved; named.size() < 256; ++k) named.push_back("<|reserved_special_token_" + std::to_string(k) + "|>");
  return named;
}

}  // namespace

std::vector<std::string> llama3_special_tokens(Llama3Specials layout) {
  switch (layout) {
    case Llama3Specials::kLlama3_0:
      return reserved_from({"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                            "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
                            "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
                            "<|reserved_special_token_4|>", "<|eot_id|>"},
                           5);
    case Llama3Specials::kLlama3_1:
      return reserved_from({"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                            "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                            "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"},
                           2);
    case Llama3Specials::kLlama3_2:
      return reserved_from({"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                            "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                            "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
                            "<|image|>"},
                           2);
  }
  throw InputError("unknown Llama 3 special-token layout");
}

BpeTokenizer parse_tiktoken(std::string_view text, const TiktokenOptions& opt, const std::string& source) {
  std::vector<BpeModel::Entry> entries;
  BpeTokenizerParts parts;
  parts.source = source;
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    auto bad = [&](const std::string& why) {
      return InputError(source + " line " + std::to_string(line_no) + ": " + why + " (expected \"<base64> <rank>\")");
    };
    if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos) throw bad("not two fields");
    const std::optional<std::string> bytes = decode_base64(line.substr(0, sp));
    if (!bytes || bytes->empty()) throw bad("the token is not base64");
    int64_t rank = 0;
    const std::string_view r = line.substr(sp + 1);
    if (r.empty() || r.size() > 10) throw bad("the rank is not a number");
    for (char c : r) {
      if (c < '0' || c > '9') throw bad("the rank is not a number");
      rank = rank * 10 + (c - '0');
    }
    if (rank > INT32_MAX - 1024) throw bad("the rank is too large");
    const int32_t id = int32_t(rank);
    if (size_t(id) >= parts.spelling.size()) parts.spelling.resize(size_t(id) + 1);
    if (parts.spelling[size_t(id)]) throw bad("rank " + std::to_string(id) + " appears twice");
    parts.spelling[size_t(id)] = to_byte_level(*bytes);
    entries.push_back({*bytes, id});
  }
  if (entries.empty()) throw InputError(source + ": no tokens (an empty tiktoken file)");
  parts.model = BpeModel::from_ranks(std::move(entries));
  parts.splits.emplace_back(opt.pattern);
  const std::vector<std::string> specials = opt.specials.empty() ? llama3_special_tokens(opt.layout) : opt.specials;
  const int32_t first = int32_t(parts.spelling.size());
  for (size_t i = 0; i < specials.size(); ++i)
    parts.added.push_back({first + int32_t(i), specials[i], /*special=*/true, /*normalized=*/false});
  // Meta's encode(bos=True) prepends <|begin_of_text|>; its stop tokens are the eos ids.
  for (size_t i = 0; i < specials.size(); ++i)
    if (specials[i] == "<|begin_of_text|>") parts.prefix = {first + int32_t(i)};
  return BpeTokenizer(std::move(parts));
}

BpeTokenizer load_tiktoken(const std::string& path, const TiktokenOptions& opt) {
  return parse_tiktoken(read_regular_file(path, "tokenizer file", kMaxJsonFileBytes), opt, path);
}

}  // namespace llama4d
