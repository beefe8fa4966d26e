// Lesson 09: a real Llama 3 directory, end to end, with the commands a learner types on a download.
// Without --model the program writes a small Llama 3.2-format directory of its own (random
// weights, tied embeddings, the project's 4,096-id BPE tokenizer in Llama 3's format with Llama
// 3.2's chat template), so everything runs offline; with --model DIR it does the same to DIR (for
// example Meta's Llama-3.2-1B-Instruct). Each phase runs one `llama4d` command, printed as it is
// typed, and reads its --json:
//   1. the directory: config.json, the tokenizer, the stop ids and the chat format;
//   2. chat: `generate --chat`, the prompt Llama 3's template makes of one message;
//   3. `verify --init` of a tensor-parallel plan against one device on the directory's weights;
//   4. `train --init` on a 4D mesh of virtual GPUs, saved as a model directory again;
//   5. the saved directory loaded back: `eval` before and after, `generate --chat` from it.
// The exercises hold each command's numbers to what the files and the template say.
//   lesson09_a_real_llama [--model DIR] [--data FILE_OR_DIR] [--mesh tp=2,cp=2,pp=2,dp=2] [--steps 4] [--step] [--json]

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "core/comm/text_table.h"
#include "core/error.h"
#include "core/io/checkpoint.h"
#include "core/model/llama.h"
#include "core/train/model_directory.h"
#include "lessons/common/cli_runner.h"
#include "lessons/common/lesson.h"
#include "lessons/common/number_format.h"

#ifndef LLAMA4D_TOKENIZER_DIR
#error "LLAMA4D_TOKENIZER_DIR must be defined by lessons/CMakeLists.txt"
#endif

namespace fs = std::filesystem;

namespace llama4d::lesson {
namespace {

struct RealArgs {
  std::string model;  // a Llama 3.x directory; empty: write the lesson's own
  std::string data;   // the text to fine-tune on; empty: three documents of the shipped corpus
  std::string work;   // where the lesson writes; empty: a temporary directory, removed at the end
  std::string mesh = "tp=2,cp=2,pp=2,dp=2";
  std::string verify_mesh = "tp=2";
  int zero = 3;
  int64_t seq_len = 32, batch_size = 4, micro_batch_size = 1, steps = 4, max_new_tokens = 8, eval_windows = 8;
  double lr = 3e-3;
  std::string prompt = "What is pipeline parallelism?";
  std::string date = "26 Jul 2024";  // the template's "Today Date:", fixed so every run prints the same
};

// The lesson's own directory: a Llama 3.2-like shape, small enough for seconds on a laptop.
// Tied embeddings as Llama 3.2 1B and 3B; rope_theta 500,000 as every Llama 3; the ids of the
// project's tokenizer (data/tokenizer: <|begin_of_text|> 3840, <|end_of_text|> 3841, <|eot_id|> 3849).
const char* kOwnConfig = R"({"vocab_size": 4096, "hidden_size": 64, "intermediate_size": 192,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
  "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
  "bos_token_id": 3840, "eos_token_id": [3841, 3849]})";

// ---- Phase 1: the directory ------------------------------------------------------------------

// The lesson's own Llama 3 directory in `dir`: config.json and model.safetensors from random
// weights (init_weights, the initialisation training starts from), the project's tokenizer beside.
void write_own_directory(const std::string& dir) {
  const LlamaConfig cfg = LlamaConfig::from_json(nlohmann::json::parse(kOwnConfig));
  Llama<float> model(cfg);
  model.init_weights(1234);
  save_model(dir, cfg, model.param_specs(), model.params());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(fs::path(LLAMA4D_TOKENIZER_DIR) / f, fs::path(dir) / f, fs::copy_options::overwrite_existing);
  // generation_config.json: where a generated answer stops, as Meta's Instruct directories write it.
  write_json_file(dir + "/generation_config.json",
                  {{"bos_token_id", cfg.bos_token_id}, {"eos_token_id", {3841, 3849}}, {"do_sample", false}});
}

// The model's parameters from config.json alone (the README's formula): the embedding V h; per
// layer the query and output projections 2 h^2, key and value 2 h (kv d), the SwiGLU MLP 3 h f and
// two RMSNorm weights 2 h; the final norm h; and an output head V h unless it is tied.
int64_t parameters_from_config(const nlohmann::json& c) {
  const int64_t V = c.at("vocab_size"), h = c.at("hidden_size"), f = c.at("intermediate_size");
  const int64_t L = c.at("num_hidden_layers"), heads = c.at("num_attention_heads");
  const int64_t kv = c.value("num_key_value_heads", heads);
  const int64_t d = c.contains("head_dim") && !c["head_dim"].is_null() ? c["head_dim"].get<int64_t>() : h / heads;
  const bool tied = c.value("tie_word_embeddings", false);
  const int64_t layer = heads * d * h * 2 + 2 * h * kv * d + 3 * h * f + 2 * h;
  return V * h + L * layer + h + (tied ? 0 : V * h);
}

// What the safetensors files of a directory hold, read from their headers (8 bytes of header
// length, little-endian, then a JSON object: per tensor its dtype, shape and data_offsets).
struct StoredTensors {
  int64_t elements = 0, data_bytes = 0;
};

StoredTensors stored_tensors(const std::string& dir) {
  std::vector<std::string> files;
  if (fs::exists(dir + "/model.safetensors.index.json")) {
    std::set<std::string> names;
    const nlohmann::json index = read_json_file(dir + "/model.safetensors.index.json");
    for (const auto& entry : index.at("weight_map").items()) names.insert(entry.value().get<std::string>());
    files.assign(names.begin(), names.end());
  } else {
    files = {"model.safetensors"};
  }
  StoredTensors s;
  for (const std::string& name : files) {
    std::ifstream in(dir + "/" + name, std::ios::binary);
    if (!in) throw InputError("cannot read " + dir + "/" + name);
    unsigned char len[8] = {};
    in.read(reinterpret_cast<char*>(len), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    std::string header(n, '\0');
    in.read(header.data(), std::streamsize(n));
    const nlohmann::json tensors = nlohmann::json::parse(header);
    for (const auto& entry : tensors.items()) {
      if (entry.key() == "__metadata__") continue;
      const nlohmann::json& t = entry.value();
      int64_t count = 1;
      for (int64_t dim : t.at("shape")) count *= dim;
      s.elements += count;
      s.data_bytes += t.at("data_offsets")[1].get<int64_t>() - t.at("data_offsets")[0].get<int64_t>();
    }
  }
  return s;
}

// Phase 1. Returns the opened directory (everything but the weights, checked).
ModelDirectory show_directory(Narrator& say, const RealArgs& a, const std::string& dir, const nlohmann::json& config) {
  say.phase(std::string(a.model.empty() ? "a Llama 3.2-format directory, written here" : "the Llama 3 directory you gave") +
                ": " + dir,
            "core/train/model_directory.h (open_model_directory), core/data/tokenizer_loader.h, core/io/checkpoint.h");
  std::string files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files += "  " + e.path().filename().string() + " (" + grouped(int64_t(e.file_size())) + " bytes)\n";
  say.say("Its files:\n" + files + "\nconfig.json: " + config.dump() + "\n\n");
  say.ask("P1", "How many parameters does the model hold (the elements of every tensor in its safetensors files)?");
  ModelDirectory md = open_model_directory(dir);
  std::string stops;
  for (int32_t id : md.stop_ids) stops += (stops.empty() ? "" : ", ") + std::to_string(id);
  say.say("Opened and checked before any weight is read: tokenizer " + md.tokenizer->describe() + "; answers stop at ids " +
          stops + "; chat format " + md.chat_format().name + " (from " + md.chat_template_source + ").\n");
  say.pause();
  return md;
}

// ---- Phase 2: chat ---------------------------------------------------------------------------

// The prompt Llama 3's template renders for one user message and no system message, written out
// as text with its control tokens (Meta's model cards; chat_format.h implements it in pieces).
std::string rendered_prompt(const ChatFormat& f, const std::string& message, const std::string& date) {
  std::string s = "<|begin_of_text|>";
  if (f.layout == ChatLayout::kLlama3_1)  // 3.1, 3.2, 3.3: a system header is always there
    s += "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: " + date +
         "\n\n<|eot_id|>";
  return s + "<|start_header_id|>user<|end_header_id|>\n\n" + message +
         "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
}

nlohmann::json chat(Narrator& say, ExerciseSheet& sheet, Cli& cli, const RealArgs& a, const std::string& dir,
                    const ModelDirectory& md) {
  say.phase("chat: one message through Llama 3's instruct template",
            "core/data/chat_format.cpp (encode_chat), cli/generate_command.cpp (chat), core/model/decode.h");
  const ChatFormat format = md.chat_format();
  const std::string text = rendered_prompt(format, a.prompt, a.date);
  say.say("The template turns the message into this text, where each <|...|> is one control token:\n\n" + text +
          "\n\n");
  say.ask("C1", "How many tokens does that prompt hold, control tokens included?");
  const nlohmann::json j = cli.run("generate --checkpoint " + shell_word(dir) + " --chat --date " + shell_word(a.date) +
                                   " --max-new-tokens " + std::to_string(a.max_new_tokens) + " --prompt " + shell_word(a.prompt));
  EncodeOptions specials;
  specials.allow_special = true;  // the rendered text's <|...|> are control tokens here
  const int64_t expected = int64_t(md.tokenizer->encode(text, specials).size());
  const int64_t measured = j.at("prompt_tokens");
  say.say("prompt: " + grouped(measured) + " tokens; answer (" + grouped(j.at("new_tokens").get<int64_t>()) +
          " tokens, greedy, stop: " + j.at("stop").get<std::string>() + "): " + nlohmann::json(j.at("text")).dump() + "\n" +
          (a.model.empty() ? "(random weights: the answer is noise until the model is trained)\n" : ""));
  sheet.exact("C1", "Tokens of the chat prompt, control tokens included?",
              "the rendered template text encoded in one piece, its <|...|> as control tokens", -1, {expected}, {measured},
              "generate --chat builds the prompt piece by piece: the control ids, and each text encoded as text");
  sheet.answer("C1", {.value = double(measured), .unit = "tokens", .of = "the prompt"});
  say.pause();
  return j;
}

// ---- Phase 3: verify -------------------------------------------------------------------------

nlohmann::json verify(Narrator& say, ExerciseSheet& sheet, Cli& cli, const RealArgs& a, const std::string& dir,
                      const std::string& data, int64_t vocab) {
  say.phase("verify --init: " + a.verify_mesh + " against one device, on the directory's weights",
            "cli/verify_command.cpp, cli/init_checkpoint.cpp (stage_init_checkpoint), core/verify/equivalence.cpp");
  say.ask("V1", "What is the first step's loss on one device, in nats?");
  const nlohmann::json v = cli.run("verify --init " + shell_word(dir) + " --data " + shell_word(data) + " --mesh " + a.verify_mesh +
                                   " --seq-len " + std::to_string(a.seq_len) + " --steps 2");
  const double first = v.at("losses_single")[0];
  say.say("one device: losses " + v.at("losses_single").dump() + "\n" + a.verify_mesh + ": losses " +
          v.at("losses_parallel").dump() + "\nworst relative error " + fixed(v.at("max_rel_err").get<double>() * 1e6, 3) +
          "e-6 (" + v.at("worst_tensor").get<std::string>() + "), within the harness's bounds: " +
          (v.at("ok").get<bool>() ? "yes" : "NO") + "\n");
  Exercise e;
  e.id = "V1";
  e.question = "The first step's loss on one device (nats)?";
  e.value = first;
  if (a.model.empty()) {
    e.formula = "ln V = ln " + grouped(vocab) + " = " + fixed(std::log(double(vocab)), 3) +
                ": random weights of std 0.02 give nearly uniform next-token probabilities";
    e.pass = v.at("ok").get<bool>() && std::abs(first - std::log(double(vocab))) < 0.25;
    e.note = "within 0.25 of ln V, and the plan within the harness's bounds";
  } else {
    e.formula = "a trained model: well below ln V = " + fixed(std::log(double(vocab)), 3);
    e.pass = v.at("ok").get<bool>() && first < std::log(double(vocab));
    e.note = "below ln V, and the plan within the harness's bounds";
  }
  sheet.add(e);
  sheet.answer("V1", {.value = first, .unit = "nats", .of = "one device", .tolerance = 0.005});
  say.pause();
  return v;
}

// ---- Phases 4 and 5: fine-tune on 4D, load back ---------------------------------------------

nlohmann::json evaluate(Cli& cli, const RealArgs& a, const std::string& dir, const std::string& data) {
  return cli.run("eval --checkpoint " + shell_word(dir) + " --data " + shell_word(data) + " --seq-len " +
                 std::to_string(a.seq_len) + " --max-windows " + std::to_string(a.eval_windows));
}

int run(const LessonOptions& o, const RealArgs& a) {
  Narrator say(o);
  ExerciseSheet sheet;
  const WorkDirectory work_directory(a.work, "lesson09");
  const fs::path& work = work_directory.path();
  const std::string dir = a.model.empty() ? (work / "llama").string() : a.model;
  if (a.model.empty()) write_own_directory(dir);
  // The text to fine-tune on, copied into the work directory (its token cache is written beside it).
  std::string data = a.data;
  if (data.empty()) {
    fs::create_directories(work / "notes");
    for (const char* f : {"part-03-01.txt", "part-07-01.txt", "part-12-03.txt"})
      fs::copy_file(fs::path(default_corpus_path()) / f, work / "notes" / f, fs::copy_options::overwrite_existing);
    data = (work / "notes").string();
  }
  Cli cli(say, (work / "llama4d.log").string());

  const nlohmann::json config = read_json_file(dir + "/config.json");
  const ModelDirectory md = show_directory(say, a, dir, config);
  const StoredTensors stored = stored_tensors(dir);
  sheet.exact("P1", "Parameters in the directory's safetensors files?",
              "V h + L (2 h heads d + 2 h kv d + 3 h f + 2 h) + h, + V h for an untied head", -1,
              {parameters_from_config(config)}, {stored.elements},
              "measured: the elements of every tensor in the safetensors headers");
  sheet.answer("P1", {.value = double(stored.elements), .unit = "parameters", .of = "the model"});

  const nlohmann::json chat_before = chat(say, sheet, cli, a, dir, md);
  const nlohmann::json verified = verify(say, sheet, cli, a, dir, data, config.at("vocab_size"));

  say.phase("train --init on " + a.mesh + " (ZeRO-" + std::to_string(a.zero) + "), saved as a model directory",
            "cli/train_command.cpp (run_parallel), core/parallel/parallel_trainer.cpp (load_checkpoint, save_checkpoint)");
  const nlohmann::json before = evaluate(cli, a, dir, data);
  const std::string out = (work / "finetune").string();
  const nlohmann::json trained =
      cli.run("train --init " + shell_word(dir) + " --data " + shell_word(data) + " --mesh " + a.mesh + " --zero " +
              std::to_string(a.zero) + " --seq-len " + std::to_string(a.seq_len) + " --batch-size " +
              std::to_string(a.batch_size) + " --micro-batch-size " + std::to_string(a.micro_batch_size) + " --steps " + std::to_string(a.steps) + " --lr " + number_text(a.lr) + " --min-lr " + number_text(a.lr / 100) +
              " --warmup-steps 1 --eval-every 0 --out " + shell_word(out));
  const std::string saved = trained.at("checkpoint");
  say.say(trained.at("strategy").get<std::string>() + " on " + grouped(trained.at("ranks").get<int64_t>()) +
          " virtual GPUs; final training loss " + fixed(trained.at("final_loss").get<double>(), 4) + "\nsaved: " + saved +
          "\n");
  say.ask("S1", "How many bytes of tensor data does the saved model.safetensors hold?");
  const StoredTensors saved_tensors = stored_tensors(saved);
  std::string files;
  for (const auto& e : fs::directory_iterator(saved))
    if (e.is_regular_file()) files += "  " + e.path().filename().string() + "\n";
  say.say("Its files:\n" + files + "tensor data: " + grouped(saved_tensors.data_bytes) + " bytes\n");
  sheet.exact("S1", "Bytes of tensor data in the saved model.safetensors?",
              "4 P: training keeps and saves fp32 weights, whatever dtype the directory had", -1,
              {4 * parameters_from_config(config)}, {saved_tensors.data_bytes});
  sheet.answer("S1", {.value = double(saved_tensors.data_bytes), .unit = "bytes", .of = "the saved directory"});
  say.pause();

  say.phase("the saved directory loaded back: eval before and after, and chat",
            "core/train/evaluate.cpp (evaluate_loss), cli/eval_command.cpp");
  say.ask("F1", "What is eval's loss on your text after fine-tuning, in nats?");
  const nlohmann::json after = evaluate(cli, a, saved, data);
  const nlohmann::json chat_after = cli.run("generate --checkpoint " + shell_word(saved) + " --chat --date " + shell_word(a.date) +
                                            " --max-new-tokens " + std::to_string(a.max_new_tokens) + " --prompt " +
                                            shell_word(a.prompt));
  const double loss_before = before.at("loss"), loss_after = after.at("loss");
  say.say("eval loss on " + data + " (" + grouped(after.at("tokens").get<int64_t>()) + " tokens): " + fixed(loss_before, 4) +
          " before, " + fixed(loss_after, 4) + " after " + std::to_string(a.steps) + " steps\nanswer now: " +
          nlohmann::json(chat_after.at("text")).dump() + "\n");
  Exercise f1;
  f1.id = "F1";
  f1.question = "eval's loss on your text after fine-tuning (nats)?";
  f1.formula = "below the loss before fine-tuning, " + fixed(loss_before, 4) + ": the steps trained on this text";
  f1.value = loss_after;
  f1.pass = loss_after < loss_before && chat_after.at("prompt_tokens") == chat_before.at("prompt_tokens");
  f1.note = "and the saved directory chats with the same tokenizer and template (the same prompt tokens)";
  sheet.add(f1);
  sheet.answer("F1", {.value = loss_after, .unit = "nats", .of = "the saved directory", .tolerance = 0.005});
  say.pause();

  sheet.set_predictions(say.predictions());
  sheet.set_asked(say.asked());
  say.say("\n" + sheet.report());
  const bool passed = sheet.failed() == 0;
  if (o.json) {
    const nlohmann::json j = {{"lesson", "09-a-real-llama"},
                              {"model", a.model.empty() ? "the lesson's own" : a.model},
                              {"config", config},
                              {"parameters", stored.elements},
                              {"chat", chat_before},
                              {"verify", {{"ok", verified.at("ok")}, {"max_rel_err", verified.at("max_rel_err")},
                                          {"losses_single", verified.at("losses_single")},
                                          {"losses_parallel", verified.at("losses_parallel")}}},
                              {"train", {{"mesh", trained.at("mesh")}, {"ranks", trained.at("ranks")},
                                         {"final_loss", trained.at("final_loss")}, {"strategy", trained.at("strategy")}}},
                              {"eval_before", loss_before},
                              {"eval_after", loss_after},
                              {"chat_after", chat_after},
                              {"exercises", sheet.to_json()},
                              {"asked", sheet.asked_json()},
                              {"passed", passed}};
    std::printf("%s\n", j.dump().c_str());
  }
  return passed ? 0 : 1;
}

}  // namespace
}  // namespace llama4d::lesson

int main(int argc, char** argv) {
  llama4d::lesson::LessonOptions options;
  llama4d::lesson::RealArgs a;
  CLI::App app{"Lesson 09: a real Llama 3 directory: load, chat, verify tp=2, fine-tune on 4D, load back",
               "lesson09_a_real_llama"};
  app.add_option("--model", a.model, "a Llama 3.x directory (default: the lesson writes a small one)");
  app.add_option("--data", a.data, "text to fine-tune on: a .txt, a directory of .txt, a .jsonl (default: 3 corpus documents)");
  app.add_option("--work", a.work, "where to write (default: a temporary directory, removed at the end)");
  app.add_option("--mesh", a.mesh, "the fine-tune's mesh, innermost first")->capture_default_str();
  app.add_option("--verify-mesh", a.verify_mesh, "the plan verify checks against one device")->capture_default_str();
  llama4d::cli::add_number(app, "--zero", a.zero, "the fine-tune's ZeRO stage", 0, 3)->capture_default_str();
  llama4d::cli::add_number(app, "--seq-len", a.seq_len, "tokens per sequence", 2, 1 << 20)->capture_default_str();
  llama4d::cli::add_number(app, "--batch-size", a.batch_size, "the fine-tune's global batch (sequences)", 1, 4096)
      ->capture_default_str();
  llama4d::cli::add_number(app, "--micro-batch-size", a.micro_batch_size,
                           "sequences per micro-batch (pp=2 on dp=2 with 4 sequences: 2 micro-batches)", 1, 4096)
      ->capture_default_str();
  llama4d::cli::add_number(app, "--steps", a.steps, "fine-tune steps", 1, 100000)->capture_default_str();
  llama4d::cli::add_number(app, "--lr", a.lr,
                           "the fine-tune's peak learning rate; the cosine decays to 1/100 of it, as Llama 3's pre-training "
                           "did (8e-5 to 8e-7)")->capture_default_str();
  llama4d::cli::add_number(app, "--eval-windows", a.eval_windows, "windows eval reads", 1, 1 << 20)->capture_default_str();
  llama4d::cli::add_number(app, "--max-new-tokens", a.max_new_tokens, "tokens of each chat answer", 0, 4096)
      ->capture_default_str();
  app.add_option("--prompt", a.prompt, "the chat message")->capture_default_str();
  app.add_flag("--step", options.step, "pause at every phase (press Enter; never blocks when stdin is not a terminal)");
  app.add_flag("--json", options.json, "print one JSON object (measured vs expected) on stdout; narration on stderr");
  app.add_option("--predict", options.predict, "predictions as if typed at the questions, ID=NUMBER each (P1=300,000)");
  return llama4d::lesson::lesson_main(app, argc, argv, [&] {
    if (!a.model.empty() && !std::filesystem::is_directory(a.model))
      throw llama4d::InputError("--model " + a.model + " is not a directory");
    return llama4d::lesson::run(options, a);
  });
}
