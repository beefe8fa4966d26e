// Every op of core/ops.h gives the same bits on 1, 2, 3, 4, 8 and 16 threads (the equivalence
// harness relies on it: a virtual GPU gets cores / ranks threads, one device all of them). The
// shapes are odd and large enough that every op actually splits its work over threads
// (oversubscribed on a 2-core machine, which changes the timing, never the split). The GEMM's
// own cut into tasks is stated in test_gemm_tiling.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/ops.h"
#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

constexpr int kThreadCounts[] = {2, 3, 4, 8, 16};

// One op's outputs, as raw bytes so float, double and bool outputs compare alike.
using Outputs = std::vector<std::vector<unsigned char>>;

template <class T>
std::vector<unsigned char> bytes_of(const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  return std::vector<unsigned char>(p, p + v.size() * sizeof(T));
}

// Runs `compute` on one thread and then on each of kThreadCounts; every output must keep its bits.
template <class F>
void expect_bits_independent_of_threads(F&& compute) {
  Outputs one;
  with_threads(1, [&] { one = compute(); });
  for (int threads : kThreadCounts) {
    Outputs got;
    with_threads(threads, [&] { got = compute(); });
    ASSERT_EQ(got.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(got[i] == one[i]) << threads << " threads, output " << i;
  }
}

std::vector<float> random_floats(int64_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return cast_to<float>(random_vector(static_cast<size_t>(n), seed, lo, hi));
}

std::vector<int32_t> random_tokens(int64_t n, int32_t vocab, uint64_t seed) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = int32_t((i * 7919 + int64_t(seed) * 104729) % vocab);
  tokens[3] = -1;  // an ignored row for the losses
  return tokens;
}

TEST(ThreadCounts, Matmul) {
  // Several output tiles and three depth chunks of the weight gradient (K = 1,000 rows).
  const int64_t BT = 1000, C = 300, OC = 530;
  const auto x = random_floats(BT * C, 1), w = random_floats(OC * C, 2), dy = random_floats(BT * OC, 3);
  const auto dw0 = random_floats(OC * C, 4);  // the weight gradient accumulates into what is there
  expect_bits_independent_of_threads([&] {
    std::vector<float> y(static_cast<size_t>(BT * OC)), dx(static_cast<size_t>(BT * C), 0.5f), dw = dw0;
    ops::matmul_forward(y.data(), x.data(), w.data(), BT, C, OC);
    ops::matmul_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), BT, C, OC);
    return Outputs{bytes_of(y), bytes_of(dx), bytes_of(dw)};
  });
}

TEST(ThreadCounts, MatmulInDouble) {
  const int64_t BT = 517, C = 129, OC = 263;
  const auto x = random_vector(BT * C, 5), w = random_vector(OC * C, 6), dy = random_vector(BT * OC, 7);
  expect_bits_independent_of_threads([&] {
    std::vector<double> y(static_cast<size_t>(BT * OC)), dx(static_cast<size_t>(BT * C), 0.0), dw(static_cast<size_t>(OC * C), 0.0);
    ops::matmul_forward(y.data(), x.data(), w.data(), BT, C, OC);
    ops::matmul_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), BT, C, OC);
    return Outputs{bytes_of(y), bytes_of(dx), bytes_of(dw)};
  });
}

TEST(ThreadCounts, RmsNorm) {
  const int64_t BT = 1001, C = 301;
  const auto x = random_floats(BT * C, 8), g = random_floats(C, 9, 0.5, 1.5), dy = random_floats(BT * C, 10);
  expect_bits_independent_of_threads([&] {
    std::vector<float> y(static_cast<size_t>(BT * C)), rstd(static_cast<size_t>(BT)), dx(static_cast<size_t>(BT * C), 0.0f), dg(static_cast<size_t>(C), 0.0f);
    ops::rmsnorm_forward(y.data(), rstd.data(), x.data(), g.data(), BT, C, 1e-5f);
    ops::rmsnorm_backward(dx.data(), dg.data(), dy.data(), x.data(), g.data(), rstd.data(), BT, C);
    return Outputs{bytes_of(y), bytes_of(rstd), bytes_of(dx), bytes_of(dg)};
  });
}

TEST(ThreadCounts, Rope) {
  const int64_t B = 3, T = 301, nh = 5, hd = 48, max_pos = 400, start = 7;
  const auto x = random_floats(B * T * nh * hd, 11), dy = random_floats(B * T * nh * hd, 12);
  std::vector<float> cos(static_cast<size_t>(max_pos * hd / 2)), sin(cos.size());
  for (size_t i = 0; i < cos.size(); ++i) cos[i] = std::cos(0.01f * float(i)), sin[i] = std::sin(0.01f * float(i));
  expect_bits_independent_of_threads([&] {
    std::vector<float> y = x, dx = dy;
    ops::rope_forward(y.data(), cos.data(), sin.data(), B, T, nh, hd, start);
    ops::rope_backward(dx.data(), cos.data(), sin.data(), B, T, nh, hd, start);
    return Outputs{bytes_of(y), bytes_of(dx)};
  });
}

// Causal GQA attention with and without document masks, and the merge context parallelism uses.
TEST(ThreadCounts, Attention) {
  ops::AttentionShape s;
  s.B = 2, s.Tq = 301, s.Tk = 301, s.nh = 6, s.nkv = 2, s.hd = 24;
  const auto q = random_floats(s.B * s.Tq * s.nh * s.hd, 13), k = random_floats(s.B * s.Tk * s.nkv * s.hd, 14),
             v = random_floats(s.B * s.Tk * s.nkv * s.hd, 15), dy = random_floats(s.B * s.Tq * s.nh * s.hd, 16);
  std::vector<int32_t> docs(static_cast<size_t>(s.B * s.Tq));
  for (int64_t i = 0; i < s.B * s.Tq; ++i) docs[static_cast<size_t>(i)] = int32_t((i % s.Tq) / 97);  // documents of 97 tokens
  for (bool masked : {false, true}) {
    SCOPED_TRACE(masked ? "document mask" : "causal only");
    s.q_doc = masked ? docs.data() : nullptr;
    s.k_doc = masked ? docs.data() : nullptr;
    expect_bits_independent_of_threads([&] {
      std::vector<float> out(dy.size()), lse(static_cast<size_t>(s.B * s.nh * s.Tq));
      std::vector<float> dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
      ops::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
      ops::attention_backward(dq.data(), dk.data(), dv.data(), dy.data(), q.data(), k.data(), v.data(), out.data(),
                              lse.data(), s);
      return Outputs{bytes_of(out), bytes_of(lse), bytes_of(dq), bytes_of(dk), bytes_of(dv)};
    });
  }
  const auto part_out = random_floats(dy.size(), 17), part_lse = random_floats(s.B * s.nh * s.Tq, 18, -3, 3);
  const auto out0 = random_floats(dy.size(), 19), lse0 = random_floats(s.B * s.nh * s.Tq, 20, -3, 3);
  expect_bits_independent_of_threads([&] {
    std::vector<float> out = out0, lse = lse0;
    ops::attention_merge(out.data(), lse.data(), part_out.data(), part_lse.data(), s.B, s.Tq, s.nh, s.hd);
    return Outputs{bytes_of(out), bytes_of(lse)};
  });
}

TEST(ThreadCounts, SwiGluAndResidual) {
  const int64_t N = 300017;
  const auto a = random_floats(N, 21, -4, 4), b = random_floats(N, 22), dy = random_floats(N, 23);
  expect_bits_independent_of_threads([&] {
    std::vector<float> y(static_cast<size_t>(N)), dg(static_cast<size_t>(N), 0.25f), du(static_cast<size_t>(N), 0.0f), sum(static_cast<size_t>(N)), acc = b;
    ops::swiglu_forward(y.data(), a.data(), b.data(), N);
    ops::swiglu_backward(dg.data(), du.data(), dy.data(), a.data(), b.data(), N);
    ops::add_forward(sum.data(), a.data(), b.data(), N);
    ops::accumulate(acc.data(), dy.data(), N);
    return Outputs{bytes_of(y), bytes_of(dg), bytes_of(du), bytes_of(sum), bytes_of(acc)};
  });
}

// The router over enough tokens to split (BT·E above the CPU's threading threshold), and the
// dispatch's row moves over a permutation of the BT·k rows.
TEST(ThreadCounts, MoeRouting) {
  const int64_t BT = 4099, E = 8, k = 2, C = 67, n = BT * k;
  const auto logits = random_floats(BT * E, 31, -3, 3), x = random_floats(BT * C, 32), dy = random_floats(BT * C, 33);
  const auto dw = random_floats(n, 34), dp = random_floats(E, 35);
  std::vector<int32_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = int32_t((i * 7919) % n);  // 7919 is prime to n
  std::vector<int32_t> token(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) token[static_cast<size_t>(i)] = int32_t(perm[static_cast<size_t>(i)] / k);
  expect_bits_independent_of_threads([&] {
    std::vector<float> probs(static_cast<size_t>(BT * E)), w(static_cast<size_t>(n)), dz(static_cast<size_t>(BT * E));
    std::vector<int32_t> experts(static_cast<size_t>(n));
    std::vector<float> rows(static_cast<size_t>(n * C)), out(static_cast<size_t>(BT * C)), drows(static_cast<size_t>(n * C));
    std::vector<float> dweights(static_cast<size_t>(n));
    ops::router_topk(probs.data(), w.data(), experts.data(), logits.data(), BT, E, k);
    ops::router_backward(dz.data(), dw.data(), dp.data(), probs.data(), w.data(), experts.data(), BT, E, k);
    ops::gather_rows(rows.data(), x.data(), token.data(), n, C);
    ops::combine_rows(out.data(), rows.data(), perm.data(), w.data(), BT, k, C);
    ops::combine_rows_backward(drows.data(), dweights.data(), dy.data(), rows.data(), perm.data(), w.data(), BT, k, C);
    return Outputs{bytes_of(probs), bytes_of(w), bytes_of(experts), bytes_of(dz), bytes_of(rows), bytes_of(out),
                   bytes_of(drows), bytes_of(dweights)};
  });
}

TEST(ThreadCounts, Embedding) {
  const int64_t BT = 1001, C = 301, V = 264, row_begin = 100, rows = 90;
  const auto wte = random_floats(V * C, 24), dy = random_floats(BT * C, 25);
  std::vector<int32_t> tokens = random_tokens(BT, int32_t(V), 26);
  tokens[3] = 5;  // every id in range here
  expect_bits_independent_of_threads([&] {
    std::vector<float> y(static_cast<size_t>(BT * C)), dwte(static_cast<size_t>(V * C), 0.0f), y_rows(static_cast<size_t>(BT * C)), dw_rows(static_cast<size_t>(rows * C), 0.0f);
    ops::embedding_forward(y.data(), tokens.data(), wte.data(), BT, C);
    ops::embedding_backward(dwte.data(), dy.data(), tokens.data(), BT, C);
    ops::embedding_forward_rows(y_rows.data(), tokens.data(), wte.data() + row_begin * C, BT, C, row_begin, rows);
    ops::embedding_backward_rows(dw_rows.data(), dy.data(), tokens.data(), BT, C, row_begin, rows);
    return Outputs{bytes_of(y), bytes_of(dwte), bytes_of(y_rows), bytes_of(dw_rows)};
  });
}

// The whole-vocabulary loss and the vocabulary-parallel pieces tensor parallelism calls.
TEST(ThreadCounts, CrossEntropy) {
  const int64_t BT = 1001, V = 263, begin = 100, slice = 90;
  const auto logits = random_floats(BT * V, 27, -5, 5);
  const std::vector<int32_t> targets = random_tokens(BT, int32_t(V), 28);
  expect_bits_independent_of_threads([&] {
    std::vector<float> losses(static_cast<size_t>(BT)), dlogits(static_cast<size_t>(BT * V), 0.0f);
    ops::cross_entropy_forward(losses.data(), logits.data(), targets.data(), BT, V);
    ops::cross_entropy_backward(dlogits.data(), logits.data(), targets.data(), 1.0f / float(BT), BT, V);
    // One slice of columns [begin, begin + slice), as a tp rank holds it (copied out: [BT, slice]).
    std::vector<float> part(static_cast<size_t>(BT * slice));
    for (int64_t r = 0; r < BT; ++r)
      for (int64_t j = 0; j < slice; ++j) part[static_cast<size_t>(r * slice + j)] = logits[static_cast<size_t>(r * V + begin + j)];
    std::vector<float> row_max(static_cast<size_t>(BT)), target(static_cast<size_t>(BT)), sum_exp(static_cast<size_t>(BT)), part_losses(static_cast<size_t>(BT)),
        lse(static_cast<size_t>(BT)), dpart(part.size(), 0.0f);
    ops::vocab_slice_max_and_target(row_max.data(), target.data(), part.data(), targets.data(), BT, slice, begin);
    ops::vocab_slice_sum_exp(sum_exp.data(), part.data(), row_max.data(), BT, slice);
    ops::cross_entropy_from_stats(part_losses.data(), lse.data(), row_max.data(), sum_exp.data(), target.data(),
                                  targets.data(), BT);
    ops::cross_entropy_backward_slice(dpart.data(), part.data(), lse.data(), targets.data(), 0.5f, BT, slice, begin);
    return Outputs{bytes_of(losses), bytes_of(dlogits), bytes_of(row_max), bytes_of(target),
                   bytes_of(sum_exp), bytes_of(part_losses), bytes_of(lse), bytes_of(dpart)};
  });
}

// The optimizer step and the buffer ops around it (norms, loss sums, finiteness).
TEST(ThreadCounts, OptimizerAndVectorOps) {
  const int64_t N = 300017;
  const auto w0 = random_floats(N, 29), m0 = random_floats(N, 30, -0.1, 0.1), v0 = random_floats(N, 31, 0, 0.01),
             g = random_floats(N, 32);
  const ops::AdamWStep<float> step = ops::adamw_step_scalars<float>(1e-3, 0.9, 0.95, 1e-8, 0.1, 3, true);
  const std::vector<int32_t> targets = random_tokens(N, 264, 33);
  expect_bits_independent_of_threads([&] {
    std::vector<float> w = w0, m = m0, v = v0, filled(static_cast<size_t>(N)), copied(static_cast<size_t>(N)), y = w0;
    ops::adamw_update(w.data(), m.data(), v.data(), g.data(), N, step);
    ops::fill(filled.data(), 0.125f, N);
    ops::copy(copied.data(), g.data(), N);
    ops::add_scaled(y.data(), g.data(), -0.3f, N);
    ops::scale(y.data(), 1.7f, N);
    std::vector<double> partials(size_t((N + 4095) / 4096)), loss(1);
    int64_t count = 0;
    ops::sum_squares_chunks(partials.data(), g.data(), N, 4096);
    ops::sum_losses(loss.data(), &count, g.data(), targets.data(), N);
    std::vector<unsigned char> finite = {static_cast<unsigned char>(ops::all_finite(w.data(), N))};
    return Outputs{bytes_of(w), bytes_of(m), bytes_of(v), bytes_of(filled), bytes_of(copied), bytes_of(y),
                   bytes_of(partials), bytes_of(loss), bytes_of(std::vector<int64_t>{count}), finite};
  });
}

}  // namespace
}  // namespace llama4d::test
