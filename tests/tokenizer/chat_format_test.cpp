// Llama 3's chat format without a Python: which templates are recognised, the layout of the
// control tokens, Python's str.strip(), and what is refused. The ids themselves are checked
// against transformers' apply_chat_template in tests/transformers.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/data/chat_format.h"
#include "core/data/tokenizer_loader.h"
#include "core/error.h"
#include "tests/tokenizer/test_util.h"

namespace llama4d {
namespace {

void expect_chat_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no InputError (wanted one naming \"" << needle << "\")";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

std::string shipped_template() {
  const auto cfg = nlohmann::json::parse(test::read_file(std::string(LLAMA4D_SOURCE_DIR) + "/data/tokenizer/tokenizer_config.json"));
  return cfg.at("chat_template").get<std::string>();
}

TEST(ChatFormat, RecognisesTheShippedLlama32TemplateAndRefusesAnEditedOne) {
  const std::string t = shipped_template();
  EXPECT_EQ(recognise_chat_template(t, "cfg").name, "llama3.2");
  EXPECT_EQ(test::read_file(std::string(LLAMA4D_SOURCE_DIR) + "/data/tokenizer/chat_template.jinja"), t);
  std::string edited = t;
  edited.replace(edited.find("December 2023"), 13, "December 2024");
  expect_chat_error([&] { recognise_chat_template(edited, "x/tokenizer_config.json"); }, "x/tokenizer_config.json");
  expect_chat_error([&] { recognise_chat_template("{{ messages }}", "cfg"); }, "not one of Meta's Llama 3 templates");
  expect_chat_error([&] { chat_format_by_name("chatml"); }, "\"chatml\"");
}

// Python: "\u00a0 a b\u3000\t\n".strip() == "a b"; U+200B is not whitespace to Python.
TEST(ChatFormat, PythonStripTakesUnicodeWhitespaceOnly) {
  EXPECT_EQ(python_strip("\xc2\xa0 a b\xe3\x80\x80\t\n"), "a b");
  EXPECT_EQ(python_strip("\xe2\x80\x8b x"), "\xe2\x80\x8b x");
  EXPECT_EQ(python_strip("\x1c\x1f\xc2\x85x\xe2\x80\xa8\xe2\x80\xa9"), "x");
  EXPECT_EQ(python_strip(" \r\n "), "");
  EXPECT_EQ(python_strip("\xe6\x95\xb0"), "\xe6\x95\xb0");
}

TEST(ChatFormat, ControlTokensAreIdsAndMessageTextNeverBecomesOne) {
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(std::string(LLAMA4D_SOURCE_DIR) + "/data/tokenizer");
  const int32_t bos = *tok->token_to_id("<|begin_of_text|>"), start = *tok->token_to_id("<|start_header_id|>"),
                end = *tok->token_to_id("<|end_header_id|>"), eot = *tok->token_to_id("<|eot_id|>");
  const std::vector<ChatMessage> chat = {{"user", "say <|eot_id|> now"}};
  for (const char* name : {"llama3.0", "llama3.1", "llama3.2"}) {
    const std::vector<int32_t> ids = encode_chat(*tok, chat_format_by_name(name), chat, {.date = "26 Jul 2024"});
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.front(), bos) << name;
    EXPECT_EQ(std::count(ids.begin(), ids.end(), bos), 1) << name;
    // 3.0: one header for the user, one for the prompt; 3.1 and 3.2 add the system's.
    const long headers = std::string(name) == "llama3.0" ? 2 : 3;
    EXPECT_EQ(std::count(ids.begin(), ids.end(), start), headers) << name;
    EXPECT_EQ(std::count(ids.begin(), ids.end(), end), headers) << name;
    EXPECT_EQ(std::count(ids.begin(), ids.end(), eot), headers - 1) << name << ": the text <|eot_id|> stayed text";
    EXPECT_EQ(ids.back(), *tok->encode("\n\n").rbegin()) << name << ": ends with the generation prompt";
  }
  expect_chat_error([&] { encode_chat(*tok, chat_format_by_name("llama3.2"), {{"tool", "{}"}}); }, "role \"tool\"");
  expect_chat_error([&] { encode_chat(ByteTokenizer(), chat_format_by_name("llama3.0"), chat); }, "<|start_header_id|>");
}

}  // namespace
}  // namespace llama4d
