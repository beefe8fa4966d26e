#pragma once
// Choosing a model directory's tokenizer, and checking it against the model's config.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/data/tokenizer.h"

namespace llama4d {

// The tokenizer of the model in `model_dir`, the first of:
//   1. <model_dir>/tokenizer.json (Hugging Face's; a BpeTokenizer),
//   2. <model_dir>/tokenizer.model or <model_dir>/original/tokenizer.model (Meta's tiktoken
//      file). Its 256 special tokens come from <model_dir>/tokenizer_config.json's
//      "added_tokens_decoder" when that file is there (Hugging Face repositories keep one beside
//      Meta's file), else Llama 3.1's list (llama3_special_tokens, bpe_tokenizer.h),
//   3. the byte tokenizer, when <model_dir>/config.json says "llama4d_tokenizer": "bytes"
//      (llama4d's own models).
// None of these: InputError naming the directory and the files looked for. A config.json
// naming another "llama4d_tokenizer" is an InputError too.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir);

// InputError unless `tok` fits a model with this config: every id the tokenizer can produce
// below `vocab_size` (a model may pad its embedding past the tokenizer, as llama4d's byte models
// do; never the other way round), `bos_token_id` (when >= 0) equal to tok.bos_id(), and every
// one of `eos_token_ids` a special token of `tok`.
void check_tokenizer_matches_model(const Tokenizer& tok, int64_t vocab_size, int64_t bos_token_id,
                                   const std::vector<int64_t>& eos_token_ids);

}  // namespace llama4d
