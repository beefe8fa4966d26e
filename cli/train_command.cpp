// `llama4d train`: trains a Llama on a text file (the shipped corpus by default), on one rank or
// on a parallel mesh of virtual GPUs / MPI ranks. Logs metrics to <out>/metrics.jsonl,
// evaluates on the held-out split, saves a checkpoint that resumes bitwise on any mesh. With
// --recipe, runs a training recipe's stages on virtual GPUs.
//
// The command's files, read in this order:
//   train_command.cpp     the flags, the checks before any work, and a run on one rank;
//   train_run.*           the run the flags resolve to (model, options, resume, data);
//   train_loop.*          the loop every rank runs: steps, metrics, evaluation, checkpoints;
//   train_supervisor.*    a parallel run's faults, restarts and goodput;
//   train_parallel.*      one launch of a parallel run on its mesh;
//   train_recipe.*        --recipe's stages and the state moved between their meshes.
#include <cmath>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/train_loop.h"
#include "cli/train_recipe.h"
#include "cli/train_supervisor.h"
#include "core/error.h"
#include "core/io/atomic_dir.h"
#include "core/io/checkpoint.h"
#include "core/model/llama.h"
#include "core/ops.h"
#include "core/train/checkpoint_state.h"
#include "core/train/trainer.h"

namespace llama4d::cli {

namespace {

using namespace training;

template <class T>
nlohmann::json run_single(const Run& r, const ParallelPlan& plan, const TextDataset& data) {
  const TrainArgs& a = r.args;
  const double unigram = unigram_nats(r, data);
  Llama<T> model(r.cfg);
  model.set_checkpointing(plan.ac);
  model.init_weights(a.opt.seed);
  if (!a.init.empty()) load_model(a.init, model.param_specs(), model.params());
  Trainer<T> trainer(model, data, a.opt);
  if (!a.resume.empty()) trainer.load_checkpoint(a.resume);
  progress("train: %s, %lld parameters, %s, one rank, %d threads; data %s (%lld train / %lld val tokens)\n",
           model_name(a).c_str(), (long long)model.num_params(), a.model.dtype.c_str(), ops::backend_threads(), a.data.c_str(),
           (long long)data.train_size, (long long)data.validation().size());
  progress("train: batch %lld x %lld tokens (micro-batch %lld); unigram entropy of val %.3f nats\n",
           (long long)a.opt.batch_size, (long long)a.opt.seq_len, (long long)a.opt.micro(), unigram);
  // One rank: the step's ops may queue on a GPU's stream. A parallel run's steps share buffers
  // with collectives and other ranks, so there every op waits.
  TrainerCalls calls{[&] { return trainer.step_queued(); }, [&] { return trainer.steps_done(); },
                     [&](int64_t w) { return trainer.validation_loss(w).mean(); },
                     [&](const std::string& dir) {
                       trainer.save_checkpoint(dir);
                       write_tokenizer_files(r, dir);
                     },
                     {}, {}, {}, {}};
  AsyncCheckpointer<T> async;  // declared after the trainer: a write in flight ends before it goes
  if (a.async_checkpoint)
    use_async_checkpoint<T>(calls, async, 1,
                            [&](TrainingStateImage<T>& image, const std::function<void()>& written) {
                              trainer.save_state(image);
                              written();
                            },
                            [&](const std::string& staging) { write_tokenizer_files(r, staging); });
  nlohmann::json j = train_loop(a, a.opt, calls, true);
  j["unigram_entropy_nats"] = std::isnan(unigram) ? nlohmann::json(nullptr) : nlohmann::json(unigram);
  j["model"] = model_name(a);
  if (r.model_dir) j["tokenizer"] = r.model_dir->tokenizer->describe();
  j["parameters"] = model.num_params();
  j["dtype"] = a.model.dtype;
  j["ranks"] = 1;
  j["plan"] = plan.to_json();
  j["peak_memory_per_rank"] = memory_json({memory_peaks(model.memory())});
  return j;
}

nlohmann::json train(const TrainArgs& asked, const CLI::App& cmd) {
  if (!asked.recipe.empty() || !asked.stages.empty()) return train_recipe(asked, cmd);
  use_compute(asked.compute);
  Run r = resolve_run(asked, cmd);
  const TrainArgs& a = r.args;
  const ParallelPlan plan = a.parallel.plan(r.cfg, a.launch.algo);
  plan.check_precision(a.opt.bf16_compute);
  a.launch.validate(a.parallel.parallel());
  FaultSchedule faults = check_fault_flags(a, cmd, plan, r.cfg);
  std::optional<DrawnSchedule> drawn;
  if (cmd.count("--fault-rate") > 0) {
    drawn = draw_fault_schedule(a.fault_rate, uint64_t(a.fault_seed), plan.world_size(), last_step(a),
                                plan.zero != ZeroStage::zero3);
    faults = drawn->schedule;
  }
  const bool f64 = a.model.fp64();
  check_fits_in_memory(r.cfg, 4.0 * (f64 ? 8 : 4), a.force,
                       "training a " + std::to_string(r.cfg.num_parameters()) + "-parameter model");
  a.opt.validate();
  check_moe_micro_batches(r.cfg, a.opt, plan);
  check_step_fits_in_memory(r.cfg, a.opt, plan, a.launch.backend, f64 ? 8 : 4, a.force);
  const TextDataset data = load_run_data(r, cmd.count("--data") > 0);

  const OutputDir out(a.out);
  // One run per --out. The processes of an MPI or NCCL job share it: their rank 0 locks it, in
  // run_parallel, once it knows its rank.
  const bool processes = a.parallel.parallel() && a.launch.backend != "virtual";
  std::optional<OutputLock> lock;
  if (!processes) lock.emplace(a.out, "train");
  // Before any work, not at the end of the run: is <out>/checkpoint ours to replace? And the
  // staging directories of saves that were killed on this machine are removed, not kept forever.
  check_directory_replaceable(a.out + "/checkpoint", kConfigFile);
  if (const int stale = remove_stale_staging(a.out + "/checkpoint"))
    std::fprintf(stderr, "removed %d staging director%s left by a killed save in %s\n", stale, stale == 1 ? "y" : "ies",
                 a.out.c_str());
  if (drawn) report_drawn_faults(a, *drawn);
  // Every parallel run goes through the supervisor (with no restarts unless asked): it reports goodput.
  nlohmann::json result = a.parallel.parallel()
                              ? supervise_run(r, plan, data, faults)
                              : (f64 ? run_single<double>(r, plan, data) : run_single<float>(r, plan, data));
  if (!result.is_null()) {  // null: an MPI rank that does not report
    result["device"] = ops::backend_name();
    result["kernels"] = ops::kernel_mode_name(ops::kernel_mode());
    if (drawn) result["fault_rate"] = drawn_faults_json(a, *drawn);
  }
  return result;
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "train a Llama on one rank or a parallel mesh of ranks");
  a->model.add_options(*cmd, "small", false);
  a->parallel.add_options(*cmd, "", true);
  a->launch.add_options(*cmd);
  cmd->add_option("--data", a->data,
                  "UTF-8 text file, directory of .txt files, or .jsonl whose lines have a \"text\" string or a \"messages\" chat (default: shipped corpus)");
  cmd->add_option("--init", a->init,
                  "start from a model directory (config.json, weights, tokenizer): the data is encoded by its "
                  "tokenizer, and the tokenizer files are saved beside the checkpoint");
  cmd->add_option("--out", a->out, "output directory: metrics.jsonl and checkpoint/")->capture_default_str();
  cmd->add_option("--resume", a->resume,
                  "checkpoint directory to continue from: its model, options and loop settings; --steps, "
                  "--micro-batch-size, --eval-*, --save-every, --log-every and the mesh may change");
  cmd->add_option("--recipe", a->recipe,
                  "run a training recipe (JSON, or TOML in a .toml file; core/train/recipe.h): stages with their own batch, seq_len, mesh "
                  "and LR segment; the state moves between stages' meshes in memory (virtual GPUs)");
  cmd->add_option("--stage", a->stages,
                  "one stage of a recipe without a file, repeated for each stage: KEY=VALUE,... with a recipe stage's "
                  "keys (core/train/stage_flags.h), e.g. steps=20,batch_size=8,seq_len=64,dp=2,lr=warmup:0:3e-3")
      ->expected(1)
      ->take_all();
  add_number(*cmd, "--steps", a->opt.steps, "optimizer steps in the run")->capture_default_str();
  add_number(*cmd, "--stop-at", a->stop_at, "stop (and checkpoint) after this step, as if interrupted");
  add_number(*cmd, "--batch-size", a->opt.batch_size, "sequences per optimizer step (the global batch)")->capture_default_str();
  add_number(*cmd, "--micro-batch-size", a->opt.micro_batch_size, "sequences per forward/backward (0: all of a rank's)")
      ->capture_default_str();
  add_number(*cmd, "--seq-len", a->opt.seq_len, "tokens per sequence (at most the model's max_position_embeddings unless given)")->capture_default_str();
  cmd->add_flag("--doc-mask", a->opt.doc_mask, "mask attention between the documents packed into a sequence (cut at <|end_of_text|>), as Llama 3 trains");
  add_number(*cmd, "--lr", a->opt.lr, "peak learning rate")->capture_default_str();
  add_number(*cmd, "--min-lr", a->opt.min_lr, "final learning rate of the cosine decay")->capture_default_str();
  add_number(*cmd, "--warmup-steps", a->opt.warmup_steps, "linear warm-up steps")->capture_default_str();
  add_number(*cmd, "--grad-clip", a->opt.grad_clip, "clip the global gradient norm (0: off)")->capture_default_str();
  add_number(*cmd, "--weight-decay", a->opt.adamw.weight_decay, "AdamW weight decay")->capture_default_str();
  add_number(*cmd, "--seed", a->opt.seed, "seed for weights and batches")->capture_default_str();
  add_number(*cmd, "--eval-every", a->eval_every, "the validation loss every N steps (0: never)")->capture_default_str();
  add_number(*cmd, "--eval-windows", a->eval_windows, "validation windows per evaluation")->capture_default_str();
  add_number(*cmd, "--save-every", a->save_every, "also checkpoint every N steps")->capture_default_str();
  add_number(*cmd, "--log-every", a->log_every, "print progress every N steps")->capture_default_str();
  add_compute_options(*cmd, a->compute, "compute threads of this process (default: all cores)");
  cmd->add_option("--faults", a->faults,
                  "inject failures from this JSON schedule (kinds crash, hang, slow, collective, sdc; see "
                  "core/parallel/fault_schedule.h) into the virtual GPUs of the run");
  add_number(*cmd, "--fault-rate", a->fault_rate,
             "draw failures instead: each rank fails at each step with probability P, its cause drawn from Llama 3's "
             "Table 5 mix (core/parallel/fault_rate.h); the schedule drawn is printed and written to "
             "<out>/faults_drawn.json for --faults");
  add_number(*cmd, "--fault-seed", a->fault_seed, "seed of the schedule --fault-rate draws")->capture_default_str();
  add_number(*cmd, "--max-restarts", a->max_restarts,
             "restart a failed run up to N times from its latest checkpoint (--save-every), without a person")
      ->capture_default_str();
  add_number(*cmd, "--memory-copy-every", a->memory_copy_every,
             "every K steps each rank keeps its shard of the state and a copy of a partner's on the next node "
             "(--gpus-per-node), so --max-restarts recovers a lost node without the disk (Gemini, SOSP 2023)");
  cmd->add_option("--on-lost-node", a->on_lost_node,
                  "after a crash marked permanent (\"permanent\": true in --faults): spare (a spare takes the lost "
                  "rank's place, same mesh) or shrink (go on with one data-parallel replica less, the global batch "
                  "kept: more micro-batches per rank, as torchft's replica groups do)")
      ->capture_default_str();
  add_number(*cmd, "--heartbeat-timeout", a->heartbeat_timeout_s,
             "every rank beats as each step begins and after it; a rank silent for S seconds while another got "
             "further is named with its step and phase and stopped (virtual GPUs), before the next collective's "
             "--timeout would; S must cover the longest step or checkpoint save (0: no heartbeats)")
      ->capture_default_str();
  cmd->add_flag("--async-checkpoint", a->async_checkpoint,
                "at a checkpoint, copy the state to host memory (the step stalls only for that) and write the "
                "checkpoint directory in a background thread, atomically as always; the next checkpoint and the end "
                "of the run wait for it, and a failed write ends the run naming it");
  cmd->add_flag("--check-replicas", a->check_replicas,
                "after every step, compare checksums of the weights data-parallel replicas hold, naming a rank whose "
                "bits differ (silent data corruption); costs one read of the weights per step");
  add_number(*cmd, "--straggler-factor", a->stragglers.factor,
             "after every step the ranks share their compute times (one double each) and a rank slower than F x the "
             "median is reported as a straggler; the run goes on (0: no detection)")
      ->capture_default_str();
  add_number(*cmd, "--straggler-margin", a->stragglers.margin_s,
             "seconds a straggler's time must also exceed the median by, so noise on fast steps flags nobody")
      ->capture_default_str();
  cmd->add_flag("--force", a->force, "train even if the model looks too large for this machine");
  cmd->add_flag("--json", a->json, "print one JSON object with the results on stdout");
  cmd->callback([a, cmd] {
    a->opt.bf16_compute = a->model.bf16();
    const nlohmann::json result = train(*a, *cmd);
    if (a->json && !result.is_null()) print_json(result);
  });
}

}  // namespace llama4d::cli
