#include "core/verify/equivalence.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/comm/text_table.h"
#include "core/data/batch_sampler.h"
#include "core/error.h"
#include "core/optim/grad_clip.h"
#include "core/optim/lr_schedule.h"
#include "core/optim/segmented_norm.h"
#include "core/tensor/backend_array.h"
#include "core/tensor/bf16_rounding.h"
#include "core/train/checkpoint_state.h"
#include "core/train/trainer.h"
#include "core/verify/tensor_parallel_replay.h"

namespace llama4d {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// bf16 mixed precision after its first step, where two runs drift apart at bf16's resolution:
// the loss within `loss`, every tensor error reported but not bounded.
StepErrors bf16_drift(double loss) { return {loss, kInf, kInf, kInf, kInf}; }

// Bounds for ring reductions at step `step` (1-based), relative: about 10x (never more) the worst
// error measured there. Measured on `tiny` with verify's defaults, 10 steps, seeds 1, 7, 42 and
// 1337, over DP dp 4; ZeRO-1 dp 3/8; ZeRO-2 dp 2/4; ZeRO-3 dp 3/8; HSDP 4x2 ZeRO-2, 2x4 and 2x2
// ZeRO-3 (80 runs). Worst seen, as {loss, grad element, grad tensor, param element, param tensor}:
//   fp32 step 1   {3.4e-9, 3.7e-7, 8.9e-8, 1.1e-4, 1.1e-6}   later {2.0e-7, 9.9e-5, 1.2e-5, 1.1e-4, 1.1e-6}
//   fp64 step 1   {3.2e-16, 8.0e-16, 3.2e-16, 5.3e-13, 6.2e-15}   later {3.5e-16, 1.8e-13, 2.4e-14, 6.4e-13, 6.1e-15}
// Parameters differ from the first step on: an entry whose gradient is near zero moves by
// lr * g / (|g| + eps), which turns a rounding difference in g into a visible one.
//
// bf16 mixed precision keeps its gradients, and so their reductions, in f32: the first step is
// held to f32's bounds (measured within them: {4.3e-9, 3.9e-7, 9.1e-8, 3.0e-4, 1.8e-6}). From
// then on the weights differ by those roundings, and a forward in bf16 turns some of them into
// whole bf16 steps (2^-8 relative), which the rest of the step carries on: the two runs drift
// apart at bf16's resolution, not f32's. Worst measured in later steps over tiny (dp 4 ZeRO-2,
// dp 8; seeds 1, 3, 7, 4 steps) and small at 32 tokens (dp 4):
//   {1.7e-4, 1.1, 0.11, 0.23, 1.2e-3}
// Only the loss is bounded there; the tensors are reported (bf16_drift).
//
// Gradients reduced in bf16 (bf16_grad_reduce): a ring rounds every partial sum to bf16 as it
// travels, the replay rounds each sum once, so the first step's gradients already differ by bf16
// steps. Worst measured over tiny (dp 4 ZeRO-2, dp 8, dp 3 ZeRO-1, dp 8 ZeRO-3; seeds 1, 7, 42,
// 1337; 4 steps) and small at 32 tokens (dp 4 ZeRO-2, dp 8; seeds 1, 7; 3 steps):
//   step 1  {2.6e-4, 5.1e-2, 4.5e-3, 0.30, 6.6e-3}     later loss 1.7e-3
// The first step's tensors are held to 10x that (elements reported only, as under context
// parallelism); later steps drift like bf16's, with the loss held to 10x its worst.
StepErrors ring_tolerance(DType dtype, int64_t step, bool bf16_grad_reduce) {
  const bool first = step == 1;  // same weights on both sides: the order of additions alone
  if (dtype == DType::bf16 && bf16_grad_reduce)
    return first ? StepErrors{2.6e-3, kInf, 4.5e-2, kInf, 6.6e-2} : bf16_drift(1.7e-2);
  if (dtype == DType::bf16) return first ? ring_tolerance(DType::f32, 1, false) : bf16_drift(2e-3);
  if (dtype == DType::f32)
    return first ? StepErrors{3e-8, 3.7e-6, 8.8e-7, 1.1e-3, 1e-5} : StepErrors{2e-6, 9.9e-4, 1.1e-4, 1.1e-3, 1e-5};
  return first ? StepErrors{3e-15, 8e-15, 3e-15, 5e-12, 6e-14} : StepErrors{3.5e-15, 1.8e-12, 2.4e-13, 6.4e-12, 6e-14};
}

// Bounds for tensor parallelism at step `step`, in the same form, about 10x the worst measured
// over tiny (tp 2, 4; tp 2 x dp 2 ZeRO-3; tp 4 x dp 2 ZeRO-1 with full AC) and small at 32 tokens
// (tp 3, tp 6, tp 2 x dp 2 ZeRO-2), seeds 1 and 7, 4 steps (28 runs). Worst seen:
//   fp32 step 1   {3.5e-8, 2.8e-5, 3.3e-6, 1.0e-2, 7.0e-5}    later {6.9e-6, 2.5e-3, 1.6e-4, 1.0e-2, 1.4e-4}
//   fp64 step 1   {2.8e-15, 5.1e-14, 5.8e-15, 1.7e-11, 1.4e-13}  later {1.9e-14, 7.1e-12, 3.1e-13, 2.1e-11, 1.4e-13}
// Those runs compared TP with the whole model on one device, not with the rank-order replay
// (tensor_parallel_replay.h): a row-parallel layer (o_proj, down_proj) adds tp partial
// dot products where one device runs one dot product over the whole row, the vocabulary-parallel
// loss adds tp partial sums of exponentials, the column-parallel input gradients add tp partial
// products, and replicated key/value heads add their replicas' weight gradients. With ordered
// reductions TP is bitwise against the replay; these bounds hold what the replay does not
// follow: context parallelism (context_parallel_test measures it within them) and TP under ring
// reductions, where each chunk's sum starts at another rank. Element errors of the parameters
// are heavy-tailed as with ring reductions (AdamW turns a rounding difference in a near-zero
// gradient into a visible step), and grow with the model; the tensor errors are the tight check.
//
// bf16 mixed precision: attention's partial results are merged in f32 and then rounded to bf16,
// so where context parallelism's sum differs from one device's in its last f32 bit, the rounding
// can land a whole bf16 step away (2^-8 relative), from the first step on. Worst measured over
// tiny (cp 2 allgather and ring, cp 4 at 128 tokens, cp 2 x dp 2 ZeRO-3, tp 2 x cp 2, cp 2 with
// the document mask at 128 tokens, tp 2 x dp 4 ZeRO-1 under ring reductions; seeds 1, 3, 7, 4 steps) and small at 32 tokens (cp 2
// allgather and ring, tp 2 x cp 2), as {loss, grad element, grad tensor, param element, param tensor}:
//   step 1  {2.0e-4, 0.15, 1.8e-2, 0.30, 1.8e-2}     later {8.0e-3, 2.4, 0.37, 0.53, 2.1e-2}
// The first step's tensor errors are bounded (a wrong split of the sequence gives errors of order
// 1); element errors are heavy-tailed (AdamW's first step moves every entry by about lr, whose
// sign a near-zero gradient decides) and are reported only. Later steps drift as under ring
// reductions: only the loss is bounded. With gradients also reduced in bf16 (tp 2 x dp 4 ZeRO-1
// under ring reductions, tiny, seeds 1, 7, 42, 1337, 4 steps) the worst was
// {1.3e-4, 1.1e-2, 3.7e-3, 0.28, 7.5e-3} at step 1 and a loss of 5.4e-4 later: within these.
//
// Expert parallelism (ep > 1) is held to these bounds too: its experts' gradients are summed in
// another order than the replay's (one product per micro-batch over the rows of every ep rank).
// Worst measured on tiny-moe with verify's defaults, 5 steps, ep 2, ep 2 x dp 2 and ep 4:
//   fp32 {loss 1.2e-8, grad element 9.5e-5, grad tensor 5.9e-6, param element 8.9e-5, param tensor 1.3e-6}
//   fp64 {loss 3.9e-16, grad element 3.9e-13, grad tensor 2.4e-14, param element 2.8e-13, param tensor 5.5e-15}
// and in fp64 the plain Trainer within 3.8e-13 element by element.
StepErrors tensor_parallel_tolerance(DType dtype, int64_t step) {
  const bool first = step == 1;
  if (dtype == DType::bf16) return first ? StepErrors{2e-3, kInf, 0.18, kInf, 0.18} : bf16_drift(8e-2);
  if (dtype == DType::f32)
    return first ? StepErrors{4e-7, 3e-4, 3e-5, 1e-1, 7e-4} : StepErrors{7e-5, 3e-2, 2e-3, 1e-1, 1.4e-3};
  return first ? StepErrors{3e-14, 5e-13, 6e-14, 2e-10, 1.4e-12} : StepErrors{2e-13, 7e-11, 3e-12, 2e-10, 1.4e-12};
}

// The plain Trainer batches through its own data path (and, since it sums micro-batches in DP's
// order, adds like DP but not like HSDP or ZeRO-2/3's per-micro-batch reductions); in fp64 the
// worst measured over the 80 runs above was 4.0e-13 (element error of a later step's
// parameters). Against tensor and context parallelism, which add other partial sums than the
// plain trainer, the tensor error ||a - b|| / ||a|| is held to it instead (worst measured
// 3.1e-13, element errors up to 2.1e-11: see tensor_parallel_tolerance).
constexpr double kPlainTolerance = 1e-12;

// Rows [r0, r1) of a batch: the replay cuts the global batch itself instead of asking the
// strategies' split (data_rank_micro_batches), so a wrong split cannot agree with itself.
Batch slice_rows(const Batch& b, int64_t r0, int64_t r1) {
  Batch out;
  out.B = r1 - r0;
  out.seq = b.seq;
  out.tokens.assign(b.tokens.begin() + r0 * b.seq, b.tokens.begin() + r1 * b.seq);
  out.targets.assign(b.targets.begin() + r0 * b.seq, b.targets.begin() + r1 * b.seq);
  return out;
}

// dst = src (first term), or dst += src: the elementwise additions a reduction performs. With
// bf16 gradient reductions (--grad-reduce-in-bf16) each term is rounded to bf16 as it is put on
// the wire, and the sum stays in T (f32) until the reduction rounds it at its end (round_sum).
template <class T>
void add_into(std::vector<T>& dst, const std::vector<T>& src, bool first, bool bf16_grad_reduce) {
  if (first) dst.assign(src.size(), T(0));
  for (size_t i = 0; i < dst.size(); ++i) {
    const T term = bf16_grad_reduce ? T(nearest_bf16(src[i])) : src[i];
    dst[i] = first ? term : dst[i] + term;
  }
}

// The end of a bf16 gradient reduction: its f32 sum rounded to bf16 (then widened back, exactly,
// into the f32 gradient). Nothing for an f32 reduction.
template <class T>
void round_sum(std::vector<T>& sum, bool bf16_grad_reduce) {
  if (bf16_grad_reduce)
    for (T& v : sum) v = T(nearest_bf16(v));
}

ErrorStats compare_scalar(double ref, double got) {
  ErrorStats e;
  e.bitwise = std::memcmp(&ref, &got, sizeof(double)) == 0;
  const double diff = std::abs(ref - got);
  e.max_abs = std::isnan(diff) ? kInf : diff;
  e.max_rel = e.norm_rel = ref != 0 ? e.max_abs / std::abs(ref) : e.max_abs;
  return e;
}

// Per element |a - b| / max(|a|, kErrorFloor * rms(a)); NaN or a nonzero difference against an
// all-zero reference counts as infinite.
template <class T>
ErrorStats compare_span(const T* ref, const T* got, int64_t n) {
  ErrorStats e;
  e.bitwise = n == 0 || std::memcmp(ref, got, size_t(n) * sizeof(T)) == 0;
  if (e.bitwise) return e;
  double sum_sq = 0, diff_sq = 0;
  for (int64_t k = 0; k < n; ++k) sum_sq += double(ref[k]) * double(ref[k]);
  const double floor = kErrorFloor * std::sqrt(sum_sq / double(n));
  for (int64_t k = 0; k < n; ++k) {
    const double a = double(ref[k]), diff = std::abs(a - double(got[k]));
    if (std::isnan(diff)) {
      e.max_abs = e.max_rel = e.norm_rel = kInf;
      return e;
    }
    const double scale = std::max(std::abs(a), floor);
    e.max_abs = std::max(e.max_abs, diff);
    if (diff > 0) e.max_rel = std::max(e.max_rel, scale > 0 ? diff / scale : kInf);
    diff_sq += diff * diff;
  }
  e.norm_rel = sum_sq > 0 ? std::sqrt(diff_sq / sum_sq) : (diff_sq > 0 ? kInf : 0);
  return e;
}

// Tensor by tensor, merged into errs[spec]; returns the worst over all tensors.
template <class T>
ErrorStats compare_tensors(const std::vector<ParamSpec>& specs, const std::vector<T>& ref, const std::vector<T>& got,
                           std::vector<ErrorStats>* errs) {
  ErrorStats all;
  if (got.size() != ref.size()) {
    all.bitwise = false;
    all.max_abs = all.max_rel = all.norm_rel = kInf;
  }
  for (size_t i = 0; i < specs.size() && got.size() == ref.size(); ++i) {
    const ErrorStats e = compare_span(ref.data() + specs[i].offset, got.data() + specs[i].offset, specs[i].numel);
    if (errs) (*errs)[i].merge(e);
    all.merge(e);
  }
  return all;
}

// ErrorStats <-> doubles, so ranks can combine their findings with one max all-reduce.
constexpr size_t kStatsDoubles = 4, kStepDoubles = 5;
void put(double* v, const ErrorStats& e) { v[0] = e.max_abs, v[1] = e.max_rel, v[2] = e.norm_rel, v[3] = e.bitwise ? 0 : 1; }
ErrorStats get(const double* v) { return {v[0], v[1], v[2], v[3] == 0}; }
void put(double* v, const StepErrors& e) {
  v[0] = e.loss, v[1] = e.grad_element, v[2] = e.grad_tensor, v[3] = e.param_element, v[4] = e.param_tensor;
}
StepErrors get_step(const double* v) { return {v[0], v[1], v[2], v[3], v[4]}; }

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

}  // namespace

void ErrorStats::merge(const ErrorStats& o) {
  max_abs = std::max(max_abs, o.max_abs);
  max_rel = std::max(max_rel, o.max_rel);
  norm_rel = std::max(norm_rel, o.norm_rel);
  bitwise = bitwise && o.bitwise;
}

void StepErrors::merge(const StepErrors& o) {
  loss = std::max(loss, o.loss);
  grad_element = std::max(grad_element, o.grad_element), grad_tensor = std::max(grad_tensor, o.grad_tensor);
  param_element = std::max(param_element, o.param_element), param_tensor = std::max(param_tensor, o.param_tensor);
}

bool StepErrors::within(const StepErrors& b) const {
  return loss <= b.loss && grad_element <= b.grad_element && grad_tensor <= b.grad_tensor &&
         param_element <= b.param_element && param_tensor <= b.param_tensor;
}

// Pipeline parallelism with tied embeddings: the first stage accumulates the lookup's part of the
// embedding's gradient and the last stage the tied head's, each over its own micro-batches, and
// the two parts are added last (first + last). The replay keeps the head's part apart the same
// way: around the head's backward the embedding's gradient segment is swapped with it.
template <class T>
class TiedHeadPart final : public UnitHooks {
 public:
  explicit TiedHeadPart(Llama<T>& model)
      : model_(model), part_(size_t(model.unit_range(embedding_unit()).end - model.unit_range(embedding_unit()).begin), T(0)) {}
  void before_backward(int unit) override { swap_if_head(unit); }
  void after_backward(int unit) override { swap_if_head(unit); }
  const std::vector<T>& part() const { return part_; }
  void zero() { std::fill(part_.begin(), part_.end(), T(0)); }

 private:
  void swap_if_head(int unit) {
    if (unit != head_unit(model_.num_layers())) return;
    T* g = model_.grads() + model_.unit_range(embedding_unit()).begin;
    std::swap_ranges(part_.begin(), part_.end(), g);
  }
  Llama<T>& model_;
  std::vector<T> part_;
};

template <class T>
ReplayResult<T> replay_on_one_device(const EquivalenceOptions& o, const TextDataset& data, const std::string& resume_from) {
  ReplayResult<T> out;
  const TrainOptions& opt = o.train;
  o.plan.check_precision(opt.bf16_compute);
  Llama<T> model(o.model);
  model.set_bf16_compute(opt.bf16_compute);
  model.init_weights(opt.seed);
  AdamW<T> adamw(opt.adamw, model.param_specs());
  int64_t first_step = 0;
  if (!resume_from.empty()) first_step = load_training_checkpoint(resume_from, model, adamw).steps_done;
  const std::vector<Segment> segments = param_segments(model.param_specs());
  const LrSchedule schedule{.max_lr = opt.lr, .min_lr = opt.min_lr,
                            .warmup_steps = std::min(opt.warmup_steps, opt.steps), .total_steps = opt.steps};
  const int dp = o.plan.dp(), shard = o.plan.dp_shard();
  // Data rank d trains rows [d * rows, (d + 1) * rows) of the global batch, mb rows at a time.
  if (opt.batch_size % dp != 0) throw InputError("the global batch does not split over " + std::to_string(dp) + " data ranks");
  const int64_t rows = opt.batch_size / dp, mb = opt.micro_batch_size > 0 ? opt.micro_batch_size : rows;
  if (rows % mb != 0) throw InputError("a data rank's rows do not split into micro-batches");
  const int64_t M = rows / mb;
  const T loss_scale = T(1.0 / double(opt.tokens_per_step()));
  const bool per_micro_batch = o.plan.zero >= ZeroStage::zero2 && !o.plan.reduce_once;
  const bool bf16_grad_reduce = o.plan.bf16_grad_reduce;  // every gradient reduction moves and sums bf16
  const int64_t n = model.num_params();
  const bool tied_apart = o.plan.size("pp") > 1 && o.model.tie_word_embeddings;
  // Tensor parallelism: the whole weights, every split sum in rank order (tensor_parallel_replay.h).
  std::optional<TensorParallelReplay<T>> tp;
  if (uses_tensor_parallel_replay(o.plan))
    tp.emplace(o.model, o.plan.size("tp"), o.plan.sequence_parallel, model.params(), tied_apart, opt.bf16_compute);
  std::optional<TiedHeadPart<T>> tied;
  if (tied_apart && !tp) tied.emplace(model);
  ScopedHooks<T> hooks(model, tied ? &*tied : nullptr);
  auto zero_grad = [&] {
    if (tp) return tp->zero_grad();
    model.zero_grad();
    if (tied) tied->zero();
  };

  for (int64_t s = first_step; s < opt.steps; ++s) {
    const Batch global = sample_batch(data.train(), opt.seq_len, opt.seed, s, opt.batch_size);
    std::vector<double> rank_loss(size_t(dp), 0.0);
    auto run = [&](int d, int64_t m) {
      const int64_t r0 = d * rows + m * mb;
      Batch b = slice_rows(global, r0, r0 + mb);
      if (opt.doc_mask) mark_documents(b, opt.doc_separator);  // ids count from each row's start: slicing rows keeps them
      if (tp) {
        rank_loss[size_t(d)] += tp->forward_backward(b, loss_scale);
        return;
      }
      rank_loss[size_t(d)] += model.forward(b.tokens.data(), b.targets.data(), b.B, b.seq, b.documents()).loss_sum;
      model.backward(loss_scale);
    };
    // The flat gradient, and with tied embeddings under pipeline parallelism the head's part of
    // the embedding's after it (summed into the embedding's below, once every rank is added).
    auto grads_now = [&] {
      std::vector<T> g = tp ? tp->grads() : std::vector<T>(model.grads(), model.grads() + n);
      if (tied) g.insert(g.end(), tied->part().begin(), tied->part().end());
      if (tp && tied_apart) g.insert(g.end(), tp->tied_head_part().begin(), tp->tied_head_part().end());
      return g;
    };

    // One reduction over the data ranks of what `rank_grads(d)` leaves in the model: inside each
    // shard group in rank order, then across the replica groups (HSDP), as the reduce-scatters
    // and the replica all-reduces add.
    auto reduce_ranks = [&](auto rank_grads) {
      std::vector<T> across_replicas;
      for (int rep = 0; rep < dp / shard; ++rep) {
        std::vector<T> in_group;
        for (int sh = 0; sh < shard; ++sh) {
          zero_grad();
          rank_grads(rep * shard + sh);
          add_into(in_group, grads_now(), sh == 0, bf16_grad_reduce);
        }
        round_sum(in_group, bf16_grad_reduce);
        add_into(across_replicas, in_group, rep == 0, bf16_grad_reduce);
      }
      if (dp / shard > 1) round_sum(across_replicas, bf16_grad_reduce);
      return across_replicas;
    };
    std::vector<T> total;
    if (!per_micro_batch) {
      // DP / ZeRO-1 / --reduce-once: rank d accumulates its micro-batches; ranks are then summed.
      total = reduce_ranks([&](int d) {
        for (int64_t m = 0; m < M; ++m) run(d, m);
      });
    } else {
      // ZeRO-2/3: every micro-batch is reduced over ranks, then added to the accumulated gradient.
      for (int64_t m = 0; m < M; ++m)
        add_into(total, reduce_ranks([&](int d) { run(d, m); }), m == 0, false);  // micro-batches accumulate in f32
    }
    if (tied_apart) {  // first stage's part + last stage's part
      const int64_t e0 = model.unit_range(embedding_unit()).begin;
      for (size_t i = size_t(n); i < total.size(); ++i) {
        T& first = total[size_t(e0) + i - size_t(n)];
        // With bf16 gradient reductions the sum is itself one: each stage's part is rounded as it
        // is put on the wire (under ZeRO-2/3 a part is an f32 sum of micro-batches), the two are
        // added in f32 and the sum rounded.
        if (bf16_grad_reduce)
          first = T(nearest_bf16(T(nearest_bf16(first)) + T(nearest_bf16(total[i]))));
        else
          first += total[i];
      }
      total.resize(size_t(n));
    }
    double loss_sum = rank_loss[0];
    for (int d = 1; d < dp; ++d) loss_sum += rank_loss[size_t(d)];
    out.losses.push_back(loss_sum / double(opt.tokens_per_step()));
    out.tokens.push_back(global.counted_targets());

    // The reduced gradient where the optimizer's ops read it (the backend's memory).
    BackendArray<T> reduced(total);
    const double sum_sq = tp ? tensor_parallel_grad_sum_squares(o.model, o.plan, total)
                             : segmented_grad_sum_squares(segments, reduced.data());
    out.grad_norms.push_back(std::sqrt(sum_sq));
    if (opt.grad_clip > 0) apply_grad_clip(reduced.data(), n, clip_coefficient(sum_sq, opt.grad_clip));
    adamw.step(model.params(), reduced.data(), lr_at_step(schedule, s + 1));
    out.grads.push_back(reduced.host());
    out.params.emplace_back(model.params(), model.params() + n);
  }
  return out;
}

template <class T>
ReplayResult<T> train_on_one_device(const EquivalenceOptions& o, const TextDataset& data) {
  ReplayResult<T> out;
  Llama<T> model(o.model);
  model.init_weights(o.train.seed);
  Trainer<T> trainer(model, data, o.train);
  if (!o.start_from.empty()) trainer.load_checkpoint(o.start_from);
  for (int64_t s = 0; s < o.train.steps; ++s) {
    const StepStats st = trainer.step();
    out.losses.push_back(st.loss);
    out.grad_norms.push_back(st.grad_norm);
    out.tokens.push_back(st.tokens);
    out.grads.emplace_back(model.grads(), model.grads() + model.num_params());  // clipped in place
    out.params.emplace_back(model.params(), model.params() + model.num_params());
  }
  return out;
}

namespace {

// The verdict from every rank's findings: bitwise where the plan's sums can be replayed in their
// order (ordered reductions, no context parallelism), else within the measured bounds per step;
// and the worst tensor, the largest errors, the plain trainer's check.
void judge(EquivalenceReport& rep, const EquivalenceOptions& o, DType compute) {
  const size_t S = size_t(o.train.steps);
  bool tokens_equal = true;
  rep.errors_per_step.assign(S, StepErrors{});
  for (const RankComparison& r : rep.per_rank) {
    rep.bitwise = rep.bitwise && r.loss.bitwise && r.grad_norm.bitwise && r.grads.bitwise && r.params.bitwise && r.tokens_equal;
    tokens_equal = tokens_equal && r.tokens_equal;
    for (size_t s = 0; s < S; ++s) rep.errors_per_step[s].merge(r.per_step[s]);
  }
  for (const StepErrors& e : rep.errors_per_step) rep.max_errors.merge(e);
  double worst = -1;
  for (const TensorComparison& t : rep.tensors)
    for (const ErrorStats& e : {t.grad, t.param}) {
      rep.max_abs_err = std::max(rep.max_abs_err, e.max_abs);
      if (e.max_rel > worst) worst = rep.max_rel_err = e.max_rel, rep.worst_tensor = t.name;
    }
  if (rep.plain_checked) {
    rep.plain_tolerance = kPlainTolerance;
    rep.plain_per_tensor = o.plan.size("tp") > 1 || o.plan.size("cp") > 1;
    rep.plain_ok = rep.plain_max_rel_err <= kPlainTolerance;
  }
  const bool complete = int(rep.per_rank.size()) == rep.ranks;
  // Context parallelism splits the sums inside attention: not bitwise. Tensor parallelism's
  // split sums are replayed in rank order (tensor_parallel_replay.h), so without cp it is.
  // Expert parallelism sums each expert's weight gradient over the rows every ep rank sent it in
  // one product per micro-batch, where the replay adds per data rank: not bitwise either (the
  // dense weights, the loss and the routing are; see expert_parallel.cpp).
  const bool ep = o.plan.size("ep") > 1;
  const bool sliced = o.plan.size("tp") > 1 || o.plan.size("cp") > 1 || ep;
  if (o.plan.algo == ReduceAlgo::ordered && o.plan.size("cp") == 1 && !ep) {
    rep.ok = complete && rep.bitwise && rep.plain_ok;
  } else {
    rep.ok = complete && tokens_equal && rep.plain_ok;
    for (size_t s = 0; s < S; ++s) {
      const int64_t step = int64_t(s) + 1;
      rep.bounds_per_step.push_back(sliced ? tensor_parallel_tolerance(compute, step)
                                           : ring_tolerance(compute, step, o.plan.bf16_grad_reduce));
      rep.ok = rep.ok && rep.errors_per_step[s].within(rep.bounds_per_step[s]);
    }
  }
}

}  // namespace

template <class T>
EquivalenceReport verify_plan(const EquivalenceOptions& o, const TextDataset& data, const RankLauncher& launch) {
  EquivalenceReport rep;
  rep.strategy = o.plan.describe();
  rep.plan = o.plan;
  // bf16 mixed precision computes in bf16 over f32 tensors: its rounding sets the bounds.
  const DType compute = o.train.bf16_compute ? DType::bf16 : dtype_of<T>();
  rep.dtype = std::string(dtype_name(compute));
  rep.algo = std::string(reduce_algo_name(o.plan.algo));
  rep.ranks = o.plan.world_size();
  rep.steps = int(o.train.steps);
  rep.micro_batches_per_rank = rank_micro_batch_count(o.train, o.plan.dp());
  rep.memory.resize(size_t(rep.ranks));

  // 1. The references, on one device, before anything parallel runs.
  const ReplayResult<T> ref = replay_on_one_device<T>(o, data, o.start_from);
  rep.plain_checked = dtype_of<T>() == DType::f64;
  const ReplayResult<T> plain = rep.plain_checked ? train_on_one_device<T>(o, data) : ReplayResult<T>{};
  rep.losses_single = ref.losses;
  rep.grad_norms_single = ref.grad_norms;
  rep.tokens_single = ref.tokens;
  const std::vector<ParamSpec> specs = llama_param_specs(o.model);
  const size_t S = size_t(o.train.steps), P = specs.size();

  // 2. The parallel run: every rank checks itself at every step, then all ranks combine their
  //    findings (max all-reduce), so the report names every rank even across processes.
  //    Per rank: loss, grad norm, grads, params (ErrorStats each), tokens, plain error, and the
  //    StepErrors of each step; then per tensor the gradient's and the parameters' ErrorStats.
  const size_t steps_at = 4 * kStatsDoubles + 2, per_rank = steps_at + kStepDoubles * S;
  const size_t tensors_at = per_rank * size_t(rep.ranks), per_tensor = 2 * kStatsDoubles;
  std::mutex mu;
  int lowest_rank = rep.ranks;
  launch([&](ProcessGroup& world) {
    Llama<T> model = o.plan.make_model<T>(o.model, world.memory(), world.rank());
    ParallelTrainer<T> trainer(world, model, data, o.train, o.plan);
    if (!o.start_from.empty()) trainer.load_checkpoint(o.start_from);
    // A tensor-parallel rank compares its slices with the same slices of the references.
    // A pipeline rank compares the tensors of its stages.
    const std::vector<ParamSpec>& held = model.param_specs();
    const bool sliced = model.tp_layout().sliced();
    const bool plain_by_tensor = sliced || o.plan.size("cp") > 1;  // the plain check: tensor errors
    std::vector<size_t> whole_index;  // [held tensor] its index in `specs`
    for (const ParamSpec& h : held) whole_index.push_back(size_t(&find_param(specs, h.name) - specs.data()));
    std::vector<T> slice_buffers[4];
    auto held_part = [&](const std::vector<T>& whole, int k) -> const std::vector<T>& {
      if (!sliced && model.holds_all_units() && model.expert_shard().all()) return whole;
      return slice_buffers[k] = slice_of_whole(held, specs, whole);
    };
    RankComparison mine;
    std::vector<ErrorStats> grad_errs(held.size()), param_errs(held.size());
    double plain_err = 0;
    std::vector<double> losses, norms;
    std::vector<int64_t> tokens;
    std::vector<T> g, p;
    for (size_t s = 0; s < S; ++s) {
      const StepStats st = trainer.step();
      losses.push_back(st.loss);
      norms.push_back(st.grad_norm);
      tokens.push_back(st.tokens);
      const ErrorStats le = compare_scalar(ref.losses[s], st.loss), ne = compare_scalar(ref.grad_norms[s], st.grad_norm);
      mine.loss.merge(le);
      mine.grad_norm.merge(ne);
      mine.tokens_equal = mine.tokens_equal && st.tokens == ref.tokens[s];
      trainer.strategy().gather_grads(g);
      trainer.strategy().gather_params(p);
      const ErrorStats ge = compare_tensors(held, held_part(ref.grads[s], 0), g, &grad_errs);
      const ErrorStats pe = compare_tensors(held, held_part(ref.params[s], 1), p, &param_errs);
      mine.grads.merge(ge);
      mine.params.merge(pe);
      mine.per_step.push_back({std::max(le.max_rel, ne.max_rel), ge.max_rel, ge.norm_rel, pe.max_rel, pe.norm_rel});
      if (rep.plain_checked) {
        for (const ErrorStats& e : {compare_scalar(plain.losses[s], st.loss), compare_scalar(plain.grad_norms[s], st.grad_norm),
                                    compare_tensors(held, held_part(plain.grads[s], 2), g, nullptr),
                                    compare_tensors(held, held_part(plain.params[s], 3), p, nullptr)})
          plain_err = std::max(plain_err, plain_by_tensor ? e.norm_rel : e.max_rel);
        if (st.tokens != plain.tokens[s]) plain_err = kInf;
      }
    }

    std::vector<double> findings(tensors_at + per_tensor * P, 0.0);
    double* own = findings.data() + per_rank * size_t(world.rank());
    const ErrorStats* stats[] = {&mine.loss, &mine.grad_norm, &mine.grads, &mine.params};
    for (size_t k = 0; k < 4; ++k) put(own + kStatsDoubles * k, *stats[k]);
    own[steps_at - 2] = mine.tokens_equal ? 0 : 1;
    own[steps_at - 1] = plain_err;
    for (size_t s = 0; s < S; ++s) put(own + steps_at + kStepDoubles * s, mine.per_step[s]);
    for (size_t i = 0; i < held.size(); ++i) {
      put(&findings[tensors_at + per_tensor * whole_index[i]], grad_errs[i]);
      put(&findings[tensors_at + per_tensor * whole_index[i] + kStatsDoubles], param_errs[i]);
    }
    AllReduceOptions ao{.label = "equivalence findings"};
    world.all_reduce(findings.data(), int64_t(findings.size()), DType::f64, ReduceOp::max, ao)->wait();

    std::lock_guard<std::mutex> lock(mu);
    rep.memory[size_t(world.rank())] = trainer.strategy().peak_memory();
    if (world.rank() < lowest_rank) {  // the report shows the lowest rank's own numbers
      lowest_rank = world.rank();
      rep.losses_parallel = losses, rep.grad_norms_parallel = norms, rep.tokens_parallel = tokens;
    }
    if (!rep.per_rank.empty()) return;  // every rank holds the same combined findings
    for (int r = 0; r < world.size(); ++r) {
      const double* v = findings.data() + per_rank * size_t(r);
      RankComparison rc;
      rc.rank = r;
      rc.loss = get(v), rc.grad_norm = get(v + kStatsDoubles), rc.grads = get(v + 2 * kStatsDoubles);
      rc.params = get(v + 3 * kStatsDoubles);
      rc.tokens_equal = v[steps_at - 2] == 0;
      rep.plain_max_rel_err = std::max(rep.plain_max_rel_err, v[steps_at - 1]);
      for (size_t s = 0; s < S; ++s) rc.per_step.push_back(get_step(v + steps_at + kStepDoubles * s));
      rep.per_rank.push_back(rc);
    }
    for (size_t i = 0; i < P; ++i) {
      const double* t = &findings[tensors_at + per_tensor * i];
      rep.tensors.push_back({specs[i].name, get(t), get(t + kStatsDoubles)});
    }
  });

  // 3. The verdict.
  judge(rep, o, compute);
  return rep;
}

namespace {

nlohmann::json stats_json(const ErrorStats& e) {
  return {{"max_abs_err", e.max_abs}, {"max_rel_err", e.max_rel}, {"norm_rel_err", e.norm_rel}, {"bitwise", e.bitwise}};
}

nlohmann::json steps_json(const std::vector<StepErrors>& steps) {
  nlohmann::json a = nlohmann::json::array();
  for (const StepErrors& e : steps)
    a.push_back({{"loss", e.loss},
                 {"grad_element", e.grad_element},
                 {"grad_tensor", e.grad_tensor},
                 {"param_element", e.param_element},
                 {"param_tensor", e.param_tensor}});
  return a;
}

}  // namespace

nlohmann::json EquivalenceReport::to_json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const TensorComparison& t : tensors) rows.push_back({{"name", t.name}, {"grad", stats_json(t.grad)}, {"param", stats_json(t.param)}});
  nlohmann::json ranks_json = nlohmann::json::array();
  for (const RankComparison& r : per_rank)
    ranks_json.push_back({{"rank", r.rank},
                          {"loss", stats_json(r.loss)},
                          {"grad_norm", stats_json(r.grad_norm)},
                          {"grads", stats_json(r.grads)},
                          {"params", stats_json(r.params)},
                          {"tokens_equal", r.tokens_equal},
                          {"errors_per_step", steps_json(r.per_step)}});
  nlohmann::json plain = nullptr;
  if (plain_checked)
    plain = {{"ok", plain_ok}, {"tolerance", plain_tolerance}, {"max_rel_err", plain_max_rel_err},
             {"measure", plain_per_tensor ? "tensor" : "element"}};
  return {{"ok", ok},
          {"bitwise", bitwise},
          {"max_abs_err", max_abs_err},
          {"max_rel_err", max_rel_err},
          {"worst_tensor", worst_tensor},
          {"errors_per_step", steps_json(errors_per_step)},
          {"bounds_per_step", steps_json(bounds_per_step)},
          {"max_errors", steps_json({max_errors})[0]},
          {"plain_trainer", plain},
          {"strategy", strategy},
          {"plan", plan.to_json()},
          {"ranks", ranks},
          {"steps", steps},
          {"micro_batches_per_rank", micro_batches_per_rank},
          {"dtype", dtype},
          {"algo", algo},
          {"losses_single", losses_single},
          {"losses_parallel", losses_parallel},
          {"grad_norms_single", grad_norms_single},
          {"grad_norms_parallel", grad_norms_parallel},
          {"tokens_single", tokens_single},
          {"tokens_parallel", tokens_parallel},
          {"per_rank", ranks_json},
          {"tensors", rows},
          {"peak_memory_per_rank", memory_json(memory)}};
}

std::string EquivalenceReport::table() const {
  std::ostringstream out;
  out << "equivalence: " << strategy << ", " << ranks << " ranks, " << steps << " AdamW steps, "
      << micro_batches_per_rank << " micro-batches per rank, " << dtype << ", " << algo << " reductions\n\n";
  const bool bounded = !bounds_per_step.empty();
  std::vector<std::vector<std::string>> steps_rows = {{"step", "loss (one device)", "loss (rank 0)", "tokens", "same bits"}};
  if (bounded)
    for (const char* h : {"loss err/bound", "grad element err/bound", "grad tensor err/bound", "param element err/bound",
                          "param tensor err/bound"})
      steps_rows[0].push_back(h);
  char num[2][40];
  for (size_t i = 0; i < losses_single.size() && i < losses_parallel.size(); ++i) {
    std::snprintf(num[0], sizeof num[0], "%.17g", losses_single[i]);
    std::snprintf(num[1], sizeof num[1], "%.17g", losses_parallel[i]);
    steps_rows.push_back({std::to_string(i + 1), num[0], num[1],
                          std::to_string(i < tokens_parallel.size() ? tokens_parallel[i] : -1),
                          std::memcmp(&losses_single[i], &losses_parallel[i], sizeof(double)) == 0 ? "yes" : "no"});
    if (bounded && i < errors_per_step.size()) {
      const StepErrors &e = errors_per_step[i], &b = bounds_per_step[i];
      for (auto [err, bound] : {std::pair{e.loss, b.loss}, {e.grad_element, b.grad_element}, {e.grad_tensor, b.grad_tensor},
                                {e.param_element, b.param_element}, {e.param_tensor, b.param_tensor}})
        steps_rows.back().push_back(std::isinf(bound) ? sci(err) + " (reported)"
                                                      : sci(err) + (err <= bound ? " <= " : " > ") + sci(bound));
    }
  }
  out << format_table(steps_rows) << "\n";
  std::vector<std::vector<std::string>> rows = {
      {"tensor", "grad max abs", "grad max rel", "grad bits", "param max abs", "param max rel", "param bits"}};
  for (const TensorComparison& r : tensors)
    rows.push_back({r.name, sci(r.grad.max_abs), sci(r.grad.max_rel), r.grad.bitwise ? "equal" : "differ",
                    sci(r.param.max_abs), sci(r.param.max_rel), r.param.bitwise ? "equal" : "differ"});
  out << format_table(rows) << "\n";
  std::vector<std::vector<std::string>> ranks_rows = {
      {"rank", "losses", "grad norms", "tokens", "grads (every step)", "params (every step)"}};
  auto cell = [](const ErrorStats& e) { return e.bitwise ? std::string("equal") : "rel " + sci(e.max_rel); };
  for (const RankComparison& r : per_rank)
    ranks_rows.push_back({std::to_string(r.rank), cell(r.loss), cell(r.grad_norm), r.tokens_equal ? "equal" : "DIFFER",
                          cell(r.grads), cell(r.params)});
  out << format_table(ranks_rows) << "\n";
  if (plain_checked)
    out << "plain single-device trainer (its own order of additions): worst relative error"
        << (plain_per_tensor ? " per tensor " : " ") << sci(plain_max_rel_err)
        << (plain_ok ? " <= " : " > ") << sci(plain_tolerance) << "\n";
  const std::string errors = "losses within " + sci(max_errors.loss) + ", gradients within " +
                             sci(max_errors.grad_element) + " per element / " + sci(max_errors.grad_tensor) +
                             " per tensor, parameters within " + sci(max_errors.param_element) + " / " +
                             sci(max_errors.param_tensor) + " (worst tensor: " + worst_tensor + ")";
  if (int(per_rank.size()) != ranks)
    out << "FAILED: findings of " << per_rank.size() << " of " << ranks << " ranks\n";
  else if (ok && bitwise)
    out << "OK: on every rank, every loss, token count, gradient norm, gradient and parameter is bitwise identical "
           "to one device at every step\n";
  else if (ok)
    out << "OK: " << errors << ", each step within its bound\n";
  else if (!bounded)
    out << "FAILED: not bitwise identical to one device; " << errors << "\n";
  else
    out << "FAILED: " << errors << "; some step is outside its bound (table above)\n";
  return out.str();
}

template ReplayResult<float> replay_on_one_device<float>(const EquivalenceOptions&, const TextDataset&,
                                                        const std::string&);
template ReplayResult<double> replay_on_one_device<double>(const EquivalenceOptions&, const TextDataset&,
                                                          const std::string&);
template ReplayResult<float> train_on_one_device<float>(const EquivalenceOptions&, const TextDataset&);
template ReplayResult<double> train_on_one_device<double>(const EquivalenceOptions&, const TextDataset&);
template EquivalenceReport verify_plan<float>(const EquivalenceOptions&, const TextDataset&, const RankLauncher&);
template EquivalenceReport verify_plan<double>(const EquivalenceOptions&, const TextDataset&, const RankLauncher&);

}  // namespace llama4d
