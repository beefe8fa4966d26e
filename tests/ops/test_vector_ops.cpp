// The buffer and vector ops (fill, copy, add_scaled, adamw_update, sum_squares_chunks,
// sum_losses, the vocabulary-parallel embedding, round_to_bf16, to_bf16 / from_bf16, all_finite).
// Where an op does the work of a plain host loop (AdamW's update, the gradient-norm partials,
// the head's loss sum, the whole-table embedding), it is checked bit for bit against that loop
// written out here, independently of the backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/optim/adamw.h"
#include "core/tensor/dtype.h"
#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

template <class T>
class VectorOps : public ::testing::Test {};
using Precisions = ::testing::Types<float, double>;
TYPED_TEST_SUITE(VectorOps, Precisions);

constexpr int64_t kBig = 70001;  // two parallel chunks of 2^15 plus a ragged tail

TYPED_TEST(VectorOps, FillCopyAddScaled) {
  using T = TypeParam;
  const auto x = cast_to<T>(random_vector(kBig, 1)), y0 = cast_to<T>(random_vector(kBig, 2));
  const T a = T(0.3);  // not a power of two: the product rounds, so a fused a*x+y would show
  std::vector<T> ref_axpy = y0;
  for (int64_t i = 0; i < kBig; ++i) {
    const T prod = a * x[size_t(i)];  // this file is built with -ffp-contract=off (CMakeLists.txt)
    ref_axpy[size_t(i)] = ref_axpy[size_t(i)] + prod;
  }
  for (int threads : {1, 2, 3}) {
    with_threads(threads, [&] {
      std::vector<T> buf(kBig, T(7));
      ops::fill(buf.data(), T(-2.5), kBig);
      for (T v : buf) ASSERT_EQ(v, T(-2.5));

      ops::copy(buf.data(), x.data(), kBig);
      EXPECT_TRUE(bitwise_equal(buf, x)) << threads << " threads";

      std::vector<T> y = y0;
      ops::add_scaled(y.data(), x.data(), a, kBig);
      EXPECT_TRUE(bitwise_equal(y, ref_axpy)) << threads << " threads";
    });
  }
  // Size zero touches nothing, so null is fine.
  ops::fill<T>(nullptr, T(1), 0);
  ops::copy<T>(nullptr, nullptr, 0);
  ops::add_scaled<T>(nullptr, nullptr, T(1), 0);
}

TYPED_TEST(VectorOps, AllFiniteFindsNanAndInfAnywhere) {
  using T = TypeParam;
  using L = std::numeric_limits<T>;
  std::vector<T> x = cast_to<T>(random_vector(kBig, 3, -1e3, 1e3));
  // The extremes of the finite range are finite, including -0 and subnormals.
  x[0] = L::max(), x[1] = L::lowest(), x[2] = L::denorm_min(), x[3] = T(-0.0);
  EXPECT_TRUE(ops::all_finite(x.data(), kBig));
  EXPECT_TRUE(ops::all_finite<T>(nullptr, 0));
  // First element, a chunk boundary, the last element of the ragged tail.
  for (int64_t at : {int64_t(0), int64_t(1) << 15, kBig - 1})
    for (T bad : {L::quiet_NaN(), -L::quiet_NaN(), L::infinity(), -L::infinity()}) {
      std::vector<T> y = x;
      y[size_t(at)] = bad;
      for (int threads : {1, 2})
        with_threads(threads, [&] { EXPECT_FALSE(ops::all_finite(y.data(), kBig)) << at; });
      EXPECT_TRUE(ops::all_finite(y.data(), at));  // the bad value just outside the range
    }
}

// ---- round_to_bf16 -----------------------------------------------------------------------------

// Values whose bf16 rounding is worked out by hand (bf16 keeps 8 significant bits: next to 1.0
// its step is 2^-7; its subnormals are k * 2^-133; its largest value is (2 - 2^-7) * 2^127).
template <class T>
std::vector<std::pair<T, T>> bf16_cases() {
  using L = std::numeric_limits<T>;
  const T ulp = T(std::ldexp(1.0, -7));  // bf16's step at 1.0
  const T big = T(std::ldexp(2.0 - std::ldexp(1.0, -7), 127));
  std::vector<std::pair<T, T>> c = {
      {T(1), T(1)},
      {T(1) + ulp / 2, T(1)},                                       // a tie: to the even 1.0
      {T(1) + 3 * ulp / 2, T(1) + 2 * ulp},                         // a tie: to the even 1 + 2^-6
      {T(1) + ulp / 2 + T(std::ldexp(1.0, -20)), T(1) + ulp},       // just past the tie
      {-(T(1) + ulp / 2 + T(std::ldexp(1.0, -20))), -(T(1) + ulp)}, // the same, negative
      {T(0.1), T(0.10009765625)},                                   // 0x3DCD: 0.1 = 0x3DCCCCCD
      {big, big},
      {T(std::ldexp(2.0 - std::ldexp(1.0, -8), 127)), L::infinity()},  // the tie past the largest
      {T(std::ldexp(3.0, -135)), T(std::ldexp(1.0, -133))},         // subnormal: 0.75 step -> 1 step
      {T(std::ldexp(1.0, -134)), T(0)},                             // subnormal tie: to the even 0
      {L::infinity(), L::infinity()},
      {-L::infinity(), -L::infinity()},
      {T(-0.0), T(-0.0)},
  };
  if constexpr (sizeof(T) == 8) {
    // Just past a tie by less than a float can hold: rounding through a float would land on the
    // tie and go to the even 1.0.
    c.push_back({1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40), 1.0 + std::ldexp(1.0, -7)});
    c.push_back({1e300, L::infinity()});
    c.push_back({-1e-300, -0.0});
  } else {
    c.push_back({L::max(), L::infinity()});
  }
  return c;
}

TYPED_TEST(VectorOps, RoundToBf16GivesTheNearestBf16) {
  using T = TypeParam;
  const auto cases = bf16_cases<T>();
  std::vector<T> x;
  for (const auto& [in, out] : cases) x.push_back(in);
  x.push_back(std::numeric_limits<T>::quiet_NaN());
  ops::round_to_bf16(x.data(), int64_t(x.size()));
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(x[i], cases[i].second) << "case " << i << ": " << double(cases[i].first);
    EXPECT_EQ(std::signbit(x[i]), std::signbit(cases[i].second)) << "case " << i;
  }
  EXPECT_TRUE(std::isnan(x.back()));

  // Random values over many binades, any thread count: each result is a bf16 value (8
  // significant bits) and no bf16 value is closer to the input.
  std::vector<T> in = cast_to<T>(random_vector(kBig, 4, -1, 1));
  for (int64_t i = 0; i < kBig; ++i) in[size_t(i)] = std::ldexp(in[size_t(i)], int(i % 61) - 30);
  for (int threads : {1, 2, 3})
    with_threads(threads, [&] {
      std::vector<T> r = in;
      ops::round_to_bf16(r.data(), kBig);
      for (int64_t i = 0; i < kBig; ++i) {
        const double a = double(in[size_t(i)]), b = double(r[size_t(i)]);
        int e = 0;
        const double m = std::frexp(b, &e);  // b = m * 2^e, m in [0.5, 1)
        ASSERT_EQ(std::ldexp(m, 8), std::round(std::ldexp(m, 8))) << a << " -> " << b << " has more than 8 bits";
        const double step = std::ldexp(1.0, e - 8);  // bf16's spacing around b
        ASSERT_LE(std::abs(a - b), step / 2) << a << " -> " << b;
      }
    });
  ops::round_to_bf16<T>(nullptr, 0);
}

// ---- to_bf16 / from_bf16 -----------------------------------------------------------------------

// The bf16 bits of a float that is a bf16 value: its top half.
uint16_t top_half(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  EXPECT_EQ(u & 0xffffu, 0u) << f << " is not a bf16 value";
  return uint16_t(u >> 16);
}

TYPED_TEST(VectorOps, ToBf16StoresTheNearestBf16AndFromBf16WidensItExactly) {
  using T = TypeParam;
  // Bits written out: 1.0 = 0x3F80, 0.1 = 0x3DCCCCCD rounds up to 0x3DCD, -0.0 = 0x8000,
  // -(1 + 2^-7) = 0xBF81, inf = 0x7F80.
  const std::vector<T> x = {T(1), T(0.1), T(-0.0), -(T(1) + T(std::ldexp(1.0, -7))), std::numeric_limits<T>::infinity()};
  const std::vector<uint16_t> bits = {0x3F80, 0x3DCD, 0x8000, 0xBF81, 0x7F80};
  std::vector<bf16> b(x.size());
  ops::to_bf16(b.data(), x.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(b[i].bits, bits[i]) << "case " << i;

  // The hand-worked roundings of round_to_bf16, through the bf16 container and back.
  const auto cases = bf16_cases<T>();
  std::vector<T> in, want;
  for (const auto& [a, r] : cases) in.push_back(a), want.push_back(r);
  in.push_back(std::numeric_limits<T>::quiet_NaN());
  std::vector<bf16> wire(in.size());
  ops::to_bf16(wire.data(), in.data(), int64_t(in.size()));
  std::vector<T> back(in.size(), T(7));
  ops::from_bf16(back.data(), wire.data(), int64_t(in.size()), false);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(wire[i].bits, top_half(float(want[i]))) << "case " << i;
    EXPECT_EQ(back[i], want[i]) << "case " << i;
    EXPECT_EQ(std::signbit(back[i]), std::signbit(want[i])) << "case " << i;
  }
  EXPECT_TRUE(std::isnan(back.back()));

  // accumulate: y += x, in T. 0.25 + 1 and 3 + 0.10009765625 are exact in both types.
  std::vector<T> y = {T(0.25), T(3)};
  const std::vector<bf16> two = {bf16{0x3F80}, bf16{0x3DCD}};
  ops::from_bf16(y.data(), two.data(), 2, true);
  EXPECT_EQ(y[0], T(1.25));
  EXPECT_EQ(y[1], T(3.10009765625));

  // Random values over many binades, any thread count: the same bf16 as round_to_bf16 gives.
  std::vector<T> r = cast_to<T>(random_vector(kBig, 6, -1, 1));
  for (int64_t i = 0; i < kBig; ++i) r[size_t(i)] = std::ldexp(r[size_t(i)], int(i % 61) - 30);
  std::vector<T> rounded = r;
  ops::round_to_bf16(rounded.data(), kBig);
  for (int threads : {1, 2, 3})
    with_threads(threads, [&] {
      std::vector<bf16> w(static_cast<size_t>(kBig));
      ops::to_bf16(w.data(), r.data(), kBig);
      std::vector<T> got(static_cast<size_t>(kBig));
      ops::from_bf16(got.data(), w.data(), kBig, false);
      for (int64_t i = 0; i < kBig; ++i) ASSERT_EQ(got[size_t(i)], rounded[size_t(i)]) << i;
    });
  ops::to_bf16<T>(nullptr, nullptr, 0);
  ops::from_bf16<T>(nullptr, nullptr, 0, true);
}

// ---- adamw_update against the update written out --------------------------------------------

// torch.optim.AdamW's element update in PyTorch's operation order, with the per-step scalars
// computed in double and rounded once to T (what core/optim/adamw.h documents). Written here
// independently of the backend; this file is compiled with -ffp-contract=off like the backend,
// so "the same operations" means the same IEEE operations.
template <class T>
void reference_adamw(std::vector<T>& w, std::vector<T>& m, std::vector<T>& v, const std::vector<T>& g,
                     const ParamSpec& p, const AdamWConfig& cfg, double lr, int t) {
  const double bc1 = 1.0 - std::pow(cfg.beta1, double(t)), bc2 = 1.0 - std::pow(cfg.beta2, double(t));
  const T decay = p.weight_decay ? T(1.0 - lr * cfg.weight_decay) : T(1);
  const T b1 = T(cfg.beta1), omb1 = T(1.0 - cfg.beta1), b2 = T(cfg.beta2), omb2 = T(1.0 - cfg.beta2);
  const T step_size = T(lr / bc1), bc2_sqrt = T(std::sqrt(bc2)), eps = T(cfg.eps);
  for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
    const size_t k = size_t(i);
    const T gi = g[k];
    T wi = w[k] * decay;
    m[k] = b1 * m[k] + omb1 * gi;
    v[k] = b2 * v[k] + omb2 * gi * gi;
    const T denom = std::sqrt(v[k]) / bc2_sqrt + eps;
    w[k] = wi - step_size * (m[k] / denom);
  }
}

// Runs `steps` steps of the written-out update and of the op (per tensor, with the scalars from
// adamw_step_scalars) on the same data; w, m and v must agree bit for bit after every step.
template <class T>
void expect_adamw_bitwise(const AdamWConfig& cfg, const std::vector<ParamSpec>& specs, int steps,
                          int op_threads) {
  const int64_t n = specs.back().offset + specs.back().numel;
  const auto w0 = cast_to<T>(random_vector(size_t(n), 10, -0.5, 0.5));
  std::vector<T> w_ref = w0, m_ref(size_t(n), T(0)), v_ref(size_t(n), T(0));
  std::vector<T> w = w0, m(size_t(n), T(0)), v(size_t(n), T(0));
  for (int t = 1; t <= steps; ++t) {
    auto g = cast_to<T>(random_vector(size_t(n), 100 + uint64_t(t), -2.0, 2.0));
    for (size_t i = 0; i < g.size(); i += 97) g[i] = T(0);  // zero gradients: denom is just eps
    const double lr = 3e-3 * t / steps;                     // a warm-up, so lr changes each step
    for (const ParamSpec& p : specs) reference_adamw(w_ref, m_ref, v_ref, g, p, cfg, lr, t);
    with_threads(op_threads, [&] {
      for (const ParamSpec& p : specs) {
        const auto s = ops::adamw_step_scalars<T>(lr, cfg.beta1, cfg.beta2, cfg.eps,
                                                  cfg.weight_decay, t, p.weight_decay);
        ops::adamw_update(w.data() + p.offset, m.data() + p.offset, v.data() + p.offset,
                          g.data() + p.offset, p.numel, s);
      }
    });
    ASSERT_TRUE(bitwise_equal(w, w_ref)) << "params differ after step " << t;
    ASSERT_TRUE(bitwise_equal(m, m_ref)) << "exp_avg differs after step " << t;
    ASSERT_TRUE(bitwise_equal(v, v_ref)) << "exp_avg_sq differs after step " << t;
  }
  EXPECT_FALSE(bitwise_equal(w, w0));  // the test did update something
}

std::vector<ParamSpec> specs_of(std::vector<std::pair<int64_t, bool>> sizes_and_decay) {
  std::vector<ParamSpec> specs;
  int64_t offset = 0;
  for (auto [numel, decay] : sizes_and_decay) {
    ParamSpec p;
    p.name = std::to_string(specs.size());  // (not "p" + ...: GCC 12 warns falsely there)
    p.shape = {numel};
    p.offset = offset, p.numel = numel, p.weight_decay = decay;
    specs.push_back(p);
    offset += numel;
  }
  return specs;
}

TYPED_TEST(VectorOps, AdamWUpdateIsTheWrittenOutUpdate) {
  using T = TypeParam;
  AdamWConfig cfg;         // the Llama betas (0.9, 0.95) and PyTorch's eps
  cfg.weight_decay = 0.5;  // larger than Llama's 0.1, so 1 - lr*wd moves the weights visibly
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(std::to_string(threads) + " op threads");
    expect_adamw_bitwise<T>(cfg, specs_of({{kBig, true}}), 6, threads);   // decayed
    expect_adamw_bitwise<T>(cfg, specs_of({{kBig, false}}), 6, threads);  // not decayed
    // A model's layout: decayed matrices around an undecayed norm weight, one op per tensor.
    expect_adamw_bitwise<T>(cfg, specs_of({{40000, true}, {129, false}, {30001, true}}), 4,
                            threads);
  }
  AdamWConfig other;
  other.beta1 = 0.8, other.beta2 = 0.999, other.eps = 1e-6, other.weight_decay = 0.0;
  expect_adamw_bitwise<T>(other, specs_of({{1000, true}, {17, false}}), 5, 1);
}

TEST(AdamWStepScalars, RejectsStepZero) {
  EXPECT_THROW(ops::adamw_step_scalars<float>(1e-3, 0.9, 0.95, 1e-8, 0.1, 0, true), InputError);
  const auto s = ops::adamw_step_scalars<double>(1e-3, 0.9, 0.95, 1e-8, 0.1, 1, false);
  EXPECT_EQ(s.decay, 1.0);  // no decay multiplies by exactly one
  EXPECT_EQ(s.one_minus_beta1, 1.0 - 0.9);
}

// ---- sum_squares_chunks against its documented order ----------------------------------------

// The order ops.h documents, written out independently of the backend: each chunk summed in
// double by 8 interleaved lanes (element i to lane i % 8), lanes added lane 0 first.
template <class T>
std::vector<double> documented_chunk_partials(const std::vector<T>& x, int64_t n, int64_t chunk) {
  std::vector<double> out;
  for (int64_t lo = 0; lo < n; lo += chunk) {
    double lane[8] = {};
    for (int64_t i = lo; i < std::min(lo + chunk, n); ++i) {
      const double v = double(x[size_t(i)]);
      lane[(i - lo) % 8] += v * v;
    }
    double sum = 0;
    for (double l : lane) sum += l;
    out.push_back(sum);
  }
  return out;
}

TYPED_TEST(VectorOps, SumSquaresChunksFollowTheDocumentedOrder) {
  using T = TypeParam;
  const auto x = cast_to<T>(random_vector(100003, 4, -3.0, 3.0));
  for (int64_t chunk : {int64_t(512), int64_t(4096)})
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(7), int64_t(511), int64_t(512), int64_t(513),
                      int64_t(4096), int64_t(40000), int64_t(100003)}) {
      SCOPED_TRACE("N = " + std::to_string(n) + ", chunk " + std::to_string(chunk));
      const std::vector<double> ref = documented_chunk_partials(x, n, chunk);
      for (int threads : {1, 2, 3}) {
        std::vector<double> got(ref.size(), -1.0);
        with_threads(threads, [&] { ops::sum_squares_chunks(got.data(), x.data(), n, chunk); });
        EXPECT_TRUE(bitwise_equal(got, ref)) << threads << " threads";
      }
    }
  double p = 0;
  EXPECT_THROW(ops::sum_squares_chunks(&p, x.data(), 10, 0), InputError);
}

// ---- sum_losses against head_forward's loop ---------------------------------------------------

TYPED_TEST(VectorOps, SumLossesIsTheHeadLossSum) {
  using T = TypeParam;
  const int64_t BT = 4099;
  const auto losses = cast_to<T>(random_vector(BT, 5, 0.0, 12.0));
  std::vector<int32_t> targets(BT);
  for (int64_t i = 0; i < BT; ++i) targets[size_t(i)] = i % 5 == 3 ? -1 : int32_t(i % 1000);
  // head_forward's loop (core/model/head.cpp), verbatim.
  double ref = 0;
  int64_t ref_count = 0;
  for (int64_t i = 0; i < BT; ++i)
    if (targets[size_t(i)] >= 0) {
      ref += double(losses[size_t(i)]);
      ++ref_count;
    }
  double sum = -1;
  int64_t count = -1;
  ops::sum_losses(&sum, &count, losses.data(), targets.data(), BT);
  EXPECT_EQ(std::memcmp(&sum, &ref, sizeof(double)), 0);
  EXPECT_EQ(count, ref_count);
  EXPECT_EQ(count, BT - (BT + 1) / 5);

  ops::sum_losses<T>(&sum, &count, nullptr, nullptr, 0);
  EXPECT_EQ(sum, 0.0);
  EXPECT_EQ(count, 0);
}

// ---- Vocabulary-parallel embedding ------------------------------------------------------------

std::vector<int32_t> tokens_in(int64_t n, int32_t V, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = dist(gen);
  return t;
}

TYPED_TEST(VectorOps, EmbeddingRowsOfTheWholeTableAreTheEmbedding) {
  using T = TypeParam;
  const int64_t BT = 1500, C = 150;  // several 64-column slices; large enough to run in parallel
  const int32_t V = 53;
  const auto wte = cast_to<T>(random_vector(size_t(V * C), 6));
  const auto dout = cast_to<T>(random_vector(size_t(BT * C), 7));
  const auto dwte0 = cast_to<T>(random_vector(size_t(V * C), 8));  // backward accumulates
  const auto tokens = tokens_in(BT, V, 9);

  std::vector<T> out_ref(size_t(BT * C)), out(size_t(BT * C), T(5));
  ops::embedding_forward(out_ref.data(), tokens.data(), wte.data(), BT, C);
  std::vector<T> dwte_ref = dwte0, dwte = dwte0;
  ops::embedding_backward(dwte_ref.data(), dout.data(), tokens.data(), BT, C);
  for (int threads : {1, 2}) {
    with_threads(threads, [&] {
      ops::embedding_forward_rows(out.data(), tokens.data(), wte.data(), BT, C, 0, V);
      dwte = dwte0;
      ops::embedding_backward_rows(dwte.data(), dout.data(), tokens.data(), BT, C, 0, V);
    });
    EXPECT_TRUE(bitwise_equal(out, out_ref)) << threads << " threads";
    EXPECT_TRUE(bitwise_equal(dwte, dwte_ref)) << threads << " threads";
  }
}

TYPED_TEST(VectorOps, EmbeddingRowShardsAddUpToTheWholeTable) {
  using T = TypeParam;
  const int64_t BT = 700, C = 70;
  const int32_t V = 41;
  const auto wte = cast_to<T>(random_vector(size_t(V * C), 10));
  const auto dout = cast_to<T>(random_vector(size_t(BT * C), 11));
  const auto tokens = tokens_in(BT, V, 12);
  std::vector<T> out_ref(size_t(BT * C)), dwte_ref(size_t(V * C), T(0));
  ops::embedding_forward(out_ref.data(), tokens.data(), wte.data(), BT, C);
  ops::embedding_backward(dwte_ref.data(), dout.data(), tokens.data(), BT, C);

  // Uneven splits of [0, V), as a vocabulary not divisible by the ranks gives.
  for (const std::vector<int64_t>& bounds : {std::vector<int64_t>{0, 20, V},
                                             std::vector<int64_t>{0, 14, 28, V}}) {
    SCOPED_TRACE(std::to_string(bounds.size() - 1) + " shards");
    std::vector<T> out_sum(size_t(BT * C), T(0)), dwte_cat(size_t(V * C), T(0));
    for (size_t r = 0; r + 1 < bounds.size(); ++r) {
      const int64_t begin = bounds[r], rows = bounds[r + 1] - bounds[r];
      std::vector<T> out(size_t(BT * C), T(9));  // overwritten, zeros included
      ops::embedding_forward_rows(out.data(), tokens.data(), wte.data() + begin * C, BT, C, begin,
                                  rows);
      ops::accumulate(out_sum.data(), out.data(), BT * C);  // the all-reduce, in rank order
      std::vector<T> dshard(size_t(rows * C), T(0));
      ops::embedding_backward_rows(dshard.data(), dout.data(), tokens.data(), BT, C, begin, rows);
      std::copy(dshard.begin(), dshard.end(), dwte_cat.begin() + begin * C);
    }
    EXPECT_TRUE(bitwise_equal(out_sum, out_ref));
    EXPECT_TRUE(bitwise_equal(dwte_cat, dwte_ref));
  }
}

}  // namespace
}  // namespace llama4d::test
