// `llama4d generate`: autoregressive decoding with a KV cache. The prompt goes through the
// model in one pass (prefill), then one token per step reuses every earlier key and value.
// With --chat, turns of a conversation in Llama 3's instruct format (chat_format.h): each line
// of stdin is a user message, and the answer streams out token by token until a stop id
// (generation_config.json's eos_token_id list and the tokenizer's end tokens).
#include <chrono>
#include <iostream>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "core/data/chat_format.h"
#include "core/data/stream_decoder.h"
#include "core/data/tokenizer.h"
#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/model/decode.h"
#include "core/model/llama.h"
#include "core/model/sampler.h"

namespace llama4d::cli {

namespace {

struct GenerateArgs {
  ModelChoice model;
  std::string prompt = "The ";
  bool prompt_given = false;
  int64_t max_new_tokens = 200, context = 4096;
  SamplerOptions sampler;
  uint64_t init_seed = 1337;
  ComputeChoice compute;
  bool json = false, force = false, chat = false;
  std::string system, chat_format, date;
};

bool is_byte_tokenizer(const Tokenizer& tok) { return dynamic_cast<const ByteTokenizer*>(&tok) != nullptr; }

struct Reply {
  std::vector<int32_t> ids;  // generated, without the stop id
  std::string text;
  bool stopped = false;      // ended on a stop id (else on --max-new-tokens)
  double seconds = 0;
};

// One model with a KV cache that holds the ids of the conversation so far.
template <class T>
class Generator {
 public:
  Generator(const ModelDirectory& md, Llama<T>& model, const SamplerOptions& s, int64_t cache_len)
      : md_(md), decoder_(model, 1, cache_len), sampler_(s), logits_(size_t(md.config.vocab_size)),
        logits_f_(logits_.size()) {
    const Tokenizer& tok = *md.tokenizer;
    // Byte models may only emit bytes or <|end_of_text|>; a BPE model any id of its tokenizer
    // (an embedding padded past it has rows no token names).
    allowed_ = is_byte_tokenizer(tok) ? std::min<int64_t>(md.config.vocab_size, kEndOfTextToken + 1)
                                      : std::min<int64_t>(md.config.vocab_size, tok.vocab_size());
  }

  // Continues `ids` (the whole sequence; the part the cache already holds is not fed again)
  // with up to max_new tokens, writing each piece of text to stdout as it completes when
  // `stream`.
  Reply reply(const std::vector<int32_t>& ids, int64_t max_new, bool stream) {
    if (ids.empty()) throw InputError("nothing to continue: the prompt encodes to no tokens");
    if (int64_t(ids.size()) + max_new > decoder_.max_len())
      throw InputError(std::to_string(ids.size()) + " prompt tokens + --max-new-tokens " + std::to_string(max_new) +
                       " exceed the " + std::to_string(decoder_.max_len()) +
                       " positions of the KV cache (max_position_embeddings, or --chat's --context)");
    const auto t0 = std::chrono::steady_clock::now();
    feed_new(ids);
    Reply r;
    StreamDecoder text(*md_.tokenizer);
    for (int64_t i = 0; i < max_new; ++i) {
      for (size_t v = 0; v < logits_.size(); ++v) logits_f_[v] = float(logits_[v]);
      const int32_t next = sampler_.next(logits_f_, allowed_);
      if (std::find(md_.stop_ids.begin(), md_.stop_ids.end(), next) != md_.stop_ids.end()) {
        r.stopped = true;
        break;
      }
      r.ids.push_back(next);
      emit(r, text.push(next), stream);
      if (i + 1 < max_new) feed({next});
    }
    emit(r, text.finish(), stream);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

 private:
  void emit(Reply& r, const std::string& piece, bool stream) {
    r.text += piece;
    if (stream && !piece.empty()) std::fwrite(piece.data(), 1, piece.size(), stdout), std::fflush(stdout);
  }
  void feed(const std::vector<int32_t>& ids) {
    decoder_.feed(ids.data(), int64_t(ids.size()), logits_.data());
    cached_.insert(cached_.end(), ids.begin(), ids.end());
  }
  // Keeps the longest cached prefix of `ids` (but at least the last id is fed, for its logits).
  void feed_new(const std::vector<int32_t>& ids) {
    size_t keep = 0;
    while (keep < cached_.size() && keep + 1 < ids.size() && cached_[keep] == ids[keep]) ++keep;
    decoder_.rewind(int64_t(keep));
    cached_.resize(keep);
    feed(std::vector<int32_t>(ids.begin() + std::ptrdiff_t(keep), ids.end()));
  }

  const ModelDirectory& md_;
  Decoder<T> decoder_;
  Sampler sampler_;
  std::vector<T> logits_;
  std::vector<float> logits_f_;
  std::vector<int32_t> cached_;
  int64_t allowed_ = 0;
};

nlohmann::json reply_json(const Reply& r) {
  return {{"text", r.text},
          {"tokens", r.ids},
          {"new_tokens", r.ids.size()},
          {"stop", r.stopped ? "eos" : "length"},
          {"tokens_per_s", double(r.ids.size()) / r.seconds}};
}

template <class T>
nlohmann::json continue_prompt(const GenerateArgs& a, const ModelDirectory& md, Generator<T>& gen) {
  const Tokenizer& tok = *md.tokenizer;
  // Byte models: no BOS (training windows are raw corpus bytes, so the model never saw one).
  // BPE models: what the tokenizer's post-processor adds (Llama 3: <|begin_of_text|>), as
  // Hugging Face's tokenizer(prompt) does.
  EncodeOptions opt;
  opt.add_bos = !is_byte_tokenizer(tok);
  const std::vector<int32_t> ids = tok.encode(a.prompt, opt);
  if (!a.json) std::fputs(a.prompt.c_str(), stdout);  // the continuation follows the prompt
  const Reply r = gen.reply(ids, a.max_new_tokens, !a.json);
  if (!a.json) std::fputc('\n', stdout);
  progress("generate: %zu tokens in %.2f s (%.1f tokens/s)\n", r.ids.size(), r.seconds, double(r.ids.size()) / r.seconds);
  nlohmann::json j = reply_json(r);
  j["prompt"] = a.prompt;
  j["prompt_tokens"] = ids.size();
  return j;
}

// --chat: one answer per user message; with --json (or --prompt) one message, one answer.
template <class T>
nlohmann::json chat(const GenerateArgs& a, const ModelDirectory& md, Generator<T>& gen) {
  const ChatFormat format = md.chat_format(a.chat_format);
  ChatEncodeOptions opt;
  opt.date = a.date;
  std::vector<ChatMessage> messages;
  if (!a.system.empty()) messages.push_back({"system", a.system});
  const bool one = a.json || a.prompt_given;
  std::string line;
  nlohmann::json last;
  while (true) {
    if (one) {
      line = a.prompt;
      if (!a.prompt_given) line.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
      if (!a.prompt_given && !line.empty() && line.back() == '\n') line.pop_back();
    } else {
      if (isatty(STDIN_FILENO)) progress("> ");  // typed by a person: show where to type
      if (!std::getline(std::cin, line)) break;
    }
    messages.push_back({"user", line});
    const std::vector<int32_t> ids = encode_chat(*md.tokenizer, format, messages, opt);
    const Reply r = gen.reply(ids, a.max_new_tokens, !a.json);
    if (!a.json) std::fputc('\n', stdout), std::fflush(stdout);
    messages.push_back({"assistant", r.text});
    last = reply_json(r);
    last["prompt_tokens"] = ids.size();
    if (one) break;
  }
  nlohmann::json turns = nlohmann::json::array();
  for (const ChatMessage& m : messages) turns.push_back({{"role", m.role}, {"content", m.content}});
  last["chat_format"] = format.name;
  last["messages"] = turns;
  return last;
}

template <class T>
nlohmann::json run_generate(const GenerateArgs& a) {
  if (a.max_new_tokens < 0) throw InputError("--max-new-tokens must be >= 0");
  if (a.context < 1) throw InputError("--context must be >= 1");
  if (!a.chat && (!a.system.empty() || !a.chat_format.empty() || !a.date.empty()))
    throw InputError("--system, --chat-format and --date need --chat");
  if (!a.chat && a.prompt.empty()) throw InputError("--prompt must not be empty");
  // The shape first: a model too big for this machine is refused before its tokenizer is read.
  const LlamaConfig cfg = a.model.resolve();
  const int64_t cache_len = std::min(cfg.max_position_embeddings, a.chat ? a.context : int64_t(1) << 62);
  // The prompt's bytes (+ BOS) bound its tokens under any tokenizer.
  const int64_t plain_len = int64_t(a.prompt.size()) + 1 + a.max_new_tokens;
  const int64_t positions = a.chat ? cache_len : std::min(plain_len, cfg.max_position_embeddings);
  // Parameters, and the KV cache's keys and values: [L][positions, kv_dim] each.
  check_fits_in_memory(cfg, sizeof(T), a.force, "generating with",
                       2.0 * double(cfg.num_hidden_layers) * double(positions) * double(cfg.kv_dim()) * sizeof(T));
  const ModelDirectory md = a.model.open();
  Llama<T> model(cfg);
  model.set_bf16_compute(a.model.bf16());
  if (!a.model.checkpoint.empty())
    load_model(a.model.checkpoint, model.param_specs(), model.params());
  else
    model.init_weights(a.init_seed);
  Generator<T> gen(md, model, a.sampler, positions);
  nlohmann::json j = a.chat ? chat(a, md, gen) : continue_prompt(a, md, gen);
  j["tokenizer"] = md.tokenizer->describe();
  j["temperature"] = a.sampler.temperature;
  j["top_p"] = a.sampler.top_p;
  return j;
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "continue a prompt, or chat, token by token, with a KV cache");
  a->model.add_options(*cmd, "small", true);
  cmd->add_option("--prompt", a->prompt, "text to continue (with --chat: the one user message)")->capture_default_str();
  add_number(*cmd, "--max-new-tokens", a->max_new_tokens, "tokens to generate (per answer)")->capture_default_str();
  add_number(*cmd, "--temperature", a->sampler.temperature, "0: greedy; > 0: sample")->capture_default_str();
  add_number(*cmd, "--top-p", a->sampler.top_p, "nucleus sampling mass")->capture_default_str();
  add_number(*cmd, "--seed", a->sampler.seed, "sampling seed")->capture_default_str();
  add_number(*cmd, "--init-seed", a->init_seed, "initial weights when no --checkpoint is given")
      ->capture_default_str();
  cmd->add_flag("--chat", a->chat, "chat in Llama 3's instruct format: each stdin line is a user message");
  cmd->add_option("--system", a->system, "the system message of the chat");
  cmd->add_option("--chat-format", a->chat_format,
                  "llama3.0, llama3.1 or llama3.2 (default: the model's chat_template)");
  cmd->add_option("--date", a->date, "the chat's \"Today Date:\" (llama3.1/3.2 formats), e.g. \"26 Jul 2024\"");
  add_number(*cmd, "--context", a->context, "positions of the chat's KV cache")->capture_default_str();
  add_compute_options(*cmd, a->compute, "compute threads (default: all cores)");
  cmd->add_flag("--force", a->force, "run even if the model looks too large for this machine");
  cmd->add_flag("--json", a->json, "print one JSON object (with the generated text) on stdout");
  cmd->callback([a, cmd] {
    use_compute(a->compute);
    a->prompt_given = cmd->count("--prompt") > 0;
    if (!a->chat && cmd->count("--context") > 0) throw InputError("--context needs --chat (it sizes the chat's KV cache)");
    const nlohmann::json result = a->model.fp64() ? run_generate<double>(*a) : run_generate<float>(*a);
    if (a->json) print_json(result);
  });
}

}  // namespace llama4d::cli
