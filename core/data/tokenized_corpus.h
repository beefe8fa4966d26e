#pragma once
// A corpus in a model's own tokens: the documents of a .txt file, a directory of .txt files or
// a .jsonl file (one JSON object per line, its "text" field a document), each encoded by the
// model's tokenizer and packed as Llama 3 packs its training sequences, <|end_of_text|> between
// consecutive documents. With the byte tokenizer this is exactly load_dataset's stream
// (dataset.h), so a byte model trains on the same tokens as before.
#include <cstdint>
#include <string>
#include <vector>

#include "core/data/dataset.h"
#include "core/data/encode_corpus.h"
#include "core/data/tokenizer.h"

namespace llama4d {

// The documents of `path`: a .jsonl file's "text" fields (InputError naming the line of one
// that is not an object with a string "text", or not valid UTF-8), else load_documents(path).
std::vector<std::string> load_text_documents(const std::string& path);

// The id documents are packed with: `tok`'s <|end_of_text|> (kEndOfTextToken for the byte
// tokenizer). InputError when `tok` has none.
int32_t end_of_text_id(const Tokenizer& tok);

// The documents of `path` encoded by `tok` (no BOS; encode_documents_cached on `threads`
// threads, so a corpus is encoded once per tokenizer and the ids do not depend on the thread
// count) and packed with <|end_of_text|> between them. InputError when `tok` has no
// <|end_of_text|>. `progress` hears of each document encoded, or once with everything done when
// the cache holds the ids (never for the byte tokenizer, whose ids are the bytes).
std::vector<int32_t> tokenize_corpus(const Tokenizer& tok, const std::string& path, int threads,
                                     const EncodeProgress& progress = {});

// tokenize_corpus, split into training and validation as make_dataset does.
TextDataset load_tokenized_dataset(const Tokenizer& tok, const std::string& path, int64_t seq_len, int threads,
                                   const EncodeProgress& progress = {}, double val_fraction = 0.1);

}  // namespace llama4d
