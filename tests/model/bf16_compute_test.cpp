// bf16 mixed precision (Llama::set_bf16_compute): what the forward keeps for the backward holds
// bf16 values (8 significant bits) except the statistics kept in f32 (1/rms, log-sum-exp); the
// master weights stay f32 and a forward and backward do not touch them; the ops read them
// rounded to bf16; the loss and gradients
// agree with fp64 to bf16's rounding, and are not f32's (the rounding happened); a double model
// refuses it. That input and weight passes, and every checkpointing policy, give the same bits in
// bf16 is checked by split_backward_test.cpp. What waits for the backward waits as bf16 (half the
// bytes, counted by the allocator) and comes back with the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../ops/operand_log.h"
#include "core/error.h"
#include "core/model/checkpointing.h"
#include "core/ops.h"
#include "core/tensor/memory_tracker.h"
#include "model_test_util.h"

namespace llama4d {
namespace {

using test::all_bf16;
bool all_bf16(const Buffer<float>& b) { return all_bf16(b.data(), b.size()); }

TEST(Bf16Compute, KeptTensorsAreBf16ValuesAndTheMasterWeightsAreNot) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const LlamaConfig cfg = test::tiny_config(tied, tied);
    Llama<float> m(cfg);
    m.set_bf16_compute(true);
    m.set_bf16_parking(false);  // the kept tensors stay where this test reads them
    m.init_weights(5);
    test::perturb_params(m, 9);
    const std::vector<float> master(m.params(), m.params() + m.num_params());
    EXPECT_FALSE(all_bf16(master.data(), int64_t(master.size())));  // nothing rounded them

    const test::Batch b = test::make_batch(2, 7, cfg.vocab_size, 6, true);
    MicroBatchState<float> st;
    m.zero_grad();
    const LossSum loss = m.forward(st, m.all_units(), b.tokens.data(), b.targets.data(), nullptr, b.B, b.seq);
    for (int l = 0; l <= m.num_layers(); ++l) EXPECT_TRUE(all_bf16(st.x[size_t(l)])) << "x_" << l;
    for (int l = 0; l < m.num_layers(); ++l) {
      const BlockActivations<float>& a = st.blocks[size_t(l)];
      for (const auto& [buffer, name] : {std::pair{&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"}, {&a.h, "h"}, {&a.gate, "gate"},
                                        {&a.up, "up"}, {&a.n1, "n1"}, {&a.att, "att"}, {&a.n2, "n2"}, {&a.act, "act"}})
        EXPECT_TRUE(all_bf16(*buffer)) << "layer " << l << " " << name;
      // Statistics stay in f32: rounding them would put bf16's error into every probability.
      EXPECT_FALSE(all_bf16(a.rstd1)) << "layer " << l;
      EXPECT_FALSE(all_bf16(a.lse)) << "layer " << l;
    }
    EXPECT_TRUE(all_bf16(st.head.n));
    EXPECT_TRUE(all_bf16(st.head.logits));
    EXPECT_FALSE(all_bf16(st.head.losses));

    m.backward(st, 1.0f / float(loss.tokens));
    EXPECT_EQ(std::memcmp(master.data(), m.params(), master.size() * sizeof(float)), 0) << "the master weights changed";
    // Weight gradients accumulate in f32: sums of bf16 products, not bf16 values themselves.
    EXPECT_FALSE(all_bf16(m.grads(), m.num_params()));
  }
}

// The ops read the weights rounded to bf16: master weights that differ only below bf16's
// precision give the same loss and gradients, bit for bit (in f32 they would not).
TEST(Bf16Compute, OpsReadTheWeightsRoundedToBf16) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const LlamaConfig cfg = test::tiny_config(tied, false);
    Llama<float> exact(cfg), rounded(cfg);
    for (Llama<float>* m : {&exact, &rounded}) {
      m->set_bf16_compute(true);
      m->init_weights(5);
      test::perturb_params(*m, 9);
    }
    ops::round_to_bf16(rounded.params(), rounded.num_params());
    const test::Batch b = test::make_batch(2, 7, cfg.vocab_size, 6, true);
    std::vector<double> losses;
    for (Llama<float>* m : {&exact, &rounded}) {
      m->zero_grad();
      const LossSum l = m->forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
      m->backward(1.0f / float(l.tokens));
      losses.push_back(l.loss_sum);
    }
    EXPECT_EQ(losses[0], losses[1]);
    EXPECT_EQ(std::memcmp(exact.grads(), rounded.grads(), size_t(exact.num_params()) * sizeof(float)), 0);
  }
}

TEST(Bf16Compute, AgreesWithFp64ToBf16Rounding) {
  const LlamaConfig cfg = test::tiny_config(false, false);
  Llama<double> m64(cfg);
  Llama<float> m32(cfg), m16(cfg);
  m16.set_bf16_compute(true);
  EXPECT_TRUE(m16.bf16_compute());
  EXPECT_FALSE(m32.bf16_compute());
  for (Llama<float>* m : {&m32, &m16}) m->init_weights(5), test::perturb_params(*m, 9);
  m64.init_weights(5);
  for (int64_t i = 0; i < m64.num_params(); ++i) m64.params()[i] = double(m32.params()[i]);  // the same weights

  const test::Batch b = test::make_batch(2, 7, cfg.vocab_size, 6, true);
  m64.zero_grad(), m32.zero_grad(), m16.zero_grad();
  const LossSum l64 = m64.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  const LossSum l32 = m32.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  const LossSum l16 = m16.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  m64.backward(1.0 / double(l64.tokens));
  m32.backward(1.0f / float(l32.tokens));
  m16.backward(1.0f / float(l16.tokens));

  const double loss32 = std::abs(l32.loss_sum - l64.loss_sum) / std::abs(l64.loss_sum);
  const double loss16 = std::abs(l16.loss_sum - l64.loss_sum) / std::abs(l64.loss_sum);
  double grad32 = 0, grad16 = 0;
  for (const ParamSpec& p : m64.param_specs()) {
    grad32 = std::max(grad32, test::rel_error(m32.grads() + p.offset, m64.grads() + p.offset, p.numel));
    grad16 = std::max(grad16, test::rel_error(m16.grads() + p.offset, m64.grads() + p.offset, p.numel));
  }
  std::printf("relative error against fp64: loss f32 %.3g, bf16 %.3g; worst gradient tensor f32 %.3g, bf16 %.3g\n",
              loss32, loss16, grad32, grad16);
  // bf16 keeps 8 significant bits: one rounding is off by up to 2^-9 = 2e-3 relative. The loss
  // and the gradients sum many of them, so they land within a few units of that; f32 within 1e-5
  // (model_basics_test.cpp). Rounding that never happened would leave bf16 as close as f32.
  EXPECT_LE(loss16, 2e-2);
  EXPECT_LE(grad16, 1e-1);
  EXPECT_GT(loss16, 10 * loss32);
  EXPECT_GT(grad16, 10 * grad32);
}

// A bf16 model's forward and backward on b, with parking on or off: the live activation bytes
// after the forward (split: between the input and the weight pass, where a zero-bubble schedule
// holds them), the loss and the gradients.
struct ParkingRun {
  int64_t activations = 0;
  double loss = 0;
  std::vector<float> grads;
};
ParkingRun run_bf16(const LlamaConfig& cfg, const test::Batch& b, bool park, const char* ac, bool split) {
  MemoryTracker memory(0, 0);
  Llama<float> m(cfg, &memory);
  m.set_bf16_compute(true);
  m.set_bf16_parking(park);
  m.set_checkpointing(Checkpointing::parse(ac, int(cfg.num_hidden_layers)));
  m.init_weights(5);
  test::perturb_params(m, 9);
  m.zero_grad();
  MicroBatchState<float> st;
  const LossSum loss = m.forward(st, m.all_units(), b.tokens.data(), b.targets.data(), nullptr, b.B, b.seq);
  ParkingRun r;
  r.loss = loss.loss_sum;
  const float scale = 1.0f / float(loss.tokens);
  if (split) m.backward(st, scale, nullptr, BackwardPass::input);
  r.activations = memory.live(MemoryCategory::activations);
  if (split)
    m.backward(st, 0.0f, nullptr, BackwardPass::weight);
  else
    m.backward(st, scale);
  r.grads.assign(m.grads(), m.grads() + m.num_params());
  return r;
}

// The forward's kept tensors wait for the backward as bf16: the allocator holds 2 bytes less per
// element of every bf16-valued tensor kept (the block inputs x_0 .. x_{L-1}; per block q, k, v, h,
// gate, up and, where the policy keeps them, n1, att, n2, act), and the same bytes of statistics;
// the loss and every gradient keep their bits.
TEST(Bf16Compute, KeptActivationsWaitAsBf16WithTheSameBits) {
  const LlamaConfig cfg = test::tiny_config(false, true);
  const int64_t B = 2, T = 7, BT = B * T, C = cfg.hidden_size, I = cfg.intermediate_size, L = cfg.num_hidden_layers;
  const int64_t qd = cfg.num_attention_heads * cfg.head_dim, kvd = cfg.num_key_value_heads * cfg.head_dim;
  const test::Batch b = test::make_batch(B, T, cfg.vocab_size, 6, true);
  // Elements parked per block, by policy (none keeps all ten tensors, selective the first six).
  const int64_t kept_six = BT * qd + 2 * BT * kvd + BT * C + 2 * BT * I;
  const int64_t all_ten = kept_six + 2 * BT * C + BT * qd + BT * I;
  struct Policy {
    const char* ac;
    int64_t parked;  // elements over the whole model: blocks' tensors + their kept inputs x_l
  };
  for (const Policy& p : {Policy{"none", L * (all_ten + BT * C)}, Policy{"selective", L * (kept_six + BT * C)},
                          Policy{"full", L * BT * C}}) {
    SCOPED_TRACE(p.ac);
    const ParkingRun parked = run_bf16(cfg, b, true, p.ac, false), in_f32 = run_bf16(cfg, b, false, p.ac, false);
    EXPECT_EQ(in_f32.activations - parked.activations, 2 * p.parked);
    EXPECT_EQ(parked.loss, in_f32.loss);
    EXPECT_EQ(std::memcmp(parked.grads.data(), in_f32.grads.data(), parked.grads.size() * sizeof(float)), 0);
  }
}

// Between a zero-bubble input pass and its weight pass, what the weight gradients are computed
// from waits as bf16 too: per block d(down_proj out), d(gate_proj out), d(up_proj out), dn2,
// d(o_proj out), dq, dk, dv, dn1 and the inputs act, n2, att, n1, h, x; for the head dlogits,
// d(final norm out), n and x_L; 1/rms stays f32. Same bits after the weight pass.
TEST(Bf16Compute, WeightPassInputsWaitAsBf16WithTheSameBits) {
  const LlamaConfig cfg = test::tiny_config(false, false);
  const int64_t B = 2, T = 7, BT = B * T, C = cfg.hidden_size, I = cfg.intermediate_size, L = cfg.num_hidden_layers;
  const int64_t V = cfg.vocab_size, qd = cfg.num_attention_heads * cfg.head_dim;
  const int64_t kvd = cfg.num_key_value_heads * cfg.head_dim;
  const int64_t parked = L * BT * (8 * C + 3 * I + 2 * qd + 2 * kvd) + BT * (V + 3 * C);
  const test::Batch b = test::make_batch(B, T, cfg.vocab_size, 6, true);
  const ParkingRun with = run_bf16(cfg, b, true, "none", true), without = run_bf16(cfg, b, false, "none", true);
  EXPECT_EQ(without.activations - with.activations, 2 * parked);
  EXPECT_EQ(std::memcmp(with.grads.data(), without.grads.data(), with.grads.size() * sizeof(float)), 0);
}

// Every product the model runs in bf16 mode tells the backend its operands are bf16
// (GemmOperands::bf16, so the CUDA backend runs it on tensor cores), and they are: each element
// of every operand it reads is a bf16 value, in the forward, the backward, the recomputation of
// selective checkpointing and a zero-bubble weight pass; attention's calls say so too
// (AttentionShape::operands) for q, k, v, and in the backward dout and out. In f32 every product
// reads as stored. Every tensor they touch is the backend's memory. tests/parallel/bf16_equivalence_test.cpp
// checks the same under the strategies.
TEST(Bf16Compute, EveryProductAndAttentionReadsBf16Operands) {
  const test::Batch b = test::make_batch(2, 7, test::tiny_config(false, false).vocab_size, 6, true);
  for (bool tied : {false, true})
    for (const char* ac : {"none", "selective"})
      for (bool split : {false, true}) {
        SCOPED_TRACE(std::string(tied ? "tied " : "untied ") + ac + (split ? " split" : ""));
        const LlamaConfig cfg = test::tiny_config(tied, false);
        test::LoggingOperands logging;
        run_bf16(cfg, b, true, ac, split);
        const test::OperandLog log = logging.log();
        // Per block 7 forward products and 7 backward calls (14 when split: input, then weight),
        // the head's 1 + 1 (+ 1); selective recomputation runs no product.
        const int backward = split ? 2 : 1;
        EXPECT_EQ(log.products_bf16, (7 + 7 * backward) * cfg.num_hidden_layers + 1 + backward);
        EXPECT_EQ(log.products_as_stored, 0);
        // Per block one attention forward (again when selective recomputes it) and one backward.
        const int forwards = std::string(ac) == "selective" ? 2 : 1;
        EXPECT_EQ(log.attention_bf16, (forwards + 1) * cfg.num_hidden_layers);
        EXPECT_EQ(log.attention_as_stored, 0);
        EXPECT_TRUE(log.not_bf16.empty()) << log.not_bf16.front();
        EXPECT_TRUE(log.not_backend_memory.empty()) << log.not_backend_memory.front();
      }
  test::LoggingOperands logging;
  const LlamaConfig cfg = test::tiny_config(false, false);
  Llama<float> m(cfg);
  m.init_weights(5);
  MicroBatchState<float> st;
  const LossSum loss = m.forward(st, m.all_units(), b.tokens.data(), b.targets.data(), nullptr, b.B, b.seq);
  m.backward(st, 1.0f / float(loss.tokens));
  const test::OperandLog log = logging.log();
  EXPECT_EQ(log.products_bf16, 0);
  EXPECT_GT(log.products_as_stored, 0);
  EXPECT_EQ(log.attention_bf16, 0);
  EXPECT_GT(log.attention_as_stored, 0);
  EXPECT_TRUE(log.not_backend_memory.empty()) << log.not_backend_memory.front();
}

TEST(Bf16Compute, IsAModeOfTheF32Model) {
  Llama<double> m(test::tiny_config(false, false));
  EXPECT_THROW(m.set_bf16_compute(true), InputError);
  EXPECT_NO_THROW(m.set_bf16_compute(false));
  EXPECT_FALSE(m.bf16_compute());
}

}  // namespace
}  // namespace llama4d
