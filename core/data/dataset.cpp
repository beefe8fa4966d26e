#include "core/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <system_error>
#include <utility>

#include "core/data/utf8.h"
#include "core/error.h"
#include "core/regular_file.h"

#ifndef LLAMA4D_DATA_DIR
#error "LLAMA4D_DATA_DIR must be defined by core/data/CMakeLists.txt"
#endif

namespace llama4d {

namespace fs = std::filesystem;

namespace {

std::string read_file_bytes(const fs::path& path) {
  return read_regular_file(path.string(), "data file", std::numeric_limits<uint64_t>::max());
}

void check_utf8(std::string_view bytes, const fs::path& path) {
  const int64_t bad = find_invalid_utf8(bytes);
  if (bad < 0) return;
  const int64_t line = 1 + std::count(bytes.begin(), bytes.begin() + bad, '\n');
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", unsigned(static_cast<unsigned char>(bytes[size_t(bad)])));
  throw InputError("data file " + path.string() + " is not valid UTF-8: invalid sequence at byte " +
                   std::to_string(bad) + " (line " + std::to_string(line) + ", byte " + hex + ")");
}

std::vector<fs::path> text_files_in(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    const std::string name = p.filename().string();
    if (name.empty() || name[0] == '.' || p.extension() != ".txt") continue;
    // A .txt that is a FIFO, a device or a symlink loop is an error naming it, not skipped: the
    // corpus would silently lack a document. A directory named *.txt is not a document.
    std::error_code dir_ec;
    if (fs::is_directory(p, dir_ec)) continue;
    stat_regular_file(p.string(), "data file");
    files.push_back(p);
  }
  if (ec) throw InputError("cannot list data directory " + dir.string() + ": " + ec.message());
  // Byte order of names, so part-01.txt < part-02.txt on every platform and locale.
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
  return files;
}

}  // namespace

std::vector<std::string> load_documents(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (path.empty()) throw InputError("data path is empty");
  const bool directory = fs::is_directory(p, ec);
  // Anything else must be a regular file: a device (/dev/zero) or a FIFO would be read forever or
  // block, a symlink loop never resolves.
  if (!directory) stat_regular_file(path, "data");
  if (directory) {
    const std::vector<fs::path> files = text_files_in(p);
    if (files.empty()) throw InputError("data directory " + path + " contains no .txt files");
    std::vector<std::string> documents;
    for (const fs::path& file : files) {
      std::string text = read_file_bytes(file);
      // An empty document would pack as two <|end_of_text|> in a row: refuse it, naming the file.
      if (text.empty()) throw InputError("data file is empty: " + file.string());
      check_utf8(text, file);  // per file, so the offset points into the file to fix
      documents.push_back(std::move(text));
    }
    return documents;
  }

  std::string text = read_file_bytes(p);
  if (text.empty()) throw InputError("data file is empty: " + path);
  check_utf8(text, p);
  return {std::move(text)};
}

std::vector<int32_t> pack_documents(const std::vector<std::string>& documents) {
  std::vector<int32_t> tokens;
  const ByteTokenizer tokenizer;
  for (size_t i = 0; i < documents.size(); ++i) {
    if (i > 0) tokens.push_back(kEndOfTextToken);
    const std::vector<int32_t> ids = tokenizer.encode(documents[i]);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }
  return tokens;
}

TextDataset split_tokens(std::vector<int32_t> tokens, int64_t seq_len, double val_fraction, std::string source) {
  if (seq_len < 1) throw InputError("seq_len must be at least 1, got " + std::to_string(seq_len));
  if (!(val_fraction > 0.0 && val_fraction < 1.0)) {
    throw InputError("validation fraction must be in (0, 1), got " + std::to_string(val_fraction));
  }
  TextDataset ds;
  ds.tokens = std::move(tokens);
  if (ds.tokens.empty()) throw InputError("data " + source + " is empty");
  ds.source = std::move(source);
  const int64_t n = int64_t(ds.tokens.size());
  const auto n_val = int64_t(std::floor(double(n) * val_fraction));
  ds.train_size = n - n_val;

  // A window is seq_len + 1 tokens (inputs plus the one-token-shifted targets), compared as
  // have <= seq_len so that no seq_len overflows.
  auto too_short = [&](const char* side, int64_t have) {
    return InputError(std::string(side) + " split of " + ds.source + " has " + std::to_string(have) +
                      " tokens, fewer than one window of seq_len + 1 = " + std::to_string(seq_len) + " + 1 tokens" +
                      " (corpus " + std::to_string(n) + " tokens, validation fraction " +
                      std::to_string(val_fraction) + "); use more text or a shorter seq_len");
  };
  if (ds.train_size <= seq_len) throw too_short("training", ds.train_size);
  if (n_val <= seq_len) throw too_short("validation", n_val);
  return ds;
}

TextDataset make_dataset(const std::vector<std::string>& documents, int64_t seq_len, double val_fraction,
                         std::string source) {
  return split_tokens(pack_documents(documents), seq_len, val_fraction, std::move(source));
}

TextDataset make_dataset(std::string_view text, int64_t seq_len, double val_fraction, std::string source) {
  return make_dataset(std::vector<std::string>{std::string(text)}, seq_len, val_fraction, std::move(source));
}

TextDataset load_dataset(const std::string& path, int64_t seq_len, double val_fraction) {
  return make_dataset(load_documents(path), seq_len, val_fraction, path);
}

namespace {

// The directory holding the running executable, or empty where /proc cannot say (not Linux).
// /proc/self/exe is the resolved file, so a symlink to the binary still finds its own share/.
fs::path executable_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

}  // namespace

std::string default_corpus_path() {
  // Installed or copied (bin/ beside share/), then the source tree this binary was built from.
  std::vector<fs::path> candidates;
  if (const fs::path dir = executable_dir(); !dir.empty())
    candidates.push_back((dir / ".." / "share" / "llama4d" / "corpus").lexically_normal());
  candidates.push_back(fs::path(LLAMA4D_DATA_DIR) / "corpus");
  std::string tried;
  for (const fs::path& c : candidates) {
    std::error_code ec;
    if (fs::is_directory(c, ec)) return c.string();
    tried += (tried.empty() ? "" : ", ") + c.string();
  }
  throw InputError("no default corpus: looked in " + tried + "; pass --data FILE_OR_DIR");
}

}  // namespace llama4d
