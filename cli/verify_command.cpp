// `llama4d verify`: the equivalence harness. Trains K steps with a parallel plan on N ranks and
// checks every rank at every step against one device (core/verify/equivalence.h), then prints
// every tensor's error, every rank's verdict and whether the bits match. Exits 1 when the results
// are outside tolerance (with ordered reductions: not bitwise).
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "cli/common.h"
#include "cli/init_checkpoint.h"
#include "cli/launch.h"
#include "cli/parallel_options.h"
#include "core/data/batch_sampler.h"
#include "core/data/dataset.h"
#include "core/data/tokenized_corpus.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/verify/equivalence.h"

namespace llama4d::cli {

namespace {

struct VerifyArgs {
  ModelChoice model;
  ParallelChoice parallel;
  LaunchOptions launch;
  TrainOptions opt;
  std::string data, init;
  ComputeChoice compute;
  bool json = false;
  int micro_batches = 0;
};

// Document boundaries the mask cut in the batches a run trained on: <|end_of_text|> tokens with a
// later token in their row. Zero means the mask never changed attention.
int64_t document_boundaries(const TextDataset& data, const TrainOptions& opt) {
  int64_t n = 0;
  for (int64_t s = 0; s < opt.steps; ++s) {
    const Batch b = sample_batch(data.train(), opt.seq_len, opt.seed, s, opt.batch_size);
    for (int64_t r = 0; r < b.B; ++r)
      n += std::count(b.tokens.begin() + r * b.seq, b.tokens.begin() + (r + 1) * b.seq - 1, opt.doc_separator);
  }
  return n;
}

struct Verified {
  EquivalenceReport report;
  int64_t boundaries = -1;  // document boundaries in the batches, with --doc-mask
};

template <class T>
Verified run_verify(const VerifyArgs& a, RankLaunch& launcher) {
  EquivalenceOptions o;
  // --init: a model directory's shape, tokenizer and weights (every side starts from them).
  std::unique_ptr<const ModelDirectory> md;
  if (!a.init.empty()) md = std::make_unique<const ModelDirectory>(open_model_directory(a.init));
  const bool bpe = md && !dynamic_cast<const ByteTokenizer*>(md->tokenizer.get());
  o.model = md ? md->config : a.model.resolve();
  o.plan = a.parallel.plan(o.model, a.launch.algo);
  if (o.plan.single_device()) throw InputError("verify needs a parallel --mesh to compare against one device");
  o.train = a.opt;
  if (bpe) o.train.doc_separator = end_of_text_id(*md->tokenizer);  // what the mask cuts after
  o.train.bf16_compute = a.model.bf16();
  // Defaults that exercise gradient accumulation: four rows per data rank, and micro-batches of
  // half a rank's rows (one row each when that is odd), so every rank accumulates.
  if (o.train.batch_size == 0) o.train.batch_size = 4 * o.plan.dp();
  if (o.train.micro_batch_size == -1) {
    const int64_t rows = o.train.batch_size / o.plan.dp();
    o.train.micro_batch_size = rows % 2 == 0 ? std::max<int64_t>(1, rows / 2) : 1;
  }
  apply_micro_batches(a.micro_batches, o.train, o.plan, o.model);
  check_fits_in_memory(o.model, 4.0 * sizeof(T) * 2, false, "verifying");
  o.train.validate();
  // The plan's ranks and the one-device replay: two of every forward.
  check_step_fits_in_memory(o.model, o.train, o.plan, a.launch.backend, 2.0 * sizeof(T), false);
  const std::string path = a.data.empty() ? default_corpus_path() : a.data;
  const TextDataset data = bpe ? load_tokenized_dataset(*md->tokenizer, path, o.train.seq_len, ops::backend_threads(),
                                                     tokenize_progress(a.launch, path), 0.1, md->data_chat_format())
                               : make_dataset(load_text_documents(path), o.train.seq_len, 0.1, path);
  // The weights staged as a step-0 checkpoint in this process's own temporary directory.
  const std::filesystem::path staged =
      std::filesystem::temp_directory_path() / ("llama4d-verify-init-" + std::to_string(getpid()));
  struct Remove {
    std::filesystem::path p;
    ~Remove() {
      std::error_code ec;
      if (!p.empty()) std::filesystem::remove_all(p, ec);
    }
  } remove{md ? staged : std::filesystem::path()};
  if (md) o.start_from = stage_init_checkpoint<T>(o.model, a.init, data, o.train, staged.string());
  // Under MPI every process must verify the same run (RankLaunch::agree_on).
  std::vector<RankSetting> settings = a.parallel.rank_settings(o.plan);
  const std::vector<RankSetting> step = model_and_step_rank_settings(o.model, a.model.dtype, o.train);
  settings.insert(settings.end(), step.begin(), step.end());
  settings.push_back({"--data (its tokens)", data_fingerprint(data.tokens)});
  settings.push_back({"--init", a.init});
  launcher.agree_on(std::move(settings));
  Verified v;
  v.report = verify_plan<T>(o, data, [&](const std::function<void(ProcessGroup&)>& fn) {
    launcher.run(o.plan.world_size(), fn);
  });
  if (o.train.doc_mask) v.boundaries = document_boundaries(data, o.train);
  return v;
}

}  // namespace

void add_verify_command(CLI::App& app) {
  auto a = std::make_shared<VerifyArgs>();
  CLI::App* cmd = app.add_subcommand("verify", "prove a parallel strategy computes the single-device gradients");
  a->model.add_options(*cmd, "tiny", false);
  a->parallel.add_options(*cmd, "dp=4", true);
  add_micro_batches_option(*cmd, a->micro_batches);
  a->launch.add_options(*cmd);
  a->opt.steps = 3;
  a->opt.batch_size = 0;
  a->opt.micro_batch_size = -1;
  a->opt.seq_len = 64;
  a->opt.warmup_steps = 1;
  add_number(*cmd, "--steps", a->opt.steps, "AdamW steps to compare")->capture_default_str();
  add_number(*cmd, "--batch-size", a->opt.batch_size, "global batch in sequences (0: four per data rank)")->capture_default_str();
  add_number(*cmd, "--micro-batch-size", a->opt.micro_batch_size, "sequences per forward on each rank (0: all; -1: half a rank's rows)", -1)
      ->capture_default_str();
  add_number(*cmd, "--seq-len", a->opt.seq_len, "tokens per sequence")->capture_default_str();
  cmd->add_flag("--doc-mask", a->opt.doc_mask, "mask attention between the documents packed into a sequence (cut at <|end_of_text|>), as Llama 3 trains");
  add_number(*cmd, "--grad-clip", a->opt.grad_clip, "clip the global gradient norm (0: off)")->capture_default_str();
  add_number(*cmd, "--seed", a->opt.seed, "seed for weights and batches")->capture_default_str();
  cmd->add_option("--data", a->data, "text to draw batches from (default: shipped corpus)");
  cmd->add_option("--init", a->init,
                  "a model directory (config.json, weights, tokenizer): verify the plan on its weights, with the data "
                  "encoded by its tokenizer");
  add_compute_options(*cmd, a->compute, "compute threads of this process (default: all cores)");
  cmd->add_flag("--json", a->json, "print one JSON object with the report on stdout");
  cmd->callback([a, cmd] {
    use_compute(a->compute);
    for (const char* flag : {"--preset", "--config"})
      if (!a->init.empty() && cmd->count(flag) > 0)
        throw InputError(std::string(flag) + " and --init: the model is --init's directory");
    RankLaunch launcher(a->launch);
    const Verified v = a->model.fp64() ? run_verify<double>(*a, launcher) : run_verify<float>(*a, launcher);
    const EquivalenceReport& r = v.report;
    if (!launcher.reporting()) return;
    // With --init the model is the directory's, not the --preset default.
    const std::string model = a->init.empty() ? a->model.describe() : "model directory " + a->init;
    progress("verify: %s, --mesh %s\n", model.c_str(), a->parallel.mesh.c_str());
    if (a->json) {
      nlohmann::json j = r.to_json();
      j["traffic"] = launcher.traffic_totals();
      j["device"] = ops::backend_name();
      j["kernels"] = ops::kernel_mode_name(ops::kernel_mode());
      j["doc_mask"] = a->opt.doc_mask;
      if (v.boundaries >= 0) j["document_boundaries"] = v.boundaries;
      print_json(j);
    } else {
      std::fputs(r.table().c_str(), stdout);
      if (v.boundaries >= 0)
        std::printf("document mask: %lld document boundaries inside the rows of the batches\n", (long long)v.boundaries);
    }
    if (!r.ok) throw VerificationFailed(r.strategy + ": worst relative error " + std::to_string(r.max_rel_err) + " in " + r.worst_tensor);
  });
}

}  // namespace llama4d::cli
