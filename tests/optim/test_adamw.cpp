// AdamW against an independent double-precision reference written from the paper's form of the
// update (Loshchilov & Hutter, decoupled weight decay), plus state save/restore and input checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/optim/adamw.h"
#include "optim_test_util.h"

namespace llama4d {
namespace {

using test::decay_flags;
using test::random_grads;
using test::random_vector;
using test::small_llama_like_specs;
using test::total_numel;

// Textbook AdamW in double, one element at a time:
//   p <- p - lr*wd*p (decayed elements only); m, v running moments;
//   p <- p - lr * m_hat / (sqrt(v_hat) + eps), m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t).
struct ReferenceAdamW {
  AdamWConfig cfg;
  std::vector<bool> decay;
  std::vector<double> m, v;
  int t = 0;

  ReferenceAdamW(const AdamWConfig& c, std::vector<bool> d)
      : cfg(c), decay(std::move(d)), m(decay.size(), 0.0), v(decay.size(), 0.0) {}

  void step(std::vector<double>& p, const std::vector<double>& g, double lr) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      if (decay[i]) p[i] -= lr * cfg.weight_decay * p[i];
      m[i] = cfg.beta1 * m[i] + (1.0 - cfg.beta1) * g[i];
      v[i] = cfg.beta2 * v[i] + (1.0 - cfg.beta2) * g[i] * g[i];
      const double m_hat = m[i] / (1.0 - std::pow(cfg.beta1, t));
      const double v_hat = v[i] / (1.0 - std::pow(cfg.beta2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + cfg.eps);
    }
  }
};

template <class T>
std::vector<double> to_double(const std::vector<T>& x) {
  return std::vector<double>(x.begin(), x.end());
}

// |got - want| <= rel * max(1, |want|) element-wise; reports the first failure.
void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rel,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = rel * std::max(1.0, std::abs(want[i]));
    ASSERT_NEAR(got[i], want[i], tol) << what << " element " << i;
  }
}

template <class T>
void run_against_reference(const AdamWConfig& cfg, double rel_tol) {
  const auto specs = small_llama_like_specs();
  const int64_t n = total_numel(specs);
  std::vector<T> params = random_vector<T>(n, 1);
  std::vector<double> ref_params = to_double(params);  // same starting values, exactly

  AdamW<T> opt(cfg, specs);
  ReferenceAdamW ref(cfg, decay_flags(specs));
  const double lrs[] = {1e-2, 3e-2, 2e-2, 5e-3, 1e-2, 4e-2};
  for (int s = 0; s < 6; ++s) {
    std::vector<T> grads = random_grads<T>(n, 100 + s);
    opt.step(params.data(), grads.data(), lrs[s]);
    ref.step(ref_params, to_double(grads), lrs[s]);
  }
  EXPECT_EQ(opt.step_count(), 6);
  expect_close(to_double(params), ref_params, rel_tol, "params");
  expect_close(to_double(test::as_vector(opt.exp_avg())), ref.m, rel_tol, "exp_avg");
  expect_close(to_double(test::as_vector(opt.exp_avg_sq())), ref.v, rel_tol, "exp_avg_sq");

  // The test must be able to fail: the updates moved the params far beyond the tolerance.
  const std::vector<T> start = random_vector<T>(n, 1);
  double moved = 0;
  for (int64_t i = 0; i < n; ++i) moved = std::max(moved, std::abs(double(params[i]) - start[i]));
  EXPECT_GT(moved, 1e3 * rel_tol);
}

TEST(AdamW, MatchesReferenceDouble) { run_against_reference<double>(AdamWConfig{}, 1e-13); }
TEST(AdamW, MatchesReferenceFloat) { run_against_reference<float>(AdamWConfig{}, 2e-6); }

TEST(AdamW, MatchesReferenceWithoutDecayAndOtherBetas) {
  AdamWConfig cfg;
  cfg.weight_decay = 0.0;
  cfg.beta1 = 0.8;
  cfg.beta2 = 0.999;
  cfg.eps = 1e-6;
  run_against_reference<double>(cfg, 1e-13);
  run_against_reference<float>(cfg, 2e-6);
}

TEST(AdamW, StrongDecayMaskMatchesReference) {
  AdamWConfig cfg;
  cfg.weight_decay = 5.0;  // lr * wd = 0.05..0.2: a wrong mask is unmistakable
  run_against_reference<double>(cfg, 1e-13);
}

// With zero gradients and fresh state the Adam term is exactly 0, so decayed params are
// multiplied by (1 - lr*wd) and RMSNorm weights must come back bitwise unchanged.
template <class T>
void check_decay_only() {
  const auto specs = small_llama_like_specs();
  const int64_t n = total_numel(specs);
  std::vector<T> params = random_vector<T>(n, 7);
  const std::vector<T> before = params;
  const std::vector<T> zeros(static_cast<size_t>(n), T(0));
  AdamW<T> opt(AdamWConfig{}, specs);
  const double lr = 0.25;
  opt.step(params.data(), zeros.data(), lr);
  const T factor = static_cast<T>(1.0 - lr * 0.1);
  const auto flags = decay_flags(specs);
  for (int64_t i = 0; i < n; ++i) {
    const T want = flags[static_cast<size_t>(i)] ? before[static_cast<size_t>(i)] * factor
                                                 : before[static_cast<size_t>(i)];
    ASSERT_EQ(params[static_cast<size_t>(i)], want) << "element " << i;
  }
}
TEST(AdamW, DecayMaskExactFloat) { check_decay_only<float>(); }
TEST(AdamW, DecayMaskExactDouble) { check_decay_only<double>(); }

TEST(AdamW, FirstStepIsSignLikeUpdate) {
  // Step 1 without decay: m_hat = g, v_hat = g^2, so p moves by lr * g / (|g| + eps).
  AdamWConfig cfg;
  cfg.weight_decay = 0.0;
  const auto specs = test::make_specs({{"w", 4, true}});
  std::vector<double> p = {1.0, -2.0, 0.5, 3.0};
  const std::vector<double> g = {0.3, -1e-3, 4.0, 0.0};
  AdamW<double> opt(cfg, specs);
  opt.step(p.data(), g.data(), 0.1);
  const double want[] = {1.0 - 0.1 * 0.3 / (0.3 + 1e-8), -2.0 + 0.1 * 1e-3 / (1e-3 + 1e-8),
                         0.5 - 0.1 * 4.0 / (4.0 + 1e-8), 3.0};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(p[i], want[i], 4e-15) << i;
}

TEST(AdamW, SaveAndRestoreStateContinuesBitwise) {
  const auto specs = small_llama_like_specs();
  const int64_t n = total_numel(specs);
  const double lrs[] = {1e-2, 2e-2, 3e-2, 1e-2, 5e-3};

  std::vector<float> straight = random_vector<float>(n, 3);
  std::vector<float> resumed = straight;
  AdamW<float> a(AdamWConfig{}, specs);
  for (int s = 0; s < 5; ++s) a.step(straight.data(), random_grads<float>(n, 50 + s).data(), lrs[s]);

  AdamW<float> first(AdamWConfig{}, specs);
  for (int s = 0; s < 2; ++s) first.step(resumed.data(), random_grads<float>(n, 50 + s).data(), lrs[s]);
  // A copy of the saved state, as a checkpoint file would hold it.
  const std::vector<float> m = test::as_vector(first.exp_avg()), v = test::as_vector(first.exp_avg_sq());
  AdamW<float> second(AdamWConfig{}, specs);
  second.load_state(first.step_count(), m, v);
  for (int s = 2; s < 5; ++s) second.step(resumed.data(), random_grads<float>(n, 50 + s).data(), lrs[s]);

  EXPECT_EQ(second.step_count(), 5);
  EXPECT_EQ(straight, resumed);
  EXPECT_EQ(test::as_vector(a.exp_avg()), test::as_vector(second.exp_avg()));
  EXPECT_EQ(test::as_vector(a.exp_avg_sq()), test::as_vector(second.exp_avg_sq()));
}

TEST(AdamW, StateBytes) {
  const auto specs = small_llama_like_specs();
  EXPECT_EQ(AdamW<float>(AdamWConfig{}, specs).state_bytes(), 2 * total_numel(specs) * 4);
  EXPECT_EQ(AdamW<double>(AdamWConfig{}, specs, 10, 30).state_bytes(), 2 * 20 * 8);
  EXPECT_EQ(AdamW<double>(AdamWConfig{}, specs, 30, 30).state_bytes(), 0);
}

TEST(AdamW, RejectsBadInput) {
  const auto specs = small_llama_like_specs();
  const int64_t n = total_numel(specs);
  AdamWConfig bad_beta;
  bad_beta.beta1 = 1.0;
  EXPECT_THROW(AdamW<float>(bad_beta, specs), InputError);
  AdamWConfig bad_beta2;
  bad_beta2.beta2 = std::nan("");
  EXPECT_THROW(AdamW<float>(bad_beta2, specs), InputError);
  AdamWConfig bad_eps;
  bad_eps.eps = -1e-8;
  EXPECT_THROW(AdamW<float>(bad_eps, specs), InputError);
  AdamWConfig bad_wd;
  bad_wd.weight_decay = -0.1;
  EXPECT_THROW(AdamW<float>(bad_wd, specs), InputError);

  EXPECT_THROW(AdamW<float>(AdamWConfig{}, specs, -1, 5), InputError);
  EXPECT_THROW(AdamW<float>(AdamWConfig{}, specs, 6, 5), InputError);
  EXPECT_THROW(AdamW<float>(AdamWConfig{}, specs, 0, n + 1), InputError);
  auto gap = specs;
  gap[2].offset += 1;
  EXPECT_THROW(AdamW<float>(AdamWConfig{}, gap), InputError);

  AdamW<float> opt(AdamWConfig{}, specs);
  std::vector<float> p(static_cast<size_t>(n), 1.0f), g(static_cast<size_t>(n), 1.0f);
  EXPECT_THROW(opt.step(p.data(), g.data(), -1e-3), InputError);
  EXPECT_THROW(opt.step(p.data(), g.data(), std::nan("")), InputError);
  EXPECT_EQ(opt.step_count(), 0);  // a rejected step changes nothing

  const std::vector<float> short_state(static_cast<size_t>(n - 1), 0.0f), ok(static_cast<size_t>(n), 0.0f);
  EXPECT_THROW(opt.load_state(1, short_state, ok), InputError);
  EXPECT_THROW(opt.load_state(1, ok, short_state), InputError);
  EXPECT_THROW(opt.load_state(-1, ok, ok), InputError);
}

}  // namespace
}  // namespace llama4d
