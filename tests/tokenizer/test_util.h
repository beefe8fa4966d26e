#pragma once
// Helpers shared by the tokenizer tests.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace llama4d {
class BpeTokenizer;
}

namespace llama4d::test {

// data/tokenizer/tokenizer.json of the source tree.
std::string project_tokenizer_path();
// The shipped corpus, one string per document (data/corpus/*.txt in name order).
std::vector<std::string> corpus_documents();
// A few hundred strings of many scripts, emoji, digits and whitespace, from a fixed seed.
std::vector<std::string> multilingual_strings();

// Meta's tokenizer.model text of `tok`'s BPE ids (every id below its <|begin_of_text|>): a line
// per id, the base64 of its bytes, a space and the id as its rank.
std::string tiktoken_text(const BpeTokenizer& tok);

std::string read_file(const std::filesystem::path& path);
void write_file(const std::filesystem::path& path, std::string_view bytes);
std::string from_hex(std::string_view hex);
// `s` printable for a failure message: escapes, at most `max` bytes shown.
std::string printable(std::string_view s, size_t max = 160);
std::string ids_text(const std::vector<int32_t>& ids, size_t around = 0, size_t max = 24);

// A scratch directory removed when the test ends.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag);
  ~TempDir();
};

}  // namespace llama4d::test
