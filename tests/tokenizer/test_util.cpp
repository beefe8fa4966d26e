#include "tests/tokenizer/test_util.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "core/data/bpe_tokenizer.h"
#include "core/data/dataset.h"

#ifndef LLAMA4D_SOURCE_DIR
#error "LLAMA4D_SOURCE_DIR must be defined by the build"
#endif

namespace llama4d::test {

namespace fs = std::filesystem;

std::string project_tokenizer_path() { return std::string(LLAMA4D_SOURCE_DIR) + "/data/tokenizer/tokenizer.json"; }

std::vector<std::string> corpus_documents() { return load_documents(std::string(LLAMA4D_SOURCE_DIR) + "/data/corpus"); }

std::vector<std::string> multilingual_strings() {
  const std::vector<std::string> parts = {
      "Hello", " world", "I'm", " YOU'RE", " it's", "123456789", " 3.14", "  ", "\t", "\r\n", "\n\n", "\r",
      "\xC3\xA9", "e\xCC\x81", "\xE6\x88\x91\xE4\xBB\xAC\xE7\x9A\x84\xE6\xA8\xA1\xE5\x9E\x8B",
      "\xD8\xAA\xD8\xAF\xD8\xB1\xD9\x8A\xD8\xA8", "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87",
      "\xF0\x9F\x98\x80", "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",
      "\xF0\x9F\x87\xAB\xF0\x9F\x87\xB7", "<|eot_id|>", "<|begin_of_text|>", "!!", " ...", "\xC2\xA0", "\xE3\x80\x80",
      "\xC2\x85", "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82", " the", " model", "'ll", "\xEF\xBB\xBF"};
  std::mt19937 rng(42);
  std::vector<std::string> out;
  for (int i = 0; i < 300; ++i) {
    std::string s;
    const int n = int(rng() % 10);
    for (int k = 0; k < n; ++k) s += parts[rng() % parts.size()];
    out.push_back(s);
  }
  return out;
}

std::string tiktoken_text(const BpeTokenizer& tok) {
  static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string file;
  for (int32_t id = 0; id < tok.bos_id(); ++id) {
    const std::string bytes = tok.decode(std::vector<int32_t>{id}, {.render_specials = true});
    for (size_t i = 0; i < bytes.size(); i += 3) {  // three bytes -> four letters, '=' padding
      uint32_t v = uint32_t(static_cast<unsigned char>(bytes[i])) << 16;
      if (i + 1 < bytes.size()) v |= uint32_t(static_cast<unsigned char>(bytes[i + 1])) << 8;
      if (i + 2 < bytes.size()) v |= uint32_t(static_cast<unsigned char>(bytes[i + 2]));
      file += b64[(v >> 18) & 63];
      file += b64[(v >> 12) & 63];
      file += i + 1 < bytes.size() ? b64[(v >> 6) & 63] : '=';
      file += i + 2 < bytes.size() ? b64[v & 63] : '=';
    }
    file += " " + std::to_string(id) + "\n";
  }
  return file;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::string from_hex(std::string_view hex) {
  auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(v(hex[i]) * 16 + v(hex[i + 1])));
  return out;
}

std::string printable(std::string_view s, size_t max) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == '"' || c == '\\') out += std::string("\\") + char(c);
    else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else out += char(c);
  }
  out += s.size() > max ? "\"... (" + std::to_string(s.size()) + " bytes)" : "\"";
  return out;
}

std::string ids_text(const std::vector<int32_t>& ids, size_t around, size_t max) {
  const size_t from = around > max / 2 ? around - max / 2 : 0;
  std::string out = from > 0 ? "[... " : "[";
  for (size_t i = from; i < ids.size() && i < from + max; ++i) {
    if (i > from) out += ' ';
    out += std::to_string(ids[i]);
  }
  out += from + max < ids.size() ? " ...] (" + std::to_string(ids.size()) + " ids)" : "]";
  return out;
}

TempDir::TempDir(const std::string& tag) {
  path = fs::temp_directory_path() / ("llama4d_tok_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(path);
  fs::create_directories(path);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path, ec);
}

}  // namespace llama4d::test
