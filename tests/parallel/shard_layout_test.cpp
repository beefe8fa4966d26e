// ShardLayout against the rule its header documents, on hand-computed cases and on thousands of
// random segment lengths and rank counts. Every expectation is computed here from the segment
// lengths the test chose, never by asking the layout one question to check another:
//   S = ceil(len / n) rounded up to a multiple of kShardAlign (512);
//   rank r owns [b + r*S, b + (r+1)*S) clipped to e;
//   a rank's shard buffer holds its pieces back to back in segment order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel/shard_layout.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

// The alignment the header promises (kShardAlign == kNormChunk == 512), written as a literal so
// a change to it shows up here instead of silently moving every expectation with it.
constexpr int64_t kAlign = 512;
static_assert(kShardAlign == kAlign, "shard_layout.h documents 512-element gradient-norm chunks");

// Specs whose segments have exactly the given lengths: lengths[0] is the embedding, the last one
// the part after the last layer (final norm + head), the ones between one layer each. A layer
// is split into two tensors (as attention + MLP would be) when `split_layers` is set, so the
// segment is the union of several specs.
std::vector<ParamSpec> specs_with_segments(const std::vector<int64_t>& lengths, bool split_layers = false) {
  std::vector<ParamSpec> specs;
  int64_t offset = 0;
  auto add = [&](const std::string& name, int64_t numel, int layer) {
    ParamSpec s;
    s.name = name;
    s.shape = {numel};
    s.offset = offset;
    s.numel = numel;
    s.layer = layer;
    specs.push_back(s);
    offset += numel;
  };
  add("model.embed_tokens.weight", lengths.front(), -1);
  for (size_t l = 1; l + 1 < lengths.size(); ++l) {
    const std::string prefix = "model.layers." + std::to_string(l - 1) + ".";
    const int64_t len = lengths[l];
    if (split_layers) {
      const int64_t first = len / 3;
      add(prefix + "self_attn.weight", first, int(l - 1));
      add(prefix + "mlp.weight", len - first, int(l - 1));
    } else {
      add(prefix + "weight", len, int(l - 1));
    }
  }
  add("lm_head.weight", lengths.back(), -1);
  return specs;
}

// The documented piece size, computed independently of the layout.
int64_t expected_piece_size(int64_t len, int64_t n) {
  const int64_t even = len / n + (len % n != 0 ? 1 : 0);                 // ceil(len / n)
  return even % kAlign == 0 ? even : (even / kAlign + 1) * kAlign;       // up to a multiple of 512
}

// Checks everything the header promises about `layout`, built from segments of `lengths` over n
// ranks. Returns false (after reporting) at the first broken promise.
::testing::AssertionResult check_layout(const ShardLayout& layout, const std::vector<int64_t>& lengths, int n,
                                        bool use_bitmap) {
  using ::testing::AssertionFailure;
  auto fail = [&](size_t s, int r) {
    std::string lens;
    for (int64_t l : lengths) lens += std::to_string(l) + " ";
    return AssertionFailure() << "dp=" << n << " segment " << s << " rank " << r << " (segment lengths " << lens
                              << "): ";
  };
  if (layout.num_shards() != n) return AssertionFailure() << "num_shards " << layout.num_shards() << " != " << n;
  const std::vector<Segment>& segs = layout.segments();
  if (segs.size() != lengths.size()) return AssertionFailure() << segs.size() << " segments, expected " << lengths.size();

  std::vector<int64_t> shard_fill(size_t(n), 0);  // where the next piece of each rank must sit
  int64_t seg_begin = 0;
  for (size_t s = 0; s < segs.size(); ++s) {
    const int64_t len = lengths[s], b = seg_begin, e = seg_begin + len;
    seg_begin = e;
    if (segs[s].begin != b || segs[s].end != e)
      return fail(s, -1) << "segment is [" << segs[s].begin << ", " << segs[s].end << "), expected [" << b << ", " << e
                         << ")";
    const int64_t S = expected_piece_size(len, n);
    if (layout.piece_size(s) != S) return fail(s, -1) << "piece_size " << layout.piece_size(s) << ", expected " << S;
    // The rule's intent, stated without its formula: S is the smallest multiple of 512 with which
    // n pieces hold the whole segment.
    if (S % kAlign != 0 || S * n < len || (S > 0 && (S - kAlign) * n >= len))
      return fail(s, -1) << "expected piece size " << S << " is not the least aligned cover (test bug)";

    std::vector<uint8_t> owners(use_bitmap ? size_t(len) : 0, 0);
    const std::vector<int64_t> counts = layout.piece_counts(s);
    if (counts.size() != size_t(n)) return fail(s, -1) << "piece_counts has " << counts.size() << " entries";
    int64_t covered = 0, prev_end = b;
    bool seen_short = false;
    for (int r = 0; r < n; ++r) {
      const Piece p = layout.piece(s, r);
      const int64_t want_begin = std::min(e, b + r * S), want_end = std::min(e, b + (r + 1) * S);
      if (p.begin != want_begin || p.end != want_end)
        return fail(s, r) << "piece [" << p.begin << ", " << p.end << "), expected [" << want_begin << ", " << want_end
                          << ")";
      // The same facts as properties, so a reader sees why the rule is right.
      if (p.begin > p.end || p.begin < b || p.end > e) return fail(s, r) << "piece outside its segment";
      if (p.begin != prev_end) return fail(s, r) << "gap or overlap: begins at " << p.begin << ", previous ended at " << prev_end;
      if (p.numel() > 0 && (p.begin - b) % kAlign != 0)
        return fail(s, r) << "non-empty piece starts " << (p.begin - b) << " elements into its segment, not on a 512 boundary";
      if (p.numel() == 0 && p.begin != e) return fail(s, r) << "empty piece not clipped to the segment end";
      if (seen_short && p.numel() != 0) return fail(s, r) << "a piece follows a short one (shortfall must be at the end)";
      if (p.numel() != S) seen_short = true;
      if (counts[size_t(r)] != want_end - want_begin)
        return fail(s, r) << "piece_counts " << counts[size_t(r)] << ", expected " << want_end - want_begin;
      if (p.shard_offset != shard_fill[size_t(r)])
        return fail(s, r) << "shard_offset " << p.shard_offset << ", expected " << shard_fill[size_t(r)]
                          << " (pieces back to back in segment order)";
      shard_fill[size_t(r)] += want_end - want_begin;
      for (int64_t i = p.begin; use_bitmap && i < p.end; ++i) {
        if (owners[size_t(i - b)]++) return fail(s, r) << "element " << i << " owned twice";
      }
      covered += p.numel();
      prev_end = p.end;
    }
    if (prev_end != e) return fail(s, n - 1) << "last piece ends at " << prev_end << ", segment at " << e;
    if (covered != len) return fail(s, -1) << "pieces hold " << covered << " elements of " << len;
    for (int64_t i = 0; use_bitmap && i < len; ++i) {
      if (owners[size_t(i)] != 1) return fail(s, -1) << "element " << b + i << " owned by " << int(owners[size_t(i)]) << " ranks";
    }
  }
  int64_t total = 0;
  for (int r = 0; r < n; ++r) {
    if (layout.shard_numel(r) != shard_fill[size_t(r)])
      return fail(0, r) << "shard_numel " << layout.shard_numel(r) << ", expected " << shard_fill[size_t(r)];
    total += shard_fill[size_t(r)];
  }
  if (total != seg_begin) return AssertionFailure() << "shards hold " << total << " elements of " << seg_begin;
  return ::testing::AssertionSuccess();
}

TEST(ShardLayout, HandComputedPiecesOfThreeSegmentsOnEightRanks) {
  // Segments [0, 1000), [1000, 11000), [11000, 15097) over dp = 8:
  //   1000:  ceil(1000/8)  = 125  -> S = 512
  //   10000: ceil(10000/8) = 1250 -> S = 1536
  //   4097:  ceil(4097/8)  = 513  -> S = 1024
  const ShardLayout layout(specs_with_segments({1000, 10000, 4097}), 8);
  ASSERT_EQ(layout.segments().size(), 3u);
  EXPECT_EQ(layout.piece_size(0), 512);
  EXPECT_EQ(layout.piece_size(1), 1536);
  EXPECT_EQ(layout.piece_size(2), 1024);
  const int64_t begins[3][8] = {{0, 512, 1000, 1000, 1000, 1000, 1000, 1000},
                                {1000, 2536, 4072, 5608, 7144, 8680, 10216, 11000},
                                {11000, 12024, 13048, 14072, 15096, 15097, 15097, 15097}};
  const int64_t ends[3][8] = {{512, 1000, 1000, 1000, 1000, 1000, 1000, 1000},
                              {2536, 4072, 5608, 7144, 8680, 10216, 11000, 11000},
                              {12024, 13048, 14072, 15096, 15097, 15097, 15097, 15097}};
  // Rank r's shard: its piece of segment 0, then of segment 1, then of segment 2.
  const int64_t offsets[3][8] = {{0, 0, 0, 0, 0, 0, 0, 0},
                                 {512, 488, 0, 0, 0, 0, 0, 0},
                                 {2048, 2024, 1536, 1536, 1536, 1536, 784, 0}};
  const std::vector<int64_t> counts[3] = {{512, 488, 0, 0, 0, 0, 0, 0},
                                          {1536, 1536, 1536, 1536, 1536, 1536, 784, 0},
                                          {1024, 1024, 1024, 1024, 1, 0, 0, 0}};
  const int64_t shard_numel[8] = {3072, 3048, 2560, 2560, 1537, 1536, 784, 0};
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(layout.piece_counts(s), counts[s]) << "segment " << s;
    for (int r = 0; r < 8; ++r) {
      const Piece p = layout.piece(s, r);
      EXPECT_EQ(p.begin, begins[s][r]) << "segment " << s << " rank " << r;
      EXPECT_EQ(p.end, ends[s][r]) << "segment " << s << " rank " << r;
      EXPECT_EQ(p.shard_offset, offsets[s][r]) << "segment " << s << " rank " << r;
    }
  }
  for (int r = 0; r < 8; ++r) EXPECT_EQ(layout.shard_numel(r), shard_numel[r]) << "rank " << r;
}

TEST(ShardLayout, HandComputedPieceSizesAtTheAlignmentEdges) {
  struct Case {
    int64_t len;
    int dp;
    int64_t S;
    std::vector<int64_t> counts;
  };
  const Case cases[] = {
      {1000, 1, 1024, {1000}},                              // one rank still rounds S up to 512s
      {4096, 8, 512, {512, 512, 512, 512, 512, 512, 512, 512}},  // exact: no padding at all
      {4097, 8, 1024, {1024, 1024, 1024, 1024, 1, 0, 0, 0}},     // one past: S doubles
      {4095, 8, 512, {512, 512, 512, 512, 512, 512, 512, 511}},  // one short: the last rank is short by one
      {10000, 3, 3584, {3584, 3584, 2832}},                 // ceil(10000/3) = 3334 -> 7 * 512
      {5, 16, 512, {5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},  // fewer elements than ranks
      {512, 2, 512, {512, 0}},
      {513, 2, 512, {512, 1}},
      {0, 4, 0, {0, 0, 0, 0}},                              // an empty segment: every piece empty
  };
  for (const Case& c : cases) {
    // The case's segment sits after a 7-element embedding, so "aligned" has to mean relative to
    // the segment's own start (7 + k*512), not to the flat buffer.
    const ShardLayout layout(specs_with_segments({7, c.len, 3}), c.dp);
    EXPECT_EQ(layout.piece_size(1), c.S) << c.len << " over " << c.dp;
    EXPECT_EQ(layout.piece_counts(1), c.counts) << c.len << " over " << c.dp;
    int64_t at = 7;
    for (int r = 0; r < c.dp; ++r) {
      EXPECT_EQ(layout.piece(1, r).begin, at) << c.len << " over " << c.dp << " rank " << r;
      at += c.counts[size_t(r)];
      EXPECT_EQ(layout.piece(1, r).end, at) << c.len << " over " << c.dp << " rank " << r;
    }
    EXPECT_EQ(at, 7 + c.len);
  }
}

TEST(ShardLayout, RandomSegmentsArePartitionedAsDocumented) {
  uint64_t state = 0x5eed5eed12345678ull;
  auto next = [&]() {  // Knuth's MMIX LCG, top bits
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  auto below = [&](uint64_t n) { return int64_t(next() % n); };
  auto random_length = [&](int dp) -> int64_t {
    switch (below(8)) {
      case 0: return 0;
      case 1: return below(uint64_t(dp));                       // fewer elements than ranks (0 .. dp-1)
      case 2: return kAlign * (1 + below(40));                  // an exact multiple of the alignment
      case 3: return kAlign * (1 + below(40)) + 1;              // one past a multiple
      case 4: return kAlign * (1 + below(40)) - 1;              // one short of a multiple
      case 5: return int64_t(dp) * kAlign * (1 + below(8)) + below(3) - 1;  // near a whole number of aligned pieces per rank
      case 6: return 1 + below(5000);
      default: return 1 + below(3'000'000);                     // large
    }
  };
  int cases = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    const int dp = 1 + int(below(16));
    const int layers = int(below(5));
    std::vector<int64_t> lengths(size_t(layers + 2));
    for (int64_t& l : lengths) l = random_length(dp);
    const bool split = below(2) == 1;
    const ShardLayout layout(specs_with_segments(lengths, split), dp);
    const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
    ASSERT_TRUE(check_layout(layout, lengths, dp, /*use_bitmap=*/longest <= (int64_t(1) << 16))) << "case " << iter;
    ++cases;
  }
  EXPECT_EQ(cases, 4000);
}
// Arithmetic on random sizes: its fixed cases stay quick.
LLAMA4D_TIER(ShardLayout, RandomSegmentsArePartitionedAsDocumented, full);

TEST(ShardLayout, RejectsFewerThanOneShard) {
  const auto specs = specs_with_segments({1000, 10, 10});
  EXPECT_THROW(ShardLayout(specs, 0), InputError);
  EXPECT_THROW(ShardLayout(specs, -3), InputError);
}

}  // namespace
}  // namespace llama4d
