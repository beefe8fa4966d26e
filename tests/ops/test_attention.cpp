// attention_forward / attention_backward: causal GQA with q_start/k_start offsets, a KV cache
// stride, document masks and a saved log-sum-exp; attention_merge, which ring attention uses to
// combine the results over blocks of keys.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "core/error.h"
#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

using ops::AttentionShape;

AttentionShape make_shape(int64_t B, int64_t Tq, int64_t Tk, int64_t nh, int64_t nkv, int64_t hd,
                          int64_t q_start = 0, int64_t k_start = 0, int64_t kv_batch_stride = 0) {
  AttentionShape s;
  s.B = B, s.Tq = Tq, s.Tk = Tk, s.nh = nh, s.nkv = nkv, s.hd = hd;
  s.q_start = q_start, s.k_start = k_start, s.kv_batch_stride = kv_batch_stride;
  return s;
}

int64_t kv_stride(const AttentionShape& s) {
  return s.kv_batch_stride != 0 ? s.kv_batch_stride : s.Tk * s.nkv * s.hd;
}

struct Inputs {
  std::vector<double> q, k, v, dout;
};

Inputs make_inputs(const AttentionShape& s, uint64_t seed) {
  // Scores of a few units so softmax rows are far from uniform.
  return {random_vector(s.B * s.Tq * s.nh * s.hd, seed, -2, 2),
          random_vector(s.B * kv_stride(s), seed + 1, -2, 2),
          random_vector(s.B * kv_stride(s), seed + 2),
          random_vector(s.B * s.Tq * s.nh * s.hd, seed + 3)};
}

// Document ids of the query rows [B, Tq] and key rows [B, Tk].
struct Documents {
  std::vector<int32_t> q, k;
};

AttentionShape with_documents(AttentionShape s, const Documents& docs) {
  s.q_doc = docs.q.data(), s.k_doc = docs.k.data();
  return s;
}

// Ids from one id per absolute position and batch item (id_at[b][p]): query row i gets the id of
// position q_start + i, key row j that of k_start + j, as when both come from one packed sequence.
Documents documents_at_positions(const AttentionShape& s,
                                 const std::vector<std::vector<int32_t>>& id_at) {
  Documents d;
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t i = 0; i < s.Tq; ++i) d.q.push_back(id_at[b][s.q_start + i]);
    for (int64_t j = 0; j < s.Tk; ++j) d.k.push_back(id_at[b][s.k_start + j]);
  }
  return d;
}

int64_t positions(const AttentionShape& s) { return std::max(s.q_start + s.Tq, s.k_start + s.Tk); }

// Packed documents: runs of one id, of random lengths in [1, max_len]; each batch item's second
// document is a single token.
Documents packed_documents(const AttentionShape& s, int64_t max_len, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int64_t> length(1, max_len);
  std::vector<std::vector<int32_t>> id_at(s.B);
  for (auto& ids : id_at) {
    for (int32_t doc = 0; static_cast<int64_t>(ids.size()) < positions(s); ++doc)
      ids.insert(ids.end(), doc == 1 ? 1 : length(gen), doc);
  }
  return documents_at_positions(s, id_at);
}

// Ids drawn per position from [0, count): documents that are not contiguous runs, so a block of
// queries cannot assume its rows' keys lie in one stretch.
Documents scattered_documents(const AttentionShape& s, int32_t count, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> id(0, count - 1);
  std::vector<std::vector<int32_t>> id_at(s.B, std::vector<int32_t>(positions(s)));
  for (auto& ids : id_at)
    for (int32_t& x : ids) x = id(gen);
  return documents_at_positions(s, id_at);
}

// Every row in document 7.
Documents one_document(const AttentionShape& s) {
  return {std::vector<int32_t>(s.B * s.Tq, 7), std::vector<int32_t>(s.B * s.Tk, 7)};
}

// Key j is visible to query i of batch item b: causal, and in the same document when ids are given.
bool pair_visible(const AttentionShape& s, int64_t b, int64_t i, int64_t j) {
  if (s.k_start + j > s.q_start + i) return false;
  return s.q_doc == nullptr || s.q_doc[b * s.Tq + i] == s.k_doc[b * s.Tk + j];
}

// Reference: the explicit [Tq, Tk] probability matrix of every (batch, head), in long double.
void attention_reference(std::vector<double>& out, std::vector<double>& lse, const Inputs& in,
                         const AttentionShape& s) {
  out.assign(s.B * s.Tq * s.nh * s.hd, 0.0);
  lse.assign(s.B * s.nh * s.Tq, 0.0);
  const int64_t stride = kv_stride(s);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.nh; ++h) {
      const int64_t g = h / (s.nh / s.nkv);
      for (int64_t i = 0; i < s.Tq; ++i) {
        const double* qi = in.q.data() + ((b * s.Tq + i) * s.nh + h) * s.hd;
        std::vector<long double> prob(s.Tk, 0.0L);
        std::vector<bool> visible(s.Tk);
        long double max_score = -std::numeric_limits<long double>::infinity();
        for (int64_t j = 0; j < s.Tk; ++j) {
          visible[j] = pair_visible(s, b, i, j);
          if (!visible[j]) continue;
          const double* kj = in.k.data() + b * stride + (j * s.nkv + g) * s.hd;
          long double score = 0;
          for (int64_t d = 0; d < s.hd; ++d) score += static_cast<long double>(qi[d]) * kj[d];
          prob[j] = score / std::sqrt(static_cast<long double>(s.hd));
          max_score = std::max(max_score, prob[j]);
        }
        double& row_lse = lse[(b * s.nh + h) * s.Tq + i];
        if (max_score == -std::numeric_limits<long double>::infinity()) {
          row_lse = -std::numeric_limits<double>::infinity();
          continue;  // out stays 0
        }
        long double sum = 0;
        for (int64_t j = 0; j < s.Tk; ++j)
          if (visible[j]) sum += std::exp(prob[j] - max_score);
        row_lse = static_cast<double>(max_score + std::log(sum));
        double* oi = out.data() + ((b * s.Tq + i) * s.nh + h) * s.hd;
        for (int64_t d = 0; d < s.hd; ++d) {
          long double acc = 0;
          for (int64_t j = 0; j < s.Tk; ++j)
            if (visible[j])
              acc += std::exp(prob[j] - max_score) / sum *
                     in.v[b * stride + (j * s.nkv + g) * s.hd + d];
          oi[d] = static_cast<double>(acc);
        }
      }
    }
}

void expect_lse_equal(const std::vector<double>& lse, const std::vector<double>& ref) {
  ASSERT_EQ(lse.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isinf(ref[i])) {
      EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0) << "row " << i;
    } else {
      EXPECT_NEAR(lse[i], ref[i], 1e-12 * std::max(1.0, std::abs(ref[i]))) << "row " << i;
    }
  }
}

struct Case {
  std::string name;
  AttentionShape s;
  size_t fd_samples;  // finite-difference elements per tensor (0 = all)
};

std::vector<Case> cases() {
  return {
      {"gqa_training", make_shape(2, 6, 6, 4, 2, 8), 0},
      {"gqa_single_kv_head", make_shape(1, 5, 5, 4, 1, 8), 0},
      {"multi_head", make_shape(2, 4, 4, 2, 2, 6), 0},
      {"chunk_after_keys", make_shape(2, 3, 7, 4, 2, 8, /*q_start=*/4, /*k_start=*/0), 0},
      // Keys start after the first queries: rows 0 and 1 see no key at all.
      {"keys_in_future", make_shape(1, 5, 4, 4, 2, 8, /*q_start=*/2, /*k_start=*/4), 0},
      // Decode: one query at the end of a 6-token cache with room for 9 tokens per batch item.
      {"decode_cache_stride",
       make_shape(2, 1, 6, 4, 2, 8, /*q_start=*/5, 0, /*kv_batch_stride=*/9 * 2 * 8), 0},
      // Several query blocks; causal block skipping; shapes that do not divide evenly.
      {"blocked_square", make_shape(1, 130, 130, 4, 2, 8), 60},
      {"blocked_chunk", make_shape(2, 70, 150, 3, 1, 8, /*q_start=*/80, /*k_start=*/0), 60},
      // Heads wider than one vector and not a whole number of them (the products' last column
      // panel), three query heads per KV head (a block's 96 stacked rows and a partial one's 27).
      {"wide_heads", make_shape(1, 41, 41, 6, 2, 21), 40},
  };
}

// Same shapes with document ids: packed documents short enough that a block of 32 query rows
// spans several, and ids scattered over the positions (not contiguous runs).
struct DocCase {
  std::string name;
  AttentionShape s;  // without the id pointers
  Documents docs;
  size_t fd_samples;
  AttentionShape shape() const { return with_documents(s, docs); }
};

std::vector<DocCase> doc_cases() {
  std::vector<DocCase> out;
  uint64_t seed = 500;
  for (const Case& c : cases()) {
    const int64_t max_len = c.s.Tq > 32 ? 40 : 3;
    out.push_back({c.name + "_packed", c.s, packed_documents(c.s, max_len, seed++), c.fd_samples});
  }
  const AttentionShape square = make_shape(1, 70, 70, 4, 2, 8);
  out.push_back({"scattered_square", square, scattered_documents(square, 3, seed++), 60});
  const AttentionShape chunk = make_shape(2, 40, 90, 4, 2, 8, /*q_start=*/50, /*k_start=*/0);
  out.push_back({"scattered_chunk", chunk, scattered_documents(chunk, 4, seed++), 60});
  // Keys all before the queries, many ids: a block's rows miss some ids, so its key range is
  // trimmed at the end too.
  const AttentionShape earlier = make_shape(2, 40, 50, 4, 2, 8, /*q_start=*/60, /*k_start=*/0);
  out.push_back({"scattered_earlier_keys", earlier, scattered_documents(earlier, 12, seed++), 60});
  return out;
}

void expect_forward_matches_reference(const AttentionShape& s, uint64_t seed) {
  const Inputs in = make_inputs(s, seed);
  // Forward overwrites: start from NaN so a row left unwritten would show.
  std::vector<double> out(s.B * s.Tq * s.nh * s.hd, std::nan("")),
      lse(s.B * s.nh * s.Tq, std::nan(""));
  ops::attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), s);
  std::vector<double> out_ref, lse_ref;
  attention_reference(out_ref, lse_ref, in, s);
  EXPECT_LT(max_rel_error(out, out_ref), 1e-13);
  expect_lse_equal(lse, lse_ref);
}

TEST(Attention, ForwardMatchesExplicitProbabilities) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    expect_forward_matches_reference(c.s, 100);
  }
}

TEST(Attention, DocumentMaskForwardMatchesExplicitProbabilities) {
  for (const DocCase& c : doc_cases()) {
    SCOPED_TRACE(c.name);
    expect_forward_matches_reference(c.shape(), 100);
  }
}

void expect_backward_matches_finite_differences(const AttentionShape& s, size_t fd_samples,
                                                uint64_t seed) {
  Inputs in = make_inputs(s, seed);
  std::vector<double> out(s.B * s.Tq * s.nh * s.hd), lse(s.B * s.nh * s.Tq);
  auto objective = [&] {
    ops::attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), s);
    return dot(out, in.dout);
  };
  objective();
  std::vector<double> dq(in.q.size(), 0.0), dk(in.k.size(), 0.0), dv(in.v.size(), 0.0);
  ops::attention_backward(dq.data(), dk.data(), dv.data(), in.dout.data(), in.q.data(),
                          in.k.data(), in.v.data(), out.data(), lse.data(), s);
  const size_t n = fd_samples;
  const auto iq = n ? sample_indices(in.q.size(), n, 1) : std::vector<size_t>{};
  const auto ik = n ? sample_indices(in.k.size(), n, 2) : std::vector<size_t>{};
  const auto iv = n ? sample_indices(in.v.size(), n, 3) : std::vector<size_t>{};
  EXPECT_LT(max_rel_error(dq, fd_gradient(objective, in.q, iq), iq), 1e-6);
  EXPECT_LT(max_rel_error(dk, fd_gradient(objective, in.k, ik), ik), 1e-6);
  EXPECT_LT(max_rel_error(dv, fd_gradient(objective, in.v, iv), iv), 1e-6);

  // Cache slots beyond Tk and queries that see no key get exactly zero gradient.
  const int64_t stride = kv_stride(s), used = s.Tk * s.nkv * s.hd;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t e = used; e < stride; ++e) {
      EXPECT_EQ(dk[b * stride + e], 0.0);
      EXPECT_EQ(dv[b * stride + e], 0.0);
    }
  for (size_t r = 0; r < lse.size(); ++r)
    if (std::isinf(lse[r])) {
      const int64_t i = r % s.Tq, h = (r / s.Tq) % s.nh, b = r / (s.Tq * s.nh);
      for (int64_t d = 0; d < s.hd; ++d)
        EXPECT_EQ(dq[((b * s.Tq + i) * s.nh + h) * s.hd + d], 0.0);
    }
  // So do keys no query sees (later positions, other documents).
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t j = 0; j < s.Tk; ++j) {
      bool seen = false;
      for (int64_t i = 0; i < s.Tq; ++i) seen = seen || pair_visible(s, b, i, j);
      if (seen) continue;
      for (int64_t e = 0; e < s.nkv * s.hd; ++e) {
        EXPECT_EQ(dk[b * stride + j * s.nkv * s.hd + e], 0.0);
        EXPECT_EQ(dv[b * stride + j * s.nkv * s.hd + e], 0.0);
      }
    }

  // Backward accumulates: a second call doubles every gradient.
  objective();  // out and lse of the unperturbed inputs again
  auto dq2 = dq, dk2 = dk, dv2 = dv;
  ops::attention_backward(dq2.data(), dk2.data(), dv2.data(), in.dout.data(), in.q.data(),
                          in.k.data(), in.v.data(), out.data(), lse.data(), s);
  for (auto* g : {&dq, &dk, &dv})
    for (double& x : *g) x *= 2;
  EXPECT_LT(max_rel_error(dq2, dq), 1e-13);
  EXPECT_LT(max_rel_error(dk2, dk), 1e-13);
  EXPECT_LT(max_rel_error(dv2, dv), 1e-13);
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  // Thousands of small forward calls: one thread avoids waking a team each time (threading is
  // covered by the bitwise test below).
  with_threads(1, [] {
    for (const Case& c : cases()) {
      SCOPED_TRACE(c.name);
      expect_backward_matches_finite_differences(c.s, c.fd_samples, 200);
    }
  });
}

TEST(Attention, DocumentMaskBackwardMatchesFiniteDifferences) {
  with_threads(1, [] {
    for (const DocCase& c : doc_cases()) {
      SCOPED_TRACE(c.name);
      expect_backward_matches_finite_differences(c.shape(), c.fd_samples, 200);
    }
  });
}

// Runs forward + backward in T and returns {out, lse, dq, dk, dv} as doubles.
template <class T>
std::vector<std::vector<T>> run_attention(const Inputs& in, const AttentionShape& s) {
  auto q = cast_to<T>(in.q), k = cast_to<T>(in.k), v = cast_to<T>(in.v), dout = cast_to<T>(in.dout);
  std::vector<T> out(q.size()), lse(s.B * s.nh * s.Tq), dq(q.size(), T(0)), dk(k.size(), T(0)),
      dv(v.size(), T(0));
  ops::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
  ops::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                          v.data(), out.data(), lse.data(), s);
  return {out, lse, dq, dk, dv};
}

TEST(Attention, FloatAgreesWithDouble) {
  const AttentionShape s = make_shape(2, 100, 100, 6, 2, 16);
  const Inputs in = make_inputs(s, 300);
  const auto d = run_attention<double>(in, s);
  const auto f = run_attention<float>(in, s);
  for (int t = 0; t < 5; ++t) EXPECT_LT(max_rel_error(f[t], d[t]), 1e-5) << "tensor " << t;
}

TEST(Attention, BitwiseIdenticalAcrossRunsAndThreadCounts) {
  const AttentionShape s = make_shape(2, 140, 140, 6, 2, 16);
  const Inputs in = make_inputs(s, 400);
  std::vector<std::vector<float>> one, one_again, two;
  with_threads(1, [&] {
    one = run_attention<float>(in, s);
    one_again = run_attention<float>(in, s);
  });
  with_threads(2, [&] { two = run_attention<float>(in, s); });
  for (int t = 0; t < 5; ++t) {
    EXPECT_TRUE(bitwise_equal(one[t], one_again[t])) << "tensor " << t;
    EXPECT_TRUE(bitwise_equal(one[t], two[t])) << "tensor " << t;
  }
}

TEST(Attention, OneDocumentIsBitwiseTheUnmaskedResult) {
  for (const AttentionShape& s :
       {make_shape(2, 140, 140, 6, 2, 16), make_shape(2, 70, 150, 3, 1, 8, /*q_start=*/80, 0)}) {
    const Inputs in = make_inputs(s, 600);
    const Documents docs = one_document(s);
    const AttentionShape masked = with_documents(s, docs);
    const auto f = run_attention<float>(in, s), f_masked = run_attention<float>(in, masked);
    const auto d = run_attention<double>(in, s), d_masked = run_attention<double>(in, masked);
    for (int t = 0; t < 5; ++t) {
      EXPECT_TRUE(bitwise_equal(f[t], f_masked[t])) << "float tensor " << t;
      EXPECT_TRUE(bitwise_equal(d[t], d_masked[t])) << "double tensor " << t;
    }
  }
}

// Adds up the FLOPs an op reports.
struct FlopTotal : ops::FlopSink {
  double total = 0;
  void add_flops(double flops) override { total += flops; }
};

TEST(Attention, VisiblePairsCountEveryVisiblePair) {
  auto count = [](const AttentionShape& s) {
    int64_t pairs = 0;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t i = 0; i < s.Tq; ++i)
        for (int64_t j = 0; j < s.Tk; ++j) pairs += pair_visible(s, b, i, j);
    return pairs;
  };
  std::vector<std::pair<std::string, AttentionShape>> shapes;
  for (const Case& c : cases()) shapes.emplace_back(c.name, c.s);
  const std::vector<DocCase> docs = doc_cases();
  for (const DocCase& c : docs) shapes.emplace_back(c.name, c.shape());
  for (const auto& [name, s] : shapes) {
    SCOPED_TRACE(name);
    const int64_t pairs = count(s);
    EXPECT_EQ(ops::attention_visible_pairs(s), pairs);
    // What the op reports: 4·hd multiply-add FLOPs per pair and query head, 2.5x in backward.
    const double forward = 4.0 * double(s.hd) * double(s.nh) * double(pairs);
    EXPECT_EQ(ops::attention_forward_flops(s), forward);
    const Inputs in = make_inputs(s, 650);
    std::vector<double> out(in.q.size()), lse(s.B * s.nh * s.Tq), dq(in.q.size(), 0.0),
        dk(in.k.size(), 0.0), dv(in.v.size(), 0.0);
    FlopTotal flops;
    {
      ops::ScopedFlopSink sink(&flops);
      ops::attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), s);
      EXPECT_EQ(flops.total, forward);
      ops::attention_backward(dq.data(), dk.data(), dv.data(), in.dout.data(), in.q.data(),
                              in.k.data(), in.v.data(), out.data(), lse.data(), s);
    }
    EXPECT_EQ(flops.total, 3.5 * forward);
  }
}

// Forward over keys [lo, hi) of s only: the same queries, the keys and values read in place from
// position lo on (kv_batch_stride keeps the batch items where they are) at their true absolute
// positions, as a ring attention step sees the block of keys it was sent. Document ids have no
// batch stride, so the block's ids are copied out. Returns {out, lse}.
std::vector<std::vector<double>> attention_over_keys(const Inputs& in, const AttentionShape& s,
                                                     int64_t lo, int64_t hi) {
  AttentionShape part = s;
  part.Tk = hi - lo, part.k_start = s.k_start + lo, part.kv_batch_stride = kv_stride(s);
  std::vector<int32_t> k_doc;
  if (s.k_doc != nullptr) {
    for (int64_t b = 0; b < s.B; ++b)
      k_doc.insert(k_doc.end(), s.k_doc + b * s.Tk + lo, s.k_doc + b * s.Tk + hi);
    part.k_doc = k_doc.data();
  }
  const int64_t offset = lo * s.nkv * s.hd;
  std::vector<double> out(in.q.size()), lse(s.B * s.nh * s.Tq);
  ops::attention_forward(out.data(), lse.data(), in.q.data(), in.k.data() + offset,
                         in.v.data() + offset, part);
  return {out, lse};
}

// The hd outputs of row (b, i, h), given its lse index (b * nh + h) * Tq + i.
template <class T>
std::vector<T> out_row(const std::vector<T>& out, int64_t l, int64_t Tq, int64_t nh, int64_t hd) {
  const int64_t i = l % Tq, h = (l / Tq) % nh, b = l / (Tq * nh);
  const T* row = out.data() + ((b * Tq + i) * nh + h) * hd;
  return std::vector<T>(row, row + hd);
}

TEST(Attention, MergeOfKeySplitsIsAttentionOverAllKeys) {
  // A later chunk of queries against all keys up to it; packed documents make some rows see
  // nothing before the split, the causal mask some rows nothing after it.
  const AttentionShape chunk = make_shape(2, 24, 40, 4, 2, 8, /*q_start=*/16, /*k_start=*/0);
  const Documents docs = packed_documents(chunk, 9, 700);
  int64_t rows_only_first = 0, rows_only_second = 0;
  for (const AttentionShape& s : {chunk, with_documents(chunk, docs)})
    for (int64_t split : {1, 20, 39}) {
      SCOPED_TRACE("split " + std::to_string(split) + (s.q_doc ? " with documents" : ""));
      const Inputs in = make_inputs(s, 710);
      std::vector<double> full_out(in.q.size()), full_lse(s.B * s.nh * s.Tq);
      ops::attention_forward(full_out.data(), full_lse.data(), in.q.data(), in.k.data(),
                             in.v.data(), s);
      const auto first = attention_over_keys(in, s, 0, split);
      const auto second = attention_over_keys(in, s, split, s.Tk);
      // Ring steps may bring the blocks in either order.
      for (bool second_first : {false, true}) {
        const auto& a = second_first ? second : first;
        const auto& b = second_first ? first : second;
        std::vector<double> out = a[0], lse = a[1];
        ops::attention_merge(out.data(), lse.data(), b[0].data(), b[1].data(), s.B, s.Tq, s.nh,
                             s.hd);
        EXPECT_LT(max_rel_error(out, full_out), 1e-12);
        expect_lse_equal(lse, full_lse);
        // A row one side never saw is the other side's row, bit for bit.
        for (int64_t l = 0; l < s.B * s.nh * s.Tq; ++l) {
          const bool a_empty = std::isinf(a[1][l]), b_empty = std::isinf(b[1][l]);
          ASSERT_FALSE(a_empty && b_empty);  // every query sees at least its own position
          if (!a_empty && !b_empty) continue;
          const auto& seen = a_empty ? b : a;
          EXPECT_TRUE(bitwise_equal(out_row(out, l, s.Tq, s.nh, s.hd),
                                    out_row(seen[0], l, s.Tq, s.nh, s.hd)));
          EXPECT_EQ(std::memcmp(&lse[l], &seen[1][l], sizeof(double)), 0);
          if (std::isinf(first[1][l])) {
            ++rows_only_second;
          } else {
            ++rows_only_first;
          }
        }
      }
    }
  EXPECT_GT(rows_only_first, 0);
  EXPECT_GT(rows_only_second, 0);
}

// Random partial results of rows (b, i, h), some of which saw no key on one side or on both
// (lse = -inf and out = 0 there, as attention_forward leaves such a row).
struct Partials {
  int64_t B, Tq, nh, hd;
  std::vector<double> out, lse, part_out, part_lse;
};

Partials random_partials(int64_t B, int64_t Tq, int64_t nh, int64_t hd, uint64_t seed) {
  Partials p{B, Tq, nh, hd, random_vector(B * Tq * nh * hd, seed),
             random_vector(B * nh * Tq, seed + 1, -5, 5), random_vector(B * Tq * nh * hd, seed + 2),
             random_vector(B * nh * Tq, seed + 3, -5, 5)};
  std::mt19937_64 gen(seed + 4);
  std::uniform_int_distribution<int> kind(0, 5);  // 0: out empty, 1: part empty, 2: both
  auto empty = [&](std::vector<double>& out, std::vector<double>& lse, int64_t l) {
    lse[l] = -std::numeric_limits<double>::infinity();
    const int64_t i = l % Tq, h = (l / Tq) % nh, b = l / (Tq * nh);
    std::fill_n(out.begin() + ((b * Tq + i) * nh + h) * hd, hd, 0.0);
  };
  for (int64_t l = 0; l < B * nh * Tq; ++l) {
    const int k = kind(gen);
    if (k == 0 || k == 2) empty(p.out, p.lse, l);
    if (k == 1 || k == 2) empty(p.part_out, p.part_lse, l);
  }
  return p;
}

TEST(Attention, MergeFollowsTheFormulaAndKeepsEmptySidesExact) {
  const Partials p = random_partials(2, 9, 3, 8, 750);
  std::vector<double> out = p.out, lse = p.lse;
  ops::attention_merge(out.data(), lse.data(), p.part_out.data(), p.part_lse.data(), p.B, p.Tq,
                       p.nh, p.hd);
  for (int64_t l = 0; l < p.B * p.nh * p.Tq; ++l) {
    const auto merged = out_row(out, l, p.Tq, p.nh, p.hd);
    const auto mine = out_row(p.out, l, p.Tq, p.nh, p.hd);
    const auto theirs = out_row(p.part_out, l, p.Tq, p.nh, p.hd);
    if (std::isinf(p.part_lse[l])) {  // nothing to add: the row keeps its bits (0 if both empty)
      EXPECT_TRUE(bitwise_equal(merged, mine));
      EXPECT_EQ(std::memcmp(&lse[l], &p.lse[l], sizeof(double)), 0);
    } else if (std::isinf(p.lse[l])) {  // only the part saw keys: its bits
      EXPECT_TRUE(bitwise_equal(merged, theirs));
      EXPECT_EQ(std::memcmp(&lse[l], &p.part_lse[l], sizeof(double)), 0);
    } else {  // softmax weights of the two sides, straight from the definition in long double
      const long double w1 = std::exp(static_cast<long double>(p.lse[l]));
      const long double w2 = std::exp(static_cast<long double>(p.part_lse[l]));
      EXPECT_NEAR(lse[l], static_cast<double>(std::log(w1 + w2)), 1e-14);
      for (int64_t d = 0; d < p.hd; ++d)
        EXPECT_NEAR(merged[d], static_cast<double>((w1 * mine[d] + w2 * theirs[d]) / (w1 + w2)),
                    1e-14);
    }
  }
  for (int64_t l = 0; l < p.B * p.nh * p.Tq; ++l) {
    if (std::isinf(p.lse[l]) && std::isinf(p.part_lse[l])) {  // both empty: still empty
      EXPECT_TRUE(std::isinf(lse[l]) && lse[l] < 0);
    }
  }
}

TEST(Attention, DocumentsAndMergeBitwiseAcrossThreadCounts) {
  const AttentionShape base = make_shape(2, 140, 140, 6, 2, 16);
  const Documents docs = packed_documents(base, 50, 800);
  const AttentionShape s = with_documents(base, docs);
  const Inputs in = make_inputs(s, 810);
  // 4800 rows of 16: enough that the merge splits its rows into several chunks.
  const Partials p = random_partials(2, 400, 6, 16, 820);
  auto merge = [&] {
    auto out = cast_to<float>(p.out), lse = cast_to<float>(p.lse);
    const auto part_out = cast_to<float>(p.part_out), part_lse = cast_to<float>(p.part_lse);
    ops::attention_merge(out.data(), lse.data(), part_out.data(), part_lse.data(), p.B, p.Tq,
                         p.nh, p.hd);
    return std::vector<std::vector<float>>{out, lse};
  };
  std::vector<std::vector<std::vector<float>>> attention(3), merged(3);
  for (int threads = 1; threads <= 3; ++threads)
    with_threads(threads, [&] {
      attention[threads - 1] = run_attention<float>(in, s);
      merged[threads - 1] = merge();
    });
  for (int threads = 2; threads <= 3; ++threads) {
    for (int t = 0; t < 5; ++t)
      EXPECT_TRUE(bitwise_equal(attention[0][t], attention[threads - 1][t]))
          << threads << " threads, tensor " << t;
    for (int t = 0; t < 2; ++t)
      EXPECT_TRUE(bitwise_equal(merged[0][t], merged[threads - 1][t]))
          << threads << " threads, merge tensor " << t;
  }
}

TEST(Attention, RejectsInconsistentShapes) {
  std::vector<double> buf(4096);
  auto call = [&](const AttentionShape& s) {
    ops::attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), s);
  };
  EXPECT_THROW(call(make_shape(1, 2, 2, 3, 2, 4)), InputError);  // 3 heads, 2 KV heads
  EXPECT_THROW(call(make_shape(1, 2, 4, 2, 1, 4, 0, 0, /*stride=*/8)),
               InputError);  // stride < Tk*nkv*hd
  // Document ids for one side only.
  const int32_t ids[4] = {0, 0, 1, 1};
  AttentionShape only_q = make_shape(1, 2, 2, 2, 1, 4), only_k = only_q;
  only_q.q_doc = ids;
  only_k.k_doc = ids;
  for (const AttentionShape& s : {only_q, only_k}) {
    EXPECT_THROW(call(s), InputError);
    EXPECT_THROW(ops::attention_backward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(),
                                         buf.data(), buf.data(), buf.data(), buf.data(), s),
                 InputError);
  }
  EXPECT_THROW(ops::attention_merge(buf.data(), buf.data(), buf.data(), buf.data(), 1, 2, 0, 4),
               InputError);  // no heads
}

}  // namespace
}  // namespace llama4d::test
