#pragma once
// Deterministic training batches and sequential evaluation windows.
//
// Training: row r of step s is the window of seq_len + 1 tokens starting at
//   start(seed, s, r) = row_hash(seed, s, r) mod (n - seq_len)        (n = split size)
// i.e. a pure function of (seed, step, row) computed from a counter-based hash. There is no
// generator state to save or advance, which buys two things:
//   - resume: restarting at step s reproduces every later batch bitwise from the seed alone;
//   - data parallelism: rank k of a group can build exactly rows [r0, r1) of the global batch
//     and the union over ranks is the single-device batch, row for row.
// A stateful std::mt19937 + std::uniform_int_distribution would give neither, and the
// distribution's output is implementation-defined (libstdc++ and libc++ disagree).
#include <cstdint>
#include <vector>

#include "core/data/tokenizer.h"

namespace llama4d {

// B sequences of seq positions ([B, T] in shape comments). targets[b, t] is the token that follows tokens[b, t] in the
// text; -1 marks a position with no target (padding at the end of evaluation; the loss skips it).
struct Batch {
  int64_t B = 0, seq = 0;
  std::vector<int32_t> tokens;   // [B, T]
  std::vector<int32_t> targets;  // [B, T]
  // Document masking (mark_documents): [B, row] the document of every position of each WHOLE
  // row, row = seq, or cp·seq once context_slice has kept a rank's part of the tokens (every rank
  // needs the documents of all the keys it attends to; like the sequence lengths of
  // variable-length attention, they are metadata each rank has, not exchanged). Empty: no mask.
  std::vector<int32_t> docs;

  int64_t counted_targets() const;  // targets >= 0
  const int32_t* documents() const { return docs.empty() ? nullptr : docs.data(); }
};

// Fills b.docs from b.tokens: docs[b, t] = the number of `separator` tokens (the corpus's
// <|end_of_text|>: kEndOfTextToken for bytes, a BPE tokenizer's own id) in tokens[b, 0 .. t-1],
// so each separator belongs to the document it ends and the token after it starts the next.
// Counted from each row's start, over the whole row (before any context-parallel slicing), so
// ids never decrease along a row.
void mark_documents(Batch& b, int32_t separator);

// SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA
// 2014) as a pure function: the output the generator gives for state x, i.e. the 64-bit
// finaliser applied to x + 0x9E3779B97F4A7C15. splitmix64(0) == 0xE220A8397B1DCDAF.
uint64_t splitmix64(uint64_t x);

// splitmix64(splitmix64(splitmix64(seed) ^ step) ^ row): each input passes through a full
// avalanche before the next is mixed in, so neighbouring steps or rows are uncorrelated.
uint64_t row_hash(uint64_t seed, int64_t step, int64_t row);

// First token of the training window of (seed, step, row) in a split of split_size tokens:
// uniform over the split_size - seq_len valid starts (the modulo bias is at most
// split_size / 2^64 relative, under 2^-30 even for a 16 GiB corpus). Throws InputError if the split is shorter than seq_len + 1.
int64_t window_start(int64_t split_size, int64_t seq_len, uint64_t seed, int64_t step, int64_t row);

// Rows [row_begin, row_end) of the training batch of `step`: B = row_end - row_begin, seq = seq_len,
// tokens[b, :] = split[start .. start+T-1], targets[b, :] = split[start+1 .. start+T] with
// start = window_start(..., row_begin + b). Rows are independent, so rows [0, 4) equal
// rows [0, 2) followed by rows [2, 4).
Batch sample_rows(TokenSpan split, int64_t seq_len, uint64_t seed, int64_t step, int64_t row_begin,
                  int64_t row_end);

// The whole batch: sample_rows(split, seq_len, seed, step, 0, batch_size).
Batch sample_batch(TokenSpan split, int64_t seq_len, uint64_t seed, int64_t step, int64_t batch_size);

// Evaluation: the split cut into consecutive windows of seq_len + 1 tokens that overlap by one
// (window k covers split[k*T .. k*T + T]; its last token is the first of window k+1), so every
// token from the second on is a target exactly once: n - 1 targets in all.
// The final window may be partial: its real positions come first and the rest are padded with
// token 0 and target -1. Padding sits after the real positions, and attention is causal, so the
// pad never influences a counted prediction. ceil((n - 1) / seq_len) windows.
int64_t num_eval_windows(int64_t split_size, int64_t seq_len);

// Windows [window_begin, window_end) as a batch [window_end - window_begin, seq_len].
Batch eval_windows(TokenSpan split, int64_t seq_len, int64_t window_begin, int64_t window_end);

}  // namespace llama4d
