// Training steps whose ops queue on the GPU's stream (Trainer::step_queued, as `llama4d train`
// and `bench` run one rank) against steps whose every op waits for its kernels: the same losses,
// gradient norms and parameters, bit for bit. A host read that raced a queued kernel (a buffer
// read or written by host code before the kernels that use it ran) would change them.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../train/train_test_util.h"
#include "core/data/dataset.h"
#include "core/model/checkpointing.h"
#include "core/model/llama.h"
#include "core/ops.h"
#include "core/train/trainer.h"
#include "cuda_test_util.h"

namespace llama4d {
namespace {

struct Run {
  std::vector<StepStats> steps;
  std::vector<float> params;
};

// What a step runs: bf16 mixed precision or fp32, a checkpointing policy (recomputation in the
// backward), document masks (ids in backend memory read by attention).
struct Setup {
  bool bf16 = false;
  const char* ac = "none";
  bool doc_mask = false;
};

Run train(const TextDataset& data, const Setup& setup, bool queued, int64_t steps) {
  test::OnGpu on;
  const LlamaConfig cfg = test::tiny_config();
  TrainOptions opt = test::tiny_options(steps);
  opt.bf16_compute = setup.bf16;
  opt.doc_mask = setup.doc_mask;
  opt.grad_clip = 1.0;  // active: the untrained model's gradient norm is above 1
  Llama<float> model(cfg);
  model.set_checkpointing(Checkpointing::parse(setup.ac, int(cfg.num_hidden_layers)));
  model.init_weights(opt.seed);
  Trainer<float> trainer(model, data, opt);
  Run r;
  for (int64_t s = 0; s < steps; ++s) r.steps.push_back(queued ? trainer.step_queued() : trainer.step());
  r.params.resize(size_t(model.num_params()));
  ops::device_memcpy(r.params.data(), model.params(), model.num_params() * int64_t(sizeof(float)));
  return r;
}

// Whether this GPU lets ops queue at all (the backend keeps waiting where the device cannot share
// managed memory with the host while kernels run): without it both runs wait and prove nothing.
bool gpu_queues_ops() {
  test::OnGpu on;
  ops::QueuedOps probe;
  const bool queuing = probe.queuing();
  probe.finish();
  return queuing;
}

void expect_queued_steps_keep_their_bits(const Setup& setup) {
  if (!gpu_queues_ops()) GTEST_SKIP() << "this GPU cannot queue ops (no concurrent managed access): nothing to compare";
  const TextDataset data = make_dataset(test::small_corpus(), test::tiny_options(3).seq_len);
  const Run waited = train(data, setup, false, 3), queued = train(data, setup, true, 3);
  ASSERT_EQ(queued.steps.size(), waited.steps.size());
  for (size_t s = 0; s < waited.steps.size(); ++s) {
    EXPECT_EQ(queued.steps[s].loss, waited.steps[s].loss) << "step " << s + 1;
    EXPECT_EQ(queued.steps[s].grad_norm, waited.steps[s].grad_norm) << "step " << s + 1;
  }
  ASSERT_EQ(queued.params.size(), waited.params.size());
  EXPECT_EQ(std::memcmp(queued.params.data(), waited.params.data(), waited.params.size() * sizeof(float)), 0)
      << "the parameters after 3 queued steps differ from those after 3 steps whose every op waited";
}

TEST(CudaQueuedSteps, KeepTheBitsOfStepsWhoseEveryOpWaitsFp32) {
  LLAMA4D_REQUIRE_GPU();
  expect_queued_steps_keep_their_bits({});
}

TEST(CudaQueuedSteps, KeepTheBitsOfStepsWhoseEveryOpWaitsBf16) {
  LLAMA4D_REQUIRE_GPU();
  expect_queued_steps_keep_their_bits({.bf16 = true});
}

TEST(CudaQueuedSteps, KeepTheBitsWithRecomputationAndDocumentMasks) {
  LLAMA4D_REQUIRE_GPU();
  expect_queued_steps_keep_their_bits({.bf16 = true, .ac = "selective", .doc_mask = true});
  expect_queued_steps_keep_their_bits({.ac = "full"});
}

}  // namespace
}  // namespace llama4d
