#include "core/train/model_directory.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/data/tokenizer_loader.h"
#include "core/error.h"
#include "core/io/checkpoint.h"

namespace llama4d {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// An id or a list of ids under `key` (absent or null: none), each an integer, naming the file.
std::vector<int64_t> token_ids(const json& j, const char* key, const std::string& file) {
  std::vector<int64_t> out;
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  const json items = it->is_array() ? *it : json::array({*it});
  for (const json& v : items) {
    if (!v.is_number_integer()) throw InputError(file + ": " + key + " must be an id or a list of ids, got " + it->dump());
    out.push_back(v.get<int64_t>());
  }
  return out;
}

bool has_tokenizer_file(const fs::path& dir) {
  for (const char* f : {"tokenizer.json", "tokenizer.model", "original/tokenizer.model"})
    if (fs::exists(dir / f)) return true;
  return false;
}

// llama4d's byte models write bos 256 and eos 257 (config.h's defaults) and a vocabulary of
// at least the byte tokenizer's 264 ids.
bool is_byte_model(const LlamaConfig& cfg) {
  return cfg.bos_token_id == kBeginOfTextToken && cfg.eos_token_id == kEndOfTextToken &&
         cfg.vocab_size >= kByteVocabSize;
}

// Every id of `ids` a special token of `tok`, naming `key` and `file` otherwise.
void check_stop_ids(const Tokenizer& tok, const std::vector<int64_t>& ids, const std::string& key,
                    const std::string& file) {
  for (int64_t id : ids)
    if (id < 0 || id >= tok.vocab_size() || !tok.is_special(int32_t(id)))
      throw InputError(file + ": " + key + " " + std::to_string(id) + " is not a special token of tokenizer " +
                       tok.describe() + " (" + std::to_string(tok.vocab_size()) + " ids)");
}

void add_once(std::vector<int32_t>& to, int64_t id) {
  if (std::find(to.begin(), to.end(), int32_t(id)) == to.end()) to.push_back(int32_t(id));
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_for_shape(const LlamaConfig& cfg) {
  auto tok = std::make_unique<ByteTokenizer>();
  check_tokenizer_matches_model(*tok, cfg.vocab_size, cfg.bos_token_id, {cfg.eos_token_id});
  return tok;
}

ModelDirectory open_model_directory(const std::string& dir) {
  const fs::path path(dir);
  if (!fs::is_directory(path)) throw InputError("model directory " + dir + " does not exist");
  ModelDirectory m;
  m.dir = dir;
  m.config = load_config(dir);
  const std::string config_file = (path / kConfigFile).string();
  const json raw = read_json_file(config_file);

  if (has_tokenizer_file(path) || raw.contains("llama4d_tokenizer"))
    m.tokenizer = load_tokenizer(dir);
  else if (is_byte_model(m.config))
    m.tokenizer = std::make_unique<ByteTokenizer>();
  else
    throw InputError("no tokenizer in " + dir + ": looked for tokenizer.json, tokenizer.model and "
                     "original/tokenizer.model, and its config (vocab_size " + std::to_string(m.config.vocab_size) +
                     ", bos_token_id " + std::to_string(m.config.bos_token_id) +
                     ") is not one of llama4d's byte models; copy the tokenizer files of the model beside config.json");
  const Tokenizer& tok = *m.tokenizer;

  // bos: config.json's own value (LlamaConfig fills in the byte default when it is absent).
  const std::vector<int64_t> bos = token_ids(raw, "bos_token_id", config_file);
  const std::vector<int64_t> eos = token_ids(raw, "eos_token_id", config_file);
  try {
    check_tokenizer_matches_model(tok, m.config.vocab_size, bos.empty() ? -1 : bos[0], {});
  } catch (const InputError& e) {
    throw InputError(config_file + ": " + e.what());
  }
  check_stop_ids(tok, eos, "eos_token_id", config_file);

  std::vector<int64_t> gen_eos;
  const fs::path gen = path / "generation_config.json";
  if (fs::exists(gen)) {
    gen_eos = token_ids(read_json_file(gen.string()), "eos_token_id", gen.string());
    check_stop_ids(tok, gen_eos, "eos_token_id", gen.string());
  }
  for (int64_t id : gen_eos) add_once(m.stop_ids, id);
  for (int64_t id : eos) add_once(m.stop_ids, id);
  for (int32_t id : tok.eos_ids()) add_once(m.stop_ids, id);

  const fs::path tc = path / "tokenizer_config.json";
  if (fs::exists(tc)) {
    const json j = read_json_file(tc.string());
    if (const auto it = j.find("chat_template"); it != j.end() && !it->is_null()) {
      if (!it->is_string())
        throw InputError(tc.string() + ": chat_template is not a string (a list of named templates is not supported)");
      m.chat_template = it->get<std::string>();
      m.chat_template_source = tc.string();
    }
  }
  return m;
}

ChatFormat ModelDirectory::chat_format(const std::string& name) const {
  if (!name.empty()) return chat_format_by_name(name);
  if (!chat_template)
    throw InputError(dir + " has no chat_template (tokenizer_config.json): it is not an instruct model; "
                     "pass --chat-format llama3.0|llama3.1|llama3.2 to chat with it anyway");
  return recognise_chat_template(*chat_template, chat_template_source);
}

std::optional<ChatFormat> ModelDirectory::data_chat_format() const {
  if (!chat_template) return std::nullopt;
  try {
    return recognise_chat_template(*chat_template, chat_template_source);
  } catch (const InputError&) {
    return std::nullopt;
  }
}

}  // namespace llama4d
