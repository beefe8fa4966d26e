#include "core/data/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <unordered_map>

#include "core/data/byte_level.h"
#include "core/data/hash.h"
#include "core/data/utf8.h"
#include "core/error.h"

namespace llama4d {

// Leftmost-longest matching of a set of added tokens, as Hugging Face's Aho-Corasick automaton
// (MatchKind::LeftmostLongest) finds them: at the first position where some token starts, the
// longest token starting there; the search goes on after its end. Candidates are indexed by
// first byte, longest first; tokens are few (Llama 3: 256, all starting with '<').
struct BpeTokenizer::Matcher {
  std::array<std::vector<const AddedToken*>, 256> by_first{};

  explicit Matcher(const std::vector<const AddedToken*>& tokens) {
    for (const AddedToken* t : tokens) by_first[static_cast<unsigned char>(t->content[0])].push_back(t);
    for (auto& list : by_first)
      std::stable_sort(list.begin(), list.end(),
                       [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
  }

  // Splits text[begin, end) into segments: {begin, end, id}, id -1 for plain text. A matched
  // special token is left in the text when !allow_special (Hugging Face's encode_special_tokens),
  // and the search still resumes after it.
  void split(std::string_view text, size_t begin, size_t end, bool allow_special,
             std::vector<std::array<int64_t, 3>>& out) const {
    size_t plain = begin;
    size_t i = begin;
    while (i < end) {
      const auto& cands = by_first[static_cast<unsigned char>(text[i])];
      const AddedToken* hit = nullptr;
      for (const AddedToken* t : cands) {
        if (t->content.size() <= end - i && text.compare(i, t->content.size(), t->content) == 0) {
          hit = t;
          break;
        }
      }
      if (!hit) {
        ++i;
        continue;
      }
      if (hit->special && !allow_special) {
        i += hit->content.size();
        continue;
      }
      if (i > plain) out.push_back({int64_t(plain), int64_t(i), -1});
      out.push_back({int64_t(i), int64_t(i + hit->content.size()), hit->id});
      i += hit->content.size();
      plain = i;
    }
    if (end > plain) out.push_back({int64_t(plain), int64_t(end), -1});
  }
};

BpeTokenizer::BpeTokenizer(BpeTokenizerParts parts)
    : source_(std::move(parts.source)),
      model_(std::move(parts.model)),
      splits_(std::move(parts.splits)),
      added_(std::move(parts.added)),
      spelling_(std::move(parts.spelling)),
      prefix_(std::move(parts.prefix)),
      suffix_(std::move(parts.suffix)),
      eos_(std::move(parts.eos)) {
  for (const AddedToken& t : added_) {
    if (t.id < 0) throw InputError(source_ + ": added token '" + t.content + "' has a negative id");
    if (size_t(t.id) >= spelling_.size()) spelling_.resize(size_t(t.id) + 1);
    if (spelling_[size_t(t.id)] && *spelling_[size_t(t.id)] != t.content)
      throw InputError(source_ + ": added token '" + t.content + "' has id " + std::to_string(t.id) +
                       ", which the vocabulary gives to '" + *spelling_[size_t(t.id)] + "'");
    spelling_[size_t(t.id)] = t.content;
  }
  special_.assign(spelling_.size(), false);
  for (const AddedToken& t : added_) special_[size_t(t.id)] = special_[size_t(t.id)] || t.special;
  bytes_.resize(spelling_.size());
  for (size_t id = 0; id < spelling_.size(); ++id) {
    if (!spelling_[id]) continue;
    std::optional<std::string> b = from_byte_level(*spelling_[id]);
    bytes_[id] = b ? std::move(*b) : *spelling_[id];
  }
  for (int32_t id : prefix_) check_id(id);
  for (int32_t id : suffix_) check_id(id);
  if (eos_.empty()) {
    for (const char* name : {"<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"})
      if (const auto id = do_token_to_id(name)) eos_.push_back(*id);
  }
  for (int32_t id : eos_) check_id(id);
  if (prefix_.size() == 1) {
    bos_ = prefix_[0];
  } else if (const auto id = do_token_to_id("<|begin_of_text|>")) {
    bos_ = *id;
  }

  std::vector<const AddedToken*> raw, normalized;
  for (const AddedToken& t : added_) {
    if (t.content.empty()) continue;  // Hugging Face ignores an empty added token
    (t.normalized ? normalized : raw).push_back(&t);
  }
  raw_matcher_ = std::make_shared<Matcher>(raw);
  normalized_matcher_ = std::make_shared<Matcher>(normalized);

  // The fingerprint covers what decides the ids, in a canonical order.
  uint64_t h = hash_bytes("llama4d bpe tokenizer v1");
  for (const auto& m : model_.merge_table())
    for (int32_t v : m) h = hash_u64(uint64_t(uint32_t(v)), h);
  h = hash_u64(model_.ignore_merges(), h);
  for (size_t id = 0; id < spelling_.size(); ++id) {
    h = hash_u64(id, h);
    h = hash_u64(spelling_[id].has_value(), h);
    if (spelling_[id]) h = hash_bytes(*spelling_[id], hash_u64(spelling_[id]->size(), h));
  }
  for (const AddedToken& t : added_)
    h = hash_u64(uint64_t(uint32_t(t.id)) | (uint64_t(t.special) << 32) | (uint64_t(t.normalized) << 33), h);
  for (const RegexSplitter& s : splits_) h = hash_bytes(s.pattern(), hash_u64(s.pattern().size(), h));
  for (const auto* list : {&prefix_, &suffix_, &eos_}) {
    h = hash_u64(list->size(), h);
    for (int32_t id : *list) h = hash_u64(uint64_t(uint32_t(id)), h);
  }
  fingerprint_ = h;
}

std::string BpeTokenizer::do_describe() const { return "bpe (" + source_ + ")"; }

void BpeTokenizer::check_id(int32_t id) const {
  if (id < 0 || size_t(id) >= spelling_.size() || !spelling_[size_t(id)])
    throw InputError("token id " + std::to_string(id) + " is outside the vocabulary of " + source_ +
                     (id >= 0 && size_t(id) < spelling_.size() ? " (no token has that id)"
                                                               : " [0, " + std::to_string(spelling_.size()) + ")"));
}

void BpeTokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  // Pre-tokenization: each split cuts the pieces of the one before.
  std::vector<std::pair<size_t, size_t>> pieces{{0, text.size()}}, next;
  for (const RegexSplitter& s : splits_) {
    next.clear();
    for (const auto& [b, e] : pieces) {
      const size_t first = next.size();
      s.split(text.substr(b, e - b), next);
      for (size_t k = first; k < next.size(); ++k) next[k].first += b, next[k].second += b;
    }
    pieces.swap(next);
  }
  for (const auto& [b, e] : pieces) model_.encode_word(text.substr(b, e - b), out);
}

std::vector<int32_t> BpeTokenizer::do_encode(std::string_view text, const EncodeOptions& opt) const {
  std::string replaced;
  if (const int64_t bad = find_invalid_utf8(text); bad >= 0) {
    if (opt.invalid_utf8 == InvalidUtf8::kError)
      throw InputError("text to encode is not valid UTF-8 at byte offset " + std::to_string(bad) +
                       " (EncodeOptions::invalid_utf8 = kReplace turns bad bytes into U+FFFD)");
    replaced = replace_invalid_utf8(text);
    text = replaced;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (opt.add_bos) ids.insert(ids.end(), prefix_.begin(), prefix_.end());
  // Pass 1: tokens matched on the raw text; pass 2: the normalized ones, in the plain stretches.
  std::vector<std::array<int64_t, 3>> first, second;
  raw_matcher_->split(text, 0, text.size(), opt.allow_special, first);
  for (const auto& seg : first) {
    if (seg[2] >= 0) {
      second.push_back(seg);
    } else {
      normalized_matcher_->split(text, size_t(seg[0]), size_t(seg[1]), opt.allow_special, second);
    }
  }
  for (const auto& [b, e, id] : second) {
    if (id >= 0) {
      ids.push_back(int32_t(id));
    } else {
      encode_text(text.substr(size_t(b), size_t(e - b)), ids);
    }
  }
  if (opt.add_bos) ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  if (opt.add_eos) {
    if (eos_.empty()) throw InputError("add_eos: " + source_ + " has no end-of-sequence token");
    ids.push_back(eos_[0]);
  }
  return ids;
}

std::string BpeTokenizer::do_decode(std::span<const int32_t> ids, const DecodeOptions& opt) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    check_id(id);
    if (special_[size_t(id)] && !opt.render_specials) continue;
    out += bytes_[size_t(id)];
  }
  return out;
}

std::optional<int32_t> BpeTokenizer::do_token_to_id(std::string_view token) const {
  for (const AddedToken& t : added_)
    if (t.content == token) return t.id;
  const std::string bytes = from_byte_level(token).value_or(std::string(token));
  if (const auto id = model_.find(bytes); id && spelling_[size_t(*id)] == token) return id;
  for (size_t id = 0; id < spelling_.size(); ++id)  // a spelling outside the byte alphabet
    if (spelling_[id] && *spelling_[id] == token) return int32_t(id);
  return std::nullopt;
}

std::string BpeTokenizer::do_id_to_token(int32_t id) const {
  check_id(id);
  return *spelling_[size_t(id)];
}

bool BpeTokenizer::do_is_special(int32_t id) const {
  return id >= 0 && size_t(id) < special_.size() && special_[size_t(id)];
}

}  // namespace llama4d
