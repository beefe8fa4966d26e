// tokenizer_bench: encoding speed of the BPE tokenizer (core/data/bpe_tokenizer.h), for
// bench/tokenizer_vs_hf.py to set beside Hugging Face's. A benchmark, not a test.
//
//   tokenizer_bench --tokenizer data/tokenizer/tokenizer.json --docs FILE [--threads 1,2,4] [--passes 3]
//                   [--ids-out IDS]
//
// FILE holds documents separated by NUL bytes (one document if it has none). Each thread count
// encodes all documents `passes` times after one untimed pass (which fills the word cache, as
// a long-running trainer's is), on encode_documents' threads, and prints one JSON line per
// thread count: bytes, tokens, the median and best MB/s (10^6 bytes of text per second).
// --ids-out writes each document's ids as text, one document per line, for a comparison.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/data/bpe_tokenizer.h"
#include "core/data/encode_corpus.h"
#include "core/data/tokenizer_loader.h"
#include "core/error.h"
#include "core/parse_number.h"

namespace {

std::string read_all(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw llama4d::InputError("cannot open " + path);
  std::string s;
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
  std::fclose(f);
  return s;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  size_t at = 0;
  while (at < s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    out.push_back(llama4d::parse_number<int>(s.substr(at, comma - at), "--threads item", 1));
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string tokenizer_path, docs_path, ids_out;
    std::vector<int> threads{1};
    int passes = 3;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw llama4d::InputError(a + " needs a value");
        return argv[++i];
      };
      if (a == "--tokenizer") tokenizer_path = value();
      else if (a == "--docs") docs_path = value();
      else if (a == "--threads") threads = parse_list(value());
      else if (a == "--passes") passes = llama4d::parse_number<int>(value(), "--passes", 1);
      else if (a == "--ids-out") ids_out = value();
      else throw llama4d::InputError("unknown argument " + a + " (see bench/tokenizer_bench.cpp)");
    }
    if (tokenizer_path.empty() || docs_path.empty()) throw llama4d::InputError("--tokenizer and --docs are required");
    std::unique_ptr<llama4d::Tokenizer> tok;
    if (tokenizer_path.size() > 6 && tokenizer_path.substr(tokenizer_path.size() - 6) == ".model")
      tok = std::make_unique<llama4d::BpeTokenizer>(llama4d::load_tiktoken(tokenizer_path));
    else
      tok = std::make_unique<llama4d::BpeTokenizer>(llama4d::load_tokenizer_json(tokenizer_path));
    const std::string all = read_all(docs_path);
    std::vector<std::string> docs;
    for (size_t at = 0; at <= all.size();) {
      size_t end = all.find('\0', at);
      if (end == std::string::npos) end = all.size();
      if (end > at) docs.push_back(all.substr(at, end - at));
      at = end + 1;
    }
    const double bytes = double(all.size() - (docs.empty() ? 0 : docs.size() - 1));
    for (int t : threads) {
      const llama4d::EncodedDocuments warm = llama4d::encode_documents(*tok, docs, t);
      std::vector<double> rates;
      for (int p = 0; p < passes; ++p) {
        const auto t0 = std::chrono::steady_clock::now();
        const llama4d::EncodedDocuments e = llama4d::encode_documents(*tok, docs, t);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (e.ids.size() != warm.ids.size()) throw llama4d::Error("a pass gave another token count");
        rates.push_back(bytes / s / 1e6);
      }
      std::sort(rates.begin(), rates.end());
      if (!ids_out.empty()) {
        FILE* f = std::fopen(ids_out.c_str(), "w");
        if (!f) throw llama4d::InputError("cannot write " + ids_out);
        for (size_t d = 0; d < warm.size(); ++d) {
          for (int32_t id : warm.document(d)) std::fprintf(f, "%d ", id);
          std::fputc('\n', f);
        }
        std::fclose(f);
      }
      std::printf("{\"threads\": %d, \"documents\": %zu, \"bytes\": %.0f, \"tokens\": %zu, \"median_mb_s\": %.2f, \"best_mb_s\": %.2f}\n",
                  t, docs.size(), bytes, warm.ids.size(), rates[rates.size() / 2], rates.back());
      std::fflush(stdout);
    }
    return 0;
  } catch (const llama4d::InputError& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
}
