#pragma once
// A corpus in a model's own tokens: the documents of a .txt file, a directory of .txt files or
// a .jsonl file (one JSON object per line, a document: its "text" string, or its "messages"
// list of {"role": system|user|assistant, "content": string} rendered in Llama 3's chat format
// by encode_chat, chat_format.h), each encoded by the
// model's tokenizer and packed as Llama 3 packs its training sequences, <|end_of_text|> between
// consecutive documents. With the byte tokenizer this is exactly load_dataset's stream
// (dataset.h), so a byte model trains on the same tokens as before.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/data/chat_format.h"
#include "core/data/dataset.h"
#include "core/data/encode_corpus.h"
#include "core/data/tokenizer.h"

namespace llama4d {

// One document of a corpus: `text`, or `messages` for a .jsonl line with a "messages" field.
struct CorpusDocument {
  std::string where;  // "<file>:<line>" for a .jsonl line, else the data path, for messages
  std::string text;
  std::optional<std::vector<ChatMessage>> messages;
};

// The non-blank lines of a .jsonl file. InputError naming "<path>:<line>" for a line that is
// not valid UTF-8, not valid JSON, not an object, has both or neither of "text" and
// "messages", a non-string "text", a "messages" that is not a non-empty list, or a message
// without string "role" and "content" or with a role other than system, user or assistant.
std::vector<CorpusDocument> load_jsonl_documents(const std::string& path);

// The documents of `path`: a .jsonl file's lines (load_jsonl_documents); a directory's .txt
// files and .jsonl files' lines, files in byte order of their names (load_documents' rules
// for a directory of .txt files alone); else load_documents(path), one text each.
std::vector<CorpusDocument> load_corpus_documents(const std::string& path);

// The "Today Date:" a kLlama3_1 chat is rendered with in training data when its format has no
// fixed default_date (Llama 3.2's template asks for today's): a fixed date, so the same file
// gives the same ids on any day. Llama 3.1's template's own default.
inline constexpr const char* kTrainingChatDate = "26 Jul 2024";

// The documents of `path` as text (load_corpus_documents; a "messages" line is InputError
// naming its file:line, since text alone cannot hold the chat format's special tokens).
std::vector<std::string> load_text_documents(const std::string& path);

// The id documents are packed with: `tok`'s <|end_of_text|> (kEndOfTextToken for the byte
// tokenizer). InputError when `tok` has none.
int32_t end_of_text_id(const Tokenizer& tok);

// The documents of `path` encoded by `tok` (no BOS; encode_documents_cached on `threads`
// threads, so a corpus is encoded once per tokenizer and the ids do not depend on the thread
// count) and packed with <|end_of_text|> between them. InputError when `tok` has no
// <|end_of_text|>. `progress` hears of each document encoded, or once with everything done when
// the cache holds the ids (never for the byte tokenizer, whose ids are the bytes). A .jsonl
// "messages" line is encode_chat(tok, *chat, messages) without a generation prompt (date
// kTrainingChatDate where the format has none); InputError naming its file:line when `chat` is
// empty or `tok` is the byte tokenizer.
std::vector<int32_t> tokenize_corpus(const Tokenizer& tok, const std::string& path, int threads,
                                     const EncodeProgress& progress = {},
                                     const std::optional<ChatFormat>& chat = std::nullopt);

// tokenize_corpus, split into training and validation as make_dataset does.
TextDataset load_tokenized_dataset(const Tokenizer& tok, const std::string& path, int64_t seq_len, int threads,
                                   const EncodeProgress& progress = {}, double val_fraction = 0.1,
                                   const std::optional<ChatFormat>& chat = std::nullopt);

}  // namespace llama4d
