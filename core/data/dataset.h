#pragma once
// A text corpus as byte tokens, with a held-out validation split.
//
// Split rule (deterministic, no randomness, no shuffling):
//   n_val   = floor(n * val_fraction)       (n = tokens in the corpus)
//   train() = tokens[0, n - n_val)          the first 90% by default
//   validation() = tokens[n - n_val, n)     the LAST 10% by default
// The split is contiguous so no training window overlaps a validation window: a random
// per-window split would leak validation text into training through the overlaps. The cut is
// at a byte, which may fall inside a word or a multi-byte character; a byte model does not care.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/tokenizer.h"

namespace llama4d {

// Reads a corpus as documents (the units a document mask keeps apart). `path` is either
//   - a file: one document, its bytes, or
//   - a directory: one document per regular file in it whose name ends in ".txt" (not hidden,
//     not recursive), in byte order of the file names.
// Throws InputError naming the path for a missing path, one that is neither a regular file nor
// a directory (a device, a FIFO), an unreadable or empty file, a
// directory with no .txt file, or bytes that are not valid UTF-8 (with the file, byte offset
// and line of the first invalid sequence).
std::vector<std::string> load_documents(const std::string& path);

// The token stream of documents packed one after another, as Llama 3 packs its training
// sequences: each document's bytes, and <|end_of_text|> between consecutive documents. So one
// document is its bytes alone, and a training window that spans a boundary holds the
// <|end_of_text|> that a document mask (mark_documents, batch_sampler.h) cuts at.
std::vector<int32_t> pack_documents(const std::vector<std::string>& documents);

struct TextDataset {
  std::string source;           // where the text came from (a path, or "<memory>")
  std::vector<int32_t> tokens;  // the whole corpus, one byte token per byte
  int64_t train_size = 0;       // tokens[0, train_size) train, the rest validation

  TokenSpan train() const { return TokenSpan(tokens).first(size_t(train_size)); }
  TokenSpan validation() const { return TokenSpan(tokens).subspan(size_t(train_size)); }
};

// Packs `documents` (pack_documents) and splits the stream (rule above). seq_len is the model's training context: each
// side must hold at least one window of seq_len + 1 tokens (inputs plus the shifted target),
// else InputError. val_fraction must lie in (0, 1).
TextDataset make_dataset(const std::vector<std::string>& documents, int64_t seq_len, double val_fraction = 0.1,
                         std::string source = "<memory>");
// A token stream already packed (tokenized_corpus.h: another tokenizer's ids), split as above.
TextDataset split_tokens(std::vector<int32_t> tokens, int64_t seq_len, double val_fraction = 0.1,
                         std::string source = "<memory>");
// One document.
TextDataset make_dataset(std::string_view text, int64_t seq_len, double val_fraction = 0.1,
                         std::string source = "<memory>");

// load_documents(path) then make_dataset.
TextDataset load_dataset(const std::string& path, int64_t seq_len, double val_fraction = 0.1);

// The corpus shipped with the project (a directory of .txt documents, see data/README.md), so a
// binary works offline with no flags. The first of, in order:
//   1. <directory of the running executable>/../share/llama4d/corpus: where `cmake --install`
//      puts it, and where the build tree mirrors it (build/release/bin -> build/release/share),
//      so a copied or installed binary needs no source tree;
//   2. LLAMA4D_DATA_DIR "/corpus": the source tree, compiled in.
// None there: InputError naming every place looked in and suggesting --data.
std::string default_corpus_path();

}  // namespace llama4d
