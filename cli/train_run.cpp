// Resolving a `train` run: the model (preset, config, --init's directory or a --resume
// checkpoint), the options a resume keeps or may change, and the data (cli/train_run.h).
#include "cli/train_run.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/data/entropy.h"
#include "core/data/tokenized_corpus.h"
#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/ops.h"
#include "core/train/checkpoint_state.h"

namespace llama4d::cli::training {

namespace {

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

}  // namespace

double unigram_nats(const Run& r, const TextDataset& data) {
  return has_bpe_tokenizer(r) ? NAN : unigram_entropy(data.validation()).nats;
}

void write_tokenizer_files(const Run& r, const std::string& dir) {
  for (const auto& [name, bytes] : r.tokenizer_files) {
    std::ofstream out(std::filesystem::path(dir) / name, std::ios::binary | std::ios::trunc);
    if (!(out << bytes) || !out.flush()) throw IoError("cannot write " + dir + "/" + name);
  }
}

std::string absolute_path(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

namespace {

// On --resume, starts from the checkpoint's run and applies the flags given: those that may change
// (--steps, --micro-batch-size, the loop settings; the mesh and --threads are not saved) replace
// the saved values; one that would change the math (model, dtype, data, batch, schedule, seed) is
// an error naming it. Nothing given is ignored, nothing saved is dropped.
void apply_checkpoint(Run& r, const TrainArgs& a, const CLI::App& cmd) {
  const TrainingCheckpointInfo saved = read_training_state(a.resume);
  if (saved.options.recipe.active() && a.recipe.empty() && a.stages.empty())
    throw InputError("--resume " + a.resume + " was saved by recipe \"" + saved.options.recipe.recipe + "\" (stage " +
                     std::to_string(saved.options.recipe.stage + 1) + ", \"" + saved.options.recipe.stage_name +
                     "\"): resume it with --recipe FILE, or the same --stage flags");
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

}  // namespace

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

std::string model_name(const TrainArgs& a) {
  if (!a.init.empty()) return "model directory " + a.init;
  return a.resume.empty() ? a.model.describe() : "checkpoint " + a.resume;
}

TextDataset load_source(const Run& r, const std::string& path) {
  return has_bpe_tokenizer(r) ? load_tokenized_dataset(*r.model_dir->tokenizer, path, r.args.opt.seq_len,
                                                       ops::backend_threads(), tokenize_progress(r.args.launch, path), 0.1,
                                                       r.model_dir->data_chat_format())
                              : make_dataset(load_text_documents(path), r.args.opt.seq_len, 0.1, path);
}

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


int64_t last_step(const TrainArgs& a) { return a.stop_at > 0 ? std::min(a.stop_at, a.opt.steps) : a.opt.steps; }

}  // namespace llama4d::cli::training
