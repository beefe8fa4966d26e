// The backward split in two (BackwardPass::input, then ::weight), as zero-bubble pipeline
// schedules run it: for several micro-batches, in order or interleaved as ZB-H1 interleaves them,
// every unit gradient and every input gradient is bitwise the whole backward's, for ranges with
// and without the embedding and the head, under every activation checkpointing policy; the
// input pass writes no gradient; the weight pass frees what the input pass kept; the two passes
// report the whole backward's FLOPs; the hooks bracket each pass as units.h documents. The same
// holds in bf16 mixed precision, whose roundings the two passes must place alike.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "model_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

// GQA with a group of 3, odd widths and an odd vocabulary, 4 layers, untied.
LlamaConfig odd_config() {
  LlamaConfig c = test::tiny_config(false, false);
  c.vocab_size = 37;
  c.hidden_size = 18;
  c.intermediate_size = 29;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 2;
  c.head_dim = 6;
  return c;
}

// The `tiny` preset with 4 layers (blocks 1..3 then leave a block before them) and tied
// embeddings (the head's and the lookup's gradients share unit 0).
LlamaConfig tiny_preset() {
  LlamaConfig c = LlamaConfig::preset("tiny");
  c.num_hidden_layers = 4;
  c.tie_word_embeddings = true;
  return c;
}

enum class Schedule {
  full,        // backward(full) per micro-batch
  split,       // input then weight, per micro-batch
  zero_bubble  // input(m0), input(m1), weight(m0), input(m2), weight(m1), weight(m2)
};

template <class T>
std::vector<T> deterministic(int64_t n, uint64_t seed) {
  std::vector<T> v(static_cast<size_t>(n));
  uint64_t s = seed;
  for (T& x : v) x = T(test::next_uniform(s) - 0.5);
  return v;
}



struct FlopCounter : ops::FlopSink {
  double flops = 0;
  void add_flops(double f) override { flops += f; }
};

// What one schedule leaves: the flat gradients, each micro-batch's input gradient, the FLOPs.
template <class T>
struct Outcome {
  std::vector<T> grads;
  std::vector<std::vector<T>> input_grads;
  double flops = 0;
};

constexpr int kMicroBatches = 3;

template <class T>
Outcome<T> run(const LlamaConfig& cfg, const char* ac, UnitRange r, Schedule schedule, bool bf16) {
  Llama<T> m(cfg);
  m.set_bf16_compute(bf16);
  m.set_checkpointing(Checkpointing::parse(ac, int(cfg.num_hidden_layers)));
  m.init_weights(3);
  test::perturb_params(m, 8);
  m.zero_grad();
  const int64_t B = 2, seq = 7, C = cfg.hidden_size;
  const bool has_embedding = r.contains(embedding_unit()), has_head = r.contains(head_unit(m.num_layers()));
  const T scale = T(1) / T(23);

  std::vector<test::Batch> batches;
  std::vector<std::vector<T>> hidden, grad_out;
  for (int i = 0; i < kMicroBatches; ++i) {
    batches.push_back(test::make_batch(B, seq, cfg.vocab_size, 100 + uint64_t(i), true));
    hidden.push_back(deterministic<T>(B * seq * C, 200 + uint64_t(i)));
    grad_out.push_back(deterministic<T>(B * seq * C, 300 + uint64_t(i)));
  }
  std::vector<MicroBatchState<T>> st(kMicroBatches);
  FlopCounter counter;
  auto forward = [&](int i) {
    const size_t k = size_t(i);
    m.forward(st[k], r, has_embedding ? batches[k].tokens.data() : nullptr,
              has_head ? batches[k].targets.data() : nullptr, has_embedding ? nullptr : hidden[k].data(), B, seq);
  };
  auto backward = [&](int i, BackwardPass pass) {
    const size_t k = size_t(i);
    const std::vector<T> before = test::flat_grads(m);
    ops::ScopedFlopSink sink(&counter);
    m.backward(st[k], scale, has_head ? nullptr : grad_out[k].data(), pass);
    if (pass == BackwardPass::input) {
      EXPECT_TRUE(test::same_bits(test::flat_grads(m), before)) << "the input pass wrote a gradient";
      EXPECT_GT(st[k].activation_bytes(), st[k].input_grad.bytes()) << "nothing kept for the weight pass";
    }
  };

  for (int i = 0; i < kMicroBatches; ++i) forward(i);
  switch (schedule) {
    case Schedule::full:
      for (int i = 0; i < kMicroBatches; ++i) backward(i, BackwardPass::full);
      break;
    case Schedule::split:
      for (int i = 0; i < kMicroBatches; ++i) backward(i, BackwardPass::input), backward(i, BackwardPass::weight);
      break;
    case Schedule::zero_bubble:
      backward(0, BackwardPass::input);
      backward(1, BackwardPass::input);
      backward(0, BackwardPass::weight);
      backward(2, BackwardPass::input);
      backward(1, BackwardPass::weight);
      backward(2, BackwardPass::weight);
      break;
  }

  Outcome<T> out{test::flat_grads(m), {}, counter.flops};
  for (MicroBatchState<T>& s : st) {
    // Everything freed but the input gradient (scratch, handed to the previous stage).
    EXPECT_EQ(s.activation_bytes(), s.input_grad.bytes());
    EXPECT_EQ(s.input_grad.empty(), has_embedding);
    out.input_grads.emplace_back(s.input_grad.data(), s.input_grad.data() + s.input_grad.size());
  }
  EXPECT_EQ(m.memory().live(MemoryCategory::activations), 0);
  return out;
}

// Also: every checkpointing policy gives the bits of none (a recompute repeats the forward's ops,
// its roundings to bf16 included).
template <class T>
void expect_split_bitwise(const LlamaConfig& cfg, bool bf16 = false) {
  const int L = int(cfg.num_hidden_layers);
  const struct {
    UnitRange r;
    const char* name;
  } ranges[] = {{{0, L + 2}, "all units"},
                {{2, 5}, "blocks 1..3"},
                {{3, L + 2}, "blocks 2..3 and the head"},
                {{0, 3}, "embedding and blocks 0..1"}};
  for (const auto& [r, name] : ranges) {
    const Outcome<T> kept = run<T>(cfg, "none", r, Schedule::full, bf16);
    for (const char* ac : {"none", "selective", "every:2"}) {
      SCOPED_TRACE(std::string(name) + ", checkpointing " + ac);
      const Outcome<T> full = run<T>(cfg, ac, r, Schedule::full, bf16);
      EXPECT_TRUE(test::same_bits(full.grads, kept.grads)) << "checkpointing changed the gradients";
      for (Schedule s : {Schedule::split, Schedule::zero_bubble}) {
        const Outcome<T> split = run<T>(cfg, ac, r, s, bf16);
        EXPECT_TRUE(test::same_bits(split.grads, full.grads)) << "schedule " << int(s);
        for (int i = 0; i < kMicroBatches; ++i)
          EXPECT_TRUE(test::same_bits(split.input_grads[size_t(i)], full.input_grads[size_t(i)]))
              << "micro-batch " << i << " schedule " << int(s);
        EXPECT_EQ(split.flops, full.flops);
      }
      EXPECT_GT(full.flops, 0.0);
    }
  }
}

TEST(SplitBackward, BitwiseWholeBackwardTinyFp32) { expect_split_bitwise<float>(tiny_preset()); }
TEST(SplitBackward, BitwiseWholeBackwardTinyFp64) { expect_split_bitwise<double>(tiny_preset()); }
TEST(SplitBackward, BitwiseWholeBackwardOddShapesFp32) { expect_split_bitwise<float>(odd_config()); }
TEST(SplitBackward, BitwiseWholeBackwardOddShapesFp64) { expect_split_bitwise<double>(odd_config()); }
TEST(SplitBackward, BitwiseWholeBackwardOddShapesBf16) { expect_split_bitwise<float>(odd_config(), true); }

// Per-unit storage (ZeRO-2 style): the input pass allocates no gradient segment; the weight pass
// allocates each one it writes.
TEST(SplitBackward, InputPassAllocatesNoGradient) {
  const LlamaConfig cfg = odd_config();
  Llama<float> m(cfg);
  m.set_residency(Llama<float>::Residency::whole, Llama<float>::Residency::per_unit);
  m.init_weights(5);
  const test::Batch b = test::make_batch(2, 5, cfg.vocab_size, 7, false);
  MicroBatchState<float> st;
  m.forward(st, m.all_units(), b.tokens.data(), b.targets.data(), nullptr, b.B, b.seq);
  m.backward(st, 0.1f, nullptr, BackwardPass::input);
  EXPECT_EQ(m.memory().live(MemoryCategory::grads), 0);
  for (int u = 0; u < m.num_units(); ++u) EXPECT_EQ(m.unit_grads(u), nullptr) << u;
  m.backward(st, 0.1f, nullptr, BackwardPass::weight);
  for (int u = 0; u < m.num_units(); ++u) EXPECT_NE(m.unit_grads(u), nullptr) << u;
}
LLAMA4D_TIER(SplitBackward, BitwiseWholeBackwardTinyFp64, full);  // its fp32 twin runs the same code

TEST(SplitBackward, PassesOutOfOrderAreErrors) {
  const LlamaConfig cfg = odd_config();
  Llama<double> m(cfg);
  m.init_weights(5);
  m.zero_grad();
  const test::Batch b = test::make_batch(2, 5, cfg.vocab_size, 7, false);
  MicroBatchState<double> st;
  EXPECT_THROW(m.backward(st, 0.1, nullptr, BackwardPass::weight), Error);  // nothing ran
  m.forward(st, m.all_units(), b.tokens.data(), b.targets.data(), nullptr, b.B, b.seq);
  EXPECT_THROW(m.backward(st, 0.1, nullptr, BackwardPass::weight), Error);  // forward only
  m.backward(st, 0.1, nullptr, BackwardPass::input);
  EXPECT_THROW(m.backward(st, 0.1, nullptr, BackwardPass::input), Error);  // input twice
  EXPECT_THROW(m.backward(st, 0.1, nullptr, BackwardPass::full), Error);   // full over a pending weight pass
  // A forward over the state would silently drop the pending weight gradients.
  EXPECT_THROW(m.forward(st, m.all_units(), b.tokens.data(), b.targets.data(), nullptr, b.B, b.seq), Error);
  m.backward(st, 0.1, nullptr, BackwardPass::weight);
  EXPECT_THROW(m.backward(st, 0.1, nullptr, BackwardPass::weight), Error);  // weight twice
  EXPECT_EQ(st.activation_bytes(), 0);
  // A full backward still runs (and needs a forward) after a split one.
  m.forward(st, m.all_units(), b.tokens.data(), b.targets.data(), nullptr, b.B, b.seq);
  m.backward(st, 0.1);
  EXPECT_THROW(m.backward(st, 0.1, nullptr, BackwardPass::weight), Error);
}

struct Recorder : UnitHooks {
  std::vector<std::string> log;
  void before_recompute(int u) override { log.push_back("recompute " + std::to_string(u)); }
  void before_backward(int u) override { log.push_back("before_backward " + std::to_string(u)); }
  void after_backward_input(int u) override { log.push_back("after_backward_input " + std::to_string(u)); }
  void before_backward_weight(int u) override { log.push_back("before_backward_weight " + std::to_string(u)); }
  void after_backward(int u) override { log.push_back("after_backward " + std::to_string(u)); }
};

// units.h: whole: before_backward, after_backward; split: before_backward, [recompute],
// after_backward_input per unit, last to first; later before_backward_weight, after_backward per
// unit, last to first. Recompute (every:2) happens in the input pass only.
TEST(SplitBackward, HooksBracketEachPass) {
  LlamaConfig cfg = odd_config();
  cfg.num_hidden_layers = 2;  // units 0..3; every:2 keeps x_0 only, so block 1 reruns blocks 0 and 1
  const test::Batch b = test::make_batch(2, 5, cfg.vocab_size, 7, false);
  for (const char* ac : {"none", "every:2"}) {
    SCOPED_TRACE(ac);
    Llama<float> m(cfg);
    m.set_checkpointing(Checkpointing::parse(ac, 2));
    m.init_weights(5);
    m.zero_grad();
    Recorder rec;
    ScopedHooks<float> hooks(m, &rec);
    MicroBatchState<float> st;
    const std::vector<std::string> recompute =
        std::string(ac) == "none" ? std::vector<std::string>{} : std::vector<std::string>{"recompute 1", "recompute 2"};

    m.forward(st, m.all_units(), b.tokens.data(), b.targets.data(), nullptr, b.B, b.seq);
    m.backward(st, 0.1f);
    std::vector<std::string> whole = {"before_backward 3", "after_backward 3", "before_backward 2"};
    whole.insert(whole.end(), recompute.begin(), recompute.end());
    for (const char* s : {"after_backward 2", "before_backward 1", "after_backward 1", "before_backward 0",
                          "after_backward 0"})
      whole.push_back(s);
    EXPECT_EQ(rec.log, whole);

    rec.log.clear();
    m.forward(st, m.all_units(), b.tokens.data(), b.targets.data(), nullptr, b.B, b.seq);
    m.backward(st, 0.1f, nullptr, BackwardPass::input);
    std::vector<std::string> input = {"before_backward 3", "after_backward_input 3", "before_backward 2"};
    input.insert(input.end(), recompute.begin(), recompute.end());
    for (const char* s : {"after_backward_input 2", "before_backward 1", "after_backward_input 1", "before_backward 0",
                          "after_backward_input 0"})
      input.push_back(s);
    EXPECT_EQ(rec.log, input);

    rec.log.clear();
    m.backward(st, 0.1f, nullptr, BackwardPass::weight);
    const std::vector<std::string> weight = {"before_backward_weight 3", "after_backward 3", "before_backward_weight 2",
                                             "after_backward 2",         "before_backward_weight 1", "after_backward 1",
                                             "before_backward_weight 0", "after_backward 0"};
    EXPECT_EQ(rec.log, weight);
  }
}

}  // namespace
}  // namespace llama4d
