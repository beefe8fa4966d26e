#pragma once
// How the forward and backward passes of one optimizer step run on a rank, apart from what the
// data-parallel strategy does with the gradients they produce:
//   SequentialPasses   the rank's whole model, one micro-batch after another (every plan
//                      without pipeline parallelism);
//   PipelineRunner     a pipeline schedule over this rank's stages (pipeline_parallel.h).
// The strategy hears, through PassEvents, when each backward pass that writes weight gradients
// (a backward, or the W half of a split one) begins and ends, so it knows which micro-batch's
// gradients are final: DP launches its all-reduces during the last one, ZeRO-2/3 reduce-scatter
// during every one.
#include <vector>

#include "core/data/batch_sampler.h"
#include "core/model/llama.h"
#include "core/train/trainer.h"

namespace llama4d {

class PassEvents {
 public:
  virtual ~PassEvents() = default;
  // Around a backward pass of micro-batch `micro_batch` (of `count` this step) that adds
  // weight gradients; the units it runs call the model's hooks in between. A pipeline rank with
  // several model chunks has one such pass per chunk and micro-batch; the passes over any one
  // unit always come in micro-batch order.
  virtual void begin_backward_pass(int micro_batch, int count) = 0;
  virtual void end_backward_pass(int micro_batch, int count) = 0;
};

template <class T>
class Passes {
 public:
  virtual ~Passes() = default;
  // Forward and backward of every micro-batch; gradients accumulate into the model's unit
  // gradients. Returns the summed loss of the micro-batches whose loss this rank computed.
  virtual LossSum train(Llama<T>& model, const std::vector<Batch>& micro_batches, T loss_scale, PassEvents& events) = 0;
  // Forward only, no state kept: the loss sum of `batch` where this rank computes it.
  virtual LossSum evaluate(Llama<T>& model, const Batch& batch) = 0;
  // Mixture of experts: the aux_loss and expert_tokens of the last train() over this rank's
  // micro-batches (add_routing, core/train/trainer.h); the parallel trainer sums them over the
  // data ranks. Empty for a dense model (and under a pipeline, which runs no MoE model).
  StepStats routing;
  std::vector<double> aux_terms;  // (share, aux) of each of those micro-batches, in order
};

template <class T>
class SequentialPasses final : public Passes<T> {
 public:
  LossSum train(Llama<T>& model, const std::vector<Batch>& micro_batches, T loss_scale, PassEvents& events) override {
    LossSum total;
    this->routing = {};
    this->aux_terms.clear();
    const int count = int(micro_batches.size());
    for (int m = 0; m < count; ++m) {
      const Batch& b = micro_batches[size_t(m)];
      const LossSum part = model.forward(b.tokens.data(), b.targets.data(), b.B, b.seq, b.documents());
      total.loss_sum += part.loss_sum;
      total.tokens += part.tokens;
      if (model.config().moe()) {
        const double share = double(b.B * b.seq) * double(loss_scale);
        add_routing(this->routing, model, share);
        this->aux_terms.insert(this->aux_terms.end(), {share, model.aux_loss()});
      }
      events.begin_backward_pass(m, count);
      model.backward(loss_scale);
      events.end_backward_pass(m, count);
    }
    return total;
  }
  LossSum evaluate(Llama<T>& model, const Batch& b) override {
    MicroBatchState<T> st;  // dropped at once: no backward follows
    return model.forward(st, model.all_units(), b.tokens.data(), b.targets.data(), nullptr, b.B, b.seq, b.documents());
  }
};

}  // namespace llama4d
