#include "core/data/tokenizer_loader.h"

#include <filesystem>
#include <sstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/data/bpe_tokenizer.h"
#include "core/error.h"
#include "core/parse_number.h"
#include "core/regular_file.h"
#include "core/strict_json.h"

namespace llama4d {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const fs::path& path) {
  return parse_strict_json(read_regular_file(path.string(), "JSON file", kMaxJsonFileBytes), path.string());
}

// The special tokens of a tokenizer_config.json's "added_tokens_decoder" ({"128000":
// {"content": ...}, ...}), in id order from `first`; empty when it has none.
std::vector<std::string> specials_from_config(const fs::path& path, int32_t first) {
  const nlohmann::json cfg = read_json(path);
  if (!cfg.contains("added_tokens_decoder")) return {};
  std::map<int64_t, std::string> by_id;
  for (const auto& [key, value] : cfg.at("added_tokens_decoder").items()) {
    const int64_t id = parse_number<int64_t>(key, path.string() + ": added_tokens_decoder key", 0);
    by_id[id] = value.at("content").get<std::string>();
  }
  std::vector<std::string> names;
  for (const auto& [id, name] : by_id) {
    if (id != first + int64_t(names.size()))
      throw InputError(path.string() + ": added_tokens_decoder is not consecutive from id " + std::to_string(first) +
                       " (found " + std::to_string(id) + ")");
    names.push_back(name);
  }
  return names;
}

// The number of lines with a token in a tiktoken file: where its specials start.
int32_t tiktoken_size(const fs::path& path) {
  std::istringstream in(read_regular_file(path.string(), "tokenizer file", kMaxJsonFileBytes));
  int32_t n = 0;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line != "\r") ++n;
  return n;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir) {
  const fs::path dir(model_dir);
  if (!fs::is_directory(dir)) throw InputError("model directory " + model_dir + " does not exist");
  if (fs::exists(dir / "tokenizer.json"))
    return std::make_unique<BpeTokenizer>(load_tokenizer_json((dir / "tokenizer.json").string()));
  for (const fs::path& model : {dir / "tokenizer.model", dir / "original" / "tokenizer.model"}) {
    if (!fs::exists(model)) continue;
    TiktokenOptions opt;
    if (fs::exists(dir / "tokenizer_config.json"))
      opt.specials = specials_from_config(dir / "tokenizer_config.json", tiktoken_size(model));
    return std::make_unique<BpeTokenizer>(load_tiktoken(model.string(), opt));
  }
  if (fs::exists(dir / "config.json")) {
    const nlohmann::json cfg = read_json(dir / "config.json");
    if (cfg.contains("llama4d_tokenizer")) {
      const auto& kind = cfg.at("llama4d_tokenizer");
      if (kind == "bytes") return std::make_unique<ByteTokenizer>();
      throw InputError((dir / "config.json").string() + ": \"llama4d_tokenizer\" is " + kind.dump() +
                       "; the only built-in tokenizer is \"bytes\"");
    }
  }
  throw InputError("no tokenizer in " + model_dir +
                   ": looked for tokenizer.json, tokenizer.model, original/tokenizer.model, and "
                   "\"llama4d_tokenizer\": \"bytes\" in config.json");
}

void check_tokenizer_matches_model(const Tokenizer& tok, int64_t vocab_size, int64_t bos_token_id,
                                   const std::vector<int64_t>& eos_token_ids) {
  const std::string who = "tokenizer " + tok.describe();
  if (tok.vocab_size() > vocab_size)
    throw InputError(who + " has " + std::to_string(tok.vocab_size()) + " ids but the model's vocab_size is " +
                     std::to_string(vocab_size) + ": its ids would index past the embedding");
  if (bos_token_id >= 0 && bos_token_id != tok.bos_id())
    throw InputError(who + ": the model's bos_token_id is " + std::to_string(bos_token_id) +
                     " but the tokenizer's <|begin_of_text|> is " + std::to_string(tok.bos_id()));
  for (int64_t eos : eos_token_ids) {
    if (eos < 0 || eos >= tok.vocab_size() || !tok.is_special(int32_t(eos)))
      throw InputError(who + ": the model's eos_token_id " + std::to_string(eos) + " is not a special token of it");
  }
}

}  // namespace llama4d
