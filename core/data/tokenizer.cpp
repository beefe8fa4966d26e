#include "core/data/tokenizer.h"

#include <cstring>

#include "core/data/hash.h"
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
  for (size_t i = 0; i < text.size(); ++i) {
    if (opt.allow_special && text[i] == '<') {  // every special name starts with "<|"
      int32_t found = -1;
      for (int32_t id = kNumByteTokens; id < kByteVocabSize && found < 0; ++id) {
        const std::string name = special_name(id);
        if (text.substr(i, name.size()) == name) found = id;
      }
      if (found >= 0) {
        ids.push_back(found);
        i += special_name(found).size() - 1;
        continue;
      }
    }
    // Through unsigned char: plain char is signed on x86, and byte 0xE2 must become 226, not -30.
    ids.push_back(int32_t(static_cast<unsigned char>(text[i])));
  }
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

std::optional<int32_t> ByteTokenizer::do_token_to_id(std::string_view token) const {
  if (token.size() == 1) return int32_t(static_cast<unsigned char>(token[0]));
  for (int32_t id = kNumByteTokens; id < kByteVocabSize; ++id)
    if (special_name(id) == token) return id;
  return std::nullopt;
}

std::string ByteTokenizer::do_id_to_token(int32_t id) const {
  check_id(id);
  return id < kNumByteTokens ? std::string(1, static_cast<char>(static_cast<unsigned char>(id))) : special_name(id);
}

uint64_t ByteTokenizer::do_fingerprint() const { return hash_bytes("llama4d byte tokenizer, 264 ids"); }

}  // namespace llama4d
