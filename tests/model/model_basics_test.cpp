// Properties of the model that are not gradients or caching: deterministic initialisation,
// fp32 agreeing with fp64, gradient accumulation across backward calls, input validation,
// and the parameter layout (counts and names) being what Hugging Face expects.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/model/decode.h"
#include "core/model/llama.h"
#include "tests/model/model_test_util.h"
#include "tests/ops/operand_log.h"

namespace llama4d {
namespace {

TEST(ModelBasics, ParameterCountAndNamesMatchHuggingFaceLayout) {
  for (bool tied : {false, true}) {
    const LlamaConfig cfg = test::tiny_config(tied, false);
    Llama<double> m(cfg);
    // Counted by hand: V*C embedding; per layer 2 norms (C each), q and o (C*nh*hd each),
    // k and v (C*nkv*hd each), three SwiGLU matrices (C*I each); final norm; untied head.
    const int64_t V = 32, C = 16, I = 24, q = 4 * 4, kv = 2 * 4;
    const int64_t per_layer = 2 * C + 2 * C * q + 2 * C * kv + 3 * C * I;
    const int64_t expect = V * C + 2 * per_layer + C + (tied ? 0 : V * C);
    EXPECT_EQ(m.num_params(), expect);
    EXPECT_EQ(m.num_params(), cfg.num_parameters());

    std::vector<std::string> names;
    for (const ParamSpec& p : m.param_specs()) names.push_back(p.name);
    ASSERT_EQ(names.size(), size_t(tied ? 20 : 21));
    EXPECT_EQ(names.front(), "model.embed_tokens.weight");
    EXPECT_EQ(names[1], "model.layers.0.input_layernorm.weight");
    EXPECT_EQ(names[9], "model.layers.0.mlp.down_proj.weight");
    EXPECT_EQ(names[10], "model.layers.1.input_layernorm.weight");
    EXPECT_EQ(names[19], "model.norm.weight");
    if (!tied) {
      EXPECT_EQ(names[20], "lm_head.weight");
    }
    // Offsets tile the flat buffer with no gaps or overlaps.
    int64_t off = 0;
    for (const ParamSpec& p : m.param_specs()) {
      EXPECT_EQ(p.offset, off) << p.name;
      off += p.numel;
    }
    EXPECT_EQ(off, m.num_params());
  }
}

TEST(ModelBasics, InitIsDeterministicAndHasTheDocumentedStatistics) {
  const LlamaConfig cfg = test::tiny_config(false, false);
  Llama<double> a(cfg), b(cfg), c(cfg);
  a.init_weights(42);
  b.init_weights(42);
  c.init_weights(43);
  ASSERT_EQ(std::memcmp(a.params(), b.params(), size_t(a.num_params()) * sizeof(double)), 0);
  EXPECT_GT(test::rel_error(a.params(), c.params(), a.num_params()), 0.1) << "a different seed must differ";

  // Re-initialising an already-used model gives the same values again (no hidden state).
  a.init_weights(43);
  EXPECT_EQ(std::memcmp(a.params(), c.params(), size_t(a.num_params()) * sizeof(double)), 0);

  // RMSNorm gains are 1; matrices are N(0, 0.02): with ~4.9k draws the sample mean is within
  // 4 sigma = 4 * 0.02 / sqrt(n) of 0 and the sample std within a few percent of 0.02.
  double sum = 0, sq = 0;
  int64_t n = 0;
  for (const ParamSpec& p : c.param_specs()) {
    const double* w = c.params() + p.offset;
    if (p.shape.size() == 1) {
      for (int64_t i = 0; i < p.numel; ++i) ASSERT_EQ(w[i], 1.0) << p.name;
      EXPECT_FALSE(p.weight_decay) << p.name;
      continue;
    }
    EXPECT_TRUE(p.weight_decay) << p.name;
    for (int64_t i = 0; i < p.numel; ++i) sum += w[i], sq += w[i] * w[i], ++n;
  }
  const double mean = sum / double(n), stdev = std::sqrt(sq / double(n) - mean * mean);
  EXPECT_LT(std::abs(mean), 4 * 0.02 / std::sqrt(double(n)));
  EXPECT_NEAR(stdev, 0.02, 0.02 * 0.05);
}

// Every matrix draws its own stretch of the stream: no two tensors start alike (a draw counter
// that forgot to advance past some tensors would give repeated layers), and a pipeline rank
// holding only some units gets exactly those units' values of the whole model.
TEST(ModelBasics, EveryMatrixStartsDifferentAndStagesGetTheWholeModelsValues) {
  LlamaConfig cfg = test::tiny_config(false, false);
  cfg.num_hidden_layers = 3;
  Llama<double> whole(cfg);
  whole.init_weights(7);
  const std::vector<ParamSpec>& specs = whole.param_specs();
  for (size_t i = 0; i < specs.size(); ++i)
    for (size_t j = i + 1; j < specs.size(); ++j) {
      if (specs[i].shape.size() == 1 || specs[j].shape.size() == 1) continue;  // gains are all 1
      const int64_t n = std::min(specs[i].numel, specs[j].numel);
      EXPECT_NE(std::memcmp(whole.params() + specs[i].offset, whole.params() + specs[j].offset, size_t(n) * sizeof(double)), 0)
          << specs[i].name << " and " << specs[j].name << " start alike";
    }
  Llama<double> stage(cfg, nullptr, {}, {UnitRange{2, 5}});  // layers 1 and 2 and the head
  stage.init_weights(7);
  EXPECT_LT(stage.num_params(), whole.num_params());
  for (const ParamSpec& p : stage.param_specs()) {
    const ParamSpec& w = find_param(specs, p.name);
    EXPECT_EQ(std::memcmp(stage.params() + p.offset, whole.params() + w.offset, size_t(p.numel) * sizeof(double)), 0) << p.name;
  }
}

TEST(ModelBasics, Fp32AgreesWithFp64FromTheSameInit) {
  for (bool tied : {false, true}) {
    const LlamaConfig cfg = test::tiny_config(tied, tied);  // the tied case also uses rope_scaling
    Llama<double> m64(cfg);
    Llama<float> m32(cfg);
    m64.init_weights(5);
    m32.init_weights(5);
    // The float init is the double init rounded once.
    for (int64_t i = 0; i < m64.num_params(); ++i) ASSERT_EQ(m32.params()[i], float(m64.params()[i])) << i;
    const test::Batch b = test::make_batch(2, 7, cfg.vocab_size, 6, true);
    m64.zero_grad();
    m32.zero_grad();
    const LossSum l64 = m64.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
    const LossSum l32 = m32.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
    EXPECT_EQ(l64.tokens, l32.tokens);
    EXPECT_NEAR(l32.loss_sum, l64.loss_sum, 1e-5 * std::abs(l64.loss_sum));
    const int64_t nlog = b.B * b.seq * cfg.vocab_size;
    EXPECT_LE(test::rel_error(m32.logits(), m64.logits(), nlog), 1e-5);
    m64.backward(1.0 / double(l64.tokens));
    m32.backward(1.0f / float(l32.tokens));
    double worst = 0;
    std::string worst_name;
    for (const ParamSpec& p : m64.param_specs()) {
      const double rel = test::rel_error(m32.grads() + p.offset, m64.grads() + p.offset, p.numel);
      EXPECT_LE(rel, 1e-5) << p.name;
      if (rel > worst) worst = rel, worst_name = p.name;
    }
    std::printf("fp32 vs fp64 (tied=%d): loss %.9g vs %.9g, worst grad rel error %.3g in %s\n", int(tied),
                l32.loss_sum, l64.loss_sum, worst, worst_name.c_str());
  }
}

// A model made for its layout (the tensor-parallel replay's norm makes one per tensor rank and
// stage) takes no backend memory: parameters come with init or a load, the RoPE tables with the
// first block it computes.
TEST(ModelBasics, AModelMadeForItsLayoutAllocatesNothing) {
  test::LoggingOperands logging;
  const Llama<float> m(test::tiny_config(true, false));
  EXPECT_GT(m.num_params(), 0);
  EXPECT_EQ(logging.log().allocations, 0);
}

// The RoPE tables are memory a real GPU allocates too: charged to the rank as `other`, sized to
// the positions read (a forward's sequence, a KV cache's length), grown and never shrunk, and the
// longer table gives the same bits.
TEST(ModelBasics, RopeTablesAreChargedForThePositionsRead) {
  const LlamaConfig cfg = test::tiny_config(true, false);
  auto table_bytes = [&](int64_t positions) { return 2 * positions * (cfg.head_dim / 2) * int64_t(sizeof(float)); };
  MemoryTracker memory(0, 0);
  Llama<float> m(cfg, &memory);
  m.init_weights(3);
  EXPECT_EQ(memory.live(MemoryCategory::other), 0) << "made with the model";
  const test::Batch b7 = test::make_batch(2, 7, cfg.vocab_size, 4, true);
  const test::Batch b5 = test::make_batch(2, 5, cfg.vocab_size, 5, true);
  const LossSum first = m.forward(b7.tokens.data(), b7.targets.data(), b7.B, b7.seq);
  EXPECT_EQ(memory.live(MemoryCategory::other), table_bytes(7));
  m.forward(b5.tokens.data(), b5.targets.data(), b5.B, b5.seq);
  EXPECT_EQ(memory.live(MemoryCategory::other), table_bytes(7)) << "a shorter sequence shrank the tables";

  Decoder<float> decoder(m, 1, 12);
  std::vector<float> logits(size_t(cfg.vocab_size));
  decoder.feed(b5.tokens.data(), 3, logits.data());
  EXPECT_EQ(memory.live(MemoryCategory::other), table_bytes(12));
  EXPECT_EQ(memory.peak(MemoryCategory::other), table_bytes(12)) << "the old tables outlived the new ones";
  const LossSum again = m.forward(b7.tokens.data(), b7.targets.data(), b7.B, b7.seq);
  EXPECT_EQ(first.loss_sum, again.loss_sum) << "a longer table changed the positions' values";
}

TEST(ModelBasics, ForwardIsRepeatableAndBackwardAccumulates) {
  const LlamaConfig cfg = test::tiny_config(true, false);
  Llama<double> m(cfg);
  m.init_weights(8);
  test::perturb_params(m, 9);
  const test::Batch b = test::make_batch(2, 7, cfg.vocab_size, 10, true);
  const int64_t n = m.num_params();

  m.zero_grad();
  const LossSum l1 = m.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  m.backward(0.5);
  const std::vector<double> once(m.grads(), m.grads() + n);
  const LossSum l2 = m.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  EXPECT_EQ(l1.loss_sum, l2.loss_sum) << "forward must not depend on earlier calls";
  m.backward(0.5);
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::abs(m.grads()[i] - 2 * once[size_t(i)]));
    den = std::max(den, std::abs(2 * once[size_t(i)]));
  }
  EXPECT_LE(num / den, 1e-14) << "two forward/backward passes must give twice the gradient";

  // zero_grad really zeroes, and a third pass then reproduces the first bit for bit.
  m.zero_grad();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(m.grads()[i], 0.0);
  m.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  m.backward(0.5);
  EXPECT_EQ(std::memcmp(m.grads(), once.data(), size_t(n) * sizeof(double)), 0);

  // backward scales linearly in loss_scale.
  m.zero_grad();
  m.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  m.backward(1.5);
  num = den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::abs(m.grads()[i] - 3 * once[size_t(i)]));
    den = std::max(den, std::abs(3 * once[size_t(i)]));
  }
  EXPECT_LE(num / den, 1e-14);
}

TEST(ModelBasics, TokenIdsOutOfRangeAreInputErrors) {
  const LlamaConfig cfg = test::tiny_config(false, false);
  Llama<float> m(cfg);
  m.init_weights(1);
  test::Batch b = test::make_batch(1, 4, cfg.vocab_size, 2, false);
  b.tokens[2] = int32_t(cfg.vocab_size);
  EXPECT_THROW(m.forward(b.tokens.data(), b.targets.data(), 1, 4), InputError);
  b.tokens[2] = -3;
  EXPECT_THROW(m.forward(b.tokens.data(), b.targets.data(), 1, 4), InputError);
  b.tokens[2] = 0;
  // A sequence longer than the RoPE tables is refused rather than read past them.
  const int64_t long_T = cfg.max_position_embeddings + 1;
  const test::Batch lb = test::make_batch(1, long_T, cfg.vocab_size, 3, false);
  EXPECT_THROW(m.forward(lb.tokens.data(), lb.targets.data(), 1, long_T), InputError);
  // Exactly max_position_embeddings tokens is allowed (the last RoPE row is used).
  const int64_t max_T = cfg.max_position_embeddings;
  const test::Batch mb = test::make_batch(1, max_T, cfg.vocab_size, 4, false);
  EXPECT_TRUE(std::isfinite(m.forward(mb.tokens.data(), mb.targets.data(), 1, max_T).loss_sum));
  // Still usable after the refusals.
  const LossSum ok = m.forward(b.tokens.data(), b.targets.data(), 1, 4);
  EXPECT_EQ(ok.tokens, 4);
  EXPECT_TRUE(std::isfinite(ok.loss_sum));
}

// A target id >= vocab_size would index past its logits row in the cross-entropy; only -1
// (or any negative id) means "ignored". The bad target sits in row 0, so a model without the
// check reads row 1's first logit (in bounds) and this test fails cleanly instead of aborting
// the whole binary under AddressSanitizer.
TEST(ModelBasics, TargetIdsOutOfRangeAreInputErrors) {
  const LlamaConfig cfg = test::tiny_config(false, false);
  Llama<float> m(cfg);
  m.init_weights(1);
  test::Batch b = test::make_batch(1, 4, cfg.vocab_size, 2, false);
  b.targets[0] = int32_t(cfg.vocab_size);
  EXPECT_THROW(m.forward(b.tokens.data(), b.targets.data(), 1, 4), InputError);
}

}  // namespace
}  // namespace llama4d
