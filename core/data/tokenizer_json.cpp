// Reading Hugging Face's tokenizer.json into a BpeTokenizer (bpe_tokenizer.h says what is
// accepted). Every field that would change the ids and that this reader does not implement is
// refused by name, so a tokenizer it cannot reproduce never loads as a different one.

#include <nlohmann/json.hpp>

#include "core/data/bpe_tokenizer.h"
#include "core/data/byte_level.h"
#include "core/error.h"
#include "core/regular_file.h"
#include "core/strict_json.h"

namespace llama4d {

namespace {

using nlohmann::json;

struct Reader {
  std::string source;

  [[noreturn]] void fail(const std::string& what) const { throw InputError(source + ": " + what); }

  const json& field(const json& obj, const char* key, const char* where) const {
    if (!obj.is_object() || !obj.contains(key)) fail(std::string(where) + " has no \"" + key + "\"");
    return obj.at(key);
  }
  std::string type_of(const json& obj, const char* where) const {
    const json& t = field(obj, "type", where);
    if (!t.is_string()) fail(std::string(where) + "'s \"type\" is not a string");
    return t.get<std::string>();
  }
  bool flag(const json& obj, const char* key, bool fallback) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
    if (!obj.at(key).is_boolean()) fail(std::string("\"") + key + "\" is not true or false");
    return obj.at(key).get<bool>();
  }
  void require_null(const json& root, const char* key) const {
    if (root.contains(key) && !root.at(key).is_null())
      fail(std::string("\"") + key + "\" is set (" + root.at(key).dump().substr(0, 80) +
           "); only null is supported");
  }

  // model: BPE. Fills the vocabulary, spellings and merges of `parts`.
  void model(const json& m, BpeTokenizerParts& parts) const {
    const std::string type = m.contains("type") ? type_of(m, "model") : "BPE";  // old files omit it
    if (type != "BPE") fail("model type \"" + type + "\" is not supported (only BPE)");
    if (flag(m, "byte_fallback", false)) fail("model.byte_fallback = true is not supported");
    if (m.contains("dropout") && !m.at("dropout").is_null()) fail("model.dropout is set; only null is supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (m.contains(key) && !m.at(key).is_null() && m.at(key) != "")
        fail(std::string("model.") + key + " is set; only null is supported");
    }
    const bool ignore_merges = flag(m, "ignore_merges", false);
    const json& vocab = field(m, "vocab", "model");
    if (!vocab.is_object()) fail("model.vocab is not an object");
    std::vector<BpeModel::Entry> entries;
    entries.reserve(vocab.size());
    std::unordered_map<std::string, int32_t> id_of;
    id_of.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX)
        fail("model.vocab[\"" + it.key() + "\"] is not an id");
      const int32_t id = it.value().get<int32_t>();
      if (size_t(id) >= parts.spelling.size()) parts.spelling.resize(size_t(id) + 1);
      if (parts.spelling[size_t(id)])
        fail("model.vocab gives id " + std::to_string(id) + " to both \"" + *parts.spelling[size_t(id)] + "\" and \"" +
             it.key() + "\"");
      parts.spelling[size_t(id)] = it.key();
      id_of.emplace(it.key(), id);
      // A spelling outside GPT-2's byte alphabet is a token byte-level text never produces:
      // kept for decode, not for encode.
      if (std::optional<std::string> bytes = from_byte_level(it.key())) entries.push_back({std::move(*bytes), id});
    }
    const json& merges = field(m, "merges", "model");
    if (!merges.is_array()) fail("model.merges is not an array");
    std::vector<std::pair<int32_t, int32_t>> pairs;
    pairs.reserve(merges.size());
    auto lookup = [&](const std::string& tok, size_t k) {
      const auto it = id_of.find(tok);
      if (it == id_of.end()) fail("merge " + std::to_string(k) + " names \"" + tok + "\", which is not in model.vocab");
      return it->second;
    };
    for (size_t k = 0; k < merges.size(); ++k) {
      const json& mg = merges[k];
      std::string a, b;
      if (mg.is_string()) {  // "a b": tokens never hold a plain space in byte-level spelling
        const std::string s = mg.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          fail("merge " + std::to_string(k) + " (\"" + s + "\") is not two tokens separated by one space");
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string()) {
        a = mg[0].get<std::string>(), b = mg[1].get<std::string>();
      } else {
        fail("merge " + std::to_string(k) + " is neither \"a b\" nor [\"a\", \"b\"]");
      }
      pairs.emplace_back(lookup(a, k), lookup(b, k));
      if (!id_of.count(a + b)) fail("merge " + std::to_string(k) + " (\"" + a + "\" + \"" + b + "\") makes \"" + a + b +
                                    "\", which is not in model.vocab");
    }
    try {
      parts.model = BpeModel::from_merges(std::move(entries), pairs, ignore_merges);
    } catch (const InputError& e) {
      fail(e.what());
    }
  }

  // pre_tokenizer: [Split...] then ByteLevel.
  void pre_tokenizer(const json& p, BpeTokenizerParts& parts) const {
    if (p.is_null()) fail("pre_tokenizer is null; only byte-level pre-tokenization is supported");
    std::vector<const json*> steps;
    if (type_of(p, "pre_tokenizer") == "Sequence") {
      const json& list = field(p, "pretokenizers", "pre_tokenizer Sequence");
      if (!list.is_array()) fail("pre_tokenizer.pretokenizers is not an array");
      for (const json& s : list) steps.push_back(&s);
    } else {
      steps.push_back(&p);
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      const json& s = *steps[i];
      const std::string type = type_of(s, "pre-tokenizer");
      const bool last = i + 1 == steps.size();
      if (type == "Split") {
        if (last) fail("pre_tokenizer: a Split is not followed by ByteLevel");
        const std::string behavior = field(s, "behavior", "Split").get<std::string>();
        if (behavior != "Isolated") fail("pre_tokenizer Split behavior \"" + behavior + "\" is not supported (only Isolated)");
        if (flag(s, "invert", false)) fail("pre_tokenizer Split invert = true is not supported");
        const json& pat = field(s, "pattern", "Split");
        if (pat.contains("Regex")) {
          parts.splits.emplace_back(pat.at("Regex").get<std::string>());
        } else if (pat.contains("String")) {
          std::string escaped;  // a literal: every character escaped, as Hugging Face does
          for (char c : pat.at("String").get<std::string>()) {
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  static_cast<unsigned char>(c) >= 0x80))
              escaped += '\\';
            escaped += c;
          }
          parts.splits.emplace_back(escaped);
        } else {
          fail("pre_tokenizer Split pattern is neither Regex nor String");
        }
      } else if (type == "ByteLevel") {
        if (!last) fail("pre_tokenizer: ByteLevel must come last");
        if (flag(s, "add_prefix_space", true)) fail("pre_tokenizer ByteLevel add_prefix_space = true is not supported");
        if (flag(s, "use_regex", true)) parts.splits.emplace_back(kGpt2Pattern);
      } else {
        fail("pre-tokenizer type \"" + type + "\" is not supported (only Split and ByteLevel)");
      }
    }
  }

  // post_processor: the ids TemplateProcessing's "single" template puts around the text.
  void post_processor(const json& p, BpeTokenizerParts& parts) const {
    if (p.is_null()) return;
    const std::string type = type_of(p, "post_processor");
    if (type == "Sequence") {
      for (const json& s : field(p, "processors", "post_processor Sequence")) post_processor(s, parts);
    } else if (type == "ByteLevel") {
      // Offsets only (trim_offsets): ids are unchanged.
    } else if (type == "TemplateProcessing") {
      const json& single = field(p, "single", "TemplateProcessing");
      const json& specials = field(p, "special_tokens", "TemplateProcessing");
      bool seen_text = false;
      for (const json& piece : single) {
        if (piece.contains("Sequence")) {
          if (piece.at("Sequence").at("id") != "A" || seen_text)
            fail("post_processor template: only one sequence, A, is supported in \"single\"");
          seen_text = true;
        } else if (piece.contains("SpecialToken")) {
          const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
          if (!specials.contains(name)) fail("post_processor template names \"" + name + "\", not in its special_tokens");
          for (const json& id : specials.at(name).at("ids")) (seen_text ? parts.suffix : parts.prefix).push_back(id.get<int32_t>());
        } else {
          fail("post_processor template piece " + piece.dump() + " is not supported");
        }
      }
      if (!seen_text) fail("post_processor template has no sequence A");
    } else {
      fail("post_processor type \"" + type + "\" is not supported (only TemplateProcessing, ByteLevel, Sequence)");
    }
  }

  void decoder(const json& d) const {
    if (d.is_null()) fail("decoder is null; only ByteLevel is supported");
    const std::string type = type_of(d, "decoder");
    if (type != "ByteLevel") fail("decoder type \"" + type + "\" is not supported (only ByteLevel)");
  }

  void added_tokens(const json& list, BpeTokenizerParts& parts) const {
    if (list.is_null()) return;
    if (!list.is_array()) fail("added_tokens is not an array");
    for (const json& t : list) {
      AddedToken a;
      a.id = field(t, "id", "added token").get<int32_t>();
      a.content = field(t, "content", "added token").get<std::string>();
      for (const char* key : {"lstrip", "rstrip", "single_word"})
        if (flag(t, key, false)) fail("added token \"" + a.content + "\" has " + key + " = true, which is not supported");
      a.special = flag(t, "special", false);
      a.normalized = flag(t, "normalized", !a.special);
      parts.added.push_back(std::move(a));
    }
  }
};

}  // namespace

BpeTokenizer parse_tokenizer_json(std::string_view json_text, const std::string& source) {
  const Reader r{source};
  // A token or merge listed twice, a NUL: refused by name, not resolved by the last one winning.
  const json root = parse_strict_json(json_text, source);
  if (!root.is_object()) r.fail("not a JSON object");
  BpeTokenizerParts parts;
  parts.source = source;
  try {
    r.require_null(root, "truncation");
    r.require_null(root, "padding");
    if (root.contains("normalizer") && !root.at("normalizer").is_null())
      r.fail("normalizer type \"" + root.at("normalizer").value("type", std::string("?")) +
             "\" is not supported (only null)");
    r.model(r.field(root, "model", "tokenizer.json"), parts);
    r.pre_tokenizer(root.value("pre_tokenizer", json()), parts);
    r.added_tokens(root.value("added_tokens", json()), parts);
    r.post_processor(root.value("post_processor", json()), parts);
    r.decoder(root.value("decoder", json()));
  } catch (const json::exception& e) {  // a field of the wrong JSON type
    r.fail(std::string("unexpected JSON: ") + e.what());
  }
  return BpeTokenizer(std::move(parts));
}

BpeTokenizer load_tokenizer_json(const std::string& path) {
  return parse_tokenizer_json(read_regular_file(path, "tokenizer file", kMaxJsonFileBytes), path);
}

}  // namespace llama4d
