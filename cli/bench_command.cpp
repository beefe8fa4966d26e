// `llama4d bench`: times full training steps (forward, backward, AdamW) and reports tokens/s
// and achieved model FLOP/s as a fraction of this machine's peak GEMM FLOP/s, measured here
// with the same GEMM path the model uses. `llama4d bench comm` lives in bench_comm_command.cpp.
#include <algorithm>
#include <chrono>

#include "cli/common.h"
#include "core/data/dataset.h"
#include "core/error.h"
#include "core/model/flops.h"
#include "core/model/llama.h"
#include "core/ops.h"
#include "core/train/trainer.h"

namespace llama4d::cli {

namespace {

struct BenchArgs {
  ModelChoice model;
  TrainOptions opt;
  int64_t warmup = 2, iters = 5, gemm_n = 1024;
  double gemm_seconds = 1.0;
  int threads = 0;
  bool json = false, force = false;
};

template <class T>
nlohmann::json run_bench(const BenchArgs& a) {
  const LlamaConfig cfg = a.model.resolve();
  check_fits_in_memory(cfg, 4.0 * sizeof(T), a.force, "benchmarking");
  if (a.warmup < 0 || a.iters < 1) throw InputError("--warmup must be >= 0 and --iters >= 1");
  TrainOptions opt = a.opt;
  opt.steps = a.warmup + a.iters;
  const TextDataset data = load_dataset(default_corpus_path(), opt.seq_len);
  Llama<T> model(cfg);
  model.init_weights(opt.seed);
  Trainer<T> trainer(model, data, opt);

  progress("bench: %lld parameters, batch %lld x %lld, %d threads; %lld warm-up + %lld timed steps\n",
           (long long)model.num_params(), (long long)opt.batch_size, (long long)opt.seq_len, ops::backend_threads(),
           (long long)a.warmup, (long long)a.iters);
  for (int64_t i = 0; i < a.warmup; ++i) trainer.step();
  std::vector<double> times;
  for (int64_t i = 0; i < a.iters; ++i) times.push_back(trainer.step().seconds);
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2], best = times.front();
  const double tokens = double(opt.tokens_per_step());
  const double flops_per_token = training_flops_per_token(cfg, opt.seq_len);
  const double model_flops = tokens * flops_per_token / median;

  progress("bench: measuring peak fp32 GEMM (%lld^3) for %.1f s\n", (long long)a.gemm_n, a.gemm_seconds);
  const double peak = ops::measure_peak_gemm_flops(a.gemm_n, a.gemm_seconds);
  const double fraction = model_flops / peak;
  progress("bench: step %.1f ms (median of %lld, best %.1f ms), %.0f tokens/s\n", median * 1e3, (long long)a.iters,
           best * 1e3, tokens / median);
  progress("bench: model %.2f GFLOP/s (%.3g FLOP/token) = %.1f%% of measured peak GEMM %.2f GFLOP/s\n",
           model_flops / 1e9, flops_per_token, 100 * fraction, peak / 1e9);
  return {{"tokens_per_s", tokens / median},
          {"step_seconds_median", median},
          {"step_seconds_best", best},
          {"step_seconds", times},
          {"tokens_per_step", opt.tokens_per_step()},
          {"flops_per_token", flops_per_token},
          {"model_flops_per_s", model_flops},
          {"peak_gemm_flops_per_s", peak},
          {"fraction_of_peak", fraction},
          {"parameters", model.num_params()},
          {"threads", ops::backend_threads()},
          {"dtype", a.model.dtype},
          {"batch_size", opt.batch_size},
          {"seq_len", opt.seq_len}};
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "time training steps against this machine's peak GEMM rate");
  a->model.add_options(*cmd, "small", false);
  cmd->add_option("--batch-size", a->opt.batch_size, "sequences per step")->capture_default_str();
  cmd->add_option("--seq-len", a->opt.seq_len, "tokens per sequence")->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "untimed steps first")->capture_default_str();
  cmd->add_option("--iters", a->iters, "timed steps")->capture_default_str();
  cmd->add_option("--gemm-n", a->gemm_n, "size of the square GEMM for the peak measurement")->capture_default_str();
  cmd->add_option("--gemm-seconds", a->gemm_seconds, "time spent measuring peak GEMM")->capture_default_str();
  cmd->add_option("--threads", a->threads, "compute threads (default: all cores)");
  cmd->add_flag("--force", a->force, "run even if the model looks too large for this machine");
  cmd->add_flag("--json", a->json, "print one JSON object with the results on stdout");
  cmd->callback([a, cmd] {
    if (cmd->get_subcommands().size() > 0) return;  // `bench comm` ran instead
    set_threads(a->threads);
    const nlohmann::json result = a->model.fp64() ? run_bench<double>(*a) : run_bench<float>(*a);
    if (a->json) print_json(result);
  });
  return cmd;
}

}  // namespace llama4d::cli
