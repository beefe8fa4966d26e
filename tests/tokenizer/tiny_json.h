#pragma once
// A tokenizer.json built in the test: the 256 bytes as ids 0..255 (id = byte), then `extra`
// tokens (spelled in bytes; ids from 256 on), `merges` as "a b" pairs of byte strings, Llama 3's
// pipeline, and optional added tokens after them.
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/data/byte_level.h"
#include "core/data/pretokenize.h"

namespace llama4d::test {

struct TinySpec {
  std::vector<std::string> extra = {};
  std::vector<std::pair<std::string, std::string>> merges = {};
  bool ignore_merges = true;
  std::vector<std::string> specials = {};  // added as special tokens after the BPE ids
  bool bos_template = true;           // a TemplateProcessing putting specials[0] first
};

inline nlohmann::json tiny_tokenizer_json(const TinySpec& s) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  int next = 256;
  for (const std::string& t : s.extra) vocab[to_byte_level(t)] = next++;
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [a, b] : s.merges) merges.push_back(to_byte_level(a) + " " + to_byte_level(b));
  nlohmann::json added = nlohmann::json::array();
  for (const std::string& sp : s.specials)
    added.push_back({{"id", next++}, {"content", sp}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  nlohmann::json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", std::string(kLlama3Pattern)}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", s.ignore_merges},
        {"vocab", vocab}, {"merges", merges}}}};
  if (s.bos_template && !s.specials.empty()) {
    const int bos = 256 + int(s.extra.size());
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", {{{"SpecialToken", {{"id", s.specials[0]}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                           {"pair", nlohmann::json::array()},
                           {"special_tokens", {{s.specials[0], {{"id", s.specials[0]}, {"ids", {bos}}, {"tokens", {s.specials[0]}}}}}}};
  }
  return j;
}

}  // namespace llama4d::test
