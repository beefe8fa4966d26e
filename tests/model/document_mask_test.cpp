// Document masking at the model level. Under the mask a row that packs several documents must
// compute exactly what those documents compute when each runs alone: no attention crosses a
// boundary. RoPE makes attention depend only on the distance between positions, so a document
// run alone from position 0 gives the logits it gives at its place in the row, to rounding (its
// queries and keys are rotated by other angles). The loss of the row is the sum of the
// documents' losses and its gradients the sum of theirs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "model_test_util.h"

namespace llama4d {
namespace {

struct Segment {
  int64_t row, begin, end;  // positions [begin, end) of one batch row: one document
};

TEST(DocumentMask, PackedRowsComputeWhatTheirDocumentsComputeApart) {
  const LlamaConfig cfg = test::tiny_config(false, false);
  const int64_t B = 2, T = 16, V = cfg.vocab_size;
  const test::Batch b = test::make_batch(B, T, V, 21, false);
  // Row 0 packs three documents (5, 6 and 5 tokens), row 1 holds one.
  std::vector<int32_t> docs(size_t(B * T), 0);
  for (int64_t t = 5; t < 11; ++t) docs[size_t(t)] = 1;
  for (int64_t t = 11; t < 16; ++t) docs[size_t(t)] = 2;
  const std::vector<Segment> segments = {{0, 0, 5}, {0, 5, 11}, {0, 11, 16}, {1, 0, 16}};

  Llama<double> packed(cfg), apart(cfg);
  packed.init_weights(5);
  test::perturb_params(packed, 9);
  std::copy(packed.params(), packed.params() + packed.num_params(), apart.params());

  packed.zero_grad();
  const double packed_loss = packed.forward(b.tokens.data(), b.targets.data(), B, T, docs.data()).loss_sum;
  const std::vector<double> packed_logits(packed.logits(), packed.logits() + B * T * V);
  packed.backward(1.0);

  // Each document alone, at positions 0 .., gradients accumulating over the documents.
  apart.zero_grad();
  double apart_loss = 0;
  for (const Segment& s : segments) {
    SCOPED_TRACE("row " + std::to_string(s.row) + " positions " + std::to_string(s.begin) + ".." + std::to_string(s.end));
    const int64_t n = s.end - s.begin, at = s.row * T + s.begin;
    apart_loss += apart.forward(b.tokens.data() + at, b.targets.data() + at, 1, n).loss_sum;
    EXPECT_LE(test::rel_error(packed_logits.data() + at * V, apart.logits(), n * V), 1e-12);
    apart.backward(1.0);
  }
  EXPECT_NEAR(packed_loss, apart_loss, 1e-12 * apart_loss);
  for (const ParamSpec& p : packed.param_specs())
    EXPECT_LE(test::rel_error(packed.grads() + p.offset, apart.grads() + p.offset, p.numel), 1e-12) << p.name;

  // Without the mask the later documents see the earlier ones: their logits move.
  packed.forward(b.tokens.data(), b.targets.data(), B, T);
  EXPECT_GT(test::rel_error(packed.logits() + 5 * V, packed_logits.data() + 5 * V, 11 * V), 1e-3);
  packed.backward(1.0);
}

TEST(DocumentMask, DecreasingIdsAreAnInputError) {
  const LlamaConfig cfg = test::tiny_config(false, false);
  Llama<double> model(cfg);
  model.init_weights(1);
  const test::Batch b = test::make_batch(1, 8, cfg.vocab_size, 3, false);
  const std::vector<int32_t> docs = {0, 0, 1, 1, 0, 2, 2, 2};
  try {
    model.forward(b.tokens.data(), b.targets.data(), 1, 8, docs.data());
    FAIL() << "decreasing document ids accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("from 1 to 0 at position 4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace llama4d
