#include "core/data/tokenized_corpus.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/data/encode_corpus.h"
#include "core/data/utf8.h"
#include "core/error.h"

namespace llama4d {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> load_jsonl(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("cannot open data file " + path);
  std::vector<std::string> docs;
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + " line " + std::to_string(n);
    if (find_invalid_utf8(line) >= 0) throw InputError(where + " is not valid UTF-8");
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("text") || !j.at("text").is_string())
      throw InputError(where + " is not a JSON object with a string \"text\" field");
    docs.push_back(j.at("text").get<std::string>());
  }
  if (docs.empty()) throw InputError("data file " + path + " has no documents");
  return docs;
}

}  // namespace

std::vector<std::string> load_text_documents(const std::string& path) {
  return ends_with(path, ".jsonl") ? load_jsonl(path) : load_documents(path);
}

int32_t end_of_text_id(const Tokenizer& tok) {
  if (dynamic_cast<const ByteTokenizer*>(&tok)) return kEndOfTextToken;
  const std::optional<int32_t> eot = tok.token_to_id("<|end_of_text|>");
  if (!eot) throw InputError("tokenizer " + tok.describe() + " has no <|end_of_text|> to pack documents with");
  return *eot;
}

std::vector<int32_t> tokenize_corpus(const Tokenizer& tok, const std::string& path, int threads,
                                     const EncodeProgress& progress) {
  const std::vector<std::string> docs = load_text_documents(path);
  if (dynamic_cast<const ByteTokenizer*>(&tok)) return pack_documents(docs);
  const int32_t eot = end_of_text_id(tok);
  const EncodedDocuments enc = encode_documents_cached(tok, path, docs, threads, {}, progress);
  std::vector<int32_t> tokens;
  tokens.reserve(enc.ids.size() + enc.size());
  for (size_t d = 0; d < enc.size(); ++d) {
    if (d > 0) tokens.push_back(eot);
    const TokenSpan ids = enc.document(d);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }
  return tokens;
}

TextDataset load_tokenized_dataset(const Tokenizer& tok, const std::string& path, int64_t seq_len, int threads,
                                   const EncodeProgress& progress, double val_fraction) {
  return split_tokens(tokenize_corpus(tok, path, threads, progress), seq_len, val_fraction, path);
}

}  // namespace llama4d
