#include "core/data/encode_corpus.h"

#include <atomic>
#include <chrono>
#include <bit>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <unistd.h>

#include "core/data/hash.h"
#include "core/error.h"

namespace llama4d {

namespace fs = std::filesystem;

EncodeProgress progress_printer(std::FILE* out, std::string what, int64_t min_bytes, double interval_s) {
  using Clock = std::chrono::steady_clock;
  // Calls come one at a time (encode_documents holds its lock), so the state needs no lock of its own.
  auto last = std::make_shared<std::optional<Clock::time_point>>();
  return [out, what = std::move(what), min_bytes, interval_s, last](int64_t docs_done, int64_t docs_total,
                                                                   int64_t bytes_done, int64_t bytes_total) {
    if (bytes_total < min_bytes) return;
    const Clock::time_point now = Clock::now();
    const bool done = docs_done == docs_total;
    if (!done && *last && std::chrono::duration<double>(now - **last).count() < interval_s) return;
    *last = now;
    std::fprintf(out, "tokenize: %s: %.1f of %.1f MB, %lld of %lld documents\n", what.c_str(), double(bytes_done) / 1e6,
                 double(bytes_total) / 1e6, (long long)docs_done, (long long)docs_total);
    std::fflush(out);
  };
}

EncodedDocuments encode_documents(const Tokenizer& tok, std::span<const std::string> docs, int threads,
                                  const EncodeOptions& opt, const EncodeProgress& progress) {
  if (threads < 1) throw InputError("encode_documents: threads must be >= 1, got " + std::to_string(threads));
  const size_t n = docs.size();
  std::vector<std::vector<int32_t>> per_doc(n);
  int64_t bytes_total = 0;
  for (const std::string& d : docs) bytes_total += int64_t(d.size());

  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;  // guards error and the progress counts
  int64_t docs_done = 0, bytes_done = 0;
  auto work = [&] {
    for (size_t d; !failed.load(std::memory_order_relaxed) && (d = next.fetch_add(1)) < n;) {
      try {
        per_doc[d] = tok.encode(docs[d], opt);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        failed = true;
        return;
      }
      if (progress) {
        std::lock_guard<std::mutex> lock(mu);
        ++docs_done;
        bytes_done += int64_t(docs[d].size());
        progress(docs_done, int64_t(n), bytes_done, bytes_total);
      }
    }
  };
  const size_t helpers = std::min<size_t>(size_t(threads) - 1, n > 0 ? n - 1 : 0);
  std::vector<std::thread> pool;
  pool.reserve(helpers);
  for (size_t t = 0; t < helpers; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);

  EncodedDocuments out;
  size_t total = 0;
  for (const auto& v : per_doc) total += v.size();
  out.ids.reserve(total);
  out.offsets.reserve(n + 1);
  for (const auto& v : per_doc) {
    out.ids.insert(out.ids.end(), v.begin(), v.end());
    out.offsets.push_back(int64_t(out.ids.size()));
  }
  return out;
}

namespace {

static_assert(std::endian::native == std::endian::little, "the token cache is written little-endian");

constexpr char kMagic[8] = {'L', '4', 'D', 'T', 'O', 'K', 'S', '1'};

uint64_t options_hash(const EncodeOptions& opt) {
  uint64_t h = hash_bytes("encode options v1");
  h = hash_u64(uint64_t(opt.add_bos) | uint64_t(opt.add_eos) << 1 | uint64_t(opt.allow_special) << 2 |
                   uint64_t(opt.invalid_utf8 == InvalidUtf8::kReplace) << 3,
               h);
  return h;
}

uint64_t text_hash(std::span<const std::string> docs) {
  uint64_t h = hash_u64(docs.size(), kHashSeed);
  for (const std::string& d : docs) h = hash_bytes(d, hash_u64(d.size(), h));
  return h;
}

uint64_t ids_checksum(const EncodedDocuments& e) {
  uint64_t h = kHashSeed;
  h = hash_bytes(std::string_view(reinterpret_cast<const char*>(e.offsets.data()), e.offsets.size() * 8), h);
  h = hash_bytes(std::string_view(reinterpret_cast<const char*>(e.ids.data()), e.ids.size() * 4), h);
  return h;
}

struct Header {
  char magic[8];
  uint64_t tokenizer, options, text, documents, ids;
};

// Only a regular file is read as a cache: anything else under its name (a FIFO would block the
// read) is no cache, and the save replaces it.
bool is_cache_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

// The cache's ids if `path` holds a valid cache for exactly this header.
std::optional<EncodedDocuments> read_cache(const std::string& path, const Header& want) {
  if (!is_cache_file(path)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  Header h{};
  if (!in.read(reinterpret_cast<char*>(&h), sizeof h) || std::memcmp(&h, &want, sizeof h) != 0) return std::nullopt;
  if (h.ids > (uint64_t(1) << 40) || h.documents > (uint64_t(1) << 40)) return std::nullopt;
  EncodedDocuments e;
  e.offsets.resize(size_t(h.documents + 1));
  e.ids.resize(size_t(h.ids));
  uint64_t checksum = 0;
  if (!in.read(reinterpret_cast<char*>(e.offsets.data()), std::streamsize(e.offsets.size() * 8)) ||
      !in.read(reinterpret_cast<char*>(e.ids.data()), std::streamsize(e.ids.size() * 4)) ||
      !in.read(reinterpret_cast<char*>(&checksum), 8))
    return std::nullopt;
  if (in.peek() != std::char_traits<char>::eof()) return std::nullopt;  // trailing bytes
  if (checksum != ids_checksum(e) || e.offsets.front() != 0 || e.offsets.back() != int64_t(e.ids.size()))
    return std::nullopt;
  return e;
}

void write_cache(const std::string& path, const Header& h, const EncodedDocuments& e) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;  // read-only data directory: no cache, not an error
    const uint64_t checksum = ids_checksum(e);
    out.write(reinterpret_cast<const char*>(&h), sizeof h);
    out.write(reinterpret_cast<const char*>(e.offsets.data()), std::streamsize(e.offsets.size() * 8));
    out.write(reinterpret_cast<const char*>(e.ids.data()), std::streamsize(e.ids.size() * 4));
    out.write(reinterpret_cast<const char*>(&checksum), 8);
    if (!out.flush()) {
      out.close();
      std::remove(tmp.c_str());
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fs::remove(tmp, ec);
}

Header make_header(const Tokenizer& tok, std::span<const std::string> docs, const EncodeOptions& opt) {
  Header h{};
  std::memcpy(h.magic, kMagic, 8);
  h.tokenizer = tok.fingerprint();
  h.options = options_hash(opt);
  h.text = text_hash(docs);
  h.documents = docs.size();
  return h;
}

std::string cache_path_for(const std::string& data_path, const Header& h) {
  std::string p = data_path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();  // a directory's cache sits beside it
  const uint64_t key = hash_u64(h.text, hash_u64(h.options, hash_u64(h.tokenizer, kHashSeed)));
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key));
  return p + ".llama4d-tokens-" + hex + ".bin";
}

}  // namespace

std::string token_cache_path(const std::string& data_path, const Tokenizer& tok, std::span<const std::string> docs,
                             const EncodeOptions& opt) {
  return cache_path_for(data_path, make_header(tok, docs, opt));
}

EncodedDocuments encode_documents_cached(const Tokenizer& tok, const std::string& data_path,
                                         std::span<const std::string> docs, int threads, const EncodeOptions& opt,
                                         const EncodeProgress& progress, bool* from_cache) {
  Header h = make_header(tok, docs, opt);
  const std::string path = cache_path_for(data_path, h);
  // The id count is only known after encoding: read the stored one and let the full header
  // comparison, the offsets and the checksum decide.
  if (is_cache_file(path)) {
    std::ifstream in(path, std::ios::binary);
    Header stored{};
    if (in && in.read(reinterpret_cast<char*>(&stored), sizeof stored)) {
      Header want = h;
      want.ids = stored.ids;
      in.close();
      if (std::optional<EncodedDocuments> e = read_cache(path, want)) {
        if (from_cache) *from_cache = true;
        if (progress) {
          int64_t bytes = 0;
          for (const std::string& d : docs) bytes += int64_t(d.size());
          progress(int64_t(docs.size()), int64_t(docs.size()), bytes, bytes);
        }
        return std::move(*e);
      }
    }
  }
  EncodedDocuments e = encode_documents(tok, docs, threads, opt, progress);
  h.ids = e.ids.size();
  write_cache(path, h, e);
  if (from_cache) *from_cache = false;
  return e;
}

}  // namespace llama4d
