#include "core/data/batch_sampler.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace llama4d {

namespace {

void check_seq_len(int64_t split_size, int64_t seq_len) {
  if (seq_len < 1) throw InputError("seq_len must be at least 1, got " + std::to_string(seq_len));
  if (split_size <= seq_len) {
    throw InputError("split has " + std::to_string(split_size) + " tokens, fewer than one window of seq_len + 1 = " +
                     std::to_string(seq_len) + " + 1 tokens");
  }
}

void check_range(const char* what, int64_t begin, int64_t end) {
  if (begin < 0 || end < begin) {
    throw InputError(std::string("bad ") + what + " range [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
  }
}

}  // namespace

int64_t Batch::counted_targets() const {
  return std::count_if(targets.begin(), targets.end(), [](int32_t t) { return t >= 0; });
}

void mark_documents(Batch& b, int32_t separator) {
  b.docs.resize(b.tokens.size());
  for (int64_t r = 0; r < b.B; ++r) {
    int32_t doc = 0;
    for (int64_t t = 0; t < b.seq; ++t) {
      const size_t i = size_t(r * b.seq + t);
      b.docs[i] = doc;
      doc += b.tokens[i] == separator;
    }
  }
}

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t row_hash(uint64_t seed, int64_t step, int64_t row) {
  return splitmix64(splitmix64(splitmix64(seed) ^ uint64_t(step)) ^ uint64_t(row));
}

int64_t window_start(int64_t split_size, int64_t seq_len, uint64_t seed, int64_t step, int64_t row) {
  check_seq_len(split_size, seq_len);
  if (step < 0 || row < 0) {
    throw InputError("step and row must be non-negative, got step " + std::to_string(step) + ", row " +
                     std::to_string(row));
  }
  const auto num_starts = uint64_t(split_size - seq_len);  // starts 0 .. n - (T+1)
  return int64_t(row_hash(seed, step, row) % num_starts);
}

Batch sample_rows(TokenSpan split, int64_t seq_len, uint64_t seed, int64_t step, int64_t row_begin,
                  int64_t row_end) {
  check_seq_len(int64_t(split.size()), seq_len);
  check_range("row", row_begin, row_end);
  Batch b;
  b.B = row_end - row_begin;
  b.seq = seq_len;
  b.tokens.resize(size_t(b.B * b.seq));
  b.targets.resize(size_t(b.B * b.seq));
  for (int64_t i = 0; i < b.B; ++i) {
    const int64_t start = window_start(int64_t(split.size()), seq_len, seed, step, row_begin + i);
    const int32_t* src = split.data() + start;
    std::copy(src, src + seq_len, b.tokens.begin() + i * seq_len);
    std::copy(src + 1, src + 1 + seq_len, b.targets.begin() + i * seq_len);
  }
  return b;
}

Batch sample_batch(TokenSpan split, int64_t seq_len, uint64_t seed, int64_t step, int64_t batch_size) {
  return sample_rows(split, seq_len, seed, step, 0, batch_size);
}

int64_t num_eval_windows(int64_t split_size, int64_t seq_len) {
  check_seq_len(split_size, seq_len);
  return (split_size - 1 + seq_len - 1) / seq_len;  // ceil((n - 1) / T)
}

Batch eval_windows(TokenSpan split, int64_t seq_len, int64_t window_begin, int64_t window_end) {
  const int64_t n = int64_t(split.size());
  const int64_t num_windows = num_eval_windows(n, seq_len);
  check_range("window", window_begin, window_end);
  if (window_end > num_windows) {
    throw InputError("window range [" + std::to_string(window_begin) + ", " + std::to_string(window_end) +
                     ") goes past the " + std::to_string(num_windows) + " evaluation windows");
  }
  Batch b;
  b.B = window_end - window_begin;
  b.seq = seq_len;
  b.tokens.resize(size_t(b.B * b.seq));
  b.targets.resize(size_t(b.B * b.seq));
  for (int64_t i = 0; i < b.B; ++i) {
    const int64_t start = (window_begin + i) * seq_len;
    for (int64_t t = 0; t < seq_len; ++t) {
      const int64_t pos = start + t;
      b.tokens[size_t(i * seq_len + t)] = pos < n ? split[size_t(pos)] : 0;
      b.targets[size_t(i * seq_len + t)] = pos + 1 < n ? split[size_t(pos + 1)] : -1;
    }
  }
  return b;
}

}  // namespace llama4d
