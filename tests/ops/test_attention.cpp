// attention_forward / attention_backward: causal GQA with q_start/k_start offsets, a KV cache
// stride and a saved log-sum-exp.
#include <gtest/gtest.h>

#include <limits>
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
          visible[j] = s.k_start + j <= s.q_start + i;
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
  };
}

TEST(Attention, ForwardMatchesExplicitProbabilities) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const AttentionShape& s = c.s;
    const Inputs in = make_inputs(s, 100);
    // Forward overwrites: start from NaN so a row left unwritten would show.
    std::vector<double> out(s.B * s.Tq * s.nh * s.hd, std::nan("")),
        lse(s.B * s.nh * s.Tq, std::nan(""));
    ops::attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), s);
    std::vector<double> out_ref, lse_ref;
    attention_reference(out_ref, lse_ref, in, s);
    EXPECT_LT(max_rel_error(out, out_ref), 1e-13);
    expect_lse_equal(lse, lse_ref);
  }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  // Thousands of small forward calls: one thread avoids waking a team each time (threading is
  // covered by the bitwise test below).
  const int saved_threads = ops::backend_threads();
  ops::set_backend_threads(1);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const AttentionShape& s = c.s;
    Inputs in = make_inputs(s, 200);
    std::vector<double> out(s.B * s.Tq * s.nh * s.hd), lse(s.B * s.nh * s.Tq);
    auto objective = [&] {
      ops::attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), s);
      return dot(out, in.dout);
    };
    objective();
    std::vector<double> dq(in.q.size(), 0.0), dk(in.k.size(), 0.0), dv(in.v.size(), 0.0);
    ops::attention_backward(dq.data(), dk.data(), dv.data(), in.dout.data(), in.q.data(),
                            in.k.data(), in.v.data(), out.data(), lse.data(), s);
    const size_t n = c.fd_samples;
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
  ops::set_backend_threads(saved_threads);
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

TEST(Attention, RejectsInconsistentShapes) {
  std::vector<double> buf(4096);
  auto call = [&](const AttentionShape& s) {
    ops::attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), s);
  };
  EXPECT_THROW(call(make_shape(1, 2, 2, 3, 2, 4)), InputError);  // 3 heads, 2 KV heads
  EXPECT_THROW(call(make_shape(1, 2, 4, 2, 1, 4, 0, 0, /*stride=*/8)),
               InputError);  // stride < Tk*nkv*hd
}

}  // namespace
}  // namespace llama4d::test
