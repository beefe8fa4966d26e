// `llama4d train`: trains a Llama on a text file (the shipped corpus by default), on one rank or
// on a data-parallel mesh of virtual GPUs / MPI ranks. Logs metrics to <out>/metrics.jsonl,
// evaluates on the held-out split, saves a checkpoint that resumes bitwise on any mesh. With
// --recipe, runs a training recipe's stages on virtual GPUs (run_recipe, below).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/init_checkpoint.h"
#include "cli/launch.h"
#include "cli/parallel_options.h"
#include "core/comm/rank_failure.h"
#include "core/data/data_mix.h"
#include "core/data/dataset.h"
#include "core/data/tokenized_corpus.h"
#include "core/data/entropy.h"
#include "core/error.h"
#include "core/io/atomic_dir.h"
#include "core/io/atomic_file.h"
#include "core/io/checkpoint.h"
#include "core/model/llama.h"
#include "core/ops.h"
#include "core/parallel/parallel_trainer.h"
#include "core/parallel/dp_common.h"
#include "core/parallel/fault_injector.h"
#include "core/parallel/fault_rate.h"
#include "core/parallel/replica_checksum.h"
#include "core/parallel/straggler_detector.h"
#include "core/train/async_checkpoint.h"
#include "core/train/checkpoint_state.h"
#include "core/parallel/memory_copies.h"
#include "core/train/goodput.h"
#include "core/train/recipe.h"
#include "core/train/trainer.h"
#include "core/parallel/reshard_in_memory.h"

namespace llama4d::cli {

namespace {

struct TrainArgs {
  ModelChoice model;
  ParallelChoice parallel;
  LaunchOptions launch;
  TrainOptions opt;
  std::string data, out = "runs/train", resume, init, faults, recipe;
  int64_t eval_every = 100, eval_windows = 64, save_every = 0, log_every = 10, stop_at = 0, max_restarts = 0;
  int64_t memory_copy_every = 0;  // 0: no in-memory copies
  bool check_replicas = false;
  bool async_checkpoint = false;  // --async-checkpoint: snapshot to host memory, write in the background
  double fault_rate = 0;  // --fault-rate: failures per rank per step (0: none drawn)
  int64_t fault_seed = 0;  // --fault-seed: the seed of the schedule --fault-rate draws
  StragglerOptions stragglers;
  ComputeChoice compute;
  bool json = false, force = false;
};

// The loop settings a checkpoint keeps (TrainOptions::loop) and a resume restores unless they are
// given again: a resumed run evaluates and saves as the first one did.
struct LoopSetting {
  const char* flag;
  const char* key;
  int64_t TrainArgs::*value;
};
constexpr LoopSetting kLoopSettings[] = {{"--eval-every", "eval_every", &TrainArgs::eval_every},
                                         {"--eval-windows", "eval_windows", &TrainArgs::eval_windows},
                                         {"--save-every", "save_every", &TrainArgs::save_every},
                                         {"--log-every", "log_every", &TrainArgs::log_every}};

// The run as it will go: the flags' model, options and data; on --resume, those of the checkpoint.
struct Run {
  TrainArgs args;
  LlamaConfig cfg;
  // The model directory of --init (or of a --resume checkpoint that holds tokenizer files): its
  // tokenizer encodes the data. Null: llama4d's byte tokenizer, as for every preset.
  std::shared_ptr<const ModelDirectory> model_dir;
  // Its tokenizer files (name, bytes), read before training: written beside every checkpoint
  // saved, so the result is a model directory transformers and llama4d load with its tokenizer.
  std::vector<std::pair<std::string, std::string>> tokenizer_files;
};

constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                                           "special_tokens_map.json", "generation_config.json"};

// The directory's model and tokenizer; the tokenizer files kept in memory (a resume may save over
// the directory they are read from).
void use_model_directory(Run& r, const std::string& dir) {
  r.model_dir = std::make_shared<const ModelDirectory>(open_model_directory(dir));
  for (const char* name : kTokenizerFiles) {
    const std::filesystem::path p = std::filesystem::path(dir) / name;
    if (!std::filesystem::exists(p)) continue;
    std::ifstream in(p, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in && !in.eof()) throw InputError("cannot read " + p.string());
    r.tokenizer_files.emplace_back(name, std::move(bytes));
  }
}

bool has_bpe_tokenizer(const Run& r) {
  return r.model_dir && !dynamic_cast<const ByteTokenizer*>(r.model_dir->tokenizer.get());
}

// The unigram entropy of the validation split: a byte model's baseline (one token per byte);
// NaN for another tokenizer's ids.
double unigram_nats(const Run& r, const TextDataset& data) {
  return has_bpe_tokenizer(r) ? NAN : unigram_entropy(data.validation()).nats;
}

void write_tokenizer_files(const Run& r, const std::string& dir) {
  for (const auto& [name, bytes] : r.tokenizer_files) {
    std::ofstream out(std::filesystem::path(dir) / name, std::ios::binary | std::ios::trunc);
    if (!(out << bytes) || !out.flush()) throw IoError("cannot write " + dir + "/" + name);
  }
}

// Saved absolute, so that a resume started from another directory finds the data.
std::string absolute_path(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

// On --resume, starts from the checkpoint's run and applies the flags given: those that may change
// (--steps, --micro-batch-size, the loop settings; the mesh and --threads are not saved) replace
// the saved values; one that would change the math (model, dtype, data, batch, schedule, seed) is
// an error naming it. Nothing given is ignored, nothing saved is dropped.
void apply_checkpoint(Run& r, const TrainArgs& a, const CLI::App& cmd) {
  const TrainingCheckpointInfo saved = read_training_state(a.resume);
  if (saved.options.recipe.active() && a.recipe.empty())
    throw InputError("--resume " + a.resume + " was saved by recipe \"" + saved.options.recipe.recipe + "\" (stage " +
                     std::to_string(saved.options.recipe.stage + 1) + ", \"" + saved.options.recipe.stage_name +
                     "\"): resume it with --recipe FILE");
  const auto keeps = [](const std::string& what) { return what + ": " + kResumeKeepsTheMath; };
  r.cfg = load_config(a.resume);
  for (const auto& [flag, value] : {std::pair{"--preset", a.model.preset}, std::pair{"--config", a.model.config}})
    if (cmd.count(flag) > 0 && a.model.resolve().to_json() != r.cfg.to_json())
      throw InputError(keeps(std::string(flag) + " " + value + " is another model than the checkpoint's"));
  const std::string dtype = saved.dtype == "F64" ? "f64" : saved.options.bf16_compute ? "bf16" : "f32";
  if (cmd.count("--dtype") > 0 && a.model.dtype != dtype)
    throw InputError(keeps("--dtype " + a.model.dtype + " differs from the checkpoint's " + dtype));
  r.args.model.dtype = dtype;

  nlohmann::json options = saved.options.to_json();
  const nlohmann::json asked = a.opt.to_json();
  for (const TrainOptionField& f : train_option_fields())
    if (f.flag[0] == '-' && cmd.count(f.flag) > 0) {
      const nlohmann::json::json_pointer at(f.pointer);
      options[at] = asked.at(at);
    }
  r.args.opt = TrainOptions::from_json(options);
  check_resumable(saved.options, saved.steps_done, r.args.opt);
  // An MoE model's load-balancing loss is computed per micro-batch (core/model/moe.h): their
  // rows are part of its math, as they are not for a dense model's accumulated gradients.
  if (r.cfg.moe() && r.args.opt.micro_batch_size != saved.options.micro_batch_size)
    throw InputError(keeps("--micro-batch-size " + std::to_string(r.args.opt.micro_batch_size) +
                           " differs from the checkpoint's " + std::to_string(saved.options.micro_batch_size) +
                           " (an MoE model's load-balancing loss is computed per micro-batch)"));

  const nlohmann::json loop = nlohmann::json::parse(saved.options.loop);
  try {
    for (const LoopSetting& s : kLoopSettings)
      if (cmd.count(s.flag) == 0 && loop.contains(s.key)) r.args.*s.value = loop.at(s.key).get<int64_t>();
    // Where the text was; whether it is the same text is checked once it is read (load_run_data).
    if (loop.contains("data") && cmd.count("--data") == 0) r.args.data = loop.at("data").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(a.resume + "/" + kTrainerStateFile + ": options.loop: " + e.what());
  }
  if (cmd.count("--stop-at") > 0 && a.stop_at <= saved.steps_done)
    throw InputError("--stop-at " + std::to_string(a.stop_at) + " is not after the checkpoint's step " +
                     std::to_string(saved.steps_done));
}

// Everything about the run that can be checked without computing: done before anything is
// written, so a bad flag costs nothing and leaves nothing behind.
Run resolve_run(const TrainArgs& a, const CLI::App& cmd) {
  Run r{a, {}, nullptr, {}};
  if (!a.init.empty()) {
    if (!a.resume.empty()) throw InputError("--init and --resume: a resumed run continues its checkpoint's weights");
    for (const char* flag : {"--preset", "--config"})
      if (cmd.count(flag) > 0) throw InputError(std::string(flag) + " and --init: the model is --init's directory");
    use_model_directory(r, a.init);
    r.cfg = r.model_dir->config;
    r.args.opt.seq_len = fitted_seq_len(cmd, a.opt.seq_len, r.cfg);
  } else if (a.resume.empty()) {
    r.cfg = a.model.resolve();
    r.args.opt.seq_len = fitted_seq_len(cmd, a.opt.seq_len, r.cfg);
  } else {
    apply_checkpoint(r, a, cmd);
    for (const char* f : {"tokenizer.json", "tokenizer.model"})
      if (std::filesystem::exists(std::filesystem::path(a.resume) / f)) {
        use_model_directory(r, a.resume);
        break;
      }
  }
  // The document mask cuts rows after the <|end_of_text|> the corpus is packed with: the model's own.
  if (has_bpe_tokenizer(r)) r.args.opt.doc_separator = end_of_text_id(*r.model_dir->tokenizer);
  TrainArgs& x = r.args;
  if (x.log_every < 1) throw InputError("--log-every must be >= 1");
  if (x.eval_windows < 1) throw InputError("--eval-windows must be >= 1");
  if (x.eval_every < 0) throw InputError("--eval-every must be >= 0 (0: never)");
  if (x.save_every < 0) throw InputError("--save-every must be >= 0 (0: only at the end)");
  if (cmd.count("--stop-at") > 0 && x.stop_at < 1) throw InputError("--stop-at must be >= 1");
  if (x.data.empty()) x.data = default_corpus_path();
  nlohmann::json loop = nlohmann::json::parse(x.opt.loop);
  loop["data"] = absolute_path(x.data);
  for (const LoopSetting& s : kLoopSettings) loop[s.key] = x.*s.value;
  x.opt.loop = loop.dump();
  return r;
}

// Which model the run trains: the checkpoint it resumes, or the flags' choice.
std::string model_name(const TrainArgs& a) {
  if (!a.init.empty()) return "model directory " + a.init;
  return a.resume.empty() ? a.model.describe() : "checkpoint " + a.resume;
}

// Text at `path` in the run's tokens, split into train and held-out rows as every corpus is:
// the run's --data, or one source of a recipe's data mix.
TextDataset load_source(const Run& r, const std::string& path) {
  return has_bpe_tokenizer(r) ? load_tokenized_dataset(*r.model_dir->tokenizer, path, r.args.opt.seq_len,
                                                       ops::backend_threads(), tokenize_progress(r.args.launch, path), 0.1,
                                                       r.model_dir->data_chat_format())
                              : make_dataset(load_text_documents(path), r.args.opt.seq_len, 0.1, path);
}

// The corpus the batches come from. On resume it must be the text the run started on (the
// file may have moved: --data names the new place), else every batch would differ.
TextDataset load_run_data(Run& r, bool data_given) {
  TextDataset data = load_source(r, r.args.data);
  nlohmann::json loop = nlohmann::json::parse(r.args.opt.loop);
  const std::string now = data_fingerprint(data.tokens);
  if (loop.contains("data_fingerprint") && loop.at("data_fingerprint") != now)
    throw InputError(std::string(data_given ? "--data " : "data ") + r.args.data + " (" + now +
                     ") is not the text the checkpoint's run trained on (" + loop.at("data_fingerprint").dump() +
                     "): " + kResumeKeepsTheMath);
  loop["data_fingerprint"] = now;
  r.args.opt.loop = loop.dump();
  return data;
}

// metrics.jsonl is the history of the run in <out>: a new run starts it afresh; a resume keeps
// the rows up to the checkpoint's step (the last of a repeated step: the one the run went on
// from) and drops the later ones, which the resumed run computes again.
void restart_metrics(const std::string& path, int64_t steps_done) {
  std::map<int64_t, std::string> rows;
  std::ifstream in(path);
  for (std::string line; steps_done > 0 && std::getline(in, line);) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);  // a line cut by a kill is dropped
    if (row.is_object() && row.contains("step") && row.at("step").is_number_integer() &&
        row.at("step").get<int64_t>() <= steps_done)
      rows[row.at("step").get<int64_t>()] = line;
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const auto& [step, line] : rows) out << line << "\n";
    if (!out.flush()) throw IoError("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw IoError("cannot replace " + path + ": " + ec.message());
}

// What the loop needs from a trainer, single-rank or data-parallel (whose calls are collective).
struct TrainerCalls {
  std::function<StepStats()> step;
  std::function<int64_t()> steps_done;
  std::function<double(int64_t windows)> validation_loss;  // mean
  std::function<void(const std::string& dir)> save;
  // Fault injection and detection around each step (may be empty): before step `next` runs, and
  // after it with its stats.
  std::function<void(int64_t next)> before_step;
  std::function<void(const StepStats&)> after_step;
  // --async-checkpoint (empty: save() writes before it returns). snapshot(dir): the state copied
  // to host memory and its write to dir started in the background; wait_saved(): blocks until
  // the write in flight has committed, throwing its failure, and returns the writes' figures.
  // Every rank calls both, at the same points of the loop.
  std::function<void(const std::string& dir)> snapshot;
  std::function<AsyncCheckpointStats()> wait_saved;
};

// The TrainerCalls of an asynchronous checkpoint through `writer`, shared by the `ranks` ranks of
// this process: `snapshot_into(image, written)` is the trainer's save_state (collective), calling
// `written` once the rank's share is in; the last rank in starts the write, with the tokenizer
// files beside it.
template <class T>
void use_async_checkpoint(TrainerCalls& calls, AsyncCheckpointer<T>& writer, int ranks,
                          std::function<void(TrainingStateImage<T>&, const std::function<void()>&)> snapshot_into,
                          std::function<void(const std::string&)> more_files) {
  calls.snapshot = [&writer, ranks, snapshot_into = std::move(snapshot_into),
                    more_files = std::move(more_files)](const std::string& dir) {
    snapshot_into(writer.image(), [&] { writer.share_written(ranks, dir, more_files); });
  };
  calls.wait_saved = [&writer] {
    writer.wait();
    return writer.stats();
  };
}

// Seconds since `origin`: the clock a supervised run's ledger keeps.
double seconds_since(std::chrono::steady_clock::time_point origin) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin).count();
}

// What a supervised run shares with the lead rank's loop: the ledger and its clock, and the
// stragglers found over every attempt (a replayed step is observed again).
struct Supervision {
  GoodputLedger ledger;
  std::optional<StragglerDetector> stragglers;
  std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
  double now() const { return seconds_since(origin); }

  // The last step each rank of the attempt finished (its step() returned): the least of them
  // is where the failure stopped the job, the same however far the lead rank got.
  void attempt_starts(int ranks, int64_t steps_done) {
    std::lock_guard<std::mutex> lock(mu);
    reached.assign(size_t(ranks), steps_done);
  }
  void finished(int rank, int64_t step) {
    std::lock_guard<std::mutex> lock(mu);
    reached.at(size_t(rank)) = step;
  }
  int64_t every_rank_reached() const {
    std::lock_guard<std::mutex> lock(mu);
    return reached.empty() ? -1 : *std::min_element(reached.begin(), reached.end());
  }

 private:
  mutable std::mutex mu;
  std::vector<int64_t> reached;
};

// The run itself: steps, metrics, progress, evaluation, checkpoints. `lead` is the rank that
// writes files and prints; every rank runs the loop (collectives inside the calls).
// A recipe run calls it once per stage: `stage` names the stage in every metrics row, and a
// stage that neither ends the recipe nor reaches --stop-at hands its state on in memory
// (save_at_end false) instead of writing a checkpoint.
nlohmann::json train_loop(const TrainArgs& a, const TrainOptions& opt, const TrainerCalls& t, bool lead,
                          Supervision* sup = nullptr, const std::string& stage = "", bool save_at_end = true) {
  const int64_t last = a.stop_at > 0 ? std::min(a.stop_at, opt.steps) : opt.steps;
  std::ofstream metrics;
  if (lead) {
    restart_metrics(a.out + "/metrics.jsonl", t.steps_done());
    metrics.open(a.out + "/metrics.jsonl", std::ios::app);
    if (!metrics) throw IoError("cannot append to " + a.out + "/metrics.jsonl");
  }
  double total_seconds = 0, last_loss = NAN, val_loss = NAN;
  std::optional<double> last_aux;  // mixture of experts: the last step's load-balancing loss
  int64_t total_tokens = 0, steps_this_run = 0;
  GoodputLedger* ledger = lead && sup ? &sup->ledger : nullptr;
  if (ledger) ledger->loop_started(sup->now());
  // What each checkpoint of this attempt stalled the run for (and, asynchronous, what its write
  // took beside training): rows of the JSON result's "checkpoints".
  nlohmann::json checkpoints = nlohmann::json::array();
  int64_t writing = -1;  // the step whose asynchronous write may be in flight (-1: none)
  // Waits for the asynchronous write in flight; returns the seconds waited.
  const auto wait_for_write = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const AsyncCheckpointStats st = t.wait_saved();
    const double waited = seconds_since(t0);
    if (writing >= 0 && st.last_committed_step == writing) {
      if (ledger) ledger->write_committed(writing, st.last_write_s);
      for (nlohmann::json& row : checkpoints)
        if (row.at("step") == writing) row["write_s"] = st.last_write_s;
      if (lead)
        progress("train: checkpoint of step %lld written in the background in %.3f s\n", (long long)writing,
                 st.last_write_s);
    }
    writing = -1;
    return waited;
  };
  const auto save = [&](const std::string& dir, bool last) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!t.snapshot) {
      t.save(dir);
      const double seconds = seconds_since(t0);
      if (ledger) ledger->saved(t.steps_done(), seconds, sup->now());
      checkpoints.push_back({{"step", t.steps_done()}, {"async", false}, {"stall_s", seconds}});
      return;
    }
    double waited = wait_for_write();  // the previous write: its failure ends the run here
    const auto t1 = std::chrono::steady_clock::now();
    t.snapshot(dir);
    const double snapshot = seconds_since(t1);
    writing = t.steps_done();
    checkpoints.push_back({{"step", writing}, {"async", true}, {"stall_s", waited + snapshot}, {"wait_s", waited},
                           {"snapshot_s", snapshot}, {"write_s", nullptr}});
    const int64_t step = writing;
    if (last) {
      // The run ends once its last checkpoint is on disk.
      const double end_wait = wait_for_write();
      waited += end_wait;
      checkpoints.back()["wait_s"] = waited, checkpoints.back()["stall_s"] = waited + snapshot;
    }
    if (ledger) {
      ledger->snapshot_taken(step, waited, snapshot, sup->now());
      if (last) ledger->write_committed(step, checkpoints.back().at("write_s").get<double>());
    }
  };
  while (t.steps_done() < last) {
    const auto t0 = std::chrono::steady_clock::now();
    if (t.before_step) t.before_step(t.steps_done() + 1);
    const StepStats st = t.step();
    if (t.after_step) t.after_step(st);
    if (ledger) ledger->step_done(st.step, seconds_since(t0), sup->now());
    total_seconds += st.seconds;
    total_tokens += st.tokens;
    ++steps_this_run;
    last_loss = st.loss;
    if (!st.expert_tokens.empty()) last_aux = st.aux_loss;
    if (!std::isfinite(st.loss))
      throw Error("training diverged: loss is " + std::to_string(st.loss) + " at step " + std::to_string(st.step));
    const bool eval_now = a.eval_every > 0 && (st.step % a.eval_every == 0 || st.step == last);
    if (eval_now) val_loss = t.validation_loss(a.eval_windows);
    if (lead) {
      nlohmann::json row = {{"step", st.step}, {"loss", st.loss}, {"lr", st.lr}, {"grad_norm", st.grad_norm},
                            {"tokens_per_s", double(st.tokens) / st.seconds}};
      if (eval_now) row["val_loss"] = val_loss;
      if (!st.expert_tokens.empty()) row["aux_loss"] = st.aux_loss, row["expert_tokens"] = st.expert_tokens;
      if (!stage.empty()) row["stage"] = stage;
      // A row lost to a full disk or an I/O error ends the run: the history is the run's record.
      if (!(metrics << row.dump() << "\n" << std::flush)) throw IoError("cannot write " + a.out + "/metrics.jsonl");
      if (st.step % a.log_every == 0 || st.step == last || eval_now)
        progress("step %5lld/%lld  loss %.4f  lr %.2e  grad_norm %.3f  %.0f tok/s%s%s\n", (long long)st.step,
                 (long long)last, st.loss, st.lr, st.grad_norm, double(st.tokens) / st.seconds,
                 st.expert_tokens.empty() ? "" : ("  aux_loss " + std::to_string(st.aux_loss)).c_str(),
                 eval_now ? ("  val_loss " + std::to_string(val_loss)).c_str() : "");
    }
    if (a.save_every > 0 && st.step % a.save_every == 0 && st.step != last) save(a.out + "/checkpoint", false);
  }
  if (std::isnan(val_loss) && a.eval_every > 0) val_loss = t.validation_loss(a.eval_windows);
  const std::string ckpt = a.out + "/checkpoint";
  auto num = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  if (!save_at_end) {
    if (t.wait_saved) wait_for_write();
    return {{"final_loss", num(last_loss)}, {"steps", t.steps_done()}, {"steps_this_run", steps_this_run},
            {"tokens", total_tokens}, {"seconds", total_seconds},
            {"tokens_per_s", total_seconds > 0 ? double(total_tokens) / total_seconds : 0.0}, {"val_loss", num(val_loss)}};
  }
  save(ckpt, true);
  if (lead && steps_this_run == 0)  // a resumed run that had already finished: no loss to report
    progress("train: the checkpoint had finished all %lld steps, nothing to train (pass --steps with a larger total "
             "to go on); saved %s%s\n",
             (long long)t.steps_done(), ckpt.c_str(),
             a.eval_every > 0 ? (", val loss " + std::to_string(val_loss)).c_str() : "");
  else if (lead)
    progress("train: saved %s; final loss %.4f%s\n", ckpt.c_str(), last_loss,
             a.eval_every > 0 ? (", val loss " + std::to_string(val_loss)).c_str() : " (no validation: --eval-every 0)");
  nlohmann::json result = {{"final_loss", num(last_loss)},
          {"steps", t.steps_done()},
          {"steps_this_run", steps_this_run},
          {"tokens", total_tokens},
          {"tokens_per_s", total_seconds > 0 ? double(total_tokens) / total_seconds : 0.0},
          {"val_loss", num(val_loss)},
          {"checkpoint", ckpt},
          {"metrics", a.out + "/metrics.jsonl"},
          {"options", opt.to_json()},
          {"checkpoints", checkpoints}};
  if (last_aux) result["final_aux_loss"] = *last_aux;  // final_loss is the cross-entropy alone
  return result;
}

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

// What every process of an MPI job must have alike (RankLaunch::agree_on): the model, the
// options, the plan, the data and where the run writes. Not --threads, --json or --force, which
// are each process's own and change no result.
std::vector<RankSetting> rank_settings(const Run& r, const ParallelPlan& plan) {
  const TrainArgs& a = r.args;
  std::vector<RankSetting> s = a.parallel.rank_settings(plan);
  const std::vector<RankSetting> step = model_and_step_rank_settings(r.cfg, a.model.dtype, a.opt);
  s.insert(s.end(), step.begin(), step.end());
  const nlohmann::json loop = nlohmann::json::parse(a.opt.loop);
  s.push_back({"--data (its tokens)", loop.at("data_fingerprint").get<std::string>()});
  for (const LoopSetting& l : kLoopSettings) s.push_back({l.flag, std::to_string(a.*l.value)});
  for (const auto& [flag, value] : {std::pair{"--out", a.out}, std::pair{"--resume", a.resume}, std::pair{"--init", a.init}})
    s.push_back({flag, value});
  s.push_back({"--stop-at", std::to_string(a.stop_at)});
  s.push_back({"--check-replicas", a.check_replicas ? "given" : "not given"});  // a collective every step
  s.push_back({"--straggler-factor", a.stragglers.factor == 0 ? "0" : "on"});    // a collective every step
  return s;
}

// A supervised run's attempt: the faults to inject (null: none), the ledger, and the checkpoint
// a restarted attempt resumes (empty: the run's own start).
template <class T>
struct Attempt {
  FaultInjector* faults = nullptr;
  Supervision* sup = nullptr;
  std::string restart_from;
  MemoryCopies<T>* copies = nullptr;              // --memory-copy-every: taken every K steps
  const TrainingStateImage<T>* image = nullptr;  // restored from the copies: start from it, not disk
};

// A failed parallel run leaves every rank's flight recorder in <out>/flight_recorder.json (the
// latest failure's) and prints which rank did not enter which collective.
void write_flight_records(const std::string& out, const std::vector<std::vector<FlightEntry>>& ranks) {
  const nlohmann::json j = flight_json(ranks);
  const std::string path = out + "/flight_recorder.json";
  write_text_file_atomically(path, j.dump(1) + "\n");
  const std::string diagnosis = j.at("diagnosis").get<std::string>();
  std::string lines;
  for (size_t at = 0; at < diagnosis.size();) {
    const size_t end = std::min(diagnosis.find('\n', at), diagnosis.size());
    lines += "\n  " + diagnosis.substr(at, end - at);
    at = end + 1;
  }
  progress("train: flight recorder of every rank's last collectives in %s%s\n", path.c_str(),
           lines.empty() ? "" : (":" + lines).c_str());
}

template <class T>
nlohmann::json run_parallel(const Run& r, const ParallelPlan& plan, const TextDataset& data, const Attempt<T>& at = {}) {
  const TrainArgs& a = r.args;
  // --init: the directory's weights staged as a step-0 checkpoint in <out>/init-checkpoint,
  // which every rank reads its part of, removed after the run. Virtual GPUs: this process stages
  // it before they start. MPI or NCCL: world rank 0 stages it once the job is up, the others
  // waiting (--timeout bounds the wait), and a failure there stops every rank.
  const bool staged = !at.image && at.restart_from.empty() && a.resume.empty() && !a.init.empty();
  const bool stage_in_job = staged && a.launch.backend != "virtual";
  const std::string staged_dir = a.out + "/init-checkpoint";
  const auto stage = [&] { return stage_init_checkpoint<T>(r.cfg, a.init, data, a.opt, staged_dir); };
  const std::string start = at.image                 ? ""
                            : !at.restart_from.empty() ? at.restart_from
                            : !a.resume.empty()      ? a.resume
                            : stage_in_job           ? staged_dir
                            : staged                 ? stage()
                                                     : "";
  const int ranks = plan.world_size();
  const double unigram = unigram_nats(r, data);
  RankLaunch launcher(a.launch);
  launcher.agree_on(rank_settings(r, plan));
  if (at.faults) launcher.set_fault_hook([f = at.faults](int rank, CommOp op, int64_t seq) { f->on_collective(rank, op, seq); });
  nlohmann::json result;
  std::vector<RankMemory> memory(static_cast<size_t>(ranks));
  std::mutex mu;
  std::string strategy;
  // Rank 0's; a supervised run's detector outlives its attempts.
  std::optional<StragglerDetector> own_stragglers;
  StragglerDetector& stragglers =
      at.sup && at.sup->stragglers ? *at.sup->stragglers : own_stragglers.emplace(a.stragglers);
  const bool detect = a.stragglers.factor > 0;
  // --async-checkpoint: one writer for the ranks of this process; a write in flight when the
  // job fails finishes (or fails) before the supervisor looks at the disk.
  AsyncCheckpointer<T> async;
  try {
    launcher.run(ranks, [&](ProcessGroup& world) {
      std::optional<OutputLock> out_lock;
      if (world.backend() != "virtual" && world.rank() == 0) out_lock.emplace(a.out, "train");
      if (stage_in_job) {
        std::exception_ptr error;
        const int32_t failed = world.rank() == 0 ? capture_failure(error, stage) : 0;
        if (first_failed_rank(world, failed, "--init staged") >= 0) {
          if (error) std::rethrow_exception(error);
          throw Error("train: rank 0 could not stage --init " + a.init + " in " + staged_dir + " (its error ends the job)");
        }
      }
      Llama<T> model = plan.make_model<T>(r.cfg, world.memory(), world.rank());
      ParallelTrainer<T> trainer(world, model, data, a.opt, plan);
      if (at.image)
        trainer.load_state(*at.image);  // the partners' copies: no disk
      else if (!start.empty())
        trainer.load_checkpoint(start);
      const bool lead = world.rank() == 0 && launcher.reporting();
      if (lead) {
        progress("train: %s, %lld parameters, %s, %s on %d %s ranks (%s reductions); data %s\n",
                 model_name(a).c_str(), (long long)r.cfg.num_parameters(), a.model.dtype.c_str(), trainer.describe().c_str(),
                 ranks, a.launch.backend.c_str(), a.launch.algo.c_str(), a.data.c_str());
        progress("train: global batch %lld x %lld tokens, %lld rows per rank in micro-batches of %lld\n",
                 (long long)a.opt.batch_size, (long long)a.opt.seq_len, (long long)(a.opt.batch_size / plan.dp()),
                 (long long)rank_micro_batch_rows(a.opt, plan.dp()));
      }
      // The rank's weights as bytes, where it holds them whole (not under ZeRO-3's per-unit residency).
      const auto weights = [&] {
        return model.param_residency() == Llama<T>::Residency::whole
                   ? std::span<std::byte>(reinterpret_cast<std::byte*>(model.params()), size_t(model.num_params()) * sizeof(T))
                   : std::span<std::byte>();
      };
      TrainerCalls calls{[&] {
                           const StepStats st = trainer.step();
                           if (at.sup) at.sup->finished(world.rank(), st.step);
                           return st;
                         },
                         [&] { return trainer.steps_done(); },
                         [&](int64_t w) { return trainer.validation_loss(w).mean(); },
                         [&](const std::string& dir) {
                           trainer.save_checkpoint(dir);
                           if (world.rank() == 0) write_tokenizer_files(r, dir);
                         },
                         {}, {}, {}, {}};
      if (a.async_checkpoint)
        use_async_checkpoint<T>(calls, async, world.size(),
                                [&](TrainingStateImage<T>& image, const std::function<void()>& written) {
                                  trainer.save_state(image, written);
                                },
                                [&](const std::string& staging) { write_tokenizer_files(r, staging); });
      // The rank's compute time from the start of a step to the end of its after-step work (not
      // evaluation or saving, which rank 0 does more of); see core/parallel/straggler_detector.h.
      StepComputeClock compute;
      if (at.faults || detect)
        calls.before_step = [&](int64_t next) {
          if (at.faults) at.faults->before_step(world.rank(), next);
          compute.restart();
        };
      if (at.faults || a.check_replicas || at.copies || detect)
        calls.after_step = [&](const StepStats& st) {
          if (at.faults) at.faults->after_step(world.rank(), st.step, st.seconds, weights(), int(sizeof(T)));
          if (detect) {
            const std::vector<double> times = share_step_times(world, compute.seconds());
            if (world.rank() == 0)
              for (const StragglerFlag& f : stragglers.observe(st.step, times))
                if (lead)
                  progress("train: straggler: rank %d took %.3f s of compute at step %lld, %.1fx the median %.3f s "
                           "(--straggler-factor %g); the run goes on\n",
                           f.rank, f.seconds, (long long)f.step, f.median > 0 ? f.seconds / f.median : INFINITY,
                           f.median, a.stragglers.factor);
          }
          if (a.check_replicas) check_replicas_agree(trainer.replica_group(), weights(), st.step);
          // After the replica check: a copy of corrupted weights is never taken.
          if (at.copies && at.copies->due(st.step)) {
            const auto t0 = std::chrono::steady_clock::now();
            at.copies->take(trainer, world);
            if (lead && at.sup) at.sup->ledger.memory_copied(seconds_since(t0), at.sup->now());
          }
        };
      nlohmann::json j = train_loop(a, a.opt, calls, lead, at.sup);
      std::lock_guard<std::mutex> lock(mu);
      memory[size_t(world.rank())] = trainer.strategy().peak_memory();
      if (world.rank() == 0) result = j, strategy = trainer.describe();
    });
  } catch (const Error& e) {
    if (const std::string lost = async.finish_quietly(); !lost.empty() && lost != e.what())
      progress("train: %s\n", lost.c_str());
    // Virtual GPUs only: there this process holds every rank's recorder (MPI processes would
    // each write their own rank's over the others'). A failure to write it hides nothing.
    if (dynamic_cast<const InputError*>(&e) == nullptr && a.launch.backend == "virtual") {
      try {
        write_flight_records(a.out, launcher.flight_records());
      } catch (const Error& w) {
        progress("train: the flight recorder was not written: %s\n", w.what());
      }
    }
    throw;
  }
  if (staged && launcher.reporting()) std::filesystem::remove_all(start);
  if (!launcher.reporting()) return {};
  const nlohmann::json mem = memory_json(memory);
  if (!a.json) std::fputs(launcher.summary().c_str(), stderr);
  result["unigram_entropy_nats"] = std::isnan(unigram) ? nlohmann::json(nullptr) : nlohmann::json(unigram);
  result["model"] = model_name(a);
  result["parameters"] = r.cfg.num_parameters();
  result["dtype"] = a.model.dtype;
  result["ranks"] = ranks;
  result["mesh"] = plan.describe_mesh();
  result["plan"] = plan.to_json();
  result["strategy"] = strategy;
  result["backend"] = a.launch.backend;
  result["peak_memory_per_rank"] = mem;
  result["traffic"] = launcher.traffic_totals();
  if (detect) result["stragglers"] = stragglers.to_json();
  if (r.model_dir) result["tokenizer"] = r.model_dir->tokenizer->describe();
  return result;
}

int64_t last_step(const TrainArgs& a) { return a.stop_at > 0 ? std::min(a.stop_at, a.opt.steps) : a.opt.steps; }

// Where --fault-rate's schedule is written, to replay with --faults.
std::string drawn_faults_path(const TrainArgs& a) { return a.out + "/faults_drawn.json"; }

nlohmann::json drawn_faults_json(const TrainArgs& a, const DrawnSchedule& d) {
  nlohmann::json causes = nlohmann::json::array();
  for (const DrawnFault& f : d.drawn) causes.push_back({{"fault", f.fault.describe()}, {"cause", f.cause->cause}});
  return {{"per_rank_step", a.fault_rate}, {"seed", a.fault_seed}, {"schedule", d.schedule.to_json()},
          {"causes", causes}, {"dropped_sdc", d.dropped_sdc}, {"file", drawn_faults_path(a)}};
}

// Prints the schedule --fault-rate drew, each fault with its cause in Llama 3's Table 5, and writes
// it as a --faults file, so the same failures can be injected again.
void report_drawn_faults(const TrainArgs& a, const DrawnSchedule& d) {
  const std::string path = drawn_faults_path(a);
  write_text_file_atomically(path, d.schedule.to_json().dump(1) + "\n");
  progress("train: --fault-rate %g per rank-step, --fault-seed %lld: drew %zu fault%s over %lld steps (Llama 3's "
           "Table 5 mix); replay with --faults %s\n",
           a.fault_rate, (long long)a.fault_seed, d.drawn.size(), d.drawn.size() == 1 ? "" : "s",
           (long long)last_step(a), path.c_str());
  bool sdc = false;
  for (const DrawnFault& f : d.drawn) {
    progress("  %s (%s)\n", f.fault.describe().c_str(), f.cause->cause);
    sdc = sdc || f.fault.kind == FaultKind::sdc;
  }
  if (d.dropped_sdc > 0)
    progress("  and %d silent data corruption%s not injected: ZeRO-3 (--zero 3) holds no whole weights to flip a bit of\n",
             d.dropped_sdc, d.dropped_sdc == 1 ? "" : "s");
  if (sdc && !a.check_replicas)
    progress("  (without --check-replicas nothing will notice the silent corruption: it stays in the weights)\n");
}

// Checks the fault-tolerance flags against the run before anything is computed.
FaultSchedule check_fault_flags(const TrainArgs& a, const CLI::App& cmd, const ParallelPlan& plan) {
  check_straggler_options(a.stragglers);
  if (a.max_restarts < 0)
    throw InputError("--max-restarts must be >= 0 (0: a failure ends the run), got " + std::to_string(a.max_restarts));
  const bool parallel = a.parallel.parallel();
  for (const char* flag : {"--faults", "--fault-rate", "--fault-seed", "--max-restarts", "--check-replicas",
                           "--straggler-factor", "--straggler-margin"})
    if (cmd.count(flag) > 0 && !parallel)
      throw InputError(std::string(flag) + " applies to the ranks of a parallel --mesh, and none was given (e.g. --mesh dp=2)");
  if (a.check_replicas && std::string_view(ops::backend_name()) != "cpu")
    throw InputError("--check-replicas reads the weights in host memory: it runs on --device cpu");
  if (a.check_replicas && parallel && plan.dp() * plan.size("cp") == 1)
    throw InputError("--check-replicas compares the data-parallel replicas' weights, and --mesh " + plan.describe_mesh() +
                     " has one (dp x cp = 1): it would check nothing");
  if (a.check_replicas && plan.zero == ZeroStage::zero3)
    throw InputError("--check-replicas compares whole weights, and ZeRO-3 (--zero 3) keeps only a shard of each");
  if (a.max_restarts > 0 && a.launch.backend != "virtual")
    throw InputError("--max-restarts restarts the ranks of virtual GPUs (--backend virtual); under mpirun a launcher "
                     "would relaunch the processes, which this build does not do");
  if (cmd.count("--memory-copy-every") > 0) {
    if (!parallel)
      throw InputError("--memory-copy-every copies the shards of a parallel --mesh, and none was given (e.g. --mesh dp=4)");
    if (a.launch.backend != "virtual")
      throw InputError("--memory-copy-every keeps the copies in this process, for virtual GPUs (--backend virtual), not "
                       "--backend " + a.launch.backend);
    MemoryCopies<float>(plan.world_size(), a.launch.gpus_per_node, a.memory_copy_every);  // InputError naming it
    // The copies exist to restart from; with no restart allowed they would only cost time.
    if (a.max_restarts == 0)
      throw InputError("--memory-copy-every keeps copies to restart from, and --max-restarts is 0 (a failure ends the "
                       "run): give --max-restarts N as well");
  }
  if (a.async_checkpoint && parallel && a.launch.backend != "virtual")
    throw InputError("--async-checkpoint snapshots every rank's share into this process's memory: it runs on one rank "
                     "or on virtual GPUs (--backend virtual), not --backend " + a.launch.backend);
  if (cmd.count("--fault-seed") > 0 && cmd.count("--fault-rate") == 0)
    throw InputError("--fault-seed seeds the faults --fault-rate draws, and --fault-rate was not given");
  if (cmd.count("--fault-rate") > 0) {
    if (!a.faults.empty()) throw InputError("--fault-rate and --faults: give a schedule or a rate to draw one, not both");
    if (a.launch.backend != "virtual")
      throw InputError("--fault-rate injects into virtual GPUs only (--backend virtual), not --backend " + a.launch.backend);
    if (a.fault_seed < 0) throw InputError("--fault-seed must be >= 0, got " + std::to_string(a.fault_seed));
    draw_fault_schedule(a.fault_rate, 0, 1, 0);  // InputError naming --fault-rate for a rate outside (0, 1]
    return {};
  }
  if (a.faults.empty()) return {};
  if (a.launch.backend != "virtual")
    throw InputError("--faults injects into virtual GPUs only (--backend virtual), not --backend " + a.launch.backend);
  FaultSchedule s = FaultSchedule::read(a.faults);
  s.check_fits(plan.world_size(), last_step(a));
  const int weight_bits = a.model.fp64() ? 64 : 32;  // bf16 runs keep fp32 master weights
  for (const Fault& f : s.faults) {
    if (f.bit >= weight_bits)
      throw InputError("--faults: " + f.describe() + ": \"bit\" " + std::to_string(f.bit) + " does not exist in a " +
                       std::to_string(weight_bits) + "-bit weight");
    if (f.kind == FaultKind::sdc && plan.zero == ZeroStage::zero3)
      throw InputError("--faults: " + f.describe() + ": an sdc fault flips a bit of a rank's whole weights, which ZeRO-3 "
                       "(--zero 3) does not hold");
  }
  return s;
}

// Every parallel run: runs the job and reports its goodput. With `train --max-restarts N`, when
// it fails (a rank crashed, hung, lost a link, or its weights disagree with its replicas), starts
// it again from the latest checkpoint this run saved (or from the run's own start), at most N times. The batches of a step are a pure function
// of the step, so the restarted run trains the same rows and ends on the same bytes.
template <class T>
nlohmann::json supervise(const Run& r, const ParallelPlan& plan, const TextDataset& data, const FaultSchedule& faults) {
  const TrainArgs& a = r.args;
  // A hung rank sleeps past its peers' timeout (they name it), then stops.
  FaultInjector injector(faults, std::chrono::milliseconds(int64_t(a.launch.timeout_s) * 1000 + 500));
  Supervision sup;
  sup.stragglers.emplace(a.stragglers);
  const std::string ckpt = a.out + "/checkpoint";
  // --memory-copy-every: the copies outlive the attempts, as another host's memory outlives a GPU.
  std::optional<MemoryCopies<T>> copies;
  if (a.memory_copy_every > 0) copies.emplace(plan.world_size(), a.launch.gpus_per_node, a.memory_copy_every);
  std::optional<TrainingStateImage<T>> image;  // the copies assembled for the next attempt
  // Where the next attempt starts: the run's own start, then the latest checkpoint this run saved.
  // Read from disk, not from the lead rank's view: a save can be complete on disk while the lead
  // rank, still in its last collective, fails with the rank that crashed right after it. A
  // checkpoint already in <out> before the run is not this run's unless it changed since.
  std::string from;
  int64_t from_step = a.resume.empty() ? 0 : read_training_state(a.resume).steps_done;
  const auto trainer_state = [&] {
    std::ifstream in(ckpt + "/" + kTrainerStateFile, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string state_before = trainer_state();
  // --init's staged copy of the directory's weights goes when the supervised run ends, however
  // it ends: an attempt restarted from <out>/checkpoint no longer reads (or removes) it.
  struct RemoveStagedInit {
    std::string dir;
    ~RemoveStagedInit() {
      std::error_code ignored;
      if (!dir.empty()) std::filesystem::remove_all(dir, ignored);
    }
  } remove_staged{!a.init.empty() && a.resume.empty() ? a.out + "/init-checkpoint" : ""};
  size_t fired_at_start = 0;
  for (int64_t attempt = 0;; ++attempt) {
    sup.ledger.attempt_started(sup.now(), from_step);
    sup.attempt_starts(plan.world_size(), from_step);
    try {
      fired_at_start = injector.fired().size();
      nlohmann::json j = run_parallel<T>(r, plan, data,
                                         {faults.empty() ? nullptr : &injector, &sup, from, copies ? &*copies : nullptr,
                                          image ? &*image : nullptr});
      sup.ledger.attempt_ended(sup.now(), "");
      if (!j.is_null()) {
        j["goodput"] = sup.ledger.report();
        if (!faults.empty()) {
          j["faults_injected"] = nlohmann::json::array();
          for (const Fault& f : injector.fired()) j["faults_injected"].push_back(f.describe());
        }
      }
      return j;
    } catch (const InputError&) {
      throw;
    } catch (const Error& e) {
      if (attempt >= a.max_restarts) {
        if (a.max_restarts > 0)
          throw Error("train: gave up after " + std::to_string(a.max_restarts) + " restart" +
                      (a.max_restarts == 1 ? "" : "s") + ": " + e.what());
        throw;
      }
      const std::string state = trainer_state();
      if (!state.empty() && state != state_before) {
        from = ckpt;
        from_step = read_training_state(ckpt).steps_done;
      }
      image.reset();
      std::string why_disk;
      if (copies) {
        // A crashed or hung rank takes its node's memory (its host) with it, copies included.
        const std::vector<Fault>& fired = injector.fired();
        for (size_t i = fired_at_start; i < fired.size(); ++i)
          if (fired[i].kind == FaultKind::crash || fired[i].kind == FaultKind::hang)
            copies->lose_node(copies->node_of(fired[i].rank));
        why_disk = copies->why_unrecoverable();
        if (why_disk.empty() && copies->step() >= (from.empty() ? 0 : from_step)) {
          image.emplace();
          copies->restore_into(*image);
        }
      }
      const int64_t kept = image ? image->steps_done() : from.empty() ? 0 : from_step;
      sup.ledger.attempt_ended(sup.now(), e.what(), kept, sup.every_rank_reached());
      sup.ledger.recovered(image.has_value());
      if (image) from_step = image->steps_done();
      if (copies && !why_disk.empty())
        progress("train: attempt %lld failed: %s\ntrain: cannot recover from memory: %s; falling back to disk\n",
                 (long long)attempt + 1, e.what(), why_disk.c_str());
      else
        progress("train: attempt %lld failed: %s\n", (long long)attempt + 1, e.what());
      progress("train: restarting (%lld of %lld) from %s\n", (long long)attempt + 1, (long long)a.max_restarts,
               image      ? ("the in-memory copies (step " + std::to_string(from_step) + ")").c_str()
               : !from.empty() ? (from + " (step " + std::to_string(from_step) + ")").c_str()
               : a.resume.empty() ? "the start (no checkpoint saved yet)"
                                  : a.resume.c_str());
    }
  }
}


// --recipe FILE: the stages of a training recipe (core/train/recipe.h), one after another, on
// virtual GPUs. Each stage runs on its own mesh with its global batch, sequence length and LR
// segment (Recipe::stage_options); at a boundary where the mesh changes the state moves onto the
// next stage's plan through memory (InMemoryReshard: the checkpoint's code path without the
// files), and where it does not the next stage goes on in the same launch with the state in place
// (ParallelTrainer::continue_with). Either way the run equals, byte for byte, stopping at the
// boundary (--stop-at), saving, and resuming the recipe on the next stage's plan from that
// checkpoint.
struct RecipeRun {
  Recipe recipe;
  std::vector<ParallelPlan> plans;               // stage i's plan
  std::vector<std::vector<MixEntry>> sources;    // stage i's data, paths made absolute
  std::string primary;                           // stage 1's first source: the run's --data
  size_t first_stage = 0;  // a resume's stage; stages.size(): the checkpoint had finished
  // Whether stage i draws its rows from a mix (several sources, or one that is not the primary).
  bool mixes(size_t i) const { return sources[i].size() > 1 || sources[i][0].path != primary; }
};

// Flags whose values a recipe gives per stage, or that this build does not run with one.
void check_recipe_flags(const TrainArgs& a, const CLI::App& cmd) {
  for (const char* flag : {"--mesh", "--batch-size", "--seq-len", "--steps", "--lr", "--min-lr", "--warmup-steps",
                           "--seed", "--data"})
    if (cmd.count(flag) > 0)
      throw InputError(std::string(flag) + " and --recipe: the recipe gives each stage's mesh (dp, tp, cp, pp), "
                       "batch_size, seq_len, length, LR segment and data, and its seed");
  // --trace: each stage is its own launch, which would write the file over the last stage's.
  for (const char* flag : {"--init", "--faults", "--fault-rate", "--fault-seed", "--max-restarts", "--memory-copy-every",
                           "--check-replicas", "--async-checkpoint",
                           "--straggler-factor", "--straggler-margin", "--trace"})
    if (cmd.count(flag) > 0) throw InputError(std::string(flag) + " and --recipe: not supported together in this build");
  if (a.launch.backend != "virtual")
    throw InputError("--recipe runs on virtual GPUs (--backend virtual), not --backend " + a.launch.backend +
                     ": a stage boundary moves the state between ranks in this process's memory");
}

// "recipe stage 2 (\"long\")": how errors name a stage.
std::string stage_label(const Recipe& recipe, size_t i) {
  return "recipe stage " + std::to_string(i + 1) + " (\"" + recipe.stages[i].name + "\")";
}

// The recipe checked against the model and the flags: one plan per stage, each stage's sources
// (stage 1's first is the run's data: its held-out split is what every stage evaluates on; a
// stage of other or several sources draws its rows from a DataMix of their train splits), and
// where a resume starts.
RecipeRun resolve_recipe(Run& r, const CLI::App& cmd) {
  TrainArgs& a = r.args;
  RecipeRun rr;
  rr.recipe = load_recipe(a.recipe, r.cfg.max_position_embeddings);
  const Recipe& recipe = rr.recipe;
  int64_t longest = 0;
  for (size_t i = 0; i < recipe.stages.size(); ++i) {
    const RecipeStage& st = recipe.stages[i];
    const std::string where = a.recipe + ": " + stage_label(recipe, i);
    // A relative source is relative to the recipe file, so the recipe runs from any directory.
    std::vector<MixEntry> sources;
    for (const MixEntry& e : st.data) {
      std::filesystem::path p(e.path);
      if (p.is_relative()) p = std::filesystem::path(a.recipe).parent_path() / p;
      sources.push_back({absolute_path(p.lexically_normal().string()), e.weight});
    }
    if (i == 0) rr.primary = sources[0].path;
    rr.sources.push_back(std::move(sources));
    longest = std::max(longest, st.seq_len);
    const TrainOptions opt = recipe.stage_options(a.opt, i);
    try {
      opt.validate();
      ParallelChoice choice = a.parallel;
      choice.mesh = st.mesh();
      rr.plans.push_back(choice.plan(r.cfg, a.launch.algo));
      const ParallelPlan& plan = rr.plans.back();
      plan.check_precision(opt.bf16_compute);
      check_moe_micro_batches(r.cfg, opt, plan);
      plan.check_model(r.cfg, int(rank_micro_batch_count(opt, plan.dp())));
      plan.check_sequence(opt.seq_len);
      check_step_fits_in_memory(r.cfg, opt, plan, a.launch.backend, a.model.fp64() ? 8 : 4, a.force);
    } catch (const InputError& e) {
      throw InputError(where + " (mesh " + st.mesh() + "): " + e.what());
    }
  }
  if (cmd.count("--data") == 0) a.data = rr.primary;
  a.opt.seq_len = longest;  // the data split must hold a window of the longest stage
  nlohmann::json loop = nlohmann::json::parse(a.opt.loop);
  loop["data"] = absolute_path(a.data);
  loop["recipe"] = absolute_path(a.recipe);
  a.opt.loop = loop.dump();
  if (!a.resume.empty()) {
    const TrainingCheckpointInfo saved = read_training_state(a.resume);
    const int64_t total = recipe.total_steps();
    if (saved.steps_done > total)
      throw InputError("--resume " + a.resume + " has done " + std::to_string(saved.steps_done) + " steps, more than recipe \"" +
                       recipe.name + "\"'s " + std::to_string(total));
    rr.first_stage = saved.steps_done == total ? recipe.stages.size() : recipe.locate(saved.steps_done).first;
    // The checkpoint must be this recipe's (by name and fingerprint), whatever stage it is in.
    const size_t check = std::min(rr.first_stage, recipe.stages.size() - 1);
    TrainOptions next = recipe.stage_options(a.opt, check);
    next.steps = std::max(next.steps, saved.steps_done);
    check_resumable(saved.options, saved.steps_done, next);
  }
  return rr;
}

// The rows each source of stage i's data gave to steps [from, to) (source_of is a pure function
// of seed, step and row, so the lead rank counts every rank's rows) beside the weights' shares.
nlohmann::json drawn_json(const RecipeRun& rr, size_t i, const DataMix* mix, int64_t from, int64_t to) {
  const std::vector<MixEntry>& sources = rr.sources[i];
  std::vector<int64_t> drawn(sources.size(), 0);
  const int64_t rows = rr.recipe.stages[i].batch_size;
  for (int64_t step = from; step < to; ++step)
    for (int64_t row = 0; row < rows; ++row) ++drawn[size_t(mix ? mix->source_of(rr.recipe.seed, step, row) : 0)];
  const std::vector<double> shares = drawn_shares(drawn);
  double total = 0;
  for (const MixEntry& e : sources) total += e.weight;
  nlohmann::json out = nlohmann::json::array();
  for (size_t k = 0; k < sources.size(); ++k)
    out.push_back({{"source", sources[k].path}, {"weight", sources[k].weight}, {"weight_share", sources[k].weight / total},
                   {"rows", drawn[k]}, {"share", shares[k]}});
  return out;
}

// Whether the boundary after stage i keeps the state in place: the next stage runs on the same
// mesh and plan (only its batch rows, sequence length, length, data or LR change), so every rank
// already holds exactly what it will keep, and the stage continues on the same ranks
// (ParallelTrainer::continue_with) instead of moving anything.
bool same_plan(const RecipeRun& rr, size_t i) {
  return i + 1 < rr.plans.size() && rr.plans[i].to_json() == rr.plans[i + 1].to_json();
}

// Stage i's data mix (none: it trains on the run's own train split).
std::optional<DataMix> stage_mix(const TrainArgs& a, const RecipeRun& rr, size_t i, const TextDataset& data,
                                 const std::map<std::string, TextDataset>& others) {
  if (!rr.mixes(i)) return std::nullopt;
  std::vector<MixSource> sources;
  for (const MixEntry& e : rr.sources[i])
    sources.push_back({e.path, (e.path == rr.primary ? data : others.at(e.path)).train(), e.weight});
  try {
    return DataMix(std::move(sources), rr.recipe.stages[i].seq_len);
  } catch (const InputError& e) {
    throw InputError(a.recipe + ": " + stage_label(rr.recipe, i) + " key \"data\": " + e.what());
  }
}

// What the lead rank learns about one stage inside a launch.
struct StageResult {
  nlohmann::json loop;       // train_loop's result
  int64_t started_at = 0;    // global steps done when the stage began
  std::string strategy;
  StateMoves moved;          // the boundary into the stage, when it came through memory
  double restore_seconds = 0, handoff_seconds = 0;
};

template <class T>
nlohmann::json run_recipe(const Run& r, const RecipeRun& rr, const TextDataset& data,
                          const std::map<std::string, TextDataset>& others) {
  const TrainArgs& a = r.args;
  const Recipe& recipe = rr.recipe;
  std::unique_ptr<InMemoryReshard<T>> carried;  // the state handed from one launch to the next
  nlohmann::json stages = nlohmann::json::array(), last;
  double capture_seconds = 0;
  if (rr.first_stage == recipe.stages.size())
    progress("train: the checkpoint had finished all %lld steps of recipe \"%s\"\n", (long long)recipe.total_steps(),
             recipe.name.c_str());
  const auto stops_at = [&](size_t i) { return a.stop_at > 0 && a.stop_at <= recipe.stage_options(a.opt, i).steps; };
  bool stopped = false;
  for (size_t first = rr.first_stage; first < recipe.stages.size() && !stopped;) {
    // One launch runs stages [first, end): those on the same plan, up to a stop.
    size_t end = first + 1;
    while (end < recipe.stages.size() && same_plan(rr, end - 1) && !stops_at(end - 1)) ++end;
    const ParallelPlan& plan = rr.plans[first];
    const size_t last_stage = end - 1;
    stopped = stops_at(last_stage);
    const bool hand_on = end < recipe.stages.size() && !stopped;
    std::unique_ptr<InMemoryReshard<T>> next = hand_on ? std::make_unique<InMemoryReshard<T>>() : nullptr;
    std::vector<std::optional<DataMix>> mixes;
    for (size_t i = first; i < end; ++i) mixes.push_back(stage_mix(a, rr, i, data, others));
    std::vector<StageResult> results(end - first);
    // sim_us[k][rank]: the simulated clock each rank spent in stage first + k (core/comm/trace.h):
    // the first stage from the launch's start (moving the state in included), each later one from
    // the end of the one before.
    std::vector<std::vector<double>> sim_us(end - first, std::vector<double>(size_t(plan.world_size()), 0.0));
    RankLaunch launcher(a.launch);
    std::mutex mu;
    launcher.run(plan.world_size(), [&](ProcessGroup& world) {
      Llama<T> model = plan.make_model<T>(r.cfg, world.memory(), world.rank());
      ParallelTrainer<T> trainer(world, model, data, recipe.stage_options(a.opt, first), plan);
      const bool lead = world.rank() == 0;
      if (carried) {
        const auto t0 = std::chrono::steady_clock::now();
        const StateMoves m = carried->restore(trainer);  // collective: every rank has read its share
        if (lead) {
          results[0].moved = m, results[0].restore_seconds = seconds_since(t0);
          progress("train: into %s: moved %lld of %lld bytes of state in memory from mesh %s to %s in %.3f s\n",
                   stage_label(recipe, first).c_str(), (long long)m.total_moved(), (long long)m.total_read(),
                   recipe.stages[first - 1].mesh().c_str(), recipe.stages[first].mesh().c_str(),
                   capture_seconds + results[0].restore_seconds);
        }
      } else if (!a.resume.empty()) {
        trainer.load_checkpoint(a.resume);
      }
      double clock = 0;
      for (size_t i = first; i < end; ++i) {
        const size_t k = i - first;
        const RecipeStage& st = recipe.stages[i];
        const TrainOptions opt = recipe.stage_options(a.opt, i);
        if (i > first) {
          trainer.continue_with(opt);  // the same plan: the state stays on every rank
          if (lead)
            progress("train: into %s: the same mesh %s and plan as %s: every rank keeps its state, 0 bytes moved\n",
                     stage_label(recipe, i).c_str(), st.mesh().c_str(), stage_label(recipe, i - 1).c_str());
        }
        trainer.set_data_mix(mixes[k] ? &*mixes[k] : nullptr);
        if (lead) results[k].started_at = trainer.steps_done();
        if (lead)
          progress("train: %s %lld steps (%lld..%lld), global batch %lld x %lld tokens, mesh %s (%s), lr %s %.3g -> %.3g\n",
                   stage_label(recipe, i).c_str(), (long long)st.steps, (long long)opt.recipe.first_step + 1,
                   (long long)opt.steps, (long long)st.batch_size, (long long)st.seq_len, st.mesh().c_str(),
                   trainer.describe().c_str(), st.lr.shape_name.c_str(), st.lr.from, st.lr.to);
        const TrainerCalls calls{[&] { return trainer.step(); }, [&] { return trainer.steps_done(); },
                                 [&](int64_t w) { return trainer.validation_loss(w).mean(); },
                                 [&](const std::string& dir) {
                                   trainer.save_checkpoint(dir);
                                   if (world.rank() == 0) write_tokenizer_files(r, dir);
                                 },
                                 {}, {}, {}, {}};
        // A stage hands on (no checkpoint) unless it is the last of the recipe or of --stop-at.
        const bool saves = i == last_stage && !hand_on;
        nlohmann::json res = train_loop(a, opt, calls, lead, nullptr, st.name, saves);
        if (i == last_stage && next) {
          const auto t0 = std::chrono::steady_clock::now();
          next->capture(trainer);  // collective over this launch's ranks
          if (lead) results[k].handoff_seconds = seconds_since(t0);
        }
        const double now = world.trace().sim_now_us();
        std::lock_guard<std::mutex> lock(mu);
        sim_us[k][size_t(world.rank())] = now - clock;
        if (lead) results[k].loop = std::move(res), results[k].strategy = trainer.describe();
        clock = now;
      }
    });
    for (size_t i = first; i < end; ++i) {
      const size_t k = i - first;
      const RecipeStage& st = recipe.stages[i];
      const StageResult& s = results[k];
      const nlohmann::json& j = s.loop;
      nlohmann::json row = {{"name", st.name}, {"stage", i + 1}, {"mesh", st.mesh()}, {"strategy", s.strategy},
                            {"batch_size", st.batch_size}, {"seq_len", st.seq_len},
                            {"lr", {{"shape", st.lr.shape_name}, {"from", st.lr.from}, {"to", st.lr.to}}},
                            {"steps", j.at("steps_this_run")}, {"tokens", j.at("tokens")},
                            {"final_loss", j.at("final_loss")}, {"val_loss", j.at("val_loss")},
                            {"tokens_per_s", j.at("tokens_per_s")},
                            {"data", drawn_json(rr, i, mixes[k] ? &*mixes[k] : nullptr, s.started_at,
                                                j.at("steps").get<int64_t>())}};
      // The attention cost on the modelled cluster (core/comm/cluster.h): the slowest rank's
      // simulated time in the stage (moving the state in and evaluation included) per step.
      if (const int64_t n = j.at("steps_this_run").get<int64_t>(); n > 0) {
        const double step_us = *std::max_element(sim_us[k].begin(), sim_us[k].end()) / double(n);
        row["simulated"] = {{"step_us", step_us},
                            {"tokens_per_s", step_us > 0 ? double(st.batch_size * st.seq_len) / (step_us * 1e-6) : 0.0}};
      }
      if (i > first) {
        // Kept in place: this stage's ranks are the last one's, holding what they will keep.
        row["reshard"] = {{"from_mesh", recipe.stages[i - 1].mesh()}, {"to_mesh", st.mesh()}, {"in_place", true},
                          {"moved", "nothing: the same mesh and plan, every rank keeps its state"},
                          {"bytes_moved", 0}, {"bytes_read", 0},
                          {"bytes_moved_per_rank", std::vector<int64_t>(size_t(plan.world_size()), 0)}, {"seconds", 0.0}};
      } else if (carried) {
        // What the boundary into this stage moved: the bytes each rank of this stage's plan read
        // that the same rank of the previous stage had not written (what a cluster would send).
        row["reshard"] = {{"from_mesh", recipe.stages[i - 1].mesh()}, {"to_mesh", st.mesh()}, {"in_place", false},
                          {"moved", "weights, AdamW moments (exp_avg, exp_avg_sq), step count"},
                          {"bytes_moved", s.moved.total_moved()}, {"bytes_read", s.moved.total_read()},
                          {"bytes_moved_per_rank", s.moved.bytes_moved}, {"seconds", capture_seconds + s.restore_seconds}};
      }
      progress("train: %s done: %lld steps, %lld tokens, loss %.4f, %.0f tok/s\n", stage_label(recipe, i).c_str(),
               (long long)j.at("steps_this_run").get<int64_t>(), (long long)j.at("tokens").get<int64_t>(),
               j.at("final_loss").is_number() ? j.at("final_loss").get<double>() : NAN, j.at("tokens_per_s").get<double>());
      stages.push_back(row);
      last = j;
    }
    carried = std::move(next);
    capture_seconds = results.back().handoff_seconds;
    first = end;
  }
  nlohmann::json result = last.is_null() ? nlohmann::json::object() : last;
  if (last.is_null()) {
    // A resume of a finished recipe: nothing trained, the checkpoint stays as it was.
    const int64_t done = recipe.total_steps();
    result = {{"final_loss", nullptr}, {"steps", done}, {"steps_this_run", 0}, {"tokens", 0}, {"val_loss", nullptr},
              {"checkpoint", a.resume}, {"metrics", a.out + "/metrics.jsonl"}};
  }
  const int64_t done = result.at("steps").get<int64_t>();
  nlohmann::json position = {{"step", done}};
  if (done < recipe.total_steps()) {
    const auto [stage, k] = recipe.locate(done);
    position["stage"] = stage + 1, position["stage_name"] = recipe.stages[stage].name, position["step_in_stage"] = k;
  } else {
    position["stage"] = recipe.stages.size(), position["stage_name"] = recipe.stages.back().name,
    position["step_in_stage"] = recipe.stages.back().steps, position["finished"] = true;
  }
  result.erase("steps_this_run");
  result["recipe"] = {{"name", recipe.name}, {"file", a.recipe}, {"fingerprint", recipe.fingerprint()},
                      {"total_steps", recipe.total_steps()}, {"position", position}};
  result["stages"] = stages;
  result["model"] = model_name(a);
  result["parameters"] = r.cfg.num_parameters();
  result["dtype"] = a.model.dtype;
  result["backend"] = a.launch.backend;
  return result;
}

nlohmann::json train_recipe(const TrainArgs& asked, const CLI::App& cmd) {
  use_compute(asked.compute);
  check_recipe_flags(asked, cmd);
  Run r = resolve_run(asked, cmd);
  RecipeRun rr = resolve_recipe(r, cmd);
  const TrainArgs& a = r.args;
  a.launch.validate(true);
  const bool f64 = a.model.fp64();
  check_fits_in_memory(r.cfg, 4.0 * (f64 ? 8 : 4), a.force,
                       "training a " + std::to_string(r.cfg.num_parameters()) + "-parameter model");
  const TextDataset data = load_run_data(r, false);
  // The other sources of the stages' mixes, each checked on resume against the text the run
  // started on, as the primary is.
  std::map<std::string, TextDataset> others;
  nlohmann::json loop = nlohmann::json::parse(r.args.opt.loop);
  for (const std::vector<MixEntry>& stage : rr.sources)
    for (const MixEntry& e : stage) {
      if (e.path == rr.primary || others.count(e.path)) continue;
      TextDataset d = load_source(r, e.path);
      const std::string now = data_fingerprint(d.tokens);
      nlohmann::json& saved = loop["mix_fingerprints"][e.path];
      if (!saved.is_null() && saved != now)
        throw InputError("recipe source " + e.path + " (" + now + ") is not the text the checkpoint's run trained on (" +
                         saved.dump() + "): " + kResumeKeepsTheMath);
      saved = now;
      others.emplace(e.path, std::move(d));
    }
  r.args.opt.loop = loop.dump();
  const OutputDir out(a.out);
  OutputLock lock(a.out, "train");
  check_directory_replaceable(a.out + "/checkpoint", kConfigFile);
  remove_stale_staging(a.out + "/checkpoint");
  nlohmann::json result = f64 ? run_recipe<double>(r, rr, data, others) : run_recipe<float>(r, rr, data, others);
  result["device"] = ops::backend_name();
  result["kernels"] = ops::kernel_mode_name(ops::kernel_mode());
  return result;
}

nlohmann::json train(const TrainArgs& asked, const CLI::App& cmd) {
  if (!asked.recipe.empty()) return train_recipe(asked, cmd);
  use_compute(asked.compute);
  Run r = resolve_run(asked, cmd);
  const TrainArgs& a = r.args;
  const ParallelPlan plan = a.parallel.plan(r.cfg, a.launch.algo);
  plan.check_precision(a.opt.bf16_compute);
  a.launch.validate(a.parallel.parallel());
  FaultSchedule faults = check_fault_flags(a, cmd, plan);
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
                              ? (f64 ? supervise<double>(r, plan, data, faults) : supervise<float>(r, plan, data, faults))
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
                  "run a training recipe (JSON, core/train/recipe.h): stages with their own batch, seq_len, mesh "
                  "and LR segment; the state moves between stages' meshes in memory (virtual GPUs)");
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
