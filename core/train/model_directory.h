#pragma once
// A model directory as a whole: config.json, its tokenizer, the ids that end a generated turn,
// and its chat format, checked against each other before any weight is read.
//
//   config.json                the shape (LlamaConfig) and bos_token_id / eos_token_id (an id
//                              or a list of ids, as Llama 3.1 Instruct writes)
//   tokenizer.json, tokenizer.model, original/tokenizer.model
//                              Llama 3's BPE tokenizer (load_tokenizer, tokenizer_loader.h);
//                              without one, llama4d's byte tokenizer, but only when the config
//                              is a byte model's (bos 256, eos 257, as llama4d's presets write):
//                              a Llama 3 download without its tokenizer is refused, never run
//                              on bytes
//   generation_config.json     eos_token_id (an id or a list): where a generated answer stops
//   tokenizer_config.json      chat_template (chat_format.h)
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/data/chat_format.h"
#include "core/data/tokenizer.h"
#include "core/model/config.h"

namespace llama4d {

struct ModelDirectory {
  std::string dir;
  LlamaConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  // Ids that end generation: generation_config.json's eos_token_id, config.json's, and the
  // tokenizer's end-of-sequence tokens (<|end_of_text|>, <|eom_id|>, <|eot_id|>), each once.
  std::vector<int32_t> stop_ids;
  std::optional<std::string> chat_template;  // tokenizer_config.json's, when there is one
  std::string chat_template_source;          // the file it came from

  // The chat format: `name` when given (chat_format_by_name), else the recognised
  // chat_template (recognise_chat_template), else InputError saying the directory has none.
  ChatFormat chat_format(const std::string& name = "") const;
  // The format a .jsonl corpus's "messages" lines are rendered in (tokenized_corpus.h): the
  // recognised chat_template; none when there is no template or it is not recognised, so a
  // corpus of "text" lines still trains and a "messages" line is refused naming its line.
  std::optional<ChatFormat> data_chat_format() const;
};

// Reads and checks everything above except the weights. InputError (exit 2) naming the file
// and the problem: no tokenizer for a non-byte model; a tokenizer with more ids than the
// config's vocab_size (its ids would index past the embedding; fewer is fine, a padded
// embedding); a bos_token_id that is not the tokenizer's <|begin_of_text|>; an eos_token_id
// (config or generation config) that is not one of its special tokens.
ModelDirectory open_model_directory(const std::string& dir);

// The tokenizer of a model that has no directory (a --preset or --config shape): the byte
// tokenizer, checked against `cfg` as above.
std::unique_ptr<Tokenizer> tokenizer_for_shape(const LlamaConfig& cfg);

}  // namespace llama4d
