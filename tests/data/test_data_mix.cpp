// Data mix: deterministic per-row source choice, shares drawn vs weights, mesh independence.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "core/data/batch_sampler.h"
#include "core/data/data_mix.h"
#include "core/error.h"

namespace llama4d {
namespace {

// Three corpora with distinct token ranges, so a row's tokens tell which source it came from.
struct ThreeCorpora {
  std::vector<int32_t> a, b, c;
  ThreeCorpora() {
    for (int i = 0; i < 400; ++i) a.push_back(i % 100);
    for (int i = 0; i < 300; ++i) b.push_back(100 + i % 100);
    for (int i = 0; i < 200; ++i) c.push_back(200 + i % 50);
  }
  DataMix mix(double wa, double wb, double wc, int64_t seq = 8) const {
    return DataMix({{"a", a, wa}, {"b", b, wb}, {"c", c, wc}}, seq);
  }
};

int source_of_token(int32_t t) { return t < 100 ? 0 : t < 200 ? 1 : 2; }

// The documented rule, rebuilt from splitmix64 and written without the class: the source index
// from cumulative weights, the window from window_start's formula.
void reference_row(const ThreeCorpora& d, const std::vector<double>& w, int64_t seq, uint64_t seed, int64_t step,
                   int64_t row, int& source, int64_t& start) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(seed ^ kMixSalt) ^ uint64_t(step)) ^ uint64_t(row));
  const double u = std::ldexp(double(h >> 11), -53);
  const double total = w[0] + w[1] + w[2];
  source = u < w[0] / total ? 0 : u < (w[0] + w[1]) / total ? 1 : 2;
  const int64_t n = int64_t(source == 0 ? d.a.size() : source == 1 ? d.b.size() : d.c.size());
  const uint64_t g = splitmix64(splitmix64(splitmix64(seed) ^ uint64_t(step)) ^ uint64_t(row));
  start = int64_t(g % uint64_t(n - seq));
}

TEST(DataMix, RowsFollowTheDocumentedRule) {
  const ThreeCorpora d;
  const std::vector<double> w = {2, 1, 1};
  const DataMix mix = d.mix(w[0], w[1], w[2]);
  const Batch b = mix.sample_rows(7, 3, 0, 64);
  for (int64_t r = 0; r < 64; ++r) {
    int src = 0;
    int64_t start = 0;
    reference_row(d, w, 8, 7, 3, r, src, start);
    const std::vector<int32_t>& corpus = src == 0 ? d.a : src == 1 ? d.b : d.c;
    for (int64_t t = 0; t < 8; ++t) {
      ASSERT_EQ(b.tokens[size_t(r * 8 + t)], corpus[size_t(start + t)]) << "row " << r;
      ASSERT_EQ(b.targets[size_t(r * 8 + t)], corpus[size_t(start + t + 1)]) << "row " << r;
    }
  }
}

TEST(DataMix, SharesDrawnAreWithinBinomialErrorOfTheWeights) {
  const ThreeCorpora d;
  const DataMix mix = d.mix(5, 3, 2);
  std::vector<int64_t> drawn;
  const int64_t steps = 100, rows = 100;  // 10,000 rows
  for (int64_t s = 0; s < steps; ++s) {
    const Batch b = mix.sample_rows(11, s, 0, rows, &drawn);
    for (int64_t r = 0; r < rows; ++r) {  // the counts match what the rows hold
      ASSERT_EQ(source_of_token(b.tokens[size_t(r * 8)]), mix.source_of(11, s, r));
    }
  }
  const std::vector<double> shares = drawn_shares(drawn);
  const double want[] = {0.5, 0.3, 0.2};
  const double n = double(steps * rows);
  for (int i = 0; i < 3; ++i) {
    const double sigma = std::sqrt(want[i] * (1 - want[i]) / n);
    EXPECT_NEAR(shares[size_t(i)], want[i], 4 * sigma) << "source " << i;
    EXPECT_NEAR(mix.shares()[size_t(i)], want[i], 1e-15);
  }
}

TEST(DataMix, UpsamplingRaisesTheShareDrawn) {
  const ThreeCorpora d;
  const DataMix anneal = d.mix(1, 1, 1).upsampled("c", 4);  // weights 1:1:4
  EXPECT_NEAR(anneal.shares()[2], 4.0 / 6.0, 1e-15);
  std::vector<int64_t> drawn;
  for (int64_t s = 0; s < 50; ++s) anneal.sample_rows(3, s, 0, 100, &drawn);
  const double p = 4.0 / 6.0, sigma = std::sqrt(p * (1 - p) / 5000.0);
  EXPECT_NEAR(drawn_shares(drawn)[2], p, 4 * sigma);
  EXPECT_THROW(d.mix(1, 1, 1).upsampled("nope", 2), InputError);
  EXPECT_THROW(d.mix(1, 1, 1).upsampled("c", 0), InputError);
}

// Data-parallel ranks of any mesh build their slices (on their own threads); the union is the
// batch one device builds, row for row.
TEST(DataMix, SameRowsOnEveryMeshAndThreadCount) {
  const ThreeCorpora d;
  const DataMix mix = d.mix(1, 2, 3);
  const int64_t B = 24;
  const Batch whole = mix.sample_rows(5, 9, 0, B);
  for (int64_t dp : {2, 3, 4, 8}) {
    std::vector<Batch> parts(static_cast<size_t>(dp));
    std::vector<std::thread> threads;
    for (int64_t k = 0; k < dp; ++k) {
      threads.emplace_back([&, k] { parts[size_t(k)] = mix.sample_rows(5, 9, k * B / dp, (k + 1) * B / dp); });
    }
    for (std::thread& t : threads) t.join();
    std::vector<int32_t> tokens, targets;
    for (const Batch& p : parts) {
      tokens.insert(tokens.end(), p.tokens.begin(), p.tokens.end());
      targets.insert(targets.end(), p.targets.begin(), p.targets.end());
    }
    EXPECT_EQ(tokens, whole.tokens) << "dp " << dp;
    EXPECT_EQ(targets, whole.targets) << "dp " << dp;
  }
  EXPECT_NE(mix.sample_rows(6, 9, 0, B).tokens, whole.tokens);  // the seed matters
}

TEST(DataMix, BadInputIsAnInputError) {
  const ThreeCorpora d;
  EXPECT_THROW(d.mix(1, 0, 1), InputError);
  EXPECT_THROW(d.mix(1, -1, 1), InputError);
  EXPECT_THROW(d.mix(1, std::nan(""), 1), InputError);
  EXPECT_THROW(d.mix(1, 1, 1, 200), InputError);  // c has 200 tokens < 201
  EXPECT_THROW(DataMix({}, 8), InputError);
}

TEST(ParseMix, ReadsPathWeightItems) {
  const std::vector<MixEntry> m = parse_mix("data/web=3,a=b.txt=0.5");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].path, "data/web");
  EXPECT_EQ(m[0].weight, 3);
  EXPECT_EQ(m[1].path, "a=b.txt");
  EXPECT_EQ(m[1].weight, 0.5);
  for (const char* bad : {"", "web", "=3", "web=0", "web=-1", "web=x", "web=3,", "web=nan"}) {
    EXPECT_THROW(parse_mix(bad), InputError) << bad;
  }
}

}  // namespace
}  // namespace llama4d
