#pragma once
// Encoding a corpus: documents on several threads with the same ids on any thread count, and a
// token cache file beside the data so a corpus is encoded once per tokenizer.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/data/tokenizer.h"

namespace llama4d {

// The ids of documents one after another: document d is ids[offsets[d], offsets[d + 1]).
struct EncodedDocuments {
  std::vector<int32_t> ids;
  std::vector<int64_t> offsets{0};

  size_t size() const { return offsets.size() - 1; }
  TokenSpan document(size_t d) const {
    return TokenSpan(ids).subspan(size_t(offsets[d]), size_t(offsets[d + 1] - offsets[d]));
  }
};

// Progress: documents and bytes done so far, and the totals. Called after each document from
// whichever thread finished it, one call at a time (under a lock), with counts that only grow;
// keep it quick.
using EncodeProgress = std::function<void(int64_t docs_done, int64_t docs_total, int64_t bytes_done, int64_t bytes_total)>;

// An EncodeProgress that writes "tokenize: <what>: 120.5 of 512.0 MB, 1,000 of 4,000 documents"
// lines to `out` (stderr for the commands) for a corpus of at least `min_bytes` (smaller ones
// encode in moments and print nothing): at most one line per `interval_s` seconds, and always
// the last, when every document is done.
EncodeProgress progress_printer(std::FILE* out, std::string what, int64_t min_bytes = int64_t(32) << 20,
                                double interval_s = 1.0);

// Each document encoded by tok.encode(doc, opt), on `threads` threads (>= 1; the calling
// thread is one of them). Documents are independent, so the ids do not depend on the thread
// count or on which thread took which document. The first exception a document throws is
// rethrown here once every thread has stopped.
EncodedDocuments encode_documents(const Tokenizer& tok, std::span<const std::string> docs, int threads,
                                  const EncodeOptions& opt = {}, const EncodeProgress& progress = {});

// Where encode_documents_cached keeps the ids of `docs` from `data_path` (a file or directory):
// "<data_path>.llama4d-tokens-<16 hex digits>.bin", the digits a hash of the tokenizer's
// fingerprint, the options and the text.
std::string token_cache_path(const std::string& data_path, const Tokenizer& tok, std::span<const std::string> docs,
                             const EncodeOptions& opt = {});

// encode_documents, read from token_cache_path when a valid cache is there, else encoded and
// written there (to a temporary name, then renamed, so a reader never sees half a file; a
// directory that cannot be written to only costs the cache). The file's header repeats the
// hashes and sizes and it ends with a checksum of the ids, so a stale, truncated or corrupt
// file is not used (it is encoded again and replaced). `*from_cache` (when given) says which
// happened.
//
// Layout (little-endian): "L4DTOKS1", u64 tokenizer fingerprint, u64 options hash, u64 text hash,
// u64 documents, u64 ids, then i64 offsets[documents + 1], i32 ids[ids], u64 checksum.
EncodedDocuments encode_documents_cached(const Tokenizer& tok, const std::string& data_path,
                                         std::span<const std::string> docs, int threads,
                                         const EncodeOptions& opt = {}, const EncodeProgress& progress = {},
                                         bool* from_cache = nullptr);

}  // namespace llama4d
