// Every way a tokenizer file or a call can be wrong ends in an InputError whose message names
// the problem, never in a different tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "core/data/bpe_tokenizer.h"
#include "core/data/tokenizer_loader.h"
#include "core/error.h"
#include "tests/tokenizer/test_util.h"
#include "tests/tokenizer/tiny_json.h"

namespace llama4d {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// `f` throws an InputError whose message contains `needle`.
void expect_input_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no InputError (wanted one naming \"" << needle << "\")";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

// The tiny tokenizer.json with one change.
void expect_refused(const std::function<void(json&)>& change, const std::string& needle) {
  json j = test::tiny_tokenizer_json({.extra = {"ab"}, .merges = {{"a", "b"}}, .specials = {"<|begin_of_text|>"}});
  ASSERT_NO_THROW(parse_tokenizer_json(j.dump()));
  change(j);
  expect_input_error([&] { parse_tokenizer_json(j.dump(), "bad.json"); }, needle);
}

TEST(TokenizerJsonErrors, UnknownKindsAreRefusedByName) {
  expect_refused([](json& j) { j["model"]["type"] = "WordPiece"; }, "model type \"WordPiece\"");
  expect_refused([](json& j) { j["model"]["byte_fallback"] = true; }, "byte_fallback");
  expect_refused([](json& j) { j["model"]["dropout"] = 0.1; }, "dropout");
  expect_refused([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "continuing_subword_prefix");
  expect_refused([](json& j) { j["normalizer"] = {{"type", "NFC"}}; }, "normalizer type \"NFC\"");
  expect_refused([](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre-tokenizer type \"Whitespace\"");
  expect_refused([](json& j) { j["pre_tokenizer"] = nullptr; }, "pre_tokenizer is null");
  expect_refused([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }, "behavior \"Removed\"");
  expect_refused([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; }, "invert");
  expect_refused([](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; }, "add_prefix_space");
  expect_refused([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+"; }, "\\w");
  expect_refused([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder type \"WordPiece\"");
  expect_refused([](json& j) { j["decoder"] = nullptr; }, "decoder is null");
  expect_refused([](json& j) { j["post_processor"] = {{"type", "BertProcessing"}}; }, "post_processor type \"BertProcessing\"");
  expect_refused([](json& j) { j["truncation"] = {{"max_length", 8}}; }, "\"truncation\"");
  expect_refused([](json& j) { j["added_tokens"][0]["lstrip"] = true; }, "lstrip");
}

TEST(TokenizerJsonErrors, MergesMustNameTokensOfTheVocabulary) {
  expect_refused([](json& j) { j["model"]["merges"].push_back("a zz"); }, "names \"zz\", which is not in model.vocab");
  expect_refused([](json& j) { j["model"]["merges"].push_back("b c"); }, "makes \"bc\", which is not in model.vocab");
  expect_refused([](json& j) { j["model"]["merges"].push_back("abc"); }, "not two tokens");
  expect_refused([](json& j) { j["model"]["merges"].push_back(json::array({"a"})); }, "neither");
  expect_refused([](json& j) { j["model"]["vocab"].erase("z"); }, "no token for the byte 122");
  expect_refused([](json& j) { j["model"]["vocab"]["zz"] = 5; }, "gives id 5 to both");
  // The array form of merges reads like the string form.
  json j = test::tiny_tokenizer_json({.extra = {"ab"}, .merges = {{"a", "b"}}});
  j["model"]["merges"] = json::array({json::array({"a", "b"})});
  EXPECT_EQ(parse_tokenizer_json(j.dump()).encode("ab"), std::vector<int32_t>{256});
}

TEST(TokenizerJsonErrors, MalformedJsonAndMissingFiles) {
  expect_input_error([] { parse_tokenizer_json("{\"model\": ", "broken.json"); }, "broken.json is not valid JSON");
  // A token twice in the vocabulary (with two ids) would otherwise be the last one's.
  expect_input_error([] { parse_tokenizer_json(R"({"model": {"type": "BPE", "vocab": {"a": 0, "a": 1}, "merges": []}})", "twice.json"); },
                     "twice.json: key 'a' appears twice in one object");
  expect_input_error([] { parse_tokenizer_json(std::string("{\"model\": {}}\0 trailing", 23), "nul.json"); },
                     "nul.json has a NUL byte at byte 13");
  expect_input_error([] { parse_tokenizer_json("[1, 2]", "list.json"); }, "not a JSON object");
  expect_input_error([] { parse_tokenizer_json("{}", "empty.json"); }, "has no \"model\"");
  expect_input_error([] { load_tokenizer_json("/nonexistent/tokenizer.json"); }, "/nonexistent/tokenizer.json");
}

TEST(TiktokenErrors, MalformedLinesAreNamed) {
  expect_input_error([] { parse_tiktoken("QQ== 0\nnot-base64! 1\n", {}, "t.model"); }, "t.model line 2");
  expect_input_error([] { parse_tiktoken("QQ== x\n", {}, "t.model"); }, "rank is not a number");
  expect_input_error([] { parse_tiktoken("QQ== 0\nQQ== 1\n", {}, "t.model"); }, "same bytes");
  expect_input_error([] { parse_tiktoken("QQ== 0\nQg== 0\n", {}, "t.model"); }, "rank 0 appears twice");
  expect_input_error([] { parse_tiktoken("", {}, "t.model"); }, "no tokens");
  expect_input_error([] { parse_tiktoken("QQ== 0\n", {}, "t.model"); }, "no token for the byte 0");
}

TEST(TokenizerCallErrors, IdsOutsideTheVocabularyAndBadText) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  expect_input_error([&] { tok.decode(std::vector<int32_t>{4096}); }, "token id 4096 is outside the vocabulary");
  expect_input_error([&] { tok.decode(std::vector<int32_t>{-1}); }, "token id -1");
  expect_input_error([&] { tok.id_to_token(5000); }, "token id 5000");
  expect_input_error([&] { tok.encode("ok \xFF"); }, "not valid UTF-8 at byte offset 3");
  EXPECT_NO_THROW(tok.encode("ok \xFF", {.invalid_utf8 = InvalidUtf8::kReplace}));
}

TEST(TokenizerModelCheck, VocabularyAndSpecialIdsMustFitTheConfig) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  EXPECT_NO_THROW(check_tokenizer_matches_model(tok, 4096, 3840, {3841, 3849}));
  EXPECT_NO_THROW(check_tokenizer_matches_model(tok, 4104, -1, {}));  // a padded embedding is fine
  expect_input_error([&] { check_tokenizer_matches_model(tok, 4000, 3840, {}); }, "model's vocab_size is 4000");
  expect_input_error([&] { check_tokenizer_matches_model(tok, 4096, 128000, {}); }, "bos_token_id is 128000");
  expect_input_error([&] { check_tokenizer_matches_model(tok, 4096, 3840, {65}); }, "eos_token_id 65");
  const ByteTokenizer bytes;
  EXPECT_NO_THROW(check_tokenizer_matches_model(bytes, 264, 256, {257}));
  expect_input_error([&] { check_tokenizer_matches_model(bytes, 4096, 3840, {}); }, "bos_token_id is 3840");
}

TEST(LoadTokenizer, PicksTheFileAndRefusesADirectoryWithoutOne) {
  test::TempDir dir("loader");
  expect_input_error([&] { load_tokenizer(dir.path.string()); }, "no tokenizer in " + dir.path.string());
  test::write_file(dir.path / "config.json", R"({"llama4d_tokenizer": "bytes"})");
  EXPECT_EQ(load_tokenizer(dir.path.string())->describe(), "bytes");
  test::write_file(dir.path / "config.json", R"({"llama4d_tokenizer": "sentencepiece"})");
  expect_input_error([&] { load_tokenizer(dir.path.string()); }, "\"sentencepiece\"");
  fs::copy_file(test::project_tokenizer_path(), dir.path / "tokenizer.json");
  EXPECT_EQ(load_tokenizer(dir.path.string())->vocab_size(), 4096);
  expect_input_error([&] { load_tokenizer((dir.path / "missing").string()); }, "does not exist");
}

}  // namespace
}  // namespace llama4d
