// The model as units: a forward/backward split into unit ranges (boundary tensors passed by
// hand, as a pipeline passes them) is bitwise the whole-model call; several micro-batches can be
// in flight at once; per-unit storage and sharded initialisation hold exactly the values of
// the whole buffer; activation checkpointing keeps the gradients bitwise and its activation
// high-water mark is what each policy's formula says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "core/model/initialization.h"
#include "model_test_util.h"

namespace llama4d {
namespace {



template <class T>
void expect_range_split_bitwise(bool tied) {
  LlamaConfig cfg = test::tiny_config(tied, false);
  cfg.num_hidden_layers = 3;
  const test::Batch b = test::make_batch(2, 7, cfg.vocab_size, 5, true);
  const T scale = T(1) / T(11);

  Llama<T> whole(cfg);
  whole.init_weights(3);
  test::perturb_params(whole, 8);
  whole.zero_grad();
  const LossSum lw = whole.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  whole.backward(scale);

  // Every cut point: units [0, cut) then [cut, L+2), the hidden state and its gradient handed
  // over by hand.
  for (int cut = 1; cut < whole.num_units(); ++cut) {
    Llama<T> m(cfg);
    m.init_weights(3);
    test::perturb_params(m, 8);
    m.zero_grad();
    MicroBatchState<T> first, second;
    m.forward(first, {0, cut}, b.tokens.data(), nullptr, nullptr, b.B, b.seq);
    const T* boundary = first.x[size_t(cut - 1)].data();  // output of unit cut-1 = x_{cut-1}
    const LossSum ls = m.forward(second, {cut, m.num_units()}, nullptr, b.targets.data(), boundary, b.B, b.seq);
    m.backward(second, scale);
    ASSERT_FALSE(second.input_grad.empty());
    m.backward(first, scale, second.input_grad.data());
    EXPECT_EQ(ls.tokens, lw.tokens);
    EXPECT_EQ(std::memcmp(&ls.loss_sum, &lw.loss_sum, sizeof(double)), 0) << "cut " << cut;
    EXPECT_TRUE(test::same_bits(test::flat_grads(m), test::flat_grads(whole))) << "cut " << cut << " tied " << tied;
    EXPECT_EQ(first.activation_bytes(), 0);  // backward freed everything
    EXPECT_EQ(second.activation_bytes(), second.input_grad.bytes());
  }
}

TEST(Units, RangeSplitEqualsWholeModelFp32) {
  expect_range_split_bitwise<float>(false);
  expect_range_split_bitwise<float>(true);
}
TEST(Units, RangeSplitEqualsWholeModelFp64) {
  expect_range_split_bitwise<double>(false);
  expect_range_split_bitwise<double>(true);
}

// A tied embedding whose two users live on different ranks, as the first and last pipeline
// stages: each rank holds only its units, the last one a copy of the embedding for the LM head.
// The copies' gradients, summed, are the tied gradient (up to the order of that one addition);
// every other tensor is bitwise the whole model's.
TEST(Units, TiedEmbeddingAcrossTwoRanks) {
  LlamaConfig cfg = test::tiny_config(true, false);
  cfg.num_hidden_layers = 2;
  const test::Batch b = test::make_batch(2, 7, cfg.vocab_size, 55, true);
  using R = Llama<double>::Residency;
  Llama<double> whole(cfg), first(cfg), last(cfg);
  whole.init_weights(3);
  test::perturb_params(whole, 6);
  whole.zero_grad();
  whole.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  whole.backward(0.1);

  const int L = whole.num_layers(), cut = 2;  // first: embedding + layer 0; last: layer 1 + head
  first.set_residency(R::per_unit, R::per_unit);
  last.set_residency(R::per_unit, R::per_unit);
  auto hold = [&](Llama<double>& m, int u) {
    m.allocate_unit_params(u, "test");
    const ParamRange r = whole.unit_range(u);
    std::memcpy(m.unit_params(u), whole.params() + r.begin, size_t(r.end - r.begin) * sizeof(double));
  };
  for (int u = 0; u < cut; ++u) hold(first, u);
  for (int u = cut; u < whole.num_units(); ++u) hold(last, u);
  hold(last, 0);  // the tied copy
  for (int u = cut; u < whole.num_units(); ++u) EXPECT_EQ(first.unit_params(u), nullptr);
  EXPECT_EQ(last.unit_params(1), nullptr);

  MicroBatchState<double> a, c;
  first.forward(a, {0, cut}, b.tokens.data(), nullptr, nullptr, b.B, b.seq);
  last.forward(c, {cut, L + 2}, nullptr, b.targets.data(), a.x[size_t(cut - 1)].data(), b.B, b.seq);
  last.backward(c, 0.1);
  first.backward(a, 0.1, c.input_grad.data());

  for (int u = 1; u < whole.num_units(); ++u) {
    const ParamRange r = whole.unit_range(u);
    const double* g = u < cut ? first.unit_grads(u) : last.unit_grads(u);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(std::memcmp(g, whole.grads() + r.begin, size_t(r.end - r.begin) * sizeof(double)), 0) << "unit " << u;
  }
  const ParamRange e = whole.unit_range(0);
  std::vector<double> summed(first.unit_grads(0), first.unit_grads(0) + (e.end - e.begin));
  for (size_t i = 0; i < summed.size(); ++i) summed[i] += last.unit_grads(0)[i];
  EXPECT_LE(test::rel_error(summed.data(), whole.grads() + e.begin, e.end - e.begin), 1e-14);
  EXPECT_GT(test::rel_error(first.unit_grads(0), whole.grads() + e.begin, e.end - e.begin), 1e-3)
      << "the head's share must matter, or the test shows nothing";
}

// Two micro-batches in flight (forward A, forward C, backward A, backward C) accumulate the
// same gradient as running them one after the other: each state holds its own activations.
// (Backward in the other order would add the same terms in another order: equal up to
// rounding only, because GEMMs accumulate into the gradient block by block.)
TEST(Units, MicroBatchesInFlight) {
  const LlamaConfig cfg = test::tiny_config(true, false);
  const test::Batch a = test::make_batch(2, 6, cfg.vocab_size, 21, false);
  const test::Batch c = test::make_batch(2, 6, cfg.vocab_size, 22, true);
  Llama<float> seq(cfg), fly(cfg);
  for (Llama<float>* m : {&seq, &fly}) {
    m->init_weights(4);
    test::perturb_params(*m, 9);
    m->zero_grad();
  }
  seq.forward(a.tokens.data(), a.targets.data(), a.B, a.seq);
  seq.backward(0.05f);
  seq.forward(c.tokens.data(), c.targets.data(), c.B, c.seq);
  seq.backward(0.05f);

  MicroBatchState<float> sa, sc;
  fly.forward(sa, fly.all_units(), a.tokens.data(), a.targets.data(), nullptr, a.B, a.seq);
  fly.forward(sc, fly.all_units(), c.tokens.data(), c.targets.data(), nullptr, c.B, c.seq);
  EXPECT_GT(fly.memory().live(MemoryCategory::activations), sa.activation_bytes());  // both held
  fly.backward(sa, 0.05f);
  fly.backward(sc, 0.05f);
  EXPECT_TRUE(test::same_bits(test::flat_grads(fly), test::flat_grads(seq)));
  EXPECT_EQ(fly.memory().live(MemoryCategory::activations), 0);
}

// Per-unit residency holds the same numbers as the whole buffer, and init_param_values over any
// slice equals the whole initialisation element for element (what ZeRO-3 shards compute).
TEST(Units, PerUnitStorageAndShardedInitMatchWhole) {
  LlamaConfig cfg = test::tiny_config(false, false);
  cfg.num_hidden_layers = 3;
  Llama<double> whole(cfg), units(cfg);
  units.set_residency(Llama<double>::Residency::per_unit, Llama<double>::Residency::per_unit);
  whole.init_weights(77);
  units.init_weights(77);
  for (int u = 0; u < whole.num_units(); ++u) {
    const ParamRange r = whole.unit_range(u);
    EXPECT_EQ(std::memcmp(whole.params() + r.begin, units.unit_params(u), size_t(r.end - r.begin) * sizeof(double)), 0)
        << "unit " << u;
  }
  const int64_t n = whole.num_params();
  for (int64_t begin : {int64_t(0), int64_t(1), n / 3, n - 5})
    for (int64_t end : {begin, begin + 1, std::min(n, begin + 517), n}) {
      std::vector<double> slice(size_t(end - begin) + 1, -1.0);  // one past: must stay untouched
      init_param_values<double>(whole.param_specs(), 77, begin, end, slice.data());
      EXPECT_EQ(std::memcmp(slice.data(), whole.params() + begin, size_t(end - begin) * sizeof(double)), 0)
          << "[" << begin << ", " << end << ")";
      EXPECT_EQ(slice.back(), -1.0);
    }
  // What a rank does not hold is not there: no flat buffer, freed units are null.
  EXPECT_THROW(units.params(), Error);
  units.free_unit_params(2);
  EXPECT_EQ(units.unit_params(2), nullptr);
  EXPECT_EQ(units.memory().live(MemoryCategory::params),
            int64_t(sizeof(double)) * (n - (whole.unit_range(2).end - whole.unit_range(2).begin)));
}

// init_param_values splits its range over the calling thread's compute threads: the values must not
// depend on how many (a vocabulary of 40,000 makes 1.3M draws, enough for 16 pieces).
TEST(Units, InitDrawsTheSameValuesOnAnyThreadCount) {
  LlamaConfig cfg = test::tiny_config(false, false);
  cfg.vocab_size = 40000;
  const std::vector<ParamSpec> specs = llama_param_specs(cfg);
  const int64_t n = flat_numel(specs);
  ASSERT_GE(n, 16 * (int64_t(1) << 16));
  const int saved = ops::backend_threads();
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, n}, {12345, n - 7}}) {
    ops::set_backend_threads(1);
    std::vector<float> one(size_t(end - begin));
    init_param_values<float>(specs, 3, begin, end, one.data());
    for (int threads : {2, 3, 16}) {
      ops::set_backend_threads(threads);
      if (ops::backend_threads() != threads) GTEST_SKIP() << "this build has no compute threads (no OpenMP)";
      std::vector<float> many(size_t(end - begin) + 1, -1.0f);  // one past: must stay untouched
      init_param_values<float>(specs, 3, begin, end, many.data());
      EXPECT_EQ(std::memcmp(many.data(), one.data(), one.size() * sizeof(float)), 0)
          << threads << " threads, [" << begin << ", " << end << ")";
      EXPECT_EQ(many.back(), -1.0f);
    }
  }
  ops::set_backend_threads(saved);
}

// ---- Activation checkpointing -------------------------------------------------------------------

const char* const kPolicies[] = {"none", "selective", "full", "every:2", "every:3", "every:sqrt"};

template <class T>
void expect_checkpointing_bitwise() {
  LlamaConfig cfg = test::tiny_config(true, true);
  cfg.num_hidden_layers = 5;  // every:2 and every:3 end in a short segment
  const test::Batch b = test::make_batch(2, 9, cfg.vocab_size, 31, true);
  std::vector<T> reference;
  LossSum ref_loss;
  for (const char* spec : kPolicies) {
    Llama<T> m(cfg);
    m.set_checkpointing(Checkpointing::parse(spec, int(cfg.num_hidden_layers)));
    m.init_weights(12);
    test::perturb_params(m, 13);
    m.zero_grad();
    // Two micro-batches, so recomputation also runs with gradients already accumulated.
    LossSum loss = m.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
    m.backward(T(0.1));
    loss = m.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
    m.backward(T(0.1));
    if (std::string(spec) == "none") {
      reference = test::flat_grads(m), ref_loss = loss;
      continue;
    }
    EXPECT_EQ(std::memcmp(&loss.loss_sum, &ref_loss.loss_sum, sizeof(double)), 0) << spec;
    EXPECT_TRUE(test::same_bits(test::flat_grads(m), reference)) << spec;
  }
}
TEST(ActivationCheckpointing, GradientsBitwiseFp32) { expect_checkpointing_bitwise<float>(); }
TEST(ActivationCheckpointing, GradientsBitwiseFp64) { expect_checkpointing_bitwise<double>(); }

TEST(ActivationCheckpointing, ParsesPolicies) {
  EXPECT_EQ(Checkpointing::parse("full", 8).describe(), "full");
  EXPECT_EQ(Checkpointing::parse("every:1", 8).describe(), "full");
  EXPECT_EQ(Checkpointing::parse("every:sqrt", 8).describe(), "every:3");   // ceil(sqrt(8))
  EXPECT_EQ(Checkpointing::parse("every:sqrt", 16).describe(), "every:4");
  EXPECT_EQ(Checkpointing::parse("selective", 8).describe(), "selective");
  for (const char* bad : {"ful", "every:", "every:0", "every:-1", "every:2x", "sqrt"})
    EXPECT_THROW(Checkpointing::parse(bad, 8), InputError) << bad;
}

// The activation high-water mark of one whole-model forward + backward, in bytes, written out
// per policy from the shapes (the formulas of lessons/03-activation-checkpointing). s = bytes
// per element; the int32 tokens and targets are 4 bytes each.
struct Shapes {
  int64_t s, BT, C, qd, kvd, nh, I, V, L;
  int64_t x() const { return BT * C * s; }                                         // one residual x_l
  int64_t kept() const { return BT * (qd + 2 * kvd + C + 2 * I) * s; }              // q k v h gate up
  int64_t recomputable() const { return BT * (2 * C + 2 + qd + nh + I) * s; }      // n1 rstd1 n2 rstd2 att lse act
  int64_t block() const { return kept() + recomputable(); }
  int64_t head() const { return BT * (C + 1 + V + 1) * s; }                         // n rstd logits losses
  int64_t ids() const { return BT * 4; }
};

int64_t expected_peak(const Shapes& d, const Checkpointing& ac) {
  const int64_t L = d.L;
  switch (ac.kind) {
    case Checkpointing::Kind::none:
      // Everything is held at the end of the forward; backward only frees.
      return 2 * d.ids() + (L + 1) * d.x() + L * d.block() + d.head();
    case Checkpointing::Kind::selective: {
      const int64_t end_of_forward = 2 * d.ids() + (L + 1) * d.x() + L * d.kept() + d.head();
      // Forward of the last block, before it drops its recomputable tensors (the targets come
      // with the head). In backward the same block holds one x less (x_L went with the head).
      const int64_t last_block = d.ids() + (L + 1) * d.x() + L * d.kept() + d.recomputable();
      return std::max(end_of_forward, last_block);
    }
    case Checkpointing::Kind::every: {
      const int64_t k = ac.every;
      auto kept_upto = [&](int64_t l) { return l < 0 ? 0 : l / k + 1; };  // kept inputs among x_0..x_l
      int64_t peak = 0;
      // Forward of block l: the tokens, the kept inputs below it, x_l itself (kept or not),
      // x_{l+1} and the block's activations.
      for (int64_t l = 0; l < L; ++l)
        peak = std::max(peak, d.ids() + (kept_upto(l - 1) + 2) * d.x() + d.block());
      // The head: kept inputs of x_0..x_{L-1}, its input x_L and its own activations.
      peak = std::max(peak, 2 * d.ids() + (kept_upto(L - 1) + 1) * d.x() + d.head());
      // Backward, segment [a, e): the tokens, kept inputs up to x_a, the recomputed inputs
      // x_{a+1}..x_{e-1} and every block of the segment.
      for (int64_t a = ((L - 1) / k) * k; a >= 0; a -= k) {
        const int64_t e = std::min(L, a + k);
        peak = std::max(peak, d.ids() + (kept_upto(a) + (e - a - 1)) * d.x() + (e - a) * d.block());
      }
      return peak;
    }
  }
  return -1;
}

template <class T>
void expect_activation_peaks() {
  LlamaConfig cfg = test::tiny_config(false, false);
  cfg.num_hidden_layers = 7;
  const test::Batch b = test::make_batch(3, 8, cfg.vocab_size, 41, true);
  const Shapes d{int64_t(sizeof(T)), b.B * b.seq, cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(),
                 cfg.num_attention_heads, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers};
  int64_t none_peak = 0;
  for (const char* spec : kPolicies) {
    Llama<T> m(cfg);
    const Checkpointing ac = Checkpointing::parse(spec, int(cfg.num_hidden_layers));
    m.set_checkpointing(ac);
    m.init_weights(5);
    m.zero_grad();
    m.memory().reset_peaks();
    m.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
    m.backward(T(0.01));
    const int64_t peak = m.memory().peak(MemoryCategory::activations);
    EXPECT_EQ(peak, expected_peak(d, ac)) << spec;
    EXPECT_EQ(m.memory().live(MemoryCategory::activations), 0) << spec;
    if (ac.kind == Checkpointing::Kind::none) none_peak = peak;
    else EXPECT_LT(peak, none_peak) << spec << " must hold less than no checkpointing";
  }
}
TEST(ActivationCheckpointing, HighWaterMarkMatchesFormulaFp32) { expect_activation_peaks<float>(); }
TEST(ActivationCheckpointing, HighWaterMarkMatchesFormulaFp64) { expect_activation_peaks<double>(); }

}  // namespace
}  // namespace llama4d
