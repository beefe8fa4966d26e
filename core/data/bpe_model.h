#pragma once
// Byte-pair encoding of one pre-token: the model half of a BPE tokenizer (bpe_tokenizer.h
// puts special tokens, pre-tokenization and BOS around it).
//
// A word starts as its bytes, one token each, and the adjacent pair with the lowest rank is
// merged, leftmost first among equal ranks, until no adjacent pair has a rank. Two rules give
// pairs their ranks:
//   - tokenizer.json (Hugging Face): pair (a, b) has the index of "a b" in the merges list;
//   - tiktoken (Meta's tokenizer.model): pair (a, b) has the rank of the token a+b, if a+b is
//     a token at all.
// from_ranks() turns the second into the first (every split of every token into two tokens
// becomes a merge ranked by the token), so one merge loop serves both. When a tokenizer.json
// was made from tiktoken ranks, as Llama 3's was, the two give the same ids.
//
// With `ignore_merges` (Llama 3's tokenizer.json; always for tiktoken, which looks the whole
// piece up first) a word that is itself in the vocabulary is that token, merges or not.
//
// Cost: words up to 64 bytes merge in a flat array (n^2 / 2 rank comparisons at worst, no
// allocation); longer ones with a linked list and a heap, O(n log n), so a 100,000-letter word
// is no slower per byte than prose. Results of words up to 64 bytes are kept in a cache shared by
// all threads (its contents never change a result, only the time to get it).
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace llama4d {

class BpeModel {
 public:
  // A token: its bytes and id. Ids need not be dense; bytes must be unique.
  struct Entry {
    std::string bytes;
    int32_t id;
  };

  // Hugging Face's rule. `merges[k]` = (left, right) by token id, rank k; a later duplicate of a
  // pair replaces the earlier rank (as Hugging Face's map does). InputError when a merge's
  // concatenation is not in `vocab` or an id is unknown, or when one of the 256 single bytes
  // has no token (byte-level BPE must be able to spell any byte).
  static BpeModel from_merges(std::vector<Entry> vocab, const std::vector<std::pair<int32_t, int32_t>>& merges,
                              bool ignore_merges);
  // tiktoken's rule: `vocab`'s ids are the ranks. Same checks on single bytes.
  static BpeModel from_ranks(std::vector<Entry> vocab);

  // Appends the ids of `word` (its bytes, any bytes) to `out`.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  // The id of the token spelled by `bytes`.
  std::optional<int32_t> find(std::string_view bytes) const;

  bool ignore_merges() const;
  // (left, right, rank, merged) of every merge, sorted by rank then left then right: what the
  // model computes, independent of how it was loaded (fingerprints hash it).
  std::vector<std::array<int32_t, 4>> merge_table() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace llama4d
