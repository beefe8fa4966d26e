// The training loop: it learns, micro-batching computes the gradient of the same global mean,
// and the schedule / clipping reach the optimizer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/data/batch_sampler.h"
#include "core/error.h"
#include "core/train/evaluate.h"
#include "core/train/trainer.h"
#include "train_test_util.h"

namespace llama4d {
namespace {

TEST(Trainer, LossDecreasesOnTinyCorpus) {
  const TextDataset data = make_dataset(test::small_corpus(), 32);
  TrainOptions opt = test::tiny_options(40);
  Llama<float> m(test::tiny_config());
  m.init_weights(opt.seed);
  Trainer<float> t(m, data, opt);
  const double before = t.validation_loss(8).mean();
  // An untrained model is close to uniform over the 264-token vocabulary.
  EXPECT_NEAR(before, std::log(264.0), 0.3);
  double last = 0;
  for (int i = 0; i < 40; ++i) last = t.step().loss;
  const double after = t.validation_loss(8).mean();
  EXPECT_LT(last, before - 1.0);
  EXPECT_LT(after, before - 1.0);
}

// One optimizer step with 1 micro-batch of 4 rows and with 4 micro-batches of 1 row compute the
// same gradient of the same global mean loss, up to summation order (fp64: ~1e-15).
TEST(Trainer, MicroBatchingGivesTheGlobalMeanGradient) {
  const TextDataset data = make_dataset(test::small_corpus(), 32);
  TrainOptions whole = test::tiny_options(1), split = whole;
  whole.micro_batch_size = 4;
  split.micro_batch_size = 1;
  whole.grad_clip = split.grad_clip = 0;
  Llama<double> a(test::tiny_config()), b(test::tiny_config());
  a.init_weights(3);
  b.init_weights(3);
  Trainer<double> ta(a, data, whole), tb(b, data, split);
  const StepStats sa = ta.step(), sb = tb.step();
  EXPECT_NEAR(sa.loss, sb.loss, 1e-12);
  EXPECT_NEAR(sa.grad_norm, sb.grad_norm, 1e-12 * sa.grad_norm);
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < a.num_params(); ++i) {
    worst = std::max(worst, std::abs(a.grads()[i] - b.grads()[i]));
    scale = std::max(scale, std::abs(a.grads()[i]));
  }
  EXPECT_LT(worst, 1e-12 * scale);

  // And the loss it reports is the mean over the global batch, computed independently here.
  Llama<double> c(test::tiny_config());
  c.init_weights(3);
  const Batch batch = sample_batch(data.train(), whole.seq_len, whole.seed, 0, whole.batch_size);
  const LossSum ls = c.forward(batch.tokens.data(), batch.targets.data(), batch.B, batch.seq);
  EXPECT_EQ(ls.tokens, whole.tokens_per_step());
  EXPECT_NEAR(ls.mean(), sa.loss, 1e-12);
}

TEST(Trainer, ClippingBoundsTheUpdateNormAndReportsThePreClipNorm) {
  const TextDataset data = make_dataset(test::small_corpus(), 32);
  TrainOptions opt = test::tiny_options(1);
  opt.grad_clip = 1e-3;  // far below the natural gradient norm
  Llama<double> m(test::tiny_config());
  m.init_weights(5);
  Trainer<double> t(m, data, opt);
  const StepStats st = t.step();
  EXPECT_GT(st.grad_norm, 1e-2);
  double sq = 0;
  for (int64_t i = 0; i < m.num_params(); ++i) sq += m.grads()[i] * m.grads()[i];
  EXPECT_NEAR(std::sqrt(sq), 1e-3, 1e-6);  // gradients were scaled to the clip norm
}

TEST(Trainer, RejectsBadOptions) {
  const TextDataset data = make_dataset(test::small_corpus(), 32);
  Llama<float> m(test::tiny_config());
  TrainOptions opt = test::tiny_options(5);
  opt.micro_batch_size = 3;  // 4 rows do not split into micro-batches of 3
  EXPECT_THROW(Trainer<float>(m, data, opt), InputError);
  opt = test::tiny_options(5);
  opt.seq_len = 100000;
  EXPECT_THROW(Trainer<float>(m, data, opt), InputError);
}

// Activation checkpointing changes what is stored, never what is computed: three AdamW steps
// (two micro-batches each, clipping on) with every policy end with the same losses, gradient
// norms and parameters, bit for bit, as keeping every activation.
TEST(Trainer, ActivationCheckpointingIsBitwiseAfterThreeSteps) {
  const TextDataset data = make_dataset(test::small_corpus(), 32);
  TrainOptions opt = test::tiny_options(3);
  opt.micro_batch_size = opt.batch_size / 2;
  LlamaConfig cfg = test::tiny_config();
  cfg.num_hidden_layers = 3;
  std::vector<float> reference;
  std::vector<double> ref_losses, ref_norms;
  for (const char* spec : {"none", "selective", "full", "every:2", "every:sqrt"}) {
    Llama<float> m(cfg);
    m.set_checkpointing(Checkpointing::parse(spec, int(cfg.num_hidden_layers)));
    m.init_weights(opt.seed);
    Trainer<float> t(m, data, opt);
    std::vector<double> losses, norms;
    for (int i = 0; i < 3; ++i) {
      const StepStats st = t.step();
      losses.push_back(st.loss);
      norms.push_back(st.grad_norm);
    }
    const std::vector<float> params(m.params(), m.params() + m.num_params());
    if (std::string(spec) == "none") {
      reference = params, ref_losses = losses, ref_norms = norms;
      continue;
    }
    EXPECT_EQ(losses, ref_losses) << spec;
    EXPECT_EQ(norms, ref_norms) << spec;
    EXPECT_EQ(0, std::memcmp(params.data(), reference.data(), params.size() * sizeof(float))) << spec;
  }
}

}  // namespace
}  // namespace llama4d
