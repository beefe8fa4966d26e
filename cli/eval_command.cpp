// `llama4d eval`: mean next-token cross-entropy of a checkpoint (or a fresh model) over a text
// file, in consecutive windows of --seq-len + 1 tokens. Reported next to the byte-unigram
// entropy of the same text, the loss a model that ignores context would reach.
#include <cmath>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "core/data/batch_sampler.h"
#include "core/data/dataset.h"
#include "core/data/tokenized_corpus.h"
#include "core/data/entropy.h"
#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/model/llama.h"
#include "core/ops.h"
#include "core/train/evaluate.h"

namespace llama4d::cli {

namespace {

struct EvalArgs {
  ModelChoice model;
  std::string data;
  int64_t seq_len = 256, batch_size = 8, max_windows = 0;
  uint64_t seed = 1337;
  ComputeChoice compute;
  bool doc_mask = false, json = false, force = false;
};

template <class T>
nlohmann::json run_eval(const EvalArgs& a) {
  check_fits_in_memory(a.model.resolve(), sizeof(T), a.force, "evaluating");  // before the tokenizer is read
  const ModelDirectory md = a.model.open();
  const LlamaConfig& cfg = md.config;
  const bool bytes = dynamic_cast<const ByteTokenizer*>(md.tokenizer.get()) != nullptr;
  if (a.seq_len < 1) throw InputError("--seq-len must be >= 1");
  check_batch_fits_in_memory(cfg, a.batch_size, a.seq_len, sizeof(T), 1.0, a.force,
                             "--batch-size " + std::to_string(a.batch_size) + " x --seq-len " + std::to_string(a.seq_len));
  const std::string path = a.data.empty() ? default_corpus_path() : a.data;
  const std::vector<int32_t> tokens = tokenize_corpus(*md.tokenizer, path, ops::backend_threads(), progress_printer(stderr, path),
                                                      md.data_chat_format());
  if (int64_t(tokens.size()) < 2) throw InputError(path + " has fewer than 2 tokens: nothing to predict");

  Llama<T> model(cfg);
  model.set_bf16_compute(a.model.bf16());
  if (!a.model.checkpoint.empty())
    load_model(a.model.checkpoint, model.param_specs(), model.params());
  else
    model.init_weights(a.seed);

  const LossSum loss = evaluate_loss(model, TokenSpan(tokens), a.seq_len, a.batch_size, a.max_windows, a.doc_mask,
                                     end_of_text_id(*md.tokenizer));
  // Bits per byte and the unigram baseline are byte-model measures (one token per byte).
  const double nats = loss.mean();
  if (!bytes) {
    progress("eval: %s, %s: %lld tokens predicted, loss %.4f nats per token, perplexity %.3f (%s)\n",
             a.model.describe().c_str(), path.c_str(), (long long)loss.tokens, nats, std::exp(nats),
             md.tokenizer->describe().c_str());
    return {{"loss", nats},         {"tokens", loss.tokens}, {"bits_per_byte", nullptr},
            {"perplexity", std::exp(nats)}, {"unigram_entropy_nats", nullptr}, {"data", path},
            {"seq_len", a.seq_len}, {"doc_mask", a.doc_mask}, {"tokenizer", md.tokenizer->describe()}};
  }
  const UnigramEntropy unigram = unigram_entropy(TokenSpan(tokens));
  progress("eval: %s, %s: %lld tokens predicted, loss %.4f nats (%.4f bits/byte), perplexity %.3f; unigram entropy %.4f nats\n",
           a.model.describe().c_str(), path.c_str(), (long long)loss.tokens, nats, nats / std::log(2.0), std::exp(nats),
           unigram.nats);
  return {{"loss", nats},
          {"tokens", loss.tokens},
          {"bits_per_byte", nats / std::log(2.0)},
          {"perplexity", std::exp(nats)},
          {"unigram_entropy_nats", unigram.nats},
          {"data", path},
          {"seq_len", a.seq_len},
          {"doc_mask", a.doc_mask},
          {"tokenizer", md.tokenizer->describe()}};
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "mean next-token cross-entropy over a text file");
  a->model.add_options(*cmd, "small", true);
  cmd->add_option("--data", a->data, "UTF-8 text file, directory of .txt documents, or .jsonl whose lines have a \"text\" string or a \"messages\" chat (default: shipped corpus)");
  add_number(*cmd, "--seq-len", a->seq_len, "window length (at most the model's max_position_embeddings unless given)")->capture_default_str();
  add_number(*cmd, "--batch-size", a->batch_size, "windows per forward pass")->capture_default_str();
  cmd->add_flag("--doc-mask", a->doc_mask, "mask attention between the documents in a window (as the model was trained)");
  add_number(*cmd, "--max-windows", a->max_windows, "evaluate at most N windows (0: all)")->capture_default_str();
  add_number(*cmd, "--seed", a->seed, "initial weights when no --checkpoint is given")->capture_default_str();
  add_compute_options(*cmd, a->compute, "compute threads (default: all cores)");
  cmd->add_flag("--force", a->force, "run even if the model looks too large for this machine");
  cmd->add_flag("--json", a->json, "print one JSON object with the results on stdout");
  cmd->callback([a, cmd] {
    use_compute(a->compute);
    if (a->batch_size < 1) throw InputError("--batch-size must be >= 1");
    a->seq_len = fitted_seq_len(*cmd, a->seq_len, a->model.resolve());
    const nlohmann::json result = a->model.fp64() ? run_eval<double>(*a) : run_eval<float>(*a);
    if (a->json) print_json(result);
  });
}

}  // namespace llama4d::cli
