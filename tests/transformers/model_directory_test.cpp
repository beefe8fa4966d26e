// open_model_directory without a Python: a directory made here from the project's tokenizer
// (data/tokenizer) and a config.json, changed one field at a time. Each mismatch is an
// InputError naming the file and the problem; never another tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/error.h"
#include "core/train/model_directory.h"

namespace llama4d {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ModelDir {
  fs::path path;
  ModelDir() {
    path = fs::temp_directory_path() / ("llama4d_model_dir_" + std::to_string(getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ModelDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  void write(const std::string& file, const json& j) const { std::ofstream(path / file) << j.dump(); }
  void copy_tokenizer() const {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(fs::path(LLAMA4D_SOURCE_DIR) / "data" / "tokenizer" / f, path / f);
  }
};

// A Llama 3 config.json for the project's 4,096-id tokenizer (<|begin_of_text|> = 3840).
json llama_config() {
  return {{"vocab_size", 4096}, {"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", 1},
          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 64},
          {"bos_token_id", 3840}, {"eos_token_id", json::array({3841, 3849})}};
}

void expect_dir_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no InputError (wanted one naming \"" << needle << "\")";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

TEST(ModelDirectory, ReadsTheTokenizerStopIdsAndChatTemplate) {
  ModelDir d;
  d.copy_tokenizer();
  d.write("config.json", llama_config());
  d.write("generation_config.json", {{"eos_token_id", json::array({3848})}});
  const ModelDirectory m = open_model_directory(d.path.string());
  EXPECT_EQ(m.tokenizer->describe().rfind("bpe", 0), 0u);
  EXPECT_EQ(m.stop_ids.front(), 3848);  // generation_config.json's first
  for (int32_t id : {3841, 3849}) EXPECT_NE(std::find(m.stop_ids.begin(), m.stop_ids.end(), id), m.stop_ids.end());
  EXPECT_EQ(m.chat_format().name, "llama3.2");
  EXPECT_EQ(m.chat_format("llama3.0").name, "llama3.0");
}

TEST(ModelDirectory, RefusesEveryMismatchNamingIt) {
  ModelDir d;
  d.copy_tokenizer();
  const std::string dir = d.path.string();
  json c = llama_config();
  c["vocab_size"] = 4000;
  d.write("config.json", c);
  expect_dir_error([&] { open_model_directory(dir); }, "vocab_size is 4000");
  c = llama_config();
  c["vocab_size"] = 4160;  // a padded embedding is fine
  d.write("config.json", c);
  EXPECT_NO_THROW(open_model_directory(dir));
  c = llama_config();
  c["bos_token_id"] = 128000;
  d.write("config.json", c);
  expect_dir_error([&] { open_model_directory(dir); }, "bos_token_id");
  c = llama_config();
  c["eos_token_id"] = json::array({3841, 65});
  d.write("config.json", c);
  expect_dir_error([&] { open_model_directory(dir); }, "eos_token_id 65");
  d.write("config.json", llama_config());
  d.write("generation_config.json", {{"eos_token_id", 5000}});
  expect_dir_error([&] { open_model_directory(dir); }, "generation_config.json: eos_token_id 5000");
  d.write("generation_config.json", {{"eos_token_id", "x"}});
  expect_dir_error([&] { open_model_directory(dir); }, "an id or a list of ids");
}

TEST(ModelDirectory, ByteTokenizerOnlyForAByteModel) {
  ModelDir d;
  json c = llama_config();
  d.write("config.json", c);
  expect_dir_error([&] { open_model_directory(d.path.string()); }, "no tokenizer in");
  c["vocab_size"] = 264;
  c["bos_token_id"] = 256;
  c["eos_token_id"] = 257;
  d.write("config.json", c);
  EXPECT_EQ(open_model_directory(d.path.string()).tokenizer->describe(), "bytes");
  expect_dir_error([&] { open_model_directory(d.path.string()).chat_format(); }, "has no chat_template");
}

TEST(ModelDirectory, AnUnknownChatTemplateIsRefusedWhenAsked) {
  ModelDir d;
  d.copy_tokenizer();
  d.write("config.json", llama_config());
  json tc = json::parse(std::ifstream(d.path / "tokenizer_config.json"));
  tc["chat_template"] = "{% for m in messages %}{{ m.content }}{% endfor %}";
  d.write("tokenizer_config.json", tc);
  const ModelDirectory m = open_model_directory(d.path.string());  // fine until a chat needs it
  expect_dir_error([&] { m.chat_format(); }, "is not one of Meta's Llama 3 templates");
  EXPECT_EQ(m.chat_format("llama3.1").default_date, "26 Jul 2024");
}

}  // namespace
}  // namespace llama4d
