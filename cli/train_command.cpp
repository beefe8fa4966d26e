// `llama4d train`: trains a Llama on a text file (the shipped corpus by default), on one rank or
// on a data-parallel mesh of virtual GPUs / MPI ranks. Logs metrics to <out>/metrics.jsonl,
// evaluates on the held-out split, saves a checkpoint that resumes bitwise on any mesh.
#include <cmath>
#include <fstream>
#include <functional>
#include <mutex>

#include "cli/common.h"
#include "cli/launch.h"
#include "cli/parallel_options.h"
#include "core/data/dataset.h"
#include "core/data/entropy.h"
#include "core/error.h"
#include "core/io/atomic_dir.h"
#include "core/io/checkpoint.h"
#include "core/model/llama.h"
#include "core/ops.h"
#include "core/parallel/parallel_trainer.h"
#include "core/parallel/dp_common.h"
#include "core/train/checkpoint_state.h"
#include "core/train/trainer.h"

namespace llama4d::cli {

namespace {

struct TrainArgs {
  ModelChoice model;
  ParallelChoice parallel;
  LaunchOptions launch;
  TrainOptions opt;
  std::string data, out = "runs/train", resume;
  int64_t eval_every = 100, eval_windows = 64, save_every = 0, log_every = 10, stop_at = 0;
  int threads = 0;
  bool json = false, force = false;
};

// What the loop needs from a trainer, single-rank or data-parallel (whose calls are collective).
struct TrainerCalls {
  std::function<StepStats()> step;
  std::function<int64_t()> steps_done;
  std::function<double(int64_t windows)> validate;  // mean loss
  std::function<void(const std::string& dir)> save;
};

// The run itself: steps, metrics, progress, evaluation, checkpoints. `lead` is the rank that
// writes files and prints; every rank runs the loop (collectives inside the calls).
nlohmann::json train_loop(const TrainArgs& a, const TrainOptions& opt, const TrainerCalls& t, bool lead) {
  const int64_t last = a.stop_at > 0 ? std::min(a.stop_at, opt.steps) : opt.steps;
  std::ofstream metrics;
  if (lead) {
    metrics.open(a.out + "/metrics.jsonl", std::ios::app);
    if (!metrics) throw IoError("cannot append to " + a.out + "/metrics.jsonl");
  }
  double total_seconds = 0, last_loss = NAN, val_loss = NAN;
  int64_t total_tokens = 0, steps_this_run = 0;
  while (t.steps_done() < last) {
    const StepStats st = t.step();
    total_seconds += st.seconds;
    total_tokens += st.tokens;
    ++steps_this_run;
    last_loss = st.loss;
    if (!std::isfinite(st.loss))
      throw Error("training diverged: loss is " + std::to_string(st.loss) + " at step " + std::to_string(st.step));
    const bool eval_now = a.eval_every > 0 && (st.step % a.eval_every == 0 || st.step == last);
    if (eval_now) val_loss = t.validate(a.eval_windows);
    if (lead) {
      nlohmann::json row = {{"step", st.step}, {"loss", st.loss}, {"lr", st.lr}, {"grad_norm", st.grad_norm},
                            {"tokens_per_s", double(st.tokens) / st.seconds}};
      if (eval_now) row["val_loss"] = val_loss;
      metrics << row.dump() << "\n" << std::flush;
      if (st.step % a.log_every == 0 || st.step == last || eval_now)
        progress("step %5lld/%lld  loss %.4f  lr %.2e  grad_norm %.3f  %.0f tok/s%s\n", (long long)st.step,
                 (long long)last, st.loss, st.lr, st.grad_norm, double(st.tokens) / st.seconds,
                 eval_now ? ("  val_loss " + std::to_string(val_loss)).c_str() : "");
    }
    if (a.save_every > 0 && st.step % a.save_every == 0 && st.step != last) t.save(a.out + "/checkpoint");
  }
  if (std::isnan(val_loss) && a.eval_every > 0) val_loss = t.validate(a.eval_windows);
  const std::string ckpt = a.out + "/checkpoint";
  t.save(ckpt);
  if (lead)
    progress("train: saved %s; final loss %.4f%s\n", ckpt.c_str(), last_loss,
             a.eval_every > 0 ? (", val loss " + std::to_string(val_loss)).c_str() : " (no validation: --eval-every 0)");
  auto num = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  return {{"final_loss", num(last_loss)},
          {"steps", t.steps_done()},
          {"steps_this_run", steps_this_run},
          {"tokens", total_tokens},
          {"tokens_per_s", total_seconds > 0 ? double(total_tokens) / total_seconds : 0.0},
          {"val_loss", num(val_loss)},
          {"checkpoint", ckpt},
          {"metrics", a.out + "/metrics.jsonl"},
          {"options", opt.to_json()}};
}

struct Setup {
  LlamaConfig cfg;
  TrainOptions opt;
  std::string data_path;
};

Setup prepare(const TrainArgs& a, double bytes_per_param) {
  ensure_writable_dir(a.out);
  // Before any work, not at the end of the run: is <out>/checkpoint ours to replace? And the
  // staging directories of saves that were killed on this machine are removed, not kept forever.
  check_directory_replaceable(a.out + "/checkpoint", kConfigFile);
  if (const int stale = remove_stale_staging(a.out + "/checkpoint"))
    std::fprintf(stderr, "removed %d staging director%s left by a killed save in %s\n", stale, stale == 1 ? "y" : "ies",
                 a.out.c_str());
  Setup s{a.model.resolve(), a.opt, a.data.empty() ? default_corpus_path() : a.data};
  if (!a.resume.empty()) {
    // The checkpoint defines the model shape and the run's options; only its step count moves.
    s.cfg = load_config(a.resume);
    s.opt = read_train_options(a.resume);
  }
  check_fits_in_memory(s.cfg, bytes_per_param, a.force, "training a " + std::to_string(s.cfg.num_parameters()) + "-parameter model");
  return s;
}

template <class T>
nlohmann::json run_single(const TrainArgs& a) {
  const Setup s = prepare(a, 4.0 * sizeof(T));
  const TextDataset data = load_dataset(s.data_path, s.opt.seq_len);
  const UnigramEntropy unigram = unigram_entropy(data.validation());
  const ParallelPlan plan = a.parallel.plan(s.cfg, a.launch.algo);
  Llama<T> model(s.cfg);
  model.set_checkpointing(plan.ac);
  model.init_weights(s.opt.seed);
  Trainer<T> trainer(model, data, s.opt);
  if (!a.resume.empty()) trainer.load_checkpoint(a.resume);
  progress("train: %lld parameters, %s, one rank, %d threads; data %s (%lld train / %lld val tokens)\n",
           (long long)model.num_params(), a.model.dtype.c_str(), ops::backend_threads(), s.data_path.c_str(),
           (long long)data.train_size, (long long)data.validation().size());
  progress("train: batch %lld x %lld tokens (micro-batch %lld); unigram entropy of val %.3f nats\n",
           (long long)s.opt.batch_size, (long long)s.opt.seq_len, (long long)s.opt.micro(), unigram.nats);
  const TrainerCalls calls{[&] { return trainer.step(); }, [&] { return trainer.steps_done(); },
                           [&](int64_t w) { return trainer.validate(w).mean(); },
                           [&](const std::string& dir) { trainer.save_checkpoint(dir); }};
  nlohmann::json j = train_loop(a, s.opt, calls, true);
  j["unigram_entropy_nats"] = unigram.nats;
  j["parameters"] = model.num_params();
  j["dtype"] = a.model.dtype;
  j["ranks"] = 1;
  j["plan"] = plan.to_json();
  j["peak_memory_per_rank"] = memory_json({memory_peaks(model.memory())});
  return j;
}

template <class T>
nlohmann::json run_parallel(const TrainArgs& a) {
  const Setup s = prepare(a, 4.0 * sizeof(T));
  const ParallelPlan plan = a.parallel.plan(s.cfg, a.launch.algo);
  const int ranks = plan.world_size();
  const TextDataset data = load_dataset(s.data_path, s.opt.seq_len);
  const UnigramEntropy unigram = unigram_entropy(data.validation());
  RankLaunch launcher(a.launch);
  nlohmann::json result;
  std::vector<RankMemory> memory(static_cast<size_t>(ranks));
  std::mutex mu;
  std::string strategy;
  launcher.run(ranks, [&](ProcessGroup& world) {
    Llama<T> model(s.cfg, &world.memory(), plan.tp_layout(s.cfg, world.rank()));
    ParallelTrainer<T> trainer(world, model, data, s.opt, plan);
    if (!a.resume.empty()) trainer.load_checkpoint(a.resume);
    const bool lead = world.rank() == 0 && launcher.reporting();
    if (lead) {
      progress("train: %lld parameters, %s, %s on %d %s ranks (%s reductions); data %s\n",
               (long long)model.num_params(), a.model.dtype.c_str(), trainer.describe().c_str(),
               ranks, a.launch.backend.c_str(), a.launch.algo.c_str(), s.data_path.c_str());
      progress("train: global batch %lld x %lld tokens, %lld rows per rank in micro-batches of %lld\n",
               (long long)s.opt.batch_size, (long long)s.opt.seq_len, (long long)(s.opt.batch_size / plan.dp()),
               (long long)rank_micro_batch_rows(s.opt, plan.dp()));
    }
    const TrainerCalls calls{[&] { return trainer.step(); }, [&] { return trainer.steps_done(); },
                             [&](int64_t w) { return trainer.validate(w).mean(); },
                             [&](const std::string& dir) { trainer.save_checkpoint(dir); }};
    nlohmann::json j = train_loop(a, s.opt, calls, lead);
    std::lock_guard<std::mutex> lock(mu);
    memory[size_t(world.rank())] = trainer.strategy().peak_memory();
    if (world.rank() == 0) result = j, strategy = trainer.describe();
  });
  if (!launcher.reporting()) return {};
  const nlohmann::json mem = memory_json(memory);
  if (!a.json) std::fputs(launcher.summary().c_str(), stderr);
  result["unigram_entropy_nats"] = unigram.nats;
  result["parameters"] = s.cfg.num_parameters();
  result["dtype"] = a.model.dtype;
  result["ranks"] = ranks;
  result["mesh"] = plan.describe_mesh();
  result["plan"] = plan.to_json();
  result["strategy"] = strategy;
  result["backend"] = a.launch.backend;
  result["peak_memory_per_rank"] = mem;
  result["traffic"] = launcher.traffic_totals();
  return result;
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "train a Llama on one rank or a parallel mesh of ranks");
  a->model.add_options(*cmd, "small", false);
  a->parallel.add_options(*cmd, "");
  a->launch.add_options(*cmd);
  cmd->add_option("--data", a->data, "UTF-8 text file or directory of .txt files (default: shipped corpus)");
  cmd->add_option("--out", a->out, "output directory: metrics.jsonl and checkpoint/")->capture_default_str();
  cmd->add_option("--resume", a->resume, "checkpoint directory to continue from (its options are reused)");
  cmd->add_option("--steps", a->opt.steps, "optimizer steps in the run")->capture_default_str();
  cmd->add_option("--stop-at", a->stop_at, "stop (and checkpoint) after this step, as if interrupted");
  cmd->add_option("--batch-size", a->opt.batch_size, "sequences per optimizer step (the global batch)")->capture_default_str();
  cmd->add_option("--micro-batch-size", a->opt.micro_batch_size, "sequences per forward/backward (0: all of a rank's)")
      ->capture_default_str();
  cmd->add_option("--seq-len", a->opt.seq_len, "tokens per sequence")->capture_default_str();
  cmd->add_option("--lr", a->opt.lr, "peak learning rate")->capture_default_str();
  cmd->add_option("--min-lr", a->opt.min_lr, "final learning rate of the cosine decay")->capture_default_str();
  cmd->add_option("--warmup-steps", a->opt.warmup_steps, "linear warm-up steps")->capture_default_str();
  cmd->add_option("--grad-clip", a->opt.grad_clip, "clip the global gradient norm (0: off)")->capture_default_str();
  cmd->add_option("--weight-decay", a->opt.adamw.weight_decay, "AdamW weight decay")->capture_default_str();
  cmd->add_option("--seed", a->opt.seed, "seed for weights and batches")->capture_default_str();
  cmd->add_option("--eval-every", a->eval_every, "validate every N steps (0: never)")->capture_default_str();
  cmd->add_option("--eval-windows", a->eval_windows, "validation windows per evaluation")->capture_default_str();
  cmd->add_option("--save-every", a->save_every, "also checkpoint every N steps")->capture_default_str();
  cmd->add_option("--log-every", a->log_every, "print progress every N steps")->capture_default_str();
  cmd->add_option("--threads", a->threads, "compute threads of this process (default: all cores)");
  cmd->add_flag("--force", a->force, "train even if the model looks too large for this machine");
  cmd->add_flag("--json", a->json, "print one JSON object with the results on stdout");
  cmd->callback([a] {
    set_threads(a->threads);
    if (a->log_every < 1) throw InputError("--log-every must be >= 1");
    if (a->eval_windows < 1) throw InputError("--eval-windows must be >= 1");
    const bool f64 = a->model.fp64();
    nlohmann::json result;
    if (a->parallel.parallel())
      result = f64 ? run_parallel<double>(*a) : run_parallel<float>(*a);
    else
      result = f64 ? run_single<double>(*a) : run_single<float>(*a);
    if (a->json && !result.is_null()) print_json(result);
  });
}

}  // namespace llama4d::cli
