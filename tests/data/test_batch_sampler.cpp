// Counter-based batch sampling and sequential evaluation windows.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/data/batch_sampler.h"
#include "core/data/dataset.h"
#include "core/error.h"

namespace llama4d {
namespace {

// Reference SplitMix64 written as the original stateful generator (state += gamma; mix).
struct SplitMix64Generator {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

// The documented start rule, rebuilt from the reference generator: the first output of a
// generator seeded with x is splitmix64(x).
int64_t reference_start(int64_t n, int64_t T, uint64_t seed, int64_t step, int64_t row) {
  auto first_output = [](uint64_t x) { return SplitMix64Generator{x}.next(); };
  const uint64_t h = first_output(first_output(first_output(seed) ^ uint64_t(step)) ^ uint64_t(row));
  return int64_t(h % uint64_t(n - T));
}

std::string sample_text() {
  // Varied, non-periodic text so distinct windows have distinct contents.
  std::string text;
  uint64_t s = 99;
  const char* words[] = {"gradient ", "shard ", "ring ", "all-reduce ", "pipeline ", "bubble ", "rank ",
                         "tensor ", "the ", "a ", "of ", "and, ", "memory. ", "step\n"};
  while (text.size() < 5000) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    text += words[(s >> 33) % 14];
  }
  return text;
}

TEST(SplitMix64, MatchesPublishedReferenceValues) {
  // Outputs of SplitMix64 seeded with 0, as listed with the reference implementation (Vigna).
  EXPECT_EQ(splitmix64(0), 0xE220A8397B1DCDAFull);
  SplitMix64Generator g{0};
  const uint64_t expected[] = {0xE220A8397B1DCDAFull, 0x6E789E6AA1B965F4ull, 0x06C45D188009454Full,
                               0xF88BB8A8724C81ECull};
  uint64_t state = 0;
  for (uint64_t e : expected) {
    EXPECT_EQ(g.next(), e);
    EXPECT_EQ(splitmix64(state), e);
    state += 0x9E3779B97F4A7C15ull;
  }
}

TEST(SplitMix64, OtherInputsAndRowHashMatchIndependentlyComputedValues) {
  // Literals from a separate re-implementation of the published finaliser (Python, 64-bit
  // wrap-around arithmetic), not from this library.
  EXPECT_EQ(splitmix64(1), 0x910A2DEC89025CC1ull);
  EXPECT_EQ(splitmix64(42), 0xBDD732262FEB6E95ull);
  EXPECT_EQ(splitmix64(0xFFFFFFFFFFFFFFFFull), 0xE4D971771B652C20ull);  // x + gamma wraps around
  EXPECT_EQ(splitmix64(0x9E3779B97F4A7C15ull), 0x6E789E6AA1B965F4ull);  // the generator's 2nd output
  // row_hash = splitmix64(splitmix64(splitmix64(seed) ^ step) ^ row), same independent source.
  EXPECT_EQ(row_hash(0, 0, 0), 0x238275BC38FCBE91ull);
  EXPECT_EQ(row_hash(42, 0, 0), 0x6310BF04D8207F46ull);
  EXPECT_EQ(row_hash(42, 7, 3), 0xF55E4254D4655539ull);
  EXPECT_EQ(row_hash(5, 1, 1), 0xEB37568742FFA26Bull);
  // And against the stateful reference generator in this file on many inputs.
  uint64_t x = 12345;
  for (int i = 0; i < 1000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    ASSERT_EQ(splitmix64(x), SplitMix64Generator{x}.next()) << x;
  }
}

TEST(BatchSampler, RowsAreWindowsOfTheCorpusAtTheDocumentedStarts) {
  const std::string text = sample_text();
  const TextDataset ds = make_dataset(text, 32, 0.1);
  const int64_t T = 32, n = ds.train_size;
  for (int64_t step : {0, 1, 7, 1000000}) {
    const Batch b = sample_batch(ds.train(), T, 42, step, 6);
    ASSERT_EQ(b.B, 6);
    ASSERT_EQ(b.seq, T);
    ASSERT_EQ(b.tokens.size(), size_t(6 * T));
    ASSERT_EQ(b.targets.size(), size_t(6 * T));
    for (int64_t r = 0; r < 6; ++r) {
      const int64_t start = reference_start(n, T, 42, step, r);
      ASSERT_LE(start + T, n - 1) << "window runs past the training split";
      EXPECT_EQ(window_start(n, T, 42, step, r), start);
      for (int64_t t = 0; t < T; ++t) {
        // Straight from the raw bytes: input is byte start+t, target is the byte after it.
        ASSERT_EQ(b.tokens[size_t(r * T + t)], int32_t(static_cast<unsigned char>(text[size_t(start + t)])));
        ASSERT_EQ(b.targets[size_t(r * T + t)], int32_t(static_cast<unsigned char>(text[size_t(start + t + 1)])));
        if (t + 1 < T) {
          ASSERT_EQ(b.targets[size_t(r * T + t)], b.tokens[size_t(r * T + t + 1)]);
        }
      }
    }
    EXPECT_EQ(b.counted_targets(), 6 * T);
  }
}

TEST(BatchSampler, HandMadeSplitGivesLiteralWindows) {
  // split = 10..19 (n = 10), T = 4: n - T = 6 starts (0..5). Seed 3, step 2: row_hash mod 6
  // is 4, 4, 3 for rows 0, 1, 2 (computed outside this library).
  std::vector<int32_t> split(10);
  for (int i = 0; i < 10; ++i) split[size_t(i)] = 10 + i;
  EXPECT_EQ(window_start(10, 4, 3, 2, 0), 4);
  EXPECT_EQ(window_start(10, 4, 3, 2, 1), 4);
  EXPECT_EQ(window_start(10, 4, 3, 2, 2), 3);
  const Batch b = sample_batch(split, 4, 3, 2, 3);
  EXPECT_EQ(b.B, 3);
  EXPECT_EQ(b.seq, 4);
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{14, 15, 16, 17, 14, 15, 16, 17, 13, 14, 15, 16}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{15, 16, 17, 18, 15, 16, 17, 18, 14, 15, 16, 17}));
  EXPECT_EQ(b.counted_targets(), 12);
  // Row 2 alone, as rank 1 of a 3-way split of the batch would build it.
  const Batch r2 = sample_rows(split, 4, 3, 2, 2, 3);
  EXPECT_EQ(r2.tokens, (std::vector<int32_t>{13, 14, 15, 16}));
  EXPECT_EQ(r2.targets, (std::vector<int32_t>{14, 15, 16, 17}));
}

// Document ids count the <|end_of_text|> tokens (257) before each position, from each row's
// start: the separator belongs to the document it ends, the next token starts a new one.
TEST(BatchSampler, DocumentsAreCountedFromEachRowsStart) {
  Batch b;
  b.B = 2, b.seq = 6;
  b.tokens = {'a', 257, 'b', 'c', 257, 257,  //
              257, 'd', 'e', 'f', 'g', 'h'};
  b.targets.assign(12, 0);
  EXPECT_EQ(b.documents(), nullptr);
  mark_documents(b, kEndOfTextToken);
  EXPECT_EQ(b.docs, (std::vector<int32_t>{0, 0, 1, 1, 1, 2,  //
                                          0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(b.documents(), b.docs.data());
}

// A BPE corpus is packed with its tokenizer's own <|end_of_text|> (3841 for data/tokenizer): the
// mask cuts after that id and nothing else, 257 being an ordinary token there.
TEST(BatchSampler, DocumentsAreCutAtTheGivenSeparator) {
  Batch b;
  b.B = 1, b.seq = 6;
  b.tokens = {5, 3841, 257, 7, 3841, 9};
  b.targets.assign(6, 0);
  mark_documents(b, 3841);
  EXPECT_EQ(b.docs, (std::vector<int32_t>{0, 0, 1, 1, 1, 2}));
}

TEST(BatchSampler, IsAPureFunctionAndRowsSliceLikeDataParallelRanks) {
  const TextDataset ds = make_dataset(sample_text(), 16, 0.1);
  const Batch full = sample_rows(ds.train(), 16, 7, 3, 0, 4);
  EXPECT_EQ(sample_rows(ds.train(), 16, 7, 3, 0, 4).tokens, full.tokens);  // same inputs, same output
  // ... and that output is the split at the independently computed starts.
  const TokenSpan train = ds.train();
  ASSERT_EQ(full.B, 4);
  ASSERT_EQ(full.seq, 16);
  for (int64_t r = 0; r < 4; ++r) {
    const int64_t start = reference_start(ds.train_size, 16, 7, 3, r);
    for (int64_t t = 0; t < 16; ++t) {
      ASSERT_EQ(full.tokens[size_t(r * 16 + t)], train[size_t(start + t)]) << r << "," << t;
      ASSERT_EQ(full.targets[size_t(r * 16 + t)], train[size_t(start + t + 1)]) << r << "," << t;
    }
  }

  // Two "ranks" each build half of the global batch; their concatenation is the full batch.
  const Batch lo = sample_rows(ds.train(), 16, 7, 3, 0, 2);
  const Batch hi = sample_rows(ds.train(), 16, 7, 3, 2, 4);
  std::vector<int32_t> tokens = lo.tokens, targets = lo.targets;
  tokens.insert(tokens.end(), hi.tokens.begin(), hi.tokens.end());
  targets.insert(targets.end(), hi.targets.begin(), hi.targets.end());
  EXPECT_EQ(tokens, full.tokens);
  EXPECT_EQ(targets, full.targets);

  // Resuming: step 3 computed after steps 0..2 equals step 3 computed cold.
  for (int64_t s = 0; s < 3; ++s) sample_rows(ds.train(), 16, 7, s, 0, 4);
  EXPECT_EQ(sample_rows(ds.train(), 16, 7, 3, 0, 4).targets, full.targets);

  EXPECT_EQ(sample_rows(ds.train(), 16, 7, 3, 2, 2).B, 0);  // an empty slice is allowed
}

TEST(BatchSampler, DifferentStepsSeedsAndRowsDiffer) {
  const TextDataset ds = make_dataset(sample_text(), 16, 0.1);
  const Batch a = sample_batch(ds.train(), 16, 1, 0, 8);
  EXPECT_NE(sample_batch(ds.train(), 16, 1, 1, 8).tokens, a.tokens);
  EXPECT_NE(sample_batch(ds.train(), 16, 2, 0, 8).tokens, a.tokens);
  std::set<int64_t> starts;
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_EQ(window_start(ds.train_size, 16, 1, 0, r), reference_start(ds.train_size, 16, 1, 0, r));
    EXPECT_EQ(window_start(ds.train_size, 16, 2, 0, r), reference_start(ds.train_size, 16, 2, 0, r));
    EXPECT_EQ(window_start(ds.train_size, 16, 1, 1, r), reference_start(ds.train_size, 16, 1, 1, r));
    starts.insert(window_start(ds.train_size, 16, 1, 0, r));
  }
  EXPECT_GE(starts.size(), 7u) << "rows of one batch should almost never share a window";
}

TEST(BatchSampler, StartsCoverTheWholeSplitAndStayInside) {
  // 40 tokens, T = 8: the valid starts are 0..31, and the last one reads token 39.
  std::vector<int32_t> split(40);
  for (int i = 0; i < 40; ++i) split[size_t(i)] = i;
  // The first starts, computed outside this library: row_hash(5, step, row) mod 32.
  const int64_t first_starts[3][2] = {{21, 1}, {16, 11}, {19, 4}};
  std::set<int64_t> seen;
  for (int64_t step = 0; step < 400; ++step) {
    const Batch b = sample_batch(split, 8, 5, step, 2);
    for (int64_t r = 0; r < 2; ++r) {
      const int64_t start = b.tokens[size_t(r * 8)];
      ASSERT_GE(start, 0);
      ASSERT_LE(start, 31);
      ASSERT_EQ(start, reference_start(40, 8, 5, step, r)) << step << "," << r;
      if (step < 3) {
        EXPECT_EQ(start, first_starts[step][r]) << step << "," << r;
      }
      for (int64_t t = 0; t < 8; ++t) {  // split[i] == i: the window is start .. start+7
        ASSERT_EQ(b.tokens[size_t(r * 8 + t)], start + t);
        ASSERT_EQ(b.targets[size_t(r * 8 + t)], start + t + 1);
      }
      seen.insert(start);
    }
  }
  EXPECT_EQ(seen.size(), 32u);
}

TEST(BatchSampler, RejectsBadArguments) {
  std::vector<int32_t> split(10, 1);
  EXPECT_THROW(sample_rows(split, 10, 0, 0, 0, 1), InputError);  // needs 11 tokens
  EXPECT_NO_THROW(sample_rows(split, 9, 0, 0, 0, 1));
  // Exactly seq_len + 1 tokens: one valid start (0), whatever the hash.
  const std::vector<int32_t> ramp = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const Batch only = sample_rows(ramp, 9, 123, 4, 0, 2);
  EXPECT_EQ(window_start(10, 9, 123, 4, 1), 0);
  EXPECT_EQ(only.tokens, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(only.targets, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_THROW(sample_rows(split, 4, 0, 0, 3, 2), InputError);
  EXPECT_THROW(sample_rows(split, 4, 0, -1, 0, 2), InputError);
  EXPECT_THROW(sample_rows(split, 4, 0, 0, -1, 2), InputError);
  EXPECT_THROW(sample_rows(split, 0, 0, 0, 0, 2), InputError);
}

// Every (input, target) pair of the split, in order, exactly once; pads only at the end.
void expect_windows_cover(const std::vector<int32_t>& split, int64_t T) {
  const int64_t n = int64_t(split.size());
  const int64_t windows = num_eval_windows(n, T);
  EXPECT_EQ(windows, (n - 1 + T - 1) / T);
  const Batch b = eval_windows(split, T, 0, windows);
  ASSERT_EQ(b.B, windows);
  EXPECT_EQ(b.counted_targets(), n - 1);
  int64_t next = 0;  // the next split position expected as an input with a target
  for (int64_t i = 0; i < b.B * T; ++i) {
    if (b.targets[size_t(i)] < 0) {
      EXPECT_EQ(i / T, windows - 1) << "padding only in the last window";
      continue;
    }
    ASSERT_LT(next + 1, n);
    EXPECT_EQ(b.tokens[size_t(i)], split[size_t(next)]);
    EXPECT_EQ(b.targets[size_t(i)], split[size_t(next + 1)]);
    ++next;
  }
  EXPECT_EQ(next, n - 1);
  for (int64_t w = 0; w + 1 < windows; ++w) {  // window w's last token opens window w+1
    EXPECT_EQ(b.targets[size_t(w * T + T - 1)], b.tokens[size_t((w + 1) * T)]);
  }
}

TEST(EvalWindows, CoverTheSplitExactly) {
  std::vector<int32_t> split(23);
  for (int i = 0; i < 23; ++i) split[size_t(i)] = 100 + i;
  expect_windows_cover(split, 5);  // 22 targets: 4 full windows + one with 2 targets
  const Batch b = eval_windows(split, 5, 0, 5);
  EXPECT_EQ(b.tokens[size_t(4 * 5 + 2)], 122);  // the last token is an input with no target
  EXPECT_EQ(b.targets[size_t(4 * 5 + 2)], -1);
  EXPECT_EQ(b.tokens[size_t(4 * 5 + 3)], 0);    // padding
  EXPECT_EQ(b.targets[size_t(4 * 5 + 4)], -1);

  split.resize(21);  // 20 targets = 4 full windows, no padding
  expect_windows_cover(split, 5);
  EXPECT_EQ(eval_windows(split, 5, 0, 4).counted_targets(), 20);
  expect_windows_cover(std::vector<int32_t>{1, 2}, 1);
}

TEST(EvalWindows, NumberOfWindowsForHandComputedSizes) {
  // ceil((n - 1) / T): the n - 1 targets in windows of T.
  EXPECT_EQ(num_eval_windows(2, 1), 1);      // 1 target
  EXPECT_EQ(num_eval_windows(5, 4), 1);      // 4 targets: one full window
  EXPECT_EQ(num_eval_windows(6, 4), 2);      // 5 targets: a full window and one with a single target
  EXPECT_EQ(num_eval_windows(7, 4), 2);
  EXPECT_EQ(num_eval_windows(9, 4), 2);      // 8 targets: two full windows
  EXPECT_EQ(num_eval_windows(10, 4), 3);
  EXPECT_EQ(num_eval_windows(1025, 64), 16);
  EXPECT_EQ(num_eval_windows(1026, 64), 17);
  EXPECT_EQ(num_eval_windows(100, 1), 99);
  EXPECT_THROW(num_eval_windows(4, 4), InputError);  // fewer than seq_len + 1 tokens
  EXPECT_THROW(num_eval_windows(10, 0), InputError);
}

TEST(EvalWindows, HandMadeSplitGivesLiteralWindowsAndPadding) {
  // split = 5..11 (n = 7), T = 4: 6 targets -> 2 windows. Window 0 covers split[0..4], window 1
  // split[4..6] and is padded: token 0 and target -1 past the end.
  const std::vector<int32_t> split = {5, 6, 7, 8, 9, 10, 11};
  const Batch b = eval_windows(split, 4, 0, 2);
  EXPECT_EQ(b.B, 2);
  EXPECT_EQ(b.seq, 4);
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{5, 6, 7, 8, 9, 10, 11, 0}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{6, 7, 8, 9, 10, 11, -1, -1}));
  EXPECT_EQ(b.counted_targets(), 6);
  const Batch second = eval_windows(split, 4, 1, 2);
  EXPECT_EQ(second.tokens, (std::vector<int32_t>{9, 10, 11, 0}));
  EXPECT_EQ(second.targets, (std::vector<int32_t>{10, 11, -1, -1}));
  const Batch none = eval_windows(split, 4, 1, 1);
  EXPECT_EQ(none.B, 0);
  EXPECT_TRUE(none.tokens.empty());
  // n - 1 a multiple of T: no padding at all.
  const Batch exact = eval_windows(std::vector<int32_t>{1, 2, 3, 4, 5}, 2, 0, 2);
  EXPECT_EQ(exact.tokens, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(exact.targets, (std::vector<int32_t>{2, 3, 4, 5}));
}

TEST(EvalWindows, SubrangesAreRowsOfTheFullBatch) {
  std::vector<int32_t> split(50);
  for (int i = 0; i < 50; ++i) split[size_t(i)] = i;
  const Batch all = eval_windows(split, 6, 0, num_eval_windows(50, 6));
  const Batch mid = eval_windows(split, 6, 2, 5);
  ASSERT_EQ(mid.B, 3);
  EXPECT_EQ(num_eval_windows(50, 6), 9);  // ceil(49 / 6)
  // split[i] == i: window w holds tokens 6w .. 6w+5 and targets 6w+1 .. 6w+6.
  for (int64_t i = 0; i < 3 * 6; ++i) {
    EXPECT_EQ(mid.tokens[size_t(i)], 12 + i);
    EXPECT_EQ(mid.targets[size_t(i)], 13 + i);
  }
  EXPECT_EQ(mid.tokens, std::vector<int32_t>(all.tokens.begin() + 12, all.tokens.begin() + 30));
  EXPECT_EQ(mid.targets, std::vector<int32_t>(all.targets.begin() + 12, all.targets.begin() + 30));
  EXPECT_THROW(eval_windows(split, 6, 0, num_eval_windows(50, 6) + 1), InputError);
}

TEST(EvalWindows, CoverARealValidationSplit) {
  const TextDataset ds = make_dataset(sample_text(), 64, 0.1);
  const std::vector<int32_t> val(ds.validation().begin(), ds.validation().end());
  expect_windows_cover(val, 64);
}

}  // namespace
}  // namespace llama4d
