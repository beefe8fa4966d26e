// `llama4d generate`: autoregressive decoding with a KV cache. The prompt goes through the
// model in one pass (prefill), then one token per step reuses every earlier key and value.
#include <chrono>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "core/data/tokenizer.h"
#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/model/llama.h"
#include "core/model/sampler.h"
#include "core/model/decode.h"

namespace llama4d::cli {

namespace {

struct GenerateArgs {
  ModelChoice model;
  std::string prompt = "The ";
  int64_t max_new_tokens = 200;
  SamplerOptions sampler;
  uint64_t init_seed = 1337;
  ComputeChoice compute;
  bool json = false, force = false;
};

template <class T>
nlohmann::json run_generate(const GenerateArgs& a) {
  const LlamaConfig cfg = a.model.resolve();
  check_fits_in_memory(cfg, sizeof(T), a.force, "generating with");
  if (a.max_new_tokens < 0) throw InputError("--max-new-tokens must be >= 0");
  Llama<T> model(cfg);
  model.set_bf16_compute(a.model.bf16());
  if (!a.model.checkpoint.empty())
    load_model(a.model.checkpoint, model.param_specs(), model.params());
  else
    model.init_weights(a.init_seed);

  const ByteTokenizer tok;
  // No BOS: training windows are raw corpus bytes, so the model never saw one.
  std::vector<int32_t> ids = tok.encode(a.prompt);
  if (ids.empty()) throw InputError("--prompt must not be empty");
  const int64_t total = int64_t(ids.size()) + a.max_new_tokens;
  if (total > cfg.max_position_embeddings)
    throw InputError("prompt + --max-new-tokens = " + std::to_string(total) + " exceeds max_position_embeddings " +
                     std::to_string(cfg.max_position_embeddings));

  Decoder<T> decoder(model, 1, total);
  std::vector<T> logits(static_cast<size_t>(cfg.vocab_size));
  std::vector<float> logits_f(logits.size());
  Sampler sampler(a.sampler);
  // Byte models may only emit bytes or <|end_of_text|>; other specials are never sampled.
  const int64_t allowed = std::min<int64_t>(cfg.vocab_size, kEndOfTextToken + 1);

  if (!a.json) std::fputs(a.prompt.c_str(), stdout);  // the continuation follows the prompt
  const auto t0 = std::chrono::steady_clock::now();
  decoder.feed(ids.data(), int64_t(ids.size()), logits.data());
  std::vector<int32_t> generated;
  std::string text;
  for (int64_t i = 0; i < a.max_new_tokens; ++i) {
    for (size_t v = 0; v < logits.size(); ++v) logits_f[v] = float(logits[v]);
    const int32_t next = sampler.next(logits_f, allowed);
    if (next == kEndOfTextToken) break;
    generated.push_back(next);
    const std::string piece = tok.decode(std::span<const int32_t>(&generated.back(), 1));
    text += piece;
    if (!a.json) std::fwrite(piece.data(), 1, piece.size(), stdout), std::fflush(stdout);
    if (i + 1 < a.max_new_tokens) decoder.feed(&next, 1, logits.data());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!a.json) std::fputc('\n', stdout);
  progress("generate: %zu tokens in %.2f s (%.1f tokens/s)\n", generated.size(), seconds,
           double(generated.size()) / seconds);
  return {{"prompt", a.prompt},
          {"text", text},
          {"tokens", generated},
          {"new_tokens", generated.size()},
          {"tokens_per_s", double(generated.size()) / seconds},
          {"temperature", a.sampler.temperature},
          {"top_p", a.sampler.top_p}};
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "continue a prompt, token by token, with a KV cache");
  a->model.add_options(*cmd, "small", true);
  cmd->add_option("--prompt", a->prompt, "text to continue")->capture_default_str();
  add_number(*cmd, "--max-new-tokens", a->max_new_tokens, "tokens to generate")->capture_default_str();
  add_number(*cmd, "--temperature", a->sampler.temperature, "0: greedy; > 0: sample")->capture_default_str();
  add_number(*cmd, "--top-p", a->sampler.top_p, "nucleus sampling mass")->capture_default_str();
  add_number(*cmd, "--seed", a->sampler.seed, "sampling seed")->capture_default_str();
  add_number(*cmd, "--init-seed", a->init_seed, "initial weights when no --checkpoint is given")
      
      ->capture_default_str();
  add_compute_options(*cmd, a->compute, "compute threads (default: all cores)");
  cmd->add_flag("--force", a->force, "run even if the model looks too large for this machine");
  cmd->add_flag("--json", a->json, "print one JSON object (with the generated text) on stdout");
  cmd->callback([a] {
    use_compute(a->compute);
    const nlohmann::json result = a->model.fp64() ? run_generate<double>(*a) : run_generate<float>(*a);
    if (a->json) print_json(result);
  });
}

}  // namespace llama4d::cli
