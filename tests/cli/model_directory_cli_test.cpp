// A Llama 3 model directory through the CLI: a model with the project's 4,096-id tokenizer beside
// it (data/tokenizer), used by generate (plain and --chat), eval and train --init, whose
// checkpoint carries the tokenizer on; and the refusals, each exit 2 naming the problem. The ids
// themselves are held against transformers in tests/transformers; here, what the commands do.
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/cli/cli_test_util.h"

namespace llama4d::cli_test {
namespace {

// `name`'s path under the test temp directory, without removing it (tmp() removes).
std::string tmp_path(const std::string& name) { return testing::TempDir() + "/llama4d_cli_" + name; }

// A tiny Llama 3 shape for the project's tokenizer (<|begin_of_text|> 3840, <|end_of_text|> 3841).
const char* kBpeConfig = R"({"vocab_size": 4096, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
  "bos_token_id": 3840, "eos_token_id": 3841})";

// <tmp>/checkpoint: random weights of kBpeConfig (one training step on bytes writes them), with
// data/tokenizer's tokenizer.json and tokenizer_config.json (Llama 3.2's chat template) beside them.
std::string bpe_model_dir(const std::string& name) {
  const std::string dir = tmp(name);
  fs::create_directories(dir);
  std::ofstream(dir + "/config.json") << kBpeConfig;
  const Result r = run("train --config " + dir + "/config.json --seq-len 16 --batch-size 2 --steps 1 --eval-every 0 --out " +
                       dir + "/run");
  EXPECT_EQ(r.code, 0) << r.err;
  const std::string ckpt = dir + "/run/checkpoint";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(fs::path(LLAMA4D_SOURCE_DIR) / "data" / "tokenizer" / f, fs::path(ckpt) / f,
                  fs::copy_options::overwrite_existing);
  return ckpt;
}

TEST(CliModelDirectory, GenerateAndChatUseTheDirectorysTokenizer) {
  const std::string ckpt = bpe_model_dir("bpe_generate");
  Result r = run("generate --checkpoint " + ckpt + " --prompt Hello --max-new-tokens 3 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["tokenizer"].get<std::string>().rfind("bpe", 0), 0u);
  // Hugging Face tokenizers 0.22.1 on data/tokenizer/tokenizer.json: "Hello" -> [3840, 39, 299, 484].
  EXPECT_EQ(j["prompt_tokens"], 4);
  for (int id : j["tokens"]) EXPECT_LT(id, 4096);

  r = run("generate --checkpoint " + ckpt + " --chat --json --prompt Hi --system Brief --date \"26 Jul 2024\" --max-new-tokens 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(lines(r.out), 1) << "one JSON object";
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["chat_format"], "llama3.2");
  ASSERT_EQ(j["messages"].size(), 3u);  // system, user, assistant
  EXPECT_EQ(j["messages"][2]["role"], "assistant");

  const std::string turns = tmp("bpe_turns") + ".txt";
  std::ofstream(turns) << "first question\nsecond question\n";
  r = run("generate --checkpoint " + ckpt + " --chat --max-new-tokens 2 --temperature 0.8 < " + turns);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(lines(r.out), 2) << "one answer line per user line:\n" << r.out;

  expect_bad_input(run("generate --checkpoint " + ckpt + " --chat --chat-format chatml --prompt x"), "\"chatml\"");
  expect_bad_input(run("generate --checkpoint " + ckpt + " --system x --prompt y"), "need --chat");
  expect_bad_input(run("generate --checkpoint " + ckpt + " --context 64 --prompt y"), "--context needs --chat");
}

TEST(CliModelDirectory, TrainInitTokenizesWithTheModelsTokenizerAndSavesItBeside) {
  const std::string ckpt = bpe_model_dir("bpe_init");
  const std::string data = tmp("bpe_init_data") + ".jsonl";
  {
    std::ofstream f(data);
    for (int i = 0; i < 40; ++i) f << R"({"text": "Document )" << i << R"( is about tensor and pipeline parallelism."})" << "\n";
  }
  const std::string out = tmp("bpe_init_out");
  Result r = run("train --init " + ckpt + " --data " + data + " --seq-len 16 --batch-size 2 --steps 2 --eval-every 0 --out " +
                 out + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const double causal_train = nlohmann::json::parse(r.out)["final_loss"];
  EXPECT_EQ(nlohmann::json::parse(r.out)["tokenizer"].get<std::string>().rfind("bpe", 0), 0u);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "config.json", "model.safetensors"})
    EXPECT_TRUE(fs::exists(fs::path(out) / "checkpoint" / f)) << f;
  r = run("eval --checkpoint " + out + "/checkpoint --data " + data + " --seq-len 16 --max-windows 2 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::parse(r.out)["bits_per_byte"].is_null());

  // On a mesh: ZeRO-3 on 2 virtual GPUs writes the bytes one device accumulating the same two
  // micro-batches writes (the README's claim for presets, here from a model directory).
  const std::string common = " --data " + data + " --seq-len 16 --batch-size 4 --steps 2 --eval-every 0";
  ASSERT_EQ(run("train --init " + ckpt + common + " --micro-batch-size 2 --out " + tmp("bpe_init_one")).code, 0);
  ASSERT_EQ(run("train --init " + ckpt + common + " --mesh dp=2 --zero 3 --out " + tmp("bpe_init_dp")).code, 0);
  EXPECT_EQ(read_file(tmp_path("bpe_init_one") + "/checkpoint/model.safetensors"),
            read_file(tmp_path("bpe_init_dp") + "/checkpoint/model.safetensors"));
  EXPECT_TRUE(fs::exists(tmp_path("bpe_init_dp") + "/checkpoint/tokenizer.json"));
  EXPECT_FALSE(fs::exists(tmp_path("bpe_init_dp") + "/init-checkpoint")) << "the staged weights are removed";

  // --doc-mask cuts rows at this tokenizer's <|end_of_text|> (3841), not the byte tokenizer's 257:
  // the 40 short documents put boundaries in verify's rows of 16, and the mask changes eval's loss.
  r = run("verify --init " + ckpt + " --data " + data + " --doc-mask --mesh dp=2 --seq-len 16 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json v = nlohmann::json::parse(r.out);
  EXPECT_TRUE(v["ok"].get<bool>());
  EXPECT_GT(v["document_boundaries"].get<int64_t>(), 0);
  const std::string eval = "eval --checkpoint " + out + "/checkpoint --data " + data + " --seq-len 16 --json";
  r = run(eval);
  ASSERT_EQ(r.code, 0) << r.err;
  const double causal = nlohmann::json::parse(r.out)["loss"];
  r = run(eval + " --doc-mask");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(nlohmann::json::parse(r.out)["loss"].get<double>(), causal);
  r = run("train --init " + ckpt + " --data " + data + " --seq-len 16 --batch-size 2 --steps 2 --eval-every 0 --doc-mask --out " +
          tmp("bpe_init_mask") + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(nlohmann::json::parse(r.out)["final_loss"].get<double>(), causal_train);
  expect_bad_input(run("train --init " + ckpt + " --preset tiny --out " + tmp("bpe_init_preset")), "--preset and --init");
}

// .jsonl chats: "messages" lines rendered in the directory's chat format train as documents; a
// bad line exits 2 naming file:line, and a byte model refuses a chat (it has no special tokens).
TEST(CliModelDirectory, TrainInitOnJsonlChatsAndBadLinesExitTwoNamingTheLine) {
  const std::string ckpt = bpe_model_dir("bpe_chat");
  const std::string data = tmp("bpe_chat_data") + ".jsonl";
  {
    std::ofstream f(data);
    for (int i = 0; i < 20; ++i)
      f << R"({"messages": [{"role": "user", "content": "What is rank )" << i
        << R"(?"}, {"role": "assistant", "content": "A device."}]})" << "\n";
    f << R"({"text": "A plain document between the chats."})" << "\n";
  }
  Result r = run("train --init " + ckpt + " --data " + data + " --seq-len 16 --batch-size 2 --steps 2 --eval-every 0 --doc-mask --out " +
                 tmp("bpe_chat_out") + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::isfinite(nlohmann::json::parse(r.out)["final_loss"].get<double>()));
  r = run("eval --checkpoint " + ckpt + " --data " + data + " --seq-len 16 --max-windows 2 --json");
  ASSERT_EQ(r.code, 0) << r.err;

  const std::string bad = tmp("bpe_chat_bad") + ".jsonl";
  const std::string good = R"({"text": "fine"})" "\n";
  const std::pair<std::string, std::string> cases[] = {
      {"{not json", "invalid JSON"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})", "unknown role \"robot\""},
      {R"({"messages": []})", "empty list"},
      {R"({"text": ["a"]})", "\"text\" is not a string"},
  };
  for (const auto& [line, what] : cases) {
    std::ofstream(bad, std::ios::trunc) << good << line << "\n";
    r = run("train --init " + ckpt + " --data " + bad + " --seq-len 16 --steps 2 --out " + tmp("bpe_chat_bad_out"));
    expect_bad_input(r, bad + ":2");
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
  }
  // The byte tokenizer (no --init) cannot render a chat.
  expect_bad_input(run("train --preset tiny --data " + data + " --seq-len 16 --steps 2 --out " + tmp("bpe_chat_bytes")),
                   data + ":1");
}

// verify --init: the plan checked on the directory's weights and its tokenizer's data. Its one-device
// side's first loss is the loss train --init's first step reports on the same batch (verify's
// defaults on dp=2: 8 rows in micro-batches of 2), so both started from the directory's weights.
TEST(CliModelDirectory, VerifyInitChecksAPlanOnTheDirectorysWeights) {
  const std::string ckpt = bpe_model_dir("bpe_verify");
  Result r = run("verify --init " + ckpt + " --mesh tp=2,dp=2 --zero 1 --seq-len 32 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json v = nlohmann::json::parse(r.out);
  EXPECT_TRUE(v["ok"].get<bool>());
  EXPECT_NE(r.err.find("verify: model directory " + ckpt + ","), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("preset tiny"), std::string::npos) << "the model is the directory's, not the preset's: " << r.err;
  const std::string out = tmp("bpe_verify_train");
  r = run("train --init " + ckpt + " --seq-len 32 --batch-size 8 --micro-batch-size 2 --warmup-steps 1 --steps 1 "
          "--eval-every 0 --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  const double trained = nlohmann::json::parse(read_file(out + "/metrics.jsonl"))["loss"];
  EXPECT_NEAR(v["losses_single"][0].get<double>(), trained, 1e-6 * trained);
  expect_bad_input(run("verify --init " + ckpt + " --preset tiny --mesh dp=2"), "--preset and --init");
}

TEST(CliModelDirectory, MismatchedDirectoriesExitTwoNamingTheFile) {
  const std::string ckpt = bpe_model_dir("bpe_bad");
  nlohmann::json cfg = nlohmann::json::parse(read_file(ckpt + "/config.json"));
  cfg["vocab_size"] = 4000;
  std::ofstream(ckpt + "/config.json", std::ios::trunc) << cfg.dump();
  expect_bad_input(run("generate --checkpoint " + ckpt + " --prompt x"), "vocab_size is 4000");
  expect_bad_input(run("eval --checkpoint " + ckpt), "vocab_size is 4000");
  fs::remove(ckpt + "/tokenizer.json");
  expect_bad_input(run("generate --checkpoint " + ckpt + " --prompt x"), "no tokenizer in");
  // Too big for any machine: refused before anything is allocated, in bytes.
  expect_bad_input(run("generate --preset llama3-405b --prompt x"), "bytes");
}

}  // namespace
}  // namespace llama4d::cli_test
