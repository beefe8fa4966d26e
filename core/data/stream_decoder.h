#pragma once
// Decoding as tokens arrive (generation): a token can end in the middle of a character (Llama 3
// has tokens of one byte of a 4-byte emoji), so printing each token's bytes as it comes would
// print broken characters. StreamDecoder returns only whole characters and holds back the start
// of one until its other bytes arrive.
//
// What comes out is always valid UTF-8, and all of push()'s returns plus finish()'s are exactly
// replace_invalid_utf8(tokenizer.decode(all ids)) (utf8.h): bytes that can no longer become a
// character turn into U+FFFD as soon as that is certain, and a character still unfinished at
// the end becomes one U+FFFD in finish(). That is what Hugging Face's decode returns for the
// whole sequence, so a streamed sample reads the same as one decoded afterwards.
#include <cstdint>
#include <string>

#include "core/data/tokenizer.h"

namespace llama4d {

class StreamDecoder {
 public:
  // `tokenizer` must outlive the decoder.
  explicit StreamDecoder(const Tokenizer& tokenizer, DecodeOptions opt = {}) : tok_(tokenizer), opt_(opt) {}

  // The text `id` completes (possibly empty). InputError for an id outside the vocabulary.
  std::string push(int32_t id);
  // What is still held back (a cut-short character: U+FFFD), and a fresh start.
  std::string finish();
  // Bytes held back now (0..3).
  size_t pending() const { return pending_.size(); }

 private:
  const Tokenizer& tok_;
  DecodeOptions opt_;
  std::string pending_;
};

}  // namespace llama4d
