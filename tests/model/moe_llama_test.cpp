// A mixture-of-experts Llama (every FFN Mixtral's MoE layer, core/model/moe.h) on one device:
//  - its gradients against finite differences of its objective, in fp64, for entries of every
//    tensor (the router's and every expert's included);
//  - identities that need no reference implementation: E experts all holding one dense SwiGLU's
//    weights give the dense Llama's loss and gradients for any router (the renormalised weights
//    of a token sum to 1), and a zero router gives uniform probabilities, experts 0..k-1 for every
//    token and a load-balancing loss of coef·k per layer by hand; two experts behind equal router
//    rows, one silenced, give the dense model at half its down projection;
//  - every activation-checkpointing policy gives the bits of none; KV-cache decoding the full
//    forward's logits; FLOPs per token counted by hand;
//  - the parallel paths it does not cover yet refuse it by name.
//
// Objective of backward(loss_scale) (Llama::aux_loss): loss_scale · (loss_sum + B·seq · aux_loss).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/model/decode.h"
#include "core/model/flops.h"
#include "core/model/llama.h"
#include "tests/model/model_test_util.h"

namespace llama4d {
namespace {

using test::Batch;

// InputError whose message holds every one of parts.
void expect_input_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
    return;
  }
  ADD_FAILURE() << "did not throw an InputError";
}

LlamaConfig tiny_moe(int64_t E, int64_t k, double coef, bool tied = false) {
  LlamaConfig c = test::tiny_config(tied, false);
  c.num_local_experts = E;
  c.num_experts_per_tok = k;
  c.router_aux_loss_coef = coef;
  c.output_router_logits = coef > 0;
  return c;
}

// The objective backward(1.0) differentiates: loss_sum + B·seq · aux_loss.
double objective(Llama<double>& m, const Batch& b) {
  const LossSum ls = m.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  return ls.loss_sum + double(b.B * b.seq) * m.aux_loss();
}

// Fourth-order central difference (as gradient_check_test.cpp; truncation ~h^4).
double finite_difference(Llama<double>& m, const Batch& b, double* w, double h) {
  const double saved = *w;
  auto f = [&](double x) {
    *w = x;
    return objective(m, b);
  };
  const double d = (-f(saved + 2 * h) + 8 * f(saved + h) - 8 * f(saved - h) + f(saved - 2 * h)) / (12 * h);
  *w = saved;
  return d;
}

struct MoeGradCase {
  const char* name;
  int64_t E, k;
  double coef;
  bool tied;
};
void PrintTo(const MoeGradCase& c, std::ostream* os) { *os << c.name; }

class MoeLlamaGradientCheck : public ::testing::TestWithParam<MoeGradCase> {};

TEST_P(MoeLlamaGradientCheck, EveryTensorMatchesFiniteDifferences) {
  const MoeGradCase gc = GetParam();
  const LlamaConfig cfg = tiny_moe(gc.E, gc.k, gc.coef, gc.tied);
  Llama<double> m(cfg);
  m.init_weights(7);
  test::perturb_params(m, 4321);
  const Batch b = test::make_batch(2, 7, cfg.vocab_size, 99, /*ignore_some=*/true);

  m.zero_grad();
  const double f0 = objective(m, b);
  ASSERT_TRUE(std::isfinite(f0));
  if (gc.coef > 0) {
    ASSERT_GT(m.aux_loss(), 0.0);
  }
  const std::vector<int64_t> counts = m.expert_counts();
  // backward(s) differentiates s · objective: s a power of two, so dividing by it is exact, and a
  // load-balancing gradient that ignored s (or B·seq) would not match.
  const double s = 0.25;
  m.backward(s);
  std::vector<double> grads = test::flat_grads(m);
  for (double& g : grads) g /= s;

  // A step of h must not change any token's choice of experts (top-k is piecewise): the counts
  // after the finite differences are those of the forward above, and so is the objective.
  uint64_t rng = 77;
  double worst = 0;
  std::string worst_name;
  int idle_experts = 0;
  for (const ParamSpec& p : m.param_specs()) {
    // An expert no token reached has exactly zero gradient (checked whole, not sampled).
    const std::string::size_type at = p.name.find("experts.");
    if (at != std::string::npos) {
      const int64_t e = std::stoll(p.name.substr(at + 8));
      if (counts[size_t(p.layer * gc.E + e)] == 0) {
        for (int64_t i = 0; i < p.numel; ++i) ASSERT_EQ(grads[size_t(p.offset + i)], 0.0) << p.name << " (no tokens)";
        ++idle_experts;
        continue;
      }
    }
    double num = 0, den = 0;
    for (int sample = 0; sample < 6; ++sample) {
      const int64_t i = test::next_index(rng, p.numel);
      const double fd = finite_difference(m, b, m.params() + p.offset + i, 1e-4);
      const double an = grads[size_t(p.offset + i)];
      ASSERT_TRUE(std::isfinite(an) && std::isfinite(fd)) << p.name << "[" << i << "]";
      num = std::max(num, std::abs(an - fd));
      den = std::max(den, std::abs(fd));
    }
    if (p.name == "model.embed_tokens.weight" && !gc.tied && den == 0) continue;  // rows no token reads
    ASSERT_GT(den, 1e-9) << p.name << ": every sampled gradient is ~0; the check would be vacuous";
    const double rel = num / den;
    EXPECT_LE(rel, 1e-6) << p.name << ": max|analytic - fd| = " << num << ", max|fd| = " << den;
    if (rel > worst) worst = rel, worst_name = p.name;
  }
  EXPECT_EQ(objective(m, b), f0);
  EXPECT_EQ(m.expert_counts(), counts);
  std::printf("[%s] %zu tensors (%d of idle experts), worst rel error %.3g in %s\n", gc.name,
              m.param_specs().size(), idle_experts, worst, worst_name.c_str());
}

INSTANTIATE_TEST_SUITE_P(Model, MoeLlamaGradientCheck,
                         ::testing::Values(MoeGradCase{"e4_k2_aux", 4, 2, 0.05, false},
                                           MoeGradCase{"e3_k1_aux_tied", 3, 1, 0.1, true},
                                           MoeGradCase{"e4_k4_no_aux", 4, 4, 0.0, false}),
                         [](const auto& info) { return std::string(info.param.name); });

// Copies every tensor the dense model has into the MoE model: the attention, norms, embedding and
// head by name, and the dense SwiGLU (gate_proj, up_proj, down_proj) into every expert (w1, w3, w2).
void copy_dense_into_every_expert(Llama<double>& moe, Llama<double>& dense, int64_t E) {
  for (const ParamSpec& p : dense.param_specs()) {
    const double* src = dense.param(p.name);
    auto put = [&](const std::string& name) {
      ASSERT_EQ(find_param(moe.param_specs(), name).numel, p.numel) << name;
      std::copy(src, src + p.numel, moe.param(name));
    };
    const std::string::size_type mlp = p.name.find("mlp.");
    if (mlp == std::string::npos) {
      put(p.name);
      continue;
    }
    const std::string layer = p.name.substr(0, mlp), proj = p.name.substr(mlp + 4);
    const std::string w = proj == "gate_proj.weight" ? "w1" : proj == "up_proj.weight" ? "w3" : "w2";
    for (int64_t e = 0; e < E; ++e) put(layer + "block_sparse_moe.experts." + std::to_string(e) + "." + w + ".weight");
  }
}

// For any router, E identical experts give the dense SwiGLU: out[t] = sum_j weights[t,j] f(x[t])
// = f(x[t]), the weights summing to 1. Without the load-balancing loss the MoE model's loss is the
// dense model's; the gradient of every shared tensor is the dense one; the experts' gradients sum
// to the dense FFN's (token t's share weights[t,j] of it goes to its j-th expert); and the router
// gets none (d loss / d weights[t,j] = dout[t]·f(x[t]) is the same for every j, and the weights'
// sum does not move with the logits).
TEST(MoeLlama, IdenticalExpertsGiveTheDenseModelForAnyRouter) {
  const int64_t E = 4, k = 2;
  const LlamaConfig dense_cfg = test::tiny_config(false, false);
  const LlamaConfig moe_cfg = tiny_moe(E, k, 0.0);
  Llama<double> dense(dense_cfg), moe(moe_cfg);
  dense.init_weights(3);
  test::perturb_params(dense, 55);
  moe.init_weights(4);
  test::perturb_params(moe, 66);  // the router's rows: random, and differently so per layer
  copy_dense_into_every_expert(moe, dense, E);

  const Batch b = test::make_batch(2, 7, dense_cfg.vocab_size, 11, /*ignore_some=*/true);
  dense.zero_grad();
  moe.zero_grad();
  const LossSum ld = dense.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  const LossSum lm = moe.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  EXPECT_EQ(lm.tokens, ld.tokens);
  EXPECT_NEAR(lm.loss_sum, ld.loss_sum, 1e-12 * std::abs(ld.loss_sum));
  EXPECT_EQ(moe.aux_loss(), 0.0);
  // The router is not trivial: more than one expert is chosen somewhere in every layer.
  const std::vector<int64_t>& counts = moe.expert_counts();
  ASSERT_EQ(counts.size(), size_t(2 * E));
  for (int l = 0; l < 2; ++l) {
    int64_t sum = 0, used = 0;
    for (int64_t e = 0; e < E; ++e) sum += counts[size_t(l * E + e)], used += counts[size_t(l * E + e)] > 0;
    EXPECT_EQ(sum, b.B * b.seq * k) << "layer " << l;
    EXPECT_GE(used, 3) << "layer " << l;
  }
  dense.backward(1.0);
  moe.backward(1.0);

  for (const ParamSpec& p : dense.param_specs()) {
    const double* gd = dense.grad(p.name);
    const std::string::size_type mlp = p.name.find("mlp.");
    if (mlp == std::string::npos) {
      EXPECT_LE(test::rel_error(moe.grad(p.name), gd, p.numel), 1e-11) << p.name;
      continue;
    }
    const std::string layer = p.name.substr(0, mlp), proj = p.name.substr(mlp + 4);
    const std::string w = proj == "gate_proj.weight" ? "w1" : proj == "up_proj.weight" ? "w3" : "w2";
    std::vector<double> sum(size_t(p.numel), 0.0);
    for (int64_t e = 0; e < E; ++e) {
      const double* ge = moe.grad(layer + "block_sparse_moe.experts." + std::to_string(e) + "." + w + ".weight");
      for (int64_t i = 0; i < p.numel; ++i) sum[size_t(i)] += ge[i];
    }
    EXPECT_LE(test::rel_error(sum.data(), gd, p.numel), 1e-11) << p.name << " (summed over the experts)";
  }
  // The router's gradient is zero up to rounding: compared with the size of the FFN's gradient.
  for (int l = 0; l < 2; ++l) {
    const std::string layer = "model.layers." + std::to_string(l) + ".";
    const ParamSpec& gate = find_param(moe.param_specs(), layer + "block_sparse_moe.gate.weight");
    const ParamSpec& up = find_param(dense.param_specs(), layer + "mlp.up_proj.weight");
    double gmax = 0, umax = 0;
    for (int64_t i = 0; i < gate.numel; ++i) gmax = std::max(gmax, std::abs(moe.grad(gate.name)[i]));
    for (int64_t i = 0; i < up.numel; ++i) umax = std::max(umax, std::abs(dense.grad(up.name)[i]));
    ASSERT_GT(umax, 1e-3);
    EXPECT_LE(gmax, 1e-12 * umax) << gate.name;
  }
}

// A zero router: logits 0, probabilities 1/E, ties broken by the lower expert, so every token goes
// to experts 0..k-1 with weights 1/k each. By hand, per layer, f_e = 1 for e < k (every token
// routed there) and 0 otherwise, P_e = 1/E, so aux = coef·E·sum_e f_e P_e = coef·E·k/E = coef·k;
// the model's aux_loss is L·coef·k and expert e of every layer gets B·seq tokens for e < k, none
// after. The loss then is the dense model's whose SwiGLU is the mean of experts 0..k-1 only when
// those are equal, so here the experts are made identical to check the loss as well.
TEST(MoeLlama, ZeroRouterSendsEveryTokenToTheFirstKExpertsWithAuxCoefTimesK) {
  const int64_t E = 4, k = 2;
  const double coef = 0.125;
  const LlamaConfig dense_cfg = test::tiny_config(true, false);
  LlamaConfig moe_cfg = tiny_moe(E, k, coef, true);
  Llama<double> dense(dense_cfg), moe(moe_cfg);
  dense.init_weights(8);
  test::perturb_params(dense, 9);
  moe.init_weights(10);
  copy_dense_into_every_expert(moe, dense, E);
  for (int l = 0; l < 2; ++l) {
    const ParamSpec& gate = find_param(moe.param_specs(), "model.layers." + std::to_string(l) + ".block_sparse_moe.gate.weight");
    std::fill(moe.param(gate.name), moe.param(gate.name) + gate.numel, 0.0);
  }
  const Batch b = test::make_batch(3, 5, dense_cfg.vocab_size, 12, /*ignore_some=*/false);
  const LossSum ld = dense.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  const LossSum lm = moe.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  EXPECT_NEAR(moe.aux_loss(), 2 * coef * double(k), 1e-15);
  const std::vector<int64_t> want = {15, 15, 0, 0, 15, 15, 0, 0};
  EXPECT_EQ(moe.expert_counts(), want);
  EXPECT_NEAR(lm.loss_sum, ld.loss_sum, 1e-12 * std::abs(ld.loss_sum));
}

// The combine weighs each expert by its renormalised probability. With E = k = 2, equal router rows
// (probabilities 1/2 for every token) and expert 1's down projection zero, out[t] = f_0(x[t]) / 2:
// the dense model whose down_proj is expert 0's w2 halved (exact in binary). By hand the
// load-balancing loss is coef·E·(f_0 P_0 + f_1 P_1) = coef·2·(1·1/2 + 1·1/2) = 2·coef per layer
// (every token reaches both experts), and d loss / d w2_0 is the dense down_proj's gradient halved.
TEST(MoeLlama, EqualRouterRowsWeighEachExpertByOneHalf) {
  const double coef = 0.25;
  const LlamaConfig dense_cfg = test::tiny_config(false, false);
  Llama<double> dense(dense_cfg), moe(tiny_moe(2, 2, coef));
  dense.init_weights(21);
  test::perturb_params(dense, 22);
  moe.init_weights(23);
  test::perturb_params(moe, 24);
  copy_dense_into_every_expert(moe, dense, 2);
  for (int l = 0; l < 2; ++l) {
    const std::string layer = "model.layers." + std::to_string(l) + ".";
    const int64_t C = dense_cfg.hidden_size, I = dense_cfg.intermediate_size;
    double* gate = moe.param(layer + "block_sparse_moe.gate.weight");
    std::copy(gate, gate + C, gate + C);  // row 1 = row 0 (random)
    double* w2_1 = moe.param(layer + "block_sparse_moe.experts.1.w2.weight");
    std::fill(w2_1, w2_1 + C * I, 0.0);
    double* down = dense.param(layer + "mlp.down_proj.weight");
    for (int64_t i = 0; i < C * I; ++i) down[i] /= 2;
  }
  const Batch b = test::make_batch(2, 6, dense_cfg.vocab_size, 25, /*ignore_some=*/true);
  dense.zero_grad();
  moe.zero_grad();
  const LossSum ld = dense.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  const LossSum lm = moe.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  EXPECT_NEAR(lm.loss_sum, ld.loss_sum, 1e-12 * std::abs(ld.loss_sum));
  EXPECT_NEAR(moe.aux_loss(), 2 * 2 * coef, 1e-15);
  EXPECT_EQ(moe.expert_counts(), (std::vector<int64_t>{12, 12, 12, 12}));
  dense.backward(1.0);
  moe.backward(1.0);
  for (int l = 0; l < 2; ++l) {
    const std::string layer = "model.layers." + std::to_string(l) + ".";
    const ParamSpec& down = find_param(dense.param_specs(), layer + "mlp.down_proj.weight");
    std::vector<double> half(dense.grad(down.name), dense.grad(down.name) + down.numel);
    for (double& g : half) g /= 2;
    EXPECT_LE(test::rel_error(moe.grad(layer + "block_sparse_moe.experts.0.w2.weight"), half.data(), down.numel), 1e-11)
        << layer;
  }
}

// The float model trains too, and its loss agrees with the fp64 one's at float precision.
TEST(MoeLlama, FloatForwardAgreesWithDouble) {
  const LlamaConfig cfg = tiny_moe(4, 2, 0.02);
  Llama<double> d(cfg);
  Llama<float> f(cfg);
  d.init_weights(5);
  f.init_weights(5);
  const Batch b = test::make_batch(2, 8, cfg.vocab_size, 13, false);
  const LossSum ld = d.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  const LossSum lf = f.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  EXPECT_NEAR(lf.loss_sum, ld.loss_sum, 1e-5 * std::abs(ld.loss_sum));
  EXPECT_NEAR(f.aux_loss(), d.aux_loss(), 1e-6);
  EXPECT_EQ(f.expert_counts().size(), size_t(2 * 4));
}

// Activation checkpointing recomputes the MoE layer with the same ops on the same inputs (selective
// keeps the layer's activations; full and every:k rerun its forward), so every policy gives the
// bits of none: the loss, the load-balancing loss and every gradient, over two micro-batches.
TEST(MoeLlama, CheckpointingPoliciesGiveTheBitsOfNone) {
  LlamaConfig cfg = tiny_moe(4, 2, 0.05);
  cfg.num_hidden_layers = 3;  // every:2 ends in a short segment
  const Batch b = test::make_batch(2, 9, cfg.vocab_size, 31, true);
  std::vector<float> reference;
  double ref_loss = 0, ref_aux = 0;
  for (const char* spec : {"none", "selective", "full", "every:2"}) {
    Llama<float> m(cfg);
    m.set_checkpointing(Checkpointing::parse(spec, int(cfg.num_hidden_layers)));
    m.init_weights(12);
    test::perturb_params(m, 13);
    m.zero_grad();
    LossSum loss = m.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
    m.backward(0.1f);
    loss = m.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
    m.backward(0.1f);
    if (std::string(spec) == "none") {
      reference = test::flat_grads(m), ref_loss = loss.loss_sum, ref_aux = m.aux_loss();
      ASSERT_GT(ref_aux, 0.0);
      continue;
    }
    EXPECT_EQ(loss.loss_sum, ref_loss) << spec;
    EXPECT_EQ(m.aux_loss(), ref_aux) << spec;
    EXPECT_TRUE(test::same_bits(test::flat_grads(m), reference)) << spec;
  }
}

// KV-cache decoding runs the MoE layer on the new positions only; each token's routing depends on
// that token alone, so the logits equal a full forward's at the last position of every prefix.
TEST(MoeLlama, DecodeMatchesForwardFp64) {
  const LlamaConfig cfg = tiny_moe(4, 2, 0.02);
  const int64_t B = 2, total = 8, V = cfg.vocab_size;
  Llama<double> m(cfg);
  m.init_weights(17);
  test::perturb_params(m, 18);
  const Batch seq = test::make_batch(B, total, V, 19, false);
  Decoder<double> decoder(m, B, total);
  std::vector<double> step_logits(size_t(B * V));
  int64_t len = 0;
  for (int64_t n : {3, 2, 1, 1, 1}) {
    std::vector<int32_t> chunk(size_t(B * n));
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < n; ++t) chunk[size_t(r * n + t)] = seq.tokens[size_t(r * total + len + t)];
    decoder.feed(chunk.data(), n, step_logits.data());
    len += n;
    std::vector<int32_t> prefix(size_t(B * len));
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < len; ++t) prefix[size_t(r * len + t)] = seq.tokens[size_t(r * total + t)];
    m.forward(prefix.data(), nullptr, B, len);
    for (int64_t r = 0; r < B; ++r)
      EXPECT_LE(test::rel_error(step_logits.data() + r * V, m.logits() + (r * len + len - 1) * V, V), 1e-12)
          << "row " << r << " after " << len << " tokens";
  }
}

// MFU's numerator counts what a token multiplies: tiny-moe (C 64, q 64, kv 32, I 88, E 4, k 2,
// V 264, L 2) per layer 2·64·64 + 2·32·64 = 12'288 of attention, the router 4·64 = 256 and two
// experts 2·3·88·64 = 33'792, so 46'336; two layers and the head 264·64 = 16'896: 109'568.
TEST(MoeLlama, FlopsCountTheRouterAndTheKChosenExpertsByHand) {
  const LlamaConfig cfg = LlamaConfig::preset("tiny-moe");
  EXPECT_EQ(ffn_matmul_parameters(cfg), 256 + 33'792);
  EXPECT_EQ(matmul_parameters(cfg), 109'568);
  EXPECT_EQ(training_flops_per_token(cfg, 128), 6.0 * 109'568 + 12.0 * 2 * 64 * 128);
  // One block, B 1 x T 4: products 2·4·64·(64 + 64) + 2·4·64·64 + 2·4·34'048 = 370'688; attention
  // 4·hd 16·nh 4·T(T+1)/2 10 = 2'560; a recomputed MoE layer runs whole (no down_proj saved).
  const UnitFlops f = unit_flops(cfg, 1, 4, block_unit(0));
  EXPECT_EQ(f.forward, 370'688.0 + 2'560.0);
  EXPECT_EQ(f.down_proj, 0.0);
}

// What the MoE layer does not run under yet is refused by name, before anything computes.
TEST(MoeLlama, ParallelAndBf16PathsAreRefusedByName) {
  const LlamaConfig cfg = tiny_moe(4, 2, 0.02);
  TpLayout two;  // rank 0 of tp = 2 (what the strategy's tp_layout gives for tiny's shape)
  two.tp = 2;
  two.heads = 2, two.kv_heads = 1, two.ffn = cfg.intermediate_size / 2, two.vocab_rows = cfg.vocab_size / 2;
  two.vocab_padded_rows = cfg.vocab_size / 2;
  expect_input_error([&] { Llama<float> m(cfg, nullptr, two); }, {"tensor parallelism", "mixture-of-experts"});
  Llama<float> m(cfg);
  expect_input_error([&] { m.set_context_split(2, 0); }, {"context parallelism", "mixture-of-experts"});
  expect_input_error([&] { m.set_bf16_compute(true); }, {"bf16", "mixture-of-experts"});
}

}  // namespace
}  // namespace llama4d
