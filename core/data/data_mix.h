#pragma once
// A training data mix: several corpora (sources), each drawn with a weight, as Llama 3 trains
// on a mix of data kinds and raises the share of high-quality sources while it anneals
// ("The Llama 3 Herd of Models", 2024, sections 3.1.2 and 3.4.3).
//
// Row r of step s comes from source i = source_of(seed, s, r): with
//   u = top 53 bits of row_hash(seed ^ kMixSalt, s, r) / 2^53          (uniform in [0, 1))
//   i = the first source with u < (w_0 + ... + w_i) / (w_0 + ... + w_{k-1})
// and its window starts at window_start(n_i, seq_len, seed, s, r) in that source's split
// (batch_sampler.h). Both are pure functions of (seed, step, row), like the single-source
// sampler, so resuming at any step and slicing rows across data-parallel ranks (any mesh, any
// thread count) give the same rows. The salt keeps the source draw independent of the window
// draw, which uses the unsalted hash.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/batch_sampler.h"
#include "core/data/tokenizer.h"

namespace llama4d {

inline constexpr uint64_t kMixSalt = 0x6D69785F736F7572ull;  // "mix_sour" in ASCII: any fixed odd-looking constant

struct MixSource {
  std::string name;   // for reports: a path
  TokenSpan split;    // the tokens rows are drawn from (not owned)
  double weight = 1;  // > 0 and finite; only ratios matter
};

// A source path and its weight, as written by a person: "PATH=WEIGHT" items joined by ',',
// e.g. "data/web=3,data/code=1". A path may itself contain '='; the last one splits.
struct MixEntry {
  std::string path;
  double weight = 1;
};
// Throws InputError naming the item for an empty list or path, a missing '=', or a weight
// that is not a positive finite decimal (core/parse_number.h rules).
std::vector<MixEntry> parse_mix(std::string_view text);

class DataMix {
 public:
  // Throws InputError naming the source for no sources, a weight <= 0 or not finite, or a split
  // shorter than seq_len + 1 tokens.
  DataMix(std::vector<MixSource> sources, int64_t seq_len);

  const std::vector<MixSource>& sources() const { return sources_; }
  int64_t seq_len() const { return seq_len_; }
  // Weight i over the sum of weights: the share of rows source i is drawn for, in expectation.
  std::vector<double> shares() const;

  int64_t source_of(uint64_t seed, int64_t step, int64_t row) const;

  // Rows [row_begin, row_end) of the batch of `step` (layout as sample_rows in batch_sampler.h).
  // When `drawn` is given, drawn[i] += rows taken from source i (resized to sources().size()).
  Batch sample_rows(uint64_t seed, int64_t step, int64_t row_begin, int64_t row_end,
                    std::vector<int64_t>* drawn = nullptr) const;

  // This mix with source `name`'s weight multiplied by `factor` (> 0): upsampling a source for
  // annealing. InputError when no source has that name or the factor is not positive.
  DataMix upsampled(const std::string& name, double factor) const;

 private:
  std::vector<MixSource> sources_;
  std::vector<double> cumulative_;  // cumulative_[i] = (w_0 + ... + w_i) / total; last is 1
  int64_t seq_len_ = 0;
};

// Rows drawn per source as shares of all rows drawn (0 where nothing was drawn).
std::vector<double> drawn_shares(const std::vector<int64_t>& drawn);

}  // namespace llama4d
