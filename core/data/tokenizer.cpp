#include "core/data/tokenizer.h"

#include "core/error.h"

namespace llama4d {

namespace {

void check_id(int32_t id) {
  if (id < 0 || id >= kByteVocabSize) {
    throw InputError("token id " + std::to_string(id) + " is outside the byte vocabulary [0, " +
                     std::to_string(kByteVocabSize) + ")");
  }
}

}  // namespace

std::string ByteTokenizer::special_name(int32_t id) {
  check_id(id);
  if (id == kBeginOfTextToken) return "<|begin_of_text|>";
  if (id == kEndOfTextToken) return "<|end_of_text|>";
  if (id >= kFirstReservedToken) {
    return "<|reserved_special_token_" + std::to_string(id - kFirstReservedToken) + "|>";
  }
  throw InputError("token id " + std::to_string(id) + " is a byte, not a special token");
}

std::vector<int32_t> ByteTokenizer::encode(std::string_view text, const EncodeOptions& opt) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 2);
  if (opt.add_bos) ids.push_back(kBeginOfTextToken);
  // Through unsigned char: plain char is signed on x86, and byte 0xE2 must become 226, not -30.
  for (char c : text) ids.push_back(int32_t(static_cast<unsigned char>(c)));
  if (opt.add_eos) ids.push_back(kEndOfTextToken);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids, const DecodeOptions& opt) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    check_id(id);
    if (id < kNumByteTokens) {
      out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else if (opt.render_specials) {
      out += special_name(id);
    }
  }
  return out;
}

}  // namespace llama4d
