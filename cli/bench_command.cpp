// `llama4d bench`: times full training steps (forward, backward, AdamW) and reports tokens/s
// and achieved model FLOP/s as a fraction of this machine's peak GEMM FLOP/s: the better of the
// engine's own GEMM path and a reference on the same shape and thread count, both measured here:
// a BLAS sgemm on the CPU (bench/reference_blas.h), cuBLAS on a GPU (bench/reference_cublas.h,
// with bf16 inputs in a bf16 run, as the engine's own products then are). `--threads-sweep` repeats the step and both GEMMs for
// 1, 2, 4, ... threads. `--profile` adds the time per step in each op (core/tensor/op_profile.h), at
// every thread count of a sweep. `llama4d bench comm` lives in bench_comm_command.cpp.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <nlohmann/json.hpp>

#include "bench/reference_blas.h"
#ifdef LLAMA4D_HAVE_CUDA
#include "bench/reference_cublas.h"
#endif
#include "cli/common.h"
#include "cli/launch.h"
#include "cli/parallel_options.h"
#include "core/data/dataset.h"
#include "core/tensor/memory_tracker.h"
#include "core/error.h"
#include "core/model/flops.h"
#include "core/model/llama.h"
#include "core/ops.h"
#include "core/tensor/op_profile.h"
#include "core/parallel/parallel_trainer.h"
#include "core/parallel/pipeline_picture.h"
#include "core/train/trainer.h"

namespace llama4d::cli {

namespace {

// The most warm-up or timed steps: their sum stays a step count (TrainOptions::steps).
constexpr int64_t kMaxBenchSteps = 1'000'000'000;

struct BenchArgs {
  ModelChoice model;
  ParallelChoice parallel;
  LaunchOptions launch;
  TrainOptions opt;
  int64_t warmup = 2, iters = 5, gemm_n = 1024;
  double gemm_seconds = 1.0;
  int micro_batches = 0;
  ComputeChoice compute;
  std::string reference_blas;
  bool json = false, force = false, threads_sweep = false, wait_every_op = false, profile = false;
  std::vector<int> sweep_threads;  // --sweep-threads: the thread counts of the sweep (empty: 1, 2, 4, ...)
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The same global batch on a data-parallel mesh of virtual GPUs: step times (rank 0; the steps
// end in collectives, so every rank finishes together) and the bytes each rank moved per step.
template <class T>
nlohmann::json run_parallel_bench(const BenchArgs& a, const LlamaConfig& cfg, const TextDataset& data,
                                  const TrainOptions& opt) {
  const ParallelPlan plan = a.parallel.plan(cfg, a.launch.algo);
  const int ranks = plan.world_size();
  RankLaunch launcher(a.launch);
  std::vector<double> times;
  std::string strategy;
  int threads = 0;
  std::vector<RankMemory> memory(static_cast<size_t>(ranks));
  std::mutex mu;
  launcher.run(ranks, [&](ProcessGroup& world) {
    if (world.rank() == 0) threads = ops::backend_threads();  // this rank's share (RankLaunch sets it)
    Llama<T> model = plan.make_model<T>(cfg, world.memory(), world.rank());
    ParallelTrainer<T> trainer(world, model, data, opt, plan);
    std::vector<double> mine;
    for (int64_t i = 0; i < a.warmup + a.iters; ++i) {
      const double s = trainer.step().seconds;
      if (i >= a.warmup) mine.push_back(s);
    }
    std::lock_guard<std::mutex> lock(mu);
    memory[size_t(world.rank())] = trainer.strategy().peak_memory();
    if (world.rank() == 0) times = mine, strategy = trainer.describe();
  });
  if (!launcher.reporting()) return {};
  const nlohmann::json traffic = launcher.traffic_totals();
  const double steps = double(a.warmup + a.iters);
  const double per_rank = double(traffic.at("total_bytes_sent").get<int64_t>()) / steps / ranks;
  // Per collective kind (all_reduce, all_gather, reduce_scatter, ...): bytes one rank sent per step.
  nlohmann::json by_op = nlohmann::json::object();
  for (const auto& [op, bytes] : traffic.at("bytes_sent_by_op").items())
    by_op[op] = double(bytes.template get<int64_t>()) / steps / ranks;
  // The same steps on the modelled cluster: FLOPs at the GPU's rate, links by the alpha-beta model.
  nlohmann::json sim = launcher.simulated_per_step(int64_t(steps));
  const double sim_step_s = sim.at("step_us").get<double>() * 1e-6;
  sim["tokens_per_s"] = double(opt.tokens_per_step()) / sim_step_s;
  // MFU with the PaLM convention of core/model/flops.h (attention over the full T x T square,
  // which the clock does not charge: at long sequences it can exceed compute_fraction).
  sim["mfu"] = double(opt.tokens_per_step()) * training_flops_per_token(cfg, opt.seq_len) /
               (sim_step_s * ranks * sim.at("gpu_tflops").get<double>() * 1e12);
  // The share of the step the modelled GPUs spent computing what the ops reported (<= 1).
  double computing = 0;
  for (const auto& r : sim.at("per_rank")) computing += r.at("compute_us").get<double>();
  sim["compute_fraction"] = computing / double(sim.at("per_rank").size()) / sim.at("step_us").get<double>();
  nlohmann::json pipeline = nullptr;
  if (plan.size("pp") > 1 && launcher.traces().size() == size_t(ranks)) {
    // The pipeline's idle share over the run: time outside its forward and backward actions on
    // the simulated clock (stages as the model cuts them), beside the uniform-stage formula.
    const int pp = plan.size("pp"), m = int(rank_micro_batch_count(opt, plan.dp()));
    const PipelinePicture pic = pipeline_picture(launcher.traces(), "bench");
    double busy = 0;
    for (double b : pic.busy_us()) busy += b;
    pipeline = {{"schedule", std::string(pipeline_schedule_name(plan.schedule))},
                {"micro_batches", m},
                {"bubble_fraction", 1.0 - busy / (double(ranks) * pic.end_us)},
                {"bubble_formula_uniform_stages", pipeline_bubble_formula(plan.schedule, pp, m, plan.pp_chunks)}};
  }
  return {{"strategy", strategy},
          {"pipeline", pipeline},
          {"ranks", ranks},
          {"simulated", sim},
          {"plan", plan.to_json()},
          {"step_seconds_median", median(times)},
          {"step_seconds", times},
          {"tokens_per_s", double(opt.tokens_per_step()) / median(times)},
          {"bytes_sent_per_rank_per_step", per_rank},
          {"threads_per_rank", threads},
          {"bytes_sent_per_rank_per_step_by_op", by_op},
          {"peak_memory_per_rank", memory_json(memory)},
          {"backend", a.launch.backend}};
}

// What the engine's GEMM is measured against (a CPU BLAS, or cuBLAS on a GPU), kept loaded by
// `library`; `measure(n, threads, seconds)` gives its best FLOP/s on the products bench times.
struct ReferenceGemm {
  std::string path, config;
  std::function<double(int64_t, int, double)> measure;
  std::shared_ptr<void> library;
};

// The reference for the active backend, or null when none loads. On the CPU a BLAS sgemm (its
// products are fp32 whatever the run's dtype: so are the CPU backend's); on a GPU cuBLAS, with bf16
// inputs when `bf16` (the engine's products then read bf16 operands on tensor cores).
std::unique_ptr<ReferenceGemm> open_reference(const BenchArgs& a, bool bf16) {
  if (std::string(ops::backend_name()) == "cpu") {
    std::shared_ptr<bench::ReferenceBlas> blas = bench::ReferenceBlas::open(a.reference_blas);
    if (!blas) return nullptr;
    return std::make_unique<ReferenceGemm>(ReferenceGemm{
        blas->path(), blas->config(),
        [blas](int64_t n, int threads, double seconds) { return blas->measure_sgemm_flops(n, threads, seconds); },
        blas});
  }
#ifdef LLAMA4D_HAVE_CUDA
  if (std::string(ops::backend_name()) == "cuda") {
    std::shared_ptr<bench::ReferenceCublas> cublas = bench::ReferenceCublas::open();
    if (!cublas) return nullptr;
    return std::make_unique<ReferenceGemm>(ReferenceGemm{
        cublas->path(), cublas->config(),
        [cublas, bf16](int64_t n, int, double seconds) { return cublas->measure_gemm_flops(n, bf16, seconds); },
        cublas});
  }
#endif
  (void)bf16;
  return nullptr;
}

// The engine's GEMM and the reference (when one loaded) on the same n^3 products and the same
// thread count; the peak is the better of the two. `operands`: what the run's products read.
// The two take turns in kGemmRounds rounds of a share of the budget each, and each keeps its best
// rate: on a shared or throttling machine a slow spell (a neighbour's job, the clock stepping
// down as more cores wake) then falls on both rather than on whichever ran during it. A
// 16-core VM measured the 2-thread rate of the same build at 209, 244 and 326 GFLOP/s in three
// runs that timed each library once.
constexpr int kGemmRounds = 3;
nlohmann::json measure_gemm(const BenchArgs& a, const ReferenceGemm* reference, int threads,
                            ops::GemmOperands operands) {
  ops::set_backend_threads(threads);
  double ours = 0, theirs = 0;
  for (int round = 0; round < kGemmRounds; ++round) {
    ours = std::max(ours, ops::measure_peak_gemm_flops(a.gemm_n, a.gemm_seconds / kGemmRounds, operands));
    if (reference) theirs = std::max(theirs, reference->measure(a.gemm_n, threads, a.gemm_seconds / kGemmRounds));
  }
  return {{"n", a.gemm_n},
          {"threads", threads},
          {"llama4d_flops_per_s", ours},
          {"reference_flops_per_s", reference ? nlohmann::json(theirs) : nlohmann::json(nullptr)},
          {"llama4d_over_reference", reference ? nlohmann::json(ours / theirs) : nlohmann::json(nullptr)},
          {"peak_flops_per_s", std::max(ours, theirs)}};
}

nlohmann::json reference_json(const ReferenceGemm* reference) {
  if (reference == nullptr) return nullptr;
  return {{"path", reference->path}, {"config", reference->config}};
}

void report_reference(const ReferenceGemm* reference, bool on_cpu) {
  if (reference == nullptr) {
    progress(on_cpu ? "bench: no reference BLAS found (apt install libopenblas0-pthread, or --reference-blas PATH): "
                      "the peak is the engine's own GEMM, which hides how far that GEMM is from a tuned BLAS\n"
                    : "bench: no cuBLAS found (libcublas.so.13 or .12): the peak is the engine's own GEMM, which "
                      "hides how far that GEMM is from NVIDIA's\n");
  } else {
    progress("bench: reference GEMM %s%s%s\n", reference->path.c_str(), reference->config.empty() ? "" : ": ",
             reference->config.c_str());
  }
}

// One step: its ops queued on a GPU's stream (Trainer::step_queued) unless every op is to wait.
template <class T>
double timed_step(Trainer<T>& trainer, bool wait_every_op) {
  return (wait_every_op ? trainer.step() : trainer.step_queued()).seconds;
}

// Step times of `iters` steps after `warmup` untimed ones.
template <class T>
std::vector<double> time_steps(Trainer<T>& trainer, int64_t warmup, int64_t iters, bool wait_every_op) {
  for (int64_t i = 0; i < warmup; ++i) timed_step(trainer, wait_every_op);
  std::vector<double> times;
  for (int64_t i = 0; i < iters; ++i) times.push_back(timed_step(trainer, wait_every_op));
  return times;
}

// --profile: `iters` more steps with every op timed (each waits for its kernels on a GPU): per op,
// its calls, seconds and FLOP/s per step, busiest first, and the step's time outside every op
// (the host's own work: the loop, the data, the allocator), which no thread count shortens.
template <class T>
nlohmann::json profile_steps(Trainer<T>& trainer, int64_t iters) {
  double step_seconds = 0;
  std::vector<ops::OpTime> totals;
  {
    ops::OpProfile profile;
    for (int64_t i = 0; i < iters; ++i) step_seconds += trainer.step().seconds;
    totals = profile.take();
  }
  std::sort(totals.begin(), totals.end(), [](const ops::OpTime& x, const ops::OpTime& y) { return x.seconds > y.seconds; });
  const double steps = double(iters);
  step_seconds /= steps;
  double in_ops = 0;
  nlohmann::json by_op = nlohmann::json::array();
  for (const ops::OpTime& t : totals) {
    in_ops += t.seconds / steps;
    by_op.push_back({{"op", t.op},
                     {"calls_per_step", double(t.calls) / steps},
                     {"seconds_per_step", t.seconds / steps},
                     {"share_of_step", t.seconds / steps / step_seconds},
                     {"flops_per_s", t.flops > 0 ? nlohmann::json(t.flops / t.seconds) : nlohmann::json(nullptr)}});
  }
  return {{"steps", iters},
          {"step_seconds", step_seconds},
          {"outside_ops_seconds_per_step", step_seconds - in_ops},
          {"by_op", by_op}};
}

// The profile as a table on stderr: one line per op, then the time outside them.
void print_profile(const nlohmann::json& p, int threads) {
  progress("bench: time per step by op, over %lld more steps with every op timed on %d threads (step %.2f ms):\n",
           (long long)p.at("steps").get<int64_t>(), threads, p.at("step_seconds").get<double>() * 1e3);
  progress("  %-30s %8s %10s %7s %10s\n", "op", "calls", "ms/step", "share", "GFLOP/s");
  for (const auto& o : p.at("by_op")) {
    char rate[32] = "";
    if (!o.at("flops_per_s").is_null()) std::snprintf(rate, sizeof rate, "%.1f", o.at("flops_per_s").get<double>() / 1e9);
    progress("  %-30s %8.0f %10.3f %6.1f%% %10s\n", o.at("op").get<std::string>().c_str(),
             o.at("calls_per_step").get<double>(), o.at("seconds_per_step").get<double>() * 1e3,
             100 * o.at("share_of_step").get<double>(), rate);
  }
  const double outside = p.at("outside_ops_seconds_per_step").get<double>();
  progress("  %-30s %8s %10.3f %6.1f%%\n", "(outside every op)", "", outside * 1e3,
           100 * outside / p.at("step_seconds").get<double>());
}

// A sweep's profiles side by side: ms per step of each op at each thread count (busiest on one
// thread first; "-" where an op was not called, such as the clipping's scale in a step whose norm
// stayed under the limit), and its speedup from the first count to the last.
void print_profile_sweep(const nlohmann::json& rows) {
  std::vector<std::string> names;
  for (const auto& r : rows)
    for (const auto& o : r.at("profile").at("by_op"))
      if (std::find(names.begin(), names.end(), o.at("op").get<std::string>()) == names.end())
        names.push_back(o.at("op").get<std::string>());
  names.push_back("(outside every op)");
  names.push_back("(step)");
  // ms per step, or a negative number where the op was not called.
  auto ms = [](const nlohmann::json& profile, const std::string& name) {
    if (name == "(outside every op)") return profile.at("outside_ops_seconds_per_step").get<double>() * 1e3;
    if (name == "(step)") return profile.at("step_seconds").get<double>() * 1e3;
    for (const auto& o : profile.at("by_op"))
      if (o.at("op").get<std::string>() == name) return o.at("seconds_per_step").get<double>() * 1e3;
    return -1.0;
  };
  progress("bench: ms per step by op and thread count (every op timed), and the speedup from %d to %d threads:\n",
           rows.front().at("threads").get<int>(), rows.back().at("threads").get<int>());
  progress("  %-30s", "op");
  for (const auto& r : rows) progress(" %9d", r.at("threads").get<int>());
  progress(" %9s\n", "speedup");
  for (const std::string& name : names) {
    progress("  %-30s", name.c_str());
    for (const auto& r : rows) {
      const double t = ms(r.at("profile"), name);
      t < 0 ? progress(" %9s", "-") : progress(" %9.3f", t);
    }
    const double first = ms(rows.front().at("profile"), name), last = ms(rows.back().at("profile"), name);
    first > 0 && last > 0 ? progress(" %8.2fx\n", first / last) : progress(" %9s\n", "-");
  }
}

// Thread counts 1, 2, 4, ... below `most`, then `most`.
std::vector<int> sweep_counts(int most) {
  std::vector<int> counts;
  for (int t = 1; t < most; t *= 2) counts.push_back(t);
  counts.push_back(most);
  return counts;
}

// --sweep-threads: refused before anything runs unless the backend can run every count (a build
// without OpenMP computes on one thread whatever it is told, and a row would be mislabelled).
void check_sweep_threads(const std::vector<int>& counts) {
  const int saved = ops::backend_threads();
  for (int threads : counts) {
    ops::set_backend_threads(threads);  // refuses counts outside [1, kMaxBackendThreads]
    if (ops::backend_threads() != threads)
      throw InputError("--sweep-threads " + std::to_string(threads) + ": this build computes on " +
                       std::to_string(ops::backend_threads()) + " thread(s) (built without OpenMP)");
  }
  ops::set_backend_threads(saved);
}

// --threads-sweep: the single-rank step and both GEMMs at each thread count, as a table.
template <class T>
nlohmann::json run_threads_sweep(const BenchArgs& a, Trainer<T>& trainer, const TrainOptions& opt,
                                 const ReferenceGemm* reference, int most) {
  nlohmann::json rows = nlohmann::json::array();
  double two_threads = 0;
  progress("%8s %12s %10s %16s %18s %8s\n", "threads", "tokens/s", "vs 2 thr", "llama4d GFLOP/s",
           "reference GFLOP/s", "ratio");
  for (int threads : a.sweep_threads.empty() ? sweep_counts(most) : a.sweep_threads) {
    ops::set_backend_threads(threads);
    const std::vector<double> times = time_steps(trainer, a.warmup, a.iters, a.wait_every_op);
    const double tokens_per_s = double(opt.tokens_per_step()) / median(times);
    if (threads == 2) two_threads = tokens_per_s;
    nlohmann::json row = measure_gemm(a, reference, threads, gemm_operands(opt.bf16_compute));
    row["tokens_per_s"] = tokens_per_s;
    row["tokens_per_s_over_two_threads"] = two_threads > 0 ? nlohmann::json(tokens_per_s / two_threads) : nullptr;
    if (a.profile) row["profile"] = profile_steps(trainer, a.iters);
    // "-" where a column has no value (no reference BLAS; the 2-thread row not reached yet).
    auto cell = [](const nlohmann::json& v, const char* fmt, double scale) {
      char buf[32] = "-";
      if (!v.is_null()) std::snprintf(buf, sizeof buf, fmt, v.get<double>() * scale);
      return std::string(buf);
    };
    progress("%8d %12.0f %10s %16.1f %18s %8s\n", threads, tokens_per_s,
             cell(row.at("tokens_per_s_over_two_threads"), "%.2fx", 1).c_str(),
             row.at("llama4d_flops_per_s").get<double>() / 1e9, cell(row.at("reference_flops_per_s"), "%.1f", 1e-9).c_str(),
             cell(row.at("llama4d_over_reference"), "%.2f", 1).c_str());
    rows.push_back(row);
  }
  if (a.profile) print_profile_sweep(rows);
  return rows;
}

template <class T>
nlohmann::json run_bench(const BenchArgs& a) {
  const LlamaConfig cfg = a.model.resolve();
  check_fits_in_memory(cfg, 4.0 * sizeof(T), a.force, "benchmarking");
  if (a.iters < 1) throw InputError("--iters must be >= 1");
  TrainOptions opt = a.opt;
  opt.steps = a.warmup + a.iters;
  opt.bf16_compute = a.model.bf16();
  const ParallelPlan plan = a.parallel.plan(cfg, a.launch.algo);
  plan.check_precision(opt.bf16_compute);
  apply_micro_batches(a.micro_batches, opt, plan, cfg);
  opt.validate();
  check_step_fits_in_memory(cfg, opt, plan, a.launch.backend, sizeof(T), a.force);
  const TextDataset data = load_dataset(default_corpus_path(), opt.seq_len);
  Llama<T> model(cfg);
  model.set_checkpointing(plan.ac);
  model.init_weights(opt.seed);
  Trainer<T> trainer(model, data, opt);

  const bool on_cpu = std::string(ops::backend_name()) == "cpu";
  const std::unique_ptr<ReferenceGemm> reference = open_reference(a, opt.bf16_compute);
  const int threads = ops::backend_threads();
  progress("bench: %lld parameters, batch %lld x %lld, %d threads; %lld warm-up + %lld timed steps\n",
           (long long)model.num_params(), (long long)opt.batch_size, (long long)opt.seq_len, threads,
           (long long)a.warmup, (long long)a.iters);
  report_reference(reference.get(), on_cpu);
  if (a.threads_sweep) {
    return {{"threads_sweep", run_threads_sweep(a, trainer, opt, reference.get(), threads)},
            {"reference_blas", reference_json(reference.get())},
            {"parameters", model.num_params()},
            {"dtype", a.model.dtype},
            {"batch_size", opt.batch_size},
            {"seq_len", opt.seq_len},
            {"tokens_per_step", opt.tokens_per_step()}};
  }
  const std::vector<double> times = time_steps(trainer, a.warmup, a.iters, a.wait_every_op);
  const double median = llama4d::cli::median(times), best = *std::min_element(times.begin(), times.end());
  const double tokens = double(opt.tokens_per_step());
  const double flops_per_token = training_flops_per_token(cfg, opt.seq_len);
  const double model_flops = tokens * flops_per_token / median;
  const double recompute_per_token = recompute_flops_per_token(cfg, opt.seq_len, plan.ac);
  const double hardware_flops = tokens * (flops_per_token + recompute_per_token) / median;

  progress("bench: measuring %s GEMM (%lld^3) for %.1f s%s\n", opt.bf16_compute ? "bf16-operand" : "fp32",
           (long long)a.gemm_n, a.gemm_seconds, reference ? ", and the reference for as long, taking turns" : "");
  const nlohmann::json gemm = measure_gemm(a, reference.get(), threads, gemm_operands(opt.bf16_compute));
  const double peak = gemm.at("peak_flops_per_s").get<double>();
  const double fraction = model_flops / peak, hfu = hardware_flops / peak;
  if (reference)
    progress("bench: GEMM on %d threads: llama4d %.1f GFLOP/s, reference %.1f GFLOP/s (llama4d = %.2fx)\n", threads,
             gemm.at("llama4d_flops_per_s").get<double>() / 1e9, gemm.at("reference_flops_per_s").get<double>() / 1e9,
             gemm.at("llama4d_over_reference").get<double>());
  progress("bench: step %.1f ms (median of %lld, best %.1f ms), %.0f tokens/s\n", median * 1e3, (long long)a.iters,
           best * 1e3, tokens / median);
  // On a GPU: whether the step's ops queued (Trainer::step_queued, where the device can) or each
  // waited for its kernels; the CPU's ops are done when they return.
  nlohmann::json ops_wait = nullptr;
  if (!on_cpu) {
    ops::QueuedOps probe;
    const bool queued = !a.wait_every_op && probe.queuing();
    probe.finish();
    ops_wait = queued ? "where the host reads" : "every op";
    progress("bench: %s\n", queued ? "the step's ops queued on the GPU's stream; it waited where the host reads a "
                                     "result (uploads, losses, the target check, gradient norms, the finite check)"
                                   : "every op waited for its kernels");
  }
  progress("bench: model %.2f GFLOP/s (%.3g FLOP/token) = %.1f%% of the better measured GEMM, %.2f GFLOP/s (MFU)\n",
           model_flops / 1e9, flops_per_token, 100 * fraction, peak / 1e9);
  progress("bench: activation checkpointing %s: +%.3g FLOP/token recomputed, hardware %.2f GFLOP/s = %.1f%% (HFU)\n",
           plan.ac.describe().c_str(), recompute_per_token, hardware_flops / 1e9, 100 * hfu);
  if (opt.doc_mask)
    progress("bench: --doc-mask: FLOP/token counts causal attention over whole rows (the usual MFU convention); the "
             "mask skips the pairs that cross documents, so the work done is less\n");
  nlohmann::json profile = nullptr;
  if (a.profile) {
    profile = profile_steps(trainer, a.iters);
    print_profile(profile, threads);
  }
  nlohmann::json result = {{"tokens_per_s", tokens / median},
          {"step_seconds_median", median},
          {"step_seconds_best", best},
          {"step_seconds", times},
          {"tokens_per_step", opt.tokens_per_step()},
          {"flops_per_token", flops_per_token},
          {"model_flops_per_s", model_flops},
          {"peak_gemm_flops_per_s", peak},
          {"gemm", gemm},
          {"reference_blas", reference_json(reference.get())},
          {"fraction_of_peak", fraction},
          {"mfu", fraction},
          {"hfu", hfu},
          {"ac", plan.ac.describe()},
          {"plan", plan.to_json()},
          {"recompute_flops_per_token", recompute_per_token},
          {"peak_memory", memory_json({memory_peaks(model.memory())})[0]},
          {"parameters", model.num_params()},
          {"device", ops::backend_name()},
          {"kernels", ops::kernel_mode_name(ops::kernel_mode())},
          {"ops_wait", ops_wait},
          {"profile", profile},
          {"threads", threads},
          {"dtype", a.model.dtype},
          {"batch_size", opt.batch_size},
          {"seq_len", opt.seq_len},
          {"doc_mask", opt.doc_mask}};
  if (a.parallel.parallel()) {
    const nlohmann::json par = run_parallel_bench<T>(a, cfg, data, opt);
    if (par.is_null()) return {};
    const double ratio = par.at("step_seconds_median").get<double>() / median;
    progress("bench: %s on %d %s ranks: step %.1f ms = %.2fx the single-rank step; %s sent per rank per step\n",
             par.at("strategy").get<std::string>().c_str(), par.at("ranks").get<int>(), a.launch.backend.c_str(),
             par.at("step_seconds_median").get<double>() * 1e3, ratio,
             format_bytes(int64_t(par.at("bytes_sent_per_rank_per_step").get<double>())).c_str());
    // The virtual ranks share this machine's cores with each other and with whatever else runs:
    // with fewer cores than ranks the wall-clock ratio says how busy the machine was, not what the
    // plan costs.
    const int cores = int(std::thread::hardware_concurrency()), ranks = par.at("ranks").get<int>();
    if (cores < ranks)
      progress("bench: (wall-clock, %d ranks on %d cores: a ratio below 1, or one that moves from run to run, "
               "measures the machine's load, not the plan; the simulated clock below does not depend on it)\n",
               ranks, cores);
    const nlohmann::json& sim = par.at("simulated");
    double exposed = 0;
    for (const auto& r : sim.at("per_rank")) exposed = std::max(exposed, r.at("exposed_comm_us").get<double>());
    progress("bench: simulated on %d GPUs of %g TFLOP/s: step %.3f ms, exposed communication up to %.3f ms per rank, "
             "%.0f tokens/s, MFU %.1f%%\n",
             par.at("ranks").get<int>(), sim.at("gpu_tflops").get<double>(), sim.at("step_us").get<double>() / 1e3,
             exposed / 1e3, sim.at("tokens_per_s").get<double>(), 100 * sim.at("mfu").get<double>());
    if (!par.at("pipeline").is_null())
      progress("bench: pipeline bubble on the simulated clock %.1f%% of the step (uniform stages would give %.1f%%)\n",
               100 * par.at("pipeline").at("bubble_fraction").get<double>(),
               100 * par.at("pipeline").at("bubble_formula_uniform_stages").get<double>());
    result["parallel"] = par;
    result["parallel_over_single_step_time"] = ratio;
  }
  return result;
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "time training steps against this machine's peak GEMM rate");
  a->model.add_options(*cmd, "small", false);
  a->parallel.add_options(*cmd, "", true);
  a->launch.add_options(*cmd);
  add_number(*cmd, "--batch-size", a->opt.batch_size, "sequences per step")->capture_default_str();
  add_number(*cmd, "--seq-len", a->opt.seq_len, "tokens per sequence (at most the model's max_position_embeddings unless given)")->capture_default_str();
  cmd->add_flag("--doc-mask", a->opt.doc_mask, "mask attention between the documents packed into a sequence (cut at <|end_of_text|>), as Llama 3 trains");
  add_micro_batches_option(*cmd, a->micro_batches);
  add_number(*cmd, "--warmup", a->warmup, "untimed steps first", 0, kMaxBenchSteps)->capture_default_str();
  add_number(*cmd, "--iters", a->iters, "timed steps", 0, kMaxBenchSteps)->capture_default_str();
  add_number(*cmd, "--gemm-n", a->gemm_n,
                  "size of the square GEMM for the peak measurement (with --device cuda 8192 unless given: a smaller "
                  "product cannot fill a GPU)")
      ->capture_default_str();
  add_number(*cmd, "--gemm-seconds", a->gemm_seconds, "time spent measuring peak GEMM")->capture_default_str();
  add_compute_options(*cmd, a->compute, "compute threads (default: all cores)");
  cmd->add_flag("--threads-sweep", a->threads_sweep,
                "time the step and both GEMMs on 1, 2, 4, ... threads up to --threads (default: all cores)");
  add_numbers(*cmd, "--sweep-threads", a->sweep_threads,
                  "the thread counts of --threads-sweep instead, comma-separated (e.g. 2,8,16; implies --threads-sweep)");
  cmd->add_option("--reference-blas", a->reference_blas,
                  "library with cblas_sgemm to measure the peak against (default: Debian's libopenblas.so.0 if installed)");
  cmd->add_flag("--wait-every-op", a->wait_every_op,
                "with --device cuda: every op of the single-rank step waits for its kernels, as parallel training "
                "and verify run it, instead of queuing them and waiting where the host reads a result");
  cmd->add_flag("--profile", a->profile,
                "after the timed steps, run --iters more with every op timed (on a GPU each op then waits) and print "
                "the time per step in each op and outside them; with --threads-sweep, at every thread count");
  cmd->add_flag("--force", a->force, "run even if the model looks too large for this machine");
  cmd->add_flag("--json", a->json, "print one JSON object with the results on stdout");
  cmd->callback([a, cmd] {
    if (cmd->get_subcommands().size() > 0) return;  // `bench comm` ran instead
    if (!a->sweep_threads.empty()) {
      // The counts are the sweep's: a --threads beside them would be accepted and never used.
      if (cmd->count("--threads") > 0) throw InputError("--sweep-threads names the thread counts; drop --threads");
      a->threads_sweep = true;
    }
    if (a->threads_sweep && a->compute.device != "cpu")
      throw InputError("--threads-sweep sweeps the CPU backend's threads; it does not take --device " + a->compute.device);
    // A CPU BLAS beside a GPU's GEMM would measure nothing: there the yardstick is cuBLAS.
    if (cmd->count("--reference-blas") > 0 && a->compute.device != "cpu")
      throw InputError("--reference-blas is the CPU backend's yardstick; it does not take --device " + a->compute.device);
    if (cmd->count("--gemm-n") == 0 && a->compute.device == "cuda") a->gemm_n = 8192;
    if (a->wait_every_op && a->compute.device != "cuda")
      throw InputError("--wait-every-op is about a GPU's stream; it does not take --device " + a->compute.device);
    use_compute(a->compute);
    a->opt.seq_len = fitted_seq_len(*cmd, a->opt.seq_len, a->model.resolve());
    check_sweep_threads(a->sweep_threads);
    a->launch.validate(a->parallel.parallel());
    if (a->threads_sweep && a->parallel.parallel())
      throw InputError("--threads-sweep times the single-rank step; it does not take --mesh");
    if (a->profile && a->parallel.parallel())
      throw InputError("--profile times the single-rank step's ops; it does not take --mesh");
    const nlohmann::json result = a->model.fp64() ? run_bench<double>(*a) : run_bench<float>(*a);
    if (a->json && !result.is_null()) print_json(result);
  });
  return cmd;
}

}  // namespace llama4d::cli
