// The mixture-of-experts layer (core/model/moe.h) against computations written here: the router's
// choices by hand, the forward against a dense computation (every expert on every token, masked
// by a routing this file computes itself), the backward against central finite differences in
// fp64, and the activations it keeps against the header's formula.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/model/moe.h"
#include "core/ops.h"
#include "model_test_util.h"

namespace llama4d {
namespace {

// A layer's inputs and parameters, on the CPU backend (whose memory is host memory).
struct MoeCase {
  MoeDims d;
  std::vector<double> x, params;  // [BT, C]; gate then the experts (moe.h's order)
};

MoeCase random_moe_case(MoeDims d, uint64_t seed) {
  MoeCase l{d, std::vector<double>(size_t(d.BT * d.C)), std::vector<double>(size_t(moe_numel(d)))};
  for (double& v : l.x) v = 2.0 * test::next_uniform(seed) - 1.0;
  for (double& v : l.params) v = test::next_uniform(seed) - 0.5;
  return l;
}

template <class T>
Buffer<T> to_backend(MemoryTracker* m, const std::vector<double>& v) {
  Buffer<T> b(m, MemoryCategory::other, int64_t(v.size()));
  for (size_t i = 0; i < v.size(); ++i) b.data()[i] = T(v[i]);
  return b;
}

template <class T>
std::vector<double> from_backend(const T* p, int64_t n) {
  return std::vector<double>(p, p + n);
}

// The layer's output and its activations (kept for a backward) in T.
template <class T>
struct MoeRun {
  MemoryTracker memory{0, 0};
  Buffer<T> x, params, out;
  MoeActivations<T> a;
};

template <class T>
void run_moe_forward(MoeRun<T>& r, const MoeCase& l) {
  r.x = to_backend<T>(&r.memory, l.x);
  r.params = to_backend<T>(&r.memory, l.params);
  r.out = Buffer<T>(&r.memory, MemoryCategory::other, l.d.BT * l.d.C);
  moe_forward(r.out.data(), r.a, moe_weights(r.params.data(), l.d), r.x.data(), l.d, &r.memory);
}

// ---- The reference: written from the formulas of moe.h, in double, sharing no code with it. ----
struct DenseReference {
  std::vector<double> out;               // [BT, C]
  std::vector<std::vector<int>> chosen;  // per token, its k experts, largest first
  std::vector<int64_t> counts;           // [E]
  double aux = 0.0;
};

DenseReference dense_reference(const MoeCase& l) {
  const MoeDims& d = l.d;
  const double* gate = l.params.data();
  auto w1 = [&](int64_t e) { return l.params.data() + d.E * d.C + e * 3 * d.I * d.C; };
  auto w2 = [&](int64_t e) { return w1(e) + d.I * d.C; };
  auto w3 = [&](int64_t e) { return w2(e) + d.C * d.I; };
  DenseReference r{std::vector<double>(size_t(d.BT * d.C), 0.0), {}, std::vector<int64_t>(size_t(d.E), 0), 0.0};
  std::vector<double> mean_prob(size_t(d.E), 0.0);
  for (int64_t t = 0; t < d.BT; ++t) {
    const double* x = l.x.data() + t * d.C;
    std::vector<double> p(size_t(d.E));
    for (int64_t e = 0; e < d.E; ++e) p[size_t(e)] = std::inner_product(x, x + d.C, gate + e * d.C, 0.0);
    const double m = *std::max_element(p.begin(), p.end());
    double z = 0.0;
    for (double& v : p) z += (v = std::exp(v - m));
    for (size_t e = 0; e < p.size(); ++e) p[e] /= z, mean_prob[e] += p[e] / double(d.BT);
    std::vector<int> order(size_t(d.E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
    order.resize(size_t(d.k));
    double picked = 0.0;
    for (int e : order) picked += p[size_t(e)], ++r.counts[size_t(e)];
    // Every expert on this token; the routing keeps k of them.
    for (int64_t e = 0; e < d.E; ++e) {
      std::vector<double> act(size_t(d.I));
      for (int64_t i = 0; i < d.I; ++i) {
        const double g = std::inner_product(x, x + d.C, w1(e) + i * d.C, 0.0);
        const double u = std::inner_product(x, x + d.C, w3(e) + i * d.C, 0.0);
        act[size_t(i)] = g / (1.0 + std::exp(-g)) * u;
      }
      const bool routed = std::find(order.begin(), order.end(), int(e)) != order.end();
      const double weight = routed ? p[size_t(e)] / picked : 0.0;
      for (int64_t c = 0; c < d.C; ++c)
        r.out[size_t(t * d.C + c)] += weight * std::inner_product(act.begin(), act.end(), w2(e) + c * d.I, 0.0);
    }
    r.chosen.push_back(order);
  }
  for (int64_t e = 0; e < d.E; ++e)
    r.aux += d.aux_coef * double(d.E) * double(r.counts[size_t(e)]) / double(d.BT) * mean_prob[size_t(e)];
  return r;
}

double largest_magnitude(const std::vector<double>& a) {
  double m = 0.0;
  for (double v : a) m = std::max(m, std::abs(v));
  return m;
}

constexpr MoeDims kDims{.BT = 10, .C = 8, .I = 12, .E = 4, .k = 2, .aux_coef = 0.3};

TEST(Moe, RouterBreaksTiesByTheLowerExpertAndRenormalises) {
  MemoryTracker memory(0, 0);
  const int64_t E = 6, k = 2, BT = 4;
  const std::vector<double> logits = {0, 1, 3, 0, 1, 3,                 // 2 and 5 tie on top
                                      0, 0, 0, 0, 0, 0,                 // all tie: 0 then 1
                                      1, 2, 0.5, 2, -1, 0,              // 1 and 3 tie
                                      0.1, 0.7, -0.3, 0.2, 0.9, 0.0};  // 4, then 1
  Buffer<double> z = to_backend<double>(&memory, logits);
  Buffer<double> probs(&memory, MemoryCategory::other, BT * E), weights(&memory, MemoryCategory::other, BT * k);
  Buffer<int32_t> experts(&memory, MemoryCategory::other, BT * k);
  ops::router_topk(probs.data(), weights.data(), experts.data(), z.data(), BT, E, k);
  EXPECT_EQ(std::vector<int32_t>(experts.data(), experts.data() + BT * k), (std::vector<int32_t>{2, 5, 0, 1, 1, 3, 4, 1}));
  for (int64_t j = 0; j < 6; ++j) EXPECT_NEAR(weights.data()[j], 0.5, 1e-15) << j;
  const double a = std::exp(0.9), b = std::exp(0.7);
  EXPECT_NEAR(weights.data()[6], a / (a + b), 1e-15);
  EXPECT_NEAR(weights.data()[7], b / (a + b), 1e-15);
  EXPECT_THROW(ops::router_topk(probs.data(), weights.data(), experts.data(), z.data(), BT, E, E + 1), InputError);
  MoeDims d = kDims;
  d.k = d.E + 1;
  try {
    d.validate();
    FAIL() << "top-k larger than E was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("num_experts_per_tok"), std::string::npos) << e.what();
  }
}

TEST(Moe, DispatchGroupsRowsByExpertWithTokensInOrder) {
  // Token 0 chose experts 1, 0; token 1 chose 0, 2; token 2 chose 1, 2.
  const MoeDispatch p = dispatch_in_expert_order({1, 0, 0, 2, 1, 2}, 3, 2);
  EXPECT_EQ(p.counts, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(p.begin, (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(p.token, (std::vector<int32_t>{0, 1, 0, 2, 1, 2}));
  EXPECT_EQ(p.row, (std::vector<int32_t>{2, 0, 1, 4, 3, 5}));
  EXPECT_THROW(dispatch_in_expert_order({0, 3}, 3, 2), InputError);
  EXPECT_THROW(dispatch_in_expert_order({0, 1, 2}, 3, 2), InputError);  // not k choices per token
}

template <class T>
void expect_forward_matches_dense(double tolerance) {
  const MoeCase l = random_moe_case(kDims, 7);
  const DenseReference ref = dense_reference(l);
  MoeRun<T> r;
  run_moe_forward(r, l);
  for (int64_t t = 0; t < kDims.BT; ++t)
    for (int64_t j = 0; j < kDims.k; ++j)
      ASSERT_EQ(r.a.dispatch.experts[size_t(t * kDims.k + j)], ref.chosen[size_t(t)][size_t(j)]) << t << " " << j;
  EXPECT_EQ(r.a.dispatch.counts, ref.counts);
  const std::vector<double> out = from_backend(r.out.data(), r.out.size());
  double err = 0.0;
  for (size_t i = 0; i < out.size(); ++i) err = std::max(err, std::abs(out[i] - ref.out[i]));
  EXPECT_LE(err, tolerance * largest_magnitude(ref.out));
  EXPECT_NEAR(r.a.aux_loss, ref.aux, tolerance * ref.aux);
  EXPECT_GT(ref.aux, 0.0);
}

TEST(Moe, ForwardEqualsEveryExpertOnEveryTokenMaskedByTheRoutingFp64) { expect_forward_matches_dense<double>(1e-13); }
TEST(Moe, ForwardEqualsEveryExpertOnEveryTokenMaskedByTheRoutingFp32) { expect_forward_matches_dense<float>(1e-5); }

// L = sum(out * R) + aux: moe_backward with dout = R and aux_scale = 1 against central differences
// of L over every input and parameter, the routing held fixed (checked: no perturbation flips it).
TEST(Moe, BackwardMatchesFiniteDifferencesFp64) {
  MoeCase l = random_moe_case(kDims, 11);
  uint64_t seed = 5;
  std::vector<double> R(size_t(kDims.BT * kDims.C));
  for (double& v : R) v = 2.0 * test::next_uniform(seed) - 1.0;
  MoeRun<double> base;
  run_moe_forward(base, l);
  auto loss = [&](const MoeCase& p) {
    MoeRun<double> r;
    run_moe_forward(r, p);
    EXPECT_EQ(r.a.dispatch.experts, base.a.dispatch.experts) << "a perturbation changed the routing";
    double s = r.a.aux_loss;
    for (size_t i = 0; i < R.size(); ++i) s += r.out.data()[i] * R[i];
    return s;
  };
  MemoryTracker& m = base.memory;
  Buffer<double> dout = to_backend<double>(&m, R), dx(&m, MemoryCategory::other, kDims.BT * kDims.C);
  Buffer<double> grads = to_backend<double>(&m, std::vector<double>(l.params.size(), 0.0));
  moe_backward(dx.data(), moe_weights(grads.data(), kDims), dout.data(), base.a,
               moe_weights(base.params.data(), kDims), base.x.data(), kDims, 1.0, &m);
  const double h = 1e-6;
  double worst = 0.0;
  auto check = [&](std::vector<double>& v, size_t i, double analytic) {
    const double keep = v[i];
    v[i] = keep + h;
    const double up = loss(l);
    v[i] = keep - h;
    const double down = loss(l);
    v[i] = keep;
    const double numeric = (up - down) / (2 * h);
    worst = std::max(worst, std::abs(numeric - analytic) / std::max(1.0, std::abs(numeric)));
  };
  for (size_t i = 0; i < l.x.size(); ++i) check(l.x, i, dx.data()[i]);
  for (size_t i = 0; i < l.params.size(); ++i) check(l.params, i, grads.data()[i]);
  EXPECT_LT(worst, 1e-8);
  // The load-balancing loss's own gradient is part of what was checked: without it the router's
  // gradient differs by more than the tolerance.
  Buffer<double> grads_no_aux = to_backend<double>(&m, std::vector<double>(l.params.size(), 0.0));
  moe_backward(dx.data(), moe_weights(grads_no_aux.data(), kDims), dout.data(), base.a,
               moe_weights(base.params.data(), kDims), base.x.data(), kDims, 0.0, &m);
  double gate_change = 0.0;
  for (int64_t i = 0; i < kDims.E * kDims.C; ++i)
    gate_change = std::max(gate_change, std::abs(grads.data()[i] - grads_no_aux.data()[i]));
  EXPECT_GT(gate_change, 1e-4);
}

// What the forward keeps is moe.h's formula: (E + k + 2kC + 3kI)·BT values and 3·BT·k int32.
TEST(Moe, ActivationsKeptAreTheHeaderFormula) {
  const MoeCase l = random_moe_case(kDims, 3);
  MoeRun<float> r;
  run_moe_forward(r, l);
  const MoeDims& d = kDims;
  const int64_t values = (d.E + d.k + 2 * d.k * d.C + 3 * d.k * d.I) * d.BT;
  EXPECT_EQ(r.memory.live(MemoryCategory::activations), values * int64_t(sizeof(float)) + 3 * d.BT * d.k * 4);
  EXPECT_EQ(r.memory.live(MemoryCategory::scratch), 0);  // the router's logits and sums are gone
  r.a.reset();
  EXPECT_EQ(r.memory.live(MemoryCategory::activations), 0);
}

}  // namespace
}  // namespace llama4d
