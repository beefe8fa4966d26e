// Validation loss with document masks and a window limit (--doc-mask, --eval-windows), on one
// device and under parallel plans, against a reference built here from its definition: the
// first k windows of seq_len tokens of the validation split (window w: tokens [w T, (w+1) T),
// each predicting the next), each window cut into its documents after every <|end_of_text|>,
// and every document run through the model on its own as one sequence starting at position 0.
// A document-masked token attends to the earlier tokens of its document alone, and RoPE's
// scores depend only on the distance between positions, so the two agree to rounding (fp64:
// 1e-12 relative), while attention across documents, a missed limit or a window counted twice
// moves the sum far more.
#include <gtest/gtest.h>

#include <cmath>

#include "core/data/batch_sampler.h"
#include "core/train/evaluate.h"
#include "core/train/trainer.h"
#include "parallel_test_util.h"
#include "tests/common/tier.h"

namespace llama4d {
namespace {

constexpr int64_t kSeq = 24;  // 2 cp chunks of 6 tokens at cp = 2; windows hold 2 to 4 documents

// Every token of the first `windows` windows (all of them whole: tokens and targets inside the
// split), document by document, through the whole model one document at a time.
LossSum by_documents(Llama<double>& model, TokenSpan split, int64_t windows, int32_t separator, int64_t* documents) {
  LossSum total;
  *documents = 0;
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t begin = w * kSeq, end = begin + kSeq;
    EXPECT_LT(end, int64_t(split.size())) << "window " << w << " must be whole";
    for (int64_t a = begin; a < end;) {
      int64_t b = a;
      while (b < end && split[size_t(b)] != separator) ++b;
      b = std::min(end, b + 1);  // the separator ends its document
      std::vector<int32_t> tokens(split.begin() + a, split.begin() + b), targets(split.begin() + a + 1, split.begin() + b + 1);
      const LossSum part = model.forward(tokens.data(), targets.data(), 1, b - a);
      total.loss_sum += part.loss_sum;
      total.tokens += part.tokens;
      ++*documents;
      a = b;
    }
  }
  return total;
}

// The same windows with attention across documents (no mask), as the reference that must differ.
LossSum whole_windows(Llama<double>& model, TokenSpan split, int64_t windows) {
  LossSum total;
  for (int64_t w = 0; w < windows; ++w) {
    std::vector<int32_t> tokens(split.begin() + w * kSeq, split.begin() + (w + 1) * kSeq),
        targets(split.begin() + w * kSeq + 1, split.begin() + (w + 1) * kSeq + 1);
    const LossSum part = model.forward(tokens.data(), targets.data(), 1, kSeq);
    total.loss_sum += part.loss_sum;
    total.tokens += part.tokens;
  }
  return total;
}

TrainOptions options() {
  TrainOptions o = test::options(1, 1);
  o.batch_size = 2;
  o.seq_len = kSeq;
  o.doc_mask = true;
  return o;
}

// 5 windows of the split's more: odd, so dp = 2 splits them 2 + 3 (and one rank evaluates a
// spare window it drops), and fewer than all, so the limit matters.
constexpr int64_t kWindows = 5;

struct Reference {
  LossSum masked, unmasked;
};

const Reference& reference() {
  static const Reference ref = [] {
    const TextDataset& data = test::document_corpus();
    const TokenSpan val = data.validation();
    EXPECT_GT(num_eval_windows(int64_t(val.size()), kSeq), kWindows + 1);
    MemoryTracker memory(0, 0);
    Llama<double> model(LlamaConfig::preset("tiny"), &memory);
    model.init_weights(options().seed);
    Reference r;
    int64_t documents = 0;
    r.masked = by_documents(model, val, kWindows, options().doc_separator, &documents);
    EXPECT_GE(documents, 2 * kWindows);  // every window is cut at least once
    r.unmasked = whole_windows(model, val, kWindows);
    return r;
  }();
  return ref;
}

void expect_reference(const LossSum& got, const LossSum& want, const std::string& where) {
  EXPECT_EQ(got.tokens, want.tokens) << where;
  EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-12 * want.loss_sum) << where;
}

TEST(ValidationLoss, ReferenceCanTellTheMaskAndTheLimit) {
  const Reference& r = reference();
  EXPECT_EQ(r.masked.tokens, kWindows * kSeq);  // every token of the k windows predicts once
  EXPECT_EQ(r.unmasked.tokens, r.masked.tokens);
  EXPECT_GT(std::abs(r.unmasked.loss_sum - r.masked.loss_sum), 1e-6 * r.masked.loss_sum);
}

// One device: evaluate_loss with the mask and the limit (two windows per forward, as a
// micro-batch of 2 would), and the Trainer's validation_loss.
TEST(ValidationLoss, OneDeviceEqualsTheDocumentByDocumentReference) {
  const TextDataset& data = test::document_corpus();
  MemoryTracker memory(0, 0);
  Llama<double> model(LlamaConfig::preset("tiny"), &memory);
  model.init_weights(options().seed);
  expect_reference(evaluate_loss(model, data.validation(), kSeq, 2, kWindows, true, options().doc_separator),
                   reference().masked, "evaluate_loss");
  expect_reference(evaluate_loss(model, data.validation(), kSeq, 2, kWindows, false), reference().unmasked,
                   "evaluate_loss without the mask");
  Trainer<double> trainer(model, data, options());
  expect_reference(trainer.validation_loss(kWindows), reference().masked, "Trainer");
}

// Every rank of each plan reports the whole validation loss: windows split over the data ranks,
// rows over the tensor ranks' vocabulary, each row's tokens over the context ranks (the mask
// read at their true positions), layers over the pipeline stages.
TEST(ValidationLoss, ParallelPlansEqualTheDocumentByDocumentReference) {
  const struct {
    const char* mesh;
    ZeroStage zero;
    ContextAlgo cp_algo;
  } cases[] = {{"dp=2", ZeroStage::zero3, ContextAlgo::allgather},
               {"cp=2", ZeroStage::none, ContextAlgo::ring},
               {"tp=2,cp=2,pp=2,dp=2", ZeroStage::zero1, ContextAlgo::allgather}};
  const TextDataset& data = test::document_corpus();
  const LlamaConfig cfg = LlamaConfig::preset("tiny");
  for (const auto& c : cases) {
    ParallelPlan plan = ParallelPlan::parse(c.mesh);
    plan.zero = c.zero;
    plan.cp_algo = c.cp_algo;
    std::vector<LossSum> got(size_t(plan.world_size()));
    test::virtual_launcher(plan.world_size())([&](ProcessGroup& world) {
      Llama<double> model = plan.make_model<double>(cfg, world.memory(), world.rank());
      ParallelTrainer<double> trainer(world, model, data, options(), plan);
      got[size_t(world.rank())] = trainer.validation_loss(kWindows);
    });
    for (size_t r = 0; r < got.size(); ++r)
      expect_reference(got[r], reference().masked, std::string(c.mesh) + " rank " + std::to_string(r));
  }
}
LLAMA4D_TIER(ValidationLoss, ParallelPlansEqualTheDocumentByDocumentReference, sanitizer);  // 16 virtual ranks

}  // namespace
}  // namespace llama4d
