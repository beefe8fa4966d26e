// Our BPE tokenizer against Hugging Face's `tokenizers` (the answers make_reference.py wrote):
// the same ids on 2,300 strings for the project's tokenizer and for a Llama-3-format
// tokenizer.json written by the test, in both special-token modes, with and without BOS; the
// same ids from Meta's tiktoken format of that vocabulary; the same text from decode.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/data/bpe_tokenizer.h"
#include "core/data/tokenizer_loader.h"
#include "core/data/utf8.h"
#include "core/error.h"
#include "tests/tokenizer/test_util.h"

#ifndef LLAMA4D_TOKENIZER_REFERENCE
#error "LLAMA4D_TOKENIZER_REFERENCE must be defined by the build"
#endif

namespace llama4d {
namespace {

namespace fs = std::filesystem;
using test::from_hex;
using test::ids_text;
using test::printable;

// The reference directory, or skip/fail saying why it is missing.
std::string reference_dir() {
  const std::string dir = LLAMA4D_TOKENIZER_REFERENCE;
  if (dir.empty()) return "";
  return dir;
}

#define REQUIRE_REFERENCE(dir)                                                                              \
  const std::string dir = reference_dir();                                                                  \
  if (dir.empty())                                                                                          \
    GTEST_SKIP() << "no Python with Hugging Face tokenizers configured: configure with "                    \
                    "-DLLAMA4D_TEST_PYTHON=\"$(scripts/python_env.sh)\" (scripts/test.sh does)";            \
  ASSERT_TRUE(fs::exists(fs::path(dir) / "llama3.json"))                                                    \
      << dir << " has no answers: run this test through ctest, whose fixture "                              \
      << "TokenizerReference.HuggingFaceAnswers runs tests/tokenizer/make_reference.py first"

const nlohmann::json& answers(const std::string& dir, const std::string& name) {
  static std::map<std::string, nlohmann::json> loaded;
  auto it = loaded.find(name);
  if (it == loaded.end()) it = loaded.emplace(name, nlohmann::json::parse(test::read_file(fs::path(dir) / (name + ".json")))).first;
  return it->second;
}

// Every case's ids in one mode; the first mismatch reported with its string.
void expect_same_ids(const Tokenizer& tok, const nlohmann::json& ref, const char* mode, const EncodeOptions& opt) {
  size_t checked = 0;
  for (size_t i = 0; i < ref["cases"].size(); ++i) {
    const auto& c = ref["cases"][i];
    const std::string text = from_hex(c["hex"].get<std::string>());
    const std::vector<int32_t> want = c[mode].get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok.encode(text, opt);
    if (got != want) {
      size_t at = 0;
      while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
      FAIL() << tok.describe() << ", mode " << mode << ": case " << i << " " << printable(text) << "\n  first difference at id "
             << at << "\n  Hugging Face: " << ids_text(want, at) << "\n  ours:         " << ids_text(got, at);
    }
    ++checked;
  }
  EXPECT_GE(checked, 2000u);
}

void expect_all_modes(const Tokenizer& tok, const nlohmann::json& ref) {
  expect_same_ids(tok, ref, "plain", {.allow_special = false});
  expect_same_ids(tok, ref, "plain_bos", {.add_bos = true, .allow_special = false});
  expect_same_ids(tok, ref, "special", {.allow_special = true});
  expect_same_ids(tok, ref, "special_bos", {.add_bos = true, .allow_special = true});
}

TEST(HfReference, ProjectTokenizerGivesHuggingFacesIdsInEveryMode) {
  REQUIRE_REFERENCE(dir);
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  expect_all_modes(tok, answers(dir, "project"));
}

TEST(HfReference, Llama3FormatTokenizerJsonGivesHuggingFacesIdsInEveryMode) {
  REQUIRE_REFERENCE(dir);
  const BpeTokenizer tok = load_tokenizer_json(dir + "/llama3/tokenizer.json");
  EXPECT_EQ(tok.vocab_size(), answers(dir, "llama3")["vocab_size"].get<int32_t>());
  expect_all_modes(tok, answers(dir, "llama3"));
}

// Meta's format of the same vocabulary: tiktoken's merge rule (lowest rank of the concatenation)
// gives the ids Hugging Face gives with the merges list, as for Llama 3 itself. The specials
// come from the tokenizer_config.json beside it (load_tokenizer picks tokenizer.model).
TEST(HfReference, TiktokenFileOfTheSameVocabularyGivesTheSameIds) {
  REQUIRE_REFERENCE(dir);
  const fs::path only_model = fs::path(dir) / "llama3_tiktoken_only";
  fs::create_directories(only_model);
  fs::copy_file(fs::path(dir) / "llama3/tokenizer.model", only_model / "tokenizer.model", fs::copy_options::overwrite_existing);
  fs::copy_file(fs::path(dir) / "llama3/tokenizer_config.json", only_model / "tokenizer_config.json",
                fs::copy_options::overwrite_existing);
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(only_model.string());
  EXPECT_NE(tok->describe().find("tokenizer.model"), std::string::npos) << tok->describe();
  expect_all_modes(*tok, answers(dir, "llama3"));
}

// The same, with a tiktoken file this test writes from the tokenizer.json's vocabulary.
TEST(HfReference, TiktokenWrittenFromTheTokenizerJsonVocabularyGivesTheSameIds) {
  REQUIRE_REFERENCE(dir);
  const BpeTokenizer json_tok = load_tokenizer_json(dir + "/llama3/tokenizer.json");
  const int32_t n_bpe = json_tok.bos_id();  // the specials follow the BPE ids, <|begin_of_text|> first
  const std::string file = test::tiktoken_text(json_tok);
  TiktokenOptions opt;
  for (int32_t id = n_bpe; id < json_tok.vocab_size(); ++id) opt.specials.push_back(json_tok.id_to_token(id));
  const BpeTokenizer tik = parse_tiktoken(file, opt, "tiktoken written by the test");
  expect_all_modes(tik, answers(dir, "llama3"));
}

TEST(HfReference, InvalidUtf8IsRefusedOrReplacedAsPythonWouldBeforeHuggingFace) {
  REQUIRE_REFERENCE(dir);
  for (const char* name : {"project", "llama3"}) {
    const BpeTokenizer tok = load_tokenizer_json(std::string(name) == "project" ? test::project_tokenizer_path()
                                                                                : dir + "/llama3/tokenizer.json");
    for (const auto& c : answers(dir, name)["invalid"]) {
      const std::string raw = from_hex(c["hex"].get<std::string>());
      EXPECT_EQ(replace_invalid_utf8(raw), from_hex(c["replaced_hex"].get<std::string>())) << printable(raw);
      EXPECT_EQ(tok.encode(raw, {.invalid_utf8 = InvalidUtf8::kReplace}), c["plain"].get<std::vector<int32_t>>())
          << name << ": " << printable(raw);
      if (find_invalid_utf8(raw) >= 0) {
        try {
          tok.encode(raw);
          ADD_FAILURE() << "no InputError for " << printable(raw);
        } catch (const InputError& e) {
          EXPECT_NE(std::string(e.what()).find("byte offset " + std::to_string(find_invalid_utf8(raw))), std::string::npos)
              << e.what();
        }
      }
    }
  }
}

TEST(HfReference, DecodeGivesHuggingFacesTextWithAndWithoutSpecials) {
  REQUIRE_REFERENCE(dir);
  for (const char* name : {"project", "llama3"}) {
    const BpeTokenizer tok = load_tokenizer_json(std::string(name) == "project" ? test::project_tokenizer_path()
                                                                                : dir + "/llama3/tokenizer.json");
    for (const auto& c : answers(dir, name)["decode"]) {
      const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(replace_invalid_utf8(tok.decode(ids)), from_hex(c["skip"].get<std::string>())) << name << " " << ids_text(ids);
      EXPECT_EQ(replace_invalid_utf8(tok.decode(ids, {.render_specials = true})), from_hex(c["keep"].get<std::string>()))
          << name << " " << ids_text(ids);
    }
  }
}

// data/tokenizer/tokenizer.json is what data/tokenizer/train_tokenizer.py makes, byte for byte.
TEST(HfReference, CommittedProjectTokenizerIsWhatTheScriptMakes) {
  REQUIRE_REFERENCE(dir);
  EXPECT_TRUE(test::read_file(test::project_tokenizer_path()) == test::read_file(fs::path(dir) / "retrained/tokenizer.json"))
      << "data/tokenizer/tokenizer.json differs from a fresh run of data/tokenizer/train_tokenizer.py";
}

}  // namespace
}  // namespace llama4d
