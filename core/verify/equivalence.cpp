#include "core/verify/equivalence.h"

#include <cmath>
#include <cstring>
#include <mutex>
#include <sstream>

#include "core/comm/text_table.h"
#include "core/error.h"
#include "core/optim/grad_clip.h"
#include "core/optim/segmented_norm.h"
#include "core/parallel/dp_common.h"
#include "core/optim/lr_schedule.h"
#include "core/train/checkpoint_state.h"

namespace llama4d {

namespace {

// dst = src (first term), or dst += src: the elementwise additions a reduction performs.
template <class T>
void add_into(std::vector<T>& dst, const std::vector<T>& src, bool first) {
  if (first) {
    dst = src;
    return;
  }
  for (size_t i = 0; i < dst.size(); ++i) dst[i] += src[i];
}

}  // namespace

template <class T>
ReplayResult<T> replay_on_one_device(const EquivalenceOptions& o, const TextDataset& data, const std::string& resume_from) {
  ReplayResult<T> out;
  const TrainOptions& opt = o.train;
  Llama<T> model(o.model);
  model.init_weights(opt.seed);
  AdamW<T> adamw(opt.adamw, model.param_specs());
  int64_t first_step = 0;
  if (!resume_from.empty()) first_step = load_training_checkpoint(resume_from, model, adamw).steps_done;
  const std::vector<Segment> segments = param_segments(model.param_specs());
  const LrSchedule schedule{.max_lr = opt.lr, .min_lr = opt.min_lr,
                            .warmup_steps = std::min(opt.warmup_steps, opt.steps), .total_steps = opt.steps};
  const int dp = o.plan.dp(), shard = o.plan.dp_shard();
  const T loss_scale = T(1.0 / double(opt.tokens_per_step()));
  const bool per_micro_batch = o.plan.zero >= ZeroStage::zero2;
  const int64_t n = model.num_params();

  for (int64_t s = first_step; s < opt.steps; ++s) {
    std::vector<std::vector<Batch>> mbs;
    for (int d = 0; d < dp; ++d) mbs.push_back(data_rank_micro_batches(data.train(), opt, s, d, dp));
    const size_t M = mbs[0].size();
    std::vector<double> rank_loss(size_t(dp), 0.0);
    auto run = [&](int d, size_t m) {
      const Batch& b = mbs[size_t(d)][m];
      rank_loss[size_t(d)] += model.forward(b.tokens.data(), b.targets.data(), b.B, b.T).loss_sum;
      model.backward(loss_scale);
    };
    auto grads_now = [&] { return std::vector<T>(model.grads(), model.grads() + n); };

    std::vector<T> total;
    if (!per_micro_batch) {
      // DP / ZeRO-1: rank d accumulates its micro-batches; ranks are then summed in order.
      for (int d = 0; d < dp; ++d) {
        model.zero_grad();
        for (size_t m = 0; m < M; ++m) run(d, m);
        add_into(total, grads_now(), d == 0);
      }
    } else {
      // ZeRO-2/3 / HSDP: every micro-batch is reduced over ranks (inside each shard group,
      // then across replica groups), then added to the accumulated gradient.
      for (size_t m = 0; m < M; ++m) {
        std::vector<T> across_replicas;
        for (int rep = 0; rep < dp / shard; ++rep) {
          std::vector<T> in_group;
          for (int sh = 0; sh < shard; ++sh) {
            model.zero_grad();
            run(rep * shard + sh, m);
            add_into(in_group, grads_now(), sh == 0);
          }
          add_into(across_replicas, in_group, rep == 0);
        }
        add_into(total, across_replicas, m == 0);
      }
    }
    double loss_sum = rank_loss[0];
    for (int d = 1; d < dp; ++d) loss_sum += rank_loss[size_t(d)];
    out.losses.push_back(loss_sum / double(opt.tokens_per_step()));

    const double sum_sq = segmented_grad_sum_squares(segments, total.data());
    out.grad_norms.push_back(std::sqrt(sum_sq));
    if (opt.grad_clip > 0) apply_grad_clip(total.data(), n, clip_coefficient(sum_sq, opt.grad_clip));
    adamw.step(model.params(), total.data(), lr_at_step(schedule, s + 1));
    if (s == first_step) out.first_grads = total;
    out.grads = std::move(total);
  }
  out.params.assign(model.params(), model.params() + n);
  return out;
}

namespace {

template <class T>
void compare(const std::vector<ParamSpec>& specs, const std::vector<T>& single, const std::vector<T>& parallel,
             bool is_grad, std::vector<TensorComparison>& rows) {
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& p = specs[i];
    double max_abs = 0, scale = 0;
    for (int64_t k = p.offset; k < p.offset + p.numel; ++k) {
      const double a = double(single[size_t(k)]), b = double(parallel[size_t(k)]);
      const double diff = std::abs(a - b);
      max_abs = std::isnan(diff) || diff > max_abs ? diff : max_abs;  // NaN (a freed shard leaked) sticks
      scale = std::max(scale, std::abs(a));
    }
    const double rel = scale > 0 ? max_abs / scale : max_abs;
    const bool bitwise = std::memcmp(single.data() + p.offset, parallel.data() + p.offset, size_t(p.numel) * sizeof(T)) == 0;
    TensorComparison& row = rows[i];
    row.name = p.name;
    (is_grad ? row.grad_max_abs : row.param_max_abs) = max_abs;
    (is_grad ? row.grad_max_rel : row.param_max_rel) = rel;
    (is_grad ? row.grad_bitwise : row.param_bitwise) = bitwise;
  }
}

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

}  // namespace

template <class T>
EquivalenceReport verify_plan(const EquivalenceOptions& o, const TextDataset& data, const RankLauncher& launch) {
  EquivalenceReport rep;
  rep.strategy = o.plan.describe();
  rep.plan = o.plan.to_json();
  rep.dtype = std::string(dtype_name(dtype_of<T>()));
  rep.algo = std::string(reduce_algo_name(o.plan.algo));
  rep.ranks = o.plan.world_size();
  rep.steps = int(o.train.steps);
  rep.memory.resize(size_t(rep.ranks));

  // 1. The parallel run. Rank 0 keeps the full gradients and parameters.
  std::vector<T> par_grads, par_params, par_first_grads;
  std::mutex mu;
  launch([&](ProcessGroup& world) {
    Llama<T> model(o.model, &world.memory());
    ParallelTrainer<T> trainer(world, model, data, o.train, o.plan);
    std::vector<double> losses, norms;
    std::vector<T> first;
    for (int64_t s = 0; s < o.train.steps; ++s) {
      const StepStats st = trainer.step();
      losses.push_back(st.loss);
      norms.push_back(st.grad_norm);
      if (s == 0) trainer.strategy().gather_grads(first);
    }
    std::vector<T> g, p;
    trainer.strategy().gather_grads(g);
    trainer.strategy().gather_params(p);
    std::lock_guard<std::mutex> lock(mu);
    rep.memory[size_t(world.rank())] = trainer.strategy().peak_memory();
    if (world.rank() == 0) {
      rep.losses_parallel = losses;
      rep.grad_norms_parallel = norms;
      par_grads = std::move(g);
      par_params = std::move(p);
      par_first_grads = std::move(first);
    }
  });
  if (par_params.empty()) return rep;  // not world rank 0 (MPI): nothing to compare here

  // 2. One device, same micro-batches, same order of additions.
  const ReplayResult<T> single = replay_on_one_device<T>(o, data);
  rep.losses_single = single.losses;
  rep.grad_norms_single = single.grad_norms;

  // 3. Tensor by tensor.
  const std::vector<ParamSpec> specs = llama_param_specs(o.model);
  rep.tensors.resize(specs.size());
  compare(specs, single.grads, par_grads, true, rep.tensors);
  compare(specs, single.params, par_params, false, rep.tensors);
  for (size_t i = 0; i < rep.losses_single.size(); ++i)
    rep.losses_bitwise = rep.losses_bitwise && std::memcmp(&rep.losses_single[i], &rep.losses_parallel[i], sizeof(double)) == 0;
  rep.bitwise = rep.losses_bitwise;
  double worst = -1;
  for (const TensorComparison& t : rep.tensors) {
    rep.bitwise = rep.bitwise && t.grad_bitwise && t.param_bitwise;
    for (double v : {t.grad_max_abs, t.param_max_abs}) rep.max_abs_err = std::isnan(v) ? v : std::max(rep.max_abs_err, v);
    for (double v : {t.grad_max_rel, t.param_max_rel})
      if (std::isnan(v) || v > worst) {
        worst = std::isnan(v) ? INFINITY : v;
        rep.max_rel_err = v;
        rep.worst_tensor = t.name;
      }
  }
  std::vector<TensorComparison> first_step(specs.size());
  compare(specs, single.first_grads, par_first_grads, true, first_step);
  for (const TensorComparison& t : first_step)
    rep.first_step_grad_rel_err = std::isnan(t.grad_max_rel) ? INFINITY : std::max(rep.first_step_grad_rel_err, t.grad_max_rel);
  for (const TensorComparison& t : rep.tensors) {
    rep.max_grad_rel_err = std::isnan(t.grad_max_rel) ? INFINITY : std::max(rep.max_grad_rel_err, t.grad_max_rel);
    rep.max_param_rel_err = std::isnan(t.param_max_rel) ? INFINITY : std::max(rep.max_param_rel_err, t.param_max_rel);
  }
  // Ordered reductions must reproduce the single device exactly. Ring reductions change the
  // order of additions, so only rounding-level agreement can be asked of them.
  const bool f32 = dtype_of<T>() == DType::f32;
  if (o.plan.algo == ReduceAlgo::ordered) {
    rep.ok = rep.bitwise;
  } else {
    rep.tolerance = f32 ? 1e-6 : 1e-12;
    rep.param_tolerance = f32 ? 1e-3 : 1e-9;
    rep.ok = rep.first_step_grad_rel_err <= rep.tolerance && rep.max_param_rel_err <= rep.param_tolerance;
  }
  return rep;
}

nlohmann::json EquivalenceReport::to_json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const TensorComparison& t : tensors)
    rows.push_back({{"name", t.name},
                    {"grad_max_abs_err", t.grad_max_abs},
                    {"grad_max_rel_err", t.grad_max_rel},
                    {"grad_bitwise", t.grad_bitwise},
                    {"param_max_abs_err", t.param_max_abs},
                    {"param_max_rel_err", t.param_max_rel},
                    {"param_bitwise", t.param_bitwise}});
  const nlohmann::json mem = memory_json(memory);
  return {{"ok", ok},
          {"bitwise", bitwise},
          {"losses_bitwise", losses_bitwise},
          {"max_abs_err", max_abs_err},
          {"max_rel_err", max_rel_err},
          {"tolerance", tolerance},
          {"param_tolerance", param_tolerance},
          {"max_grad_rel_err", max_grad_rel_err},
          {"first_step_grad_rel_err", first_step_grad_rel_err},
          {"max_param_rel_err", max_param_rel_err},
          {"worst_tensor", worst_tensor},
          {"strategy", strategy},
          {"plan", plan},
          {"ranks", ranks},
          {"steps", steps},
          {"dtype", dtype},
          {"algo", algo},
          {"losses_single", losses_single},
          {"losses_parallel", losses_parallel},
          {"grad_norms_single", grad_norms_single},
          {"grad_norms_parallel", grad_norms_parallel},
          {"tensors", rows},
          {"peak_memory_per_rank", mem}};
}

std::string EquivalenceReport::table() const {
  std::ostringstream out;
  out << "equivalence: " << strategy << ", " << ranks << " ranks, " << steps << " AdamW steps, " << dtype << ", "
      << algo << " reductions\n\n";
  out << "step  loss (one device)        loss (" << ranks << " ranks)            same bits\n";
  for (size_t i = 0; i < losses_single.size(); ++i) {
    char line[160];
    std::snprintf(line, sizeof line, "%4zu  %.17g  %.17g  %s\n", i + 1, losses_single[i], losses_parallel[i],
                  std::memcmp(&losses_single[i], &losses_parallel[i], sizeof(double)) == 0 ? "yes" : "no");
    out << line;
  }
  std::vector<std::vector<std::string>> rows = {
      {"tensor", "grad max abs", "grad max rel", "grad bits", "param max abs", "param max rel", "param bits"}};
  for (const TensorComparison& r : tensors)
    rows.push_back({r.name, sci(r.grad_max_abs), sci(r.grad_max_rel), r.grad_bitwise ? "equal" : "differ",
                    sci(r.param_max_abs), sci(r.param_max_rel), r.param_bitwise ? "equal" : "differ"});
  out << "\n" << format_table(rows) << "\n";
  const std::string errors = "first-step gradients within " + sci(first_step_grad_rel_err) +
                             ", final parameters within " + sci(max_param_rel_err) + " relative (worst: " +
                             worst_tensor + ")";
  if (ok && bitwise)
    out << "OK: every loss, gradient and parameter is bitwise identical to one device\n";
  else if (ok)
    out << "OK: " << errors << "; bounds " << sci(tolerance) << " / " << sci(param_tolerance) << "\n";
  else if (tolerance == 0)
    out << "FAILED: not bitwise identical to one device; " << errors << "\n";
  else
    out << "FAILED: " << errors << " exceed the bounds " << sci(tolerance) << " / " << sci(param_tolerance) << "\n";
  return out.str();
}

template ReplayResult<float> replay_on_one_device<float>(const EquivalenceOptions&, const TextDataset&,
                                                        const std::string&);
template ReplayResult<double> replay_on_one_device<double>(const EquivalenceOptions&, const TextDataset&,
                                                          const std::string&);
template EquivalenceReport verify_plan<float>(const EquivalenceOptions&, const TextDataset&, const RankLauncher&);
template EquivalenceReport verify_plan<double>(const EquivalenceOptions&, const TextDataset&, const RankLauncher&);

}  // namespace llama4d
