// Pipeline parallelism, top to bottom.
//
// The model's layers are cut into stages (pipeline_layout.h); pipeline rank r holds only its
// stages' units, so it allocates only their weights, gradients and optimizer state (its model
// is built with those units; the others' segments are empty). A step's micro-batches flow
// through the stages: a stage runs a micro-batch's forward as soon as the previous stage sent
// its activation [b, s, h], and its backward as soon as the next stage sent the gradient of that
// activation back. The ORDER in which a rank runs its forwards and backwards is the schedule,
// a list of actions per rank (pipeline_schedule.h: GPipe, 1F1B, interleaved 1F1B, ZB-H1); this
// file runs any such list:
//
//   recv activation m.c   wait for micro-batch m's input of chunk c from the previous stage
//   F m.c                 forward of chunk c's units; keeps m's activations (MicroBatchState)
//   send activation m.c   the chunk's output to the next stage (buffered: never waits)
//   recv gradient m.c     wait for the gradient of that output from the next stage
//   B m.c                 backward of chunk c: weight gradients accumulate, the input's gradient
//                         is left in the state; frees m's activations
//   I m.c / W m.c         the same backward in two halves (zero-bubble schedules): I computes
//                         only the input gradient (what the previous stage waits for) and keeps
//                         what W needs; W adds the weight gradients later, when nobody waits
//   send gradient m.c     the input gradient to the previous stage
//
// Deadlock. Sends are buffered and every receive is waited for right where the list puts it,
// so a rank only ever blocks on a message another rank's list sends earlier in its own order;
// the schedules are built that way and simulate_pipeline_schedule checks it. A wrong list
// fails: the receive times out (the group's timeout) with an error naming this rank and the
// action ("pipeline: recv gradient 3 from rank 2").
//
// Exactness. Every rank runs the backwards of one unit in micro-batch order, whatever the
// schedule, so a unit's gradient accumulates micro-batch 0, 1, ..., m-1 exactly as one device
// accumulating the same micro-batches does: the results are bitwise equal. The loss is summed
// on the last stage in micro-batch order; the data-parallel strategy adds it (and the gradient
// norm's partials) over the pipeline group, where the other stages contribute exact zeros.
//
// Traffic per step per stage boundary: m activations forward and m gradients backward, each
// b * s * h elements (b rows per micro-batch, s tokens, h hidden; /tp rows each with sequence
// parallelism): 2 m b s h elements. Interleaving with v chunks crosses p v - 1 boundaries
// instead of p - 1.
#include "core/parallel/pipeline_parallel.h"

#include <algorithm>

#include "core/comm/trace.h"
#include "core/error.h"
#include "core/parallel/pipeline_picture.h"
#include "core/comm/traffic_labels.h"

namespace llama4d {

namespace {

using Op = PipelineAction::Op;

// The action's span on the rank's trace, in the one format pipeline_picture() reads.
std::string span_name(const PipelineAction& a) {
  const char op = a.op == Op::forward ? 'F' : a.op == Op::backward ? 'B' : a.op == Op::backward_input ? 'I' : 'W';
  return pipeline_span_name(op, a.micro_batch, a.chunk);
}

// Elements of the residual stream [B*T, C] this rank holds: its rows under sequence parallelism.
template <class T>
int64_t boundary_numel(const Llama<T>& model, const Batch& b) {
  const TpLayout& tp = model.tp_layout();
  const int64_t BT = b.B * b.seq, sp = tp.sequence_parallel ? tp.tp : 1, r = tp.sequence_parallel ? tp.rank : 0;
  return (BlockDims::sequence_row0(BT, sp, r + 1) - BlockDims::sequence_row0(BT, sp, r)) * model.config().hidden_size;
}

}  // namespace

template <class T>
PipelineRunner<T>::PipelineRunner(ProcessGroup& pipeline, PipelineScheduleKind kind, const PipelineLayout& layout)
    : pp_(pipeline), kind_(kind), layout_(layout) {
  if (pipeline.size() != layout.ranks)
    throw Error("PipelineRunner: the pipeline group has " + std::to_string(pipeline.size()) + " ranks, the layout " +
                std::to_string(layout.ranks));
}

template <class T>
const PipelineSchedule& PipelineRunner<T>::schedule(int m) {
  if (!schedule_ || schedule_->micro_batches != m) {
    PipelineSchedule s = make_pipeline_schedule(kind_, layout_.ranks, m, layout_.chunks);
    simulate_pipeline_schedule(s);  // checks it is well formed and cannot deadlock
    schedule_ = std::move(s);
  }
  return *schedule_;
}

template <class T>
LossSum PipelineRunner<T>::train(Llama<T>& model, const std::vector<Batch>& micro_batches, T loss_scale,
                                 PassEvents& events) {
  const int M = int(micro_batches.size()), v = layout_.chunks, rank = pp_.rank();
  const PipelineSchedule& s = schedule(M);
  const std::vector<UnitRange> chunks = layout_.rank_units(rank, model.num_layers());
  const int head = head_unit(model.num_layers());
  // Per (micro-batch, chunk), index m * v + c: the activations kept from forward to backward,
  // a received activation or gradient until its action consumes it, the sends of its output.
  std::vector<MicroBatchState<T>> states(size_t(M * v));
  std::vector<Buffer<T>> inbox(size_t(M * v));
  std::vector<std::shared_ptr<Work>> activation_sent(size_t(M * v)), gradient_sent(size_t(M * v));
  RankTrace& trace = pp_.trace();
  LossSum loss;
  int in_flight = 0;
  peak_in_flight_ = 0;

  // A sent input gradient is freed once its send has buffered it. This is a poll, which never
  // moves the simulated clock, so how many are still held depends on this laptop's comm threads:
  // usually a few, at worst all m until the step's end (measured peaks of scratch vary by it).
  auto free_sent_gradients = [&] {
    for (size_t j = 0; j < gradient_sent.size(); ++j)
      if (gradient_sent[j] && gradient_sent[j]->is_completed()) {
        gradient_sent[j]->collect();  // rethrows a failed send
        gradient_sent[j].reset();
        states[j].input_grad.reset();
      }
  };

  for (const PipelineAction& a : s.actions[size_t(rank)]) {
    const size_t k = size_t(a.micro_batch * v + a.chunk);
    if (a.is_compute()) free_sent_gradients();
    const Batch& b = micro_batches[size_t(a.micro_batch)];
    const UnitRange units = chunks[size_t(a.chunk)];
    MicroBatchState<T>& st = states[k];
    const int64_t n = boundary_numel(model, b);
    const std::string name = std::string(label::kPipeline) + a.describe(v > 1);
    switch (a.op) {
      case Op::recv_activation:
      case Op::recv_gradient: {
        inbox[k] = Buffer<T>(&model.memory(), MemoryCategory::comm_buffers, n, a.op == Op::recv_activation ? "received activation" : "received gradient");
        RecvOptions o{.tag = s.tag(rank, a), .label = name};
        pp_.recv(inbox[k].data(), n, dtype_of<T>(), a.peer, o)->wait();
        break;
      }
      case Op::send_activation:
      case Op::send_gradient: {
        // The output stays in the state until its backward (activation) or until the send has
        // buffered it (input gradient), so the send may read it later.
        const T* src = a.op == Op::send_activation ? st.x[size_t(units.end - 1)].data() : st.input_grad.data();
        SendOptions o{.tag = s.tag(rank, a), .async_op = true, .label = name};
        (a.op == Op::send_activation ? activation_sent : gradient_sent)[k] = pp_.send(src, n, dtype_of<T>(), a.peer, o);
        break;
      }
      case Op::forward: {
        ComputeScope span(trace, span_name(a));
        const bool first = units.contains(embedding_unit()), last = units.contains(head);
        const LossSum part = model.forward(st, units, first ? b.tokens.data() : nullptr, last ? b.targets.data() : nullptr,
                                           first ? nullptr : inbox[k].data(), b.B, b.seq, b.documents());
        inbox[k].reset();
        loss.loss_sum += part.loss_sum;
        loss.tokens += part.tokens;
        peak_in_flight_ = std::max(peak_in_flight_, ++in_flight);
        break;
      }
      case Op::backward:
      case Op::backward_input:
      case Op::backward_weight: {
        if (activation_sent[k]) activation_sent[k]->wait();  // the backward frees what it sent
        activation_sent[k].reset();
        const bool adds_weight_grads = a.op != Op::backward_input;
        if (adds_weight_grads) events.begin_backward_pass(a.micro_batch, M);
        {
          ComputeScope span(trace, span_name(a));
          const BackwardPass pass = a.op == Op::backward         ? BackwardPass::full
                                    : a.op == Op::backward_input ? BackwardPass::input
                                                                 : BackwardPass::weight;
          model.backward(st, loss_scale, a.op == Op::backward_weight ? nullptr : inbox[k].data(), pass);
        }
        inbox[k].reset();
        if (adds_weight_grads) {
          events.end_backward_pass(a.micro_batch, M);
          --in_flight;
        }
        break;
      }
    }
  }
  for (auto& w : gradient_sent)
    if (w) w->wait();
  return loss;
}

template <class T>
LossSum PipelineRunner<T>::evaluate(Llama<T>& model, const Batch& b) {
  // One batch through every virtual stage in order: chunk 0 on ranks 0..p-1, then chunk 1, ...
  const int rank = pp_.rank(), p = layout_.ranks, S = layout_.virtual_stages();
  PipelineSchedule tags;  // the tag arithmetic only
  tags.ranks = p, tags.chunks = layout_.chunks;
  const std::vector<UnitRange> chunks = layout_.rank_units(rank, model.num_layers());
  const int64_t n = boundary_numel(model, b);
  LossSum loss;
  for (int c = 0; c < layout_.chunks; ++c) {
    const int stage = c * p + rank;
    const UnitRange units = chunks[size_t(c)];
    Buffer<T> in;
    if (stage > 0) {
      const PipelineAction a{Op::recv_activation, 0, c, (stage - 1) % p};
      in = Buffer<T>(&model.memory(), MemoryCategory::comm_buffers, n, "received activation");
      RecvOptions o{.tag = tags.tag(rank, a), .label = "pipeline (evaluation): " + a.describe(layout_.chunks > 1)};
      pp_.recv(in.data(), n, dtype_of<T>(), a.peer, o)->wait();
    }
    MicroBatchState<T> st;  // dropped after the send: no backward follows
    const bool first = stage == 0, last = stage == S - 1;
    const LossSum part = model.forward(st, units, first ? b.tokens.data() : nullptr, last ? b.targets.data() : nullptr,
                                       first ? nullptr : in.data(), b.B, b.seq, b.documents());
    loss.loss_sum += part.loss_sum;
    loss.tokens += part.tokens;
    if (!last) {
      const PipelineAction a{Op::send_activation, 0, c, (stage + 1) % p};
      SendOptions o{.tag = tags.tag(rank, a), .label = "pipeline (evaluation): " + a.describe(layout_.chunks > 1)};
      pp_.send(st.x[size_t(units.end - 1)].data(), n, dtype_of<T>(), a.peer, o)->wait();
    }
  }
  return loss;
}

void run_modelled_pipeline(ProcessGroup& pp, const PipelineSchedule& s, const StageCosts& c) {
  const int rank = pp.rank();
  for (const PipelineAction& a : s.actions[size_t(rank)]) {
    if (a.is_compute()) {
      const double us = a.op == Op::forward           ? c.forward
                        : a.op == Op::backward        ? c.backward_input + c.backward_weight
                        : a.op == Op::backward_input  ? c.backward_input
                                                      : c.backward_weight;
      ComputeScope span(pp.trace(), span_name(a), us);
      continue;
    }
    const bool recv = a.op == Op::recv_activation || a.op == Op::recv_gradient;
    const std::string name = std::string(label::kPipeline) + a.describe(s.chunks > 1);
    if (recv) {
      RecvOptions o{.tag = s.tag(rank, a), .label = name};
      pp.recv(nullptr, 0, DType::f32, a.peer, o)->wait();
    } else {
      SendOptions o{.tag = s.tag(rank, a), .label = name};
      pp.send(nullptr, 0, DType::f32, a.peer, o)->wait();
    }
  }
}

template class PipelineRunner<float>;
template class PipelineRunner<double>;

}  // namespace llama4d
