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

// Llama 3.1 Instruct's tokenizer_config.json chat_template (Meta's text, kept as a test file):
// recognised as llama3.1 with its fixed "26 Jul 2024". The prompt it renders for a system and a
// user message without tools, read off the template by hand: the system header, "Cutting
// Knowledge Date: December 2023\nToday Date: " + date_string + "\n\n", the system message
// trimmed, <|eot_id|>; the user's header, content trimmed, <|eot_id|>; the generation prompt.
TEST(ChatFormat, RecognisesLlama31sTemplateAndRendersItsNonToolPath) {
  const std::string t = test::read_file(std::string(LLAMA4D_SOURCE_DIR) + "/tests/tokenizer/llama3.1_chat_template.jinja");
  ASSERT_EQ(t.size(), 4614u);
  const ChatFormat f = recognise_chat_template(t, "cfg");
  EXPECT_EQ(f.name, "llama3.1");
  EXPECT_EQ(f.default_date, "26 Jul 2024");
  std::string edited = t;
  edited.replace(edited.find("26 Jul 2024"), 11, "25 Jul 2024");
  expect_chat_error([&] { recognise_chat_template(edited, "y/tokenizer_config.json"); }, "(llama3.0, llama3.1, llama3.2)");

  const std::unique_ptr<Tokenizer> tok = load_tokenizer(std::string(LLAMA4D_SOURCE_DIR) + "/data/tokenizer");
  const std::string rendered =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
      "Today Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is a "
      "tensor?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(encode_chat(*tok, f, {{"system", " Be brief.\n"}, {"user", "What is a tensor? "}}),
            tok->encode(rendered, {.allow_special = true}));
  // Tool use (the template's ipython and tool messages) is refused by name, never rendered as text.
  for (const char* role : {"ipython", "tool"})
    expect_chat_error([&] { encode_chat(*tok, f, {{"user", "x"}, {role, "{}"}}); }, "tool calling");
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
