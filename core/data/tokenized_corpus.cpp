#include "core/data/tokenized_corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/data/encode_corpus.h"
#include "core/data/utf8.h"
#include "core/error.h"
#include "core/regular_file.h"

namespace llama4d {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_role(const std::string& r) { return r == "system" || r == "user" || r == "assistant"; }

// One line's document: its "text", or its "messages" as ChatMessages; exactly one of the two.
CorpusDocument parse_line(const std::string& line, const std::string& where) {
  if (find_invalid_utf8(line) >= 0) throw InputError(where + ": not valid UTF-8");
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded()) throw InputError(where + ": invalid JSON");
  if (!j.is_object()) throw InputError(where + ": not a JSON object");
  const bool text = j.contains("text"), messages = j.contains("messages");
  if (text == messages)
    throw InputError(where + (text ? ": has both a \"text\" and a \"messages\" field; give one"
                                   : ": has neither a \"text\" nor a \"messages\" field"));
  CorpusDocument doc;
  if (text) {
    if (!j.at("text").is_string()) throw InputError(where + ": \"text\" is not a string");
    doc.text = j.at("text").get<std::string>();
    return doc;
  }
  const nlohmann::json& m = j.at("messages");
  if (!m.is_array()) throw InputError(where + ": \"messages\" is not a list");
  if (m.empty()) throw InputError(where + ": \"messages\" is an empty list");
  doc.messages.emplace();
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string at = where + ": message " + std::to_string(i);
    if (!m[i].is_object()) throw InputError(at + " is not a JSON object");
    if (!m[i].contains("role") || !m[i].at("role").is_string()) throw InputError(at + " has no string \"role\"");
    if (!m[i].contains("content") || !m[i].at("content").is_string())
      throw InputError(at + " has no string \"content\"");
    const std::string role = m[i].at("role").get<std::string>();
    if (!is_role(role)) throw InputError(at + " has unknown role \"" + role + "\" (system, user or assistant)");
    doc.messages->push_back({role, m[i].at("content").get<std::string>()});
  }
  return doc;
}

}  // namespace

std::vector<CorpusDocument> load_jsonl_documents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot open data file " + path);
  std::vector<CorpusDocument> docs;
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    docs.push_back(parse_line(line, path + ":" + std::to_string(n)));
    docs.back().where = path + ":" + std::to_string(n);
  }
  if (docs.empty()) throw InputError("data file " + path + " has no documents");
  return docs;
}

namespace {

// The .txt and .jsonl files directly in `dir` (not hidden, not directories), in byte order of
// their names as load_documents orders a directory's .txt files.
std::vector<std::filesystem::path> corpus_files_in(const std::string& dir) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::filesystem::path& p = it->path();
    const std::string name = p.filename().string();
    if (name.empty() || name[0] == '.' || (p.extension() != ".txt" && p.extension() != ".jsonl")) continue;
    std::error_code dir_ec;
    if (std::filesystem::is_directory(p, dir_ec)) continue;
    stat_regular_file(p.string(), "data file");
    files.push_back(p);
  }
  if (ec) throw InputError("cannot list data directory " + dir + ": " + ec.message());
  std::sort(files.begin(), files.end(), [](const std::filesystem::path& a, const std::filesystem::path& b) {
    return a.filename().string() < b.filename().string();
  });
  return files;
}

std::vector<CorpusDocument> as_corpus(const std::vector<std::string>& texts, const std::string& where) {
  std::vector<CorpusDocument> docs;
  for (const std::string& t : texts) docs.push_back({where, t, std::nullopt});
  return docs;
}

}  // namespace

std::vector<CorpusDocument> load_corpus_documents(const std::string& path) {
  std::error_code ec;
  const bool directory = !path.empty() && std::filesystem::is_directory(path, ec);
  if (!directory) return ends_with(path, ".jsonl") ? load_jsonl_documents(path) : as_corpus(load_documents(path), path);
  const std::vector<std::filesystem::path> files = corpus_files_in(path);
  const bool any_jsonl =
      std::any_of(files.begin(), files.end(), [](const std::filesystem::path& f) { return f.extension() == ".jsonl"; });
  if (!any_jsonl) return as_corpus(load_documents(path), path);  // a directory of .txt files as before
  std::vector<CorpusDocument> docs;
  for (const std::filesystem::path& f : files) {
    std::vector<CorpusDocument> part = load_corpus_documents(f.string());
    docs.insert(docs.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  return docs;
}

std::vector<std::string> load_text_documents(const std::string& path) {
  std::vector<std::string> docs;
  for (CorpusDocument& d : load_corpus_documents(path)) {
    if (d.messages)
      throw InputError(d.where +
                       ": a \"messages\" line needs a model directory's BPE tokenizer and its chat format "
                       "(train --init DIR); the byte tokenizer has no special tokens to render a chat with");
    docs.push_back(std::move(d.text));
  }
  return docs;
}

namespace {

// The documents of `enc` one after another with `eot` between consecutive ones.
std::vector<int32_t> pack_encoded(const EncodedDocuments& enc, int32_t eot) {
  std::vector<int32_t> tokens;
  tokens.reserve(enc.ids.size() + enc.size());
  for (size_t d = 0; d < enc.size(); ++d) {
    if (d > 0) tokens.push_back(eot);
    const TokenSpan ids = enc.document(d);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }
  return tokens;
}

}  // namespace

int32_t end_of_text_id(const Tokenizer& tok) {
  if (dynamic_cast<const ByteTokenizer*>(&tok)) return kEndOfTextToken;
  const std::optional<int32_t> eot = tok.token_to_id("<|end_of_text|>");
  if (!eot) throw InputError("tokenizer " + tok.describe() + " has no <|end_of_text|> to pack documents with");
  return *eot;
}

std::vector<int32_t> tokenize_corpus(const Tokenizer& tok, const std::string& path, int threads,
                                     const EncodeProgress& progress, const std::optional<ChatFormat>& chat) {
  if (dynamic_cast<const ByteTokenizer*>(&tok)) return pack_documents(load_text_documents(path));
  // Text documents through the cache (a corpus of them alone is cached as before), "messages"
  // lines rendered by encode_chat, then every document in order.
  const std::vector<CorpusDocument> lines = load_corpus_documents(path);
  const int32_t eot = end_of_text_id(tok);
  std::vector<std::string> texts;
  for (const CorpusDocument& d : lines)
    if (!d.messages) texts.push_back(d.text);
  const EncodedDocuments enc = encode_documents_cached(tok, path, texts, threads, {}, progress);
  std::vector<std::vector<int32_t>> ids;
  size_t t = 0;
  for (const CorpusDocument& d : lines) {
    if (!d.messages) {
      const TokenSpan s = enc.document(t++);
      ids.emplace_back(s.begin(), s.end());
      continue;
    }
    const std::string& where = d.where;
    if (!chat)
      throw InputError(where + ": a \"messages\" line needs a chat format, and the model directory gives none (no "
                       "chat_template in tokenizer_config.json, or one not recognised; see generate --chat)");
    ChatEncodeOptions opt{.add_generation_prompt = false, .date = chat->default_date};
    if (opt.date.empty()) opt.date = kTrainingChatDate;
    try {
      ids.push_back(encode_chat(tok, *chat, *d.messages, opt));
    } catch (const InputError& e) {
      throw InputError(where + ": " + e.what());
    }
  }
  EncodedDocuments all;
  for (const std::vector<int32_t>& v : ids) {
    all.ids.insert(all.ids.end(), v.begin(), v.end());
    all.offsets.push_back(int64_t(all.ids.size()));
  }
  return pack_encoded(all, eot);
}

TextDataset load_tokenized_dataset(const Tokenizer& tok, const std::string& path, int64_t seq_len, int threads,
                                   const EncodeProgress& progress, double val_fraction,
                                   const std::optional<ChatFormat>& chat) {
  return split_tokens(tokenize_corpus(tok, path, threads, progress, chat), seq_len, val_fraction, path);
}

}  // namespace llama4d
