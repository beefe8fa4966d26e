// Fine-tuning data as .jsonl (tokenized_corpus.h): "text" lines give the ids of the same
// documents given as .txt files; "messages" lines give the ids of Llama 3's chat format written
// out by hand as text with its special-token names (encoded with allow_special, a path that
// does not go through encode_chat); bad lines are refused naming file:line.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>

#include "core/data/bpe_tokenizer.h"
#include "core/data/chat_format.h"
#include "core/data/tokenized_corpus.h"
#include "core/error.h"
#include "tests/tokenizer/test_util.h"

namespace llama4d {
namespace {

namespace fs = std::filesystem;

std::string write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// `a`, <|end_of_text|>, `b`: the packing of two documents.
std::vector<int32_t> packed(std::vector<int32_t> a, const std::vector<int32_t>& b, int32_t eot) {
  a.push_back(eot);
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(JsonlCorpus, TextLinesAreTheSameIdsAsTheSameDocumentsAsTxtFiles) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  test::TempDir dir("jsonl_text");
  const std::string a = "Tensor parallelism splits each matrix.", b = "Pipeline parallelism\nsplits the layers. \"Quoted\"";
  const std::string jsonl =
      write(dir.path / "d.jsonl", R"({"text": "Tensor parallelism splits each matrix."})"
                                  "\n\n" R"({"text": "Pipeline parallelism\nsplits the layers. \"Quoted\""})" "\n");
  fs::create_directories(dir.path / "txt");
  write(dir.path / "txt" / "a.txt", a);
  write(dir.path / "txt" / "b.txt", b);
  const std::vector<int32_t> from_txt = tokenize_corpus(tok, (dir.path / "txt").string(), 1);
  EXPECT_EQ(tokenize_corpus(tok, jsonl, 2), from_txt);
  EXPECT_EQ(from_txt, packed(tok.encode(a), tok.encode(b), end_of_text_id(tok)));
  // A directory mixing the two: a.txt, then b.jsonl's one line, in the order of the names.
  fs::create_directories(dir.path / "mixed");
  write(dir.path / "mixed" / "a.txt", a);
  write(dir.path / "mixed" / "b.jsonl", R"({"text": "Pipeline parallelism\nsplits the layers. \"Quoted\""})" "\n");
  EXPECT_EQ(tokenize_corpus(tok, (dir.path / "mixed").string(), 2), from_txt);
}

TEST(JsonlCorpus, MessagesLinesAreLlama3sChatFormat) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  test::TempDir dir("jsonl_chat");
  const std::string jsonl = write(
      dir.path / "c.jsonl",
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is tp?"}, {"role": "assistant", "content": "Split matrices."}]})"
      "\n" R"({"text": "Plain text <|eot_id|> stays text."})" "\n");
  // Llama 3.1's layout with the fixed training date, written out from the template's text.
  const std::string chat =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
      "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWhat is tp?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nSplit matrices.<|eot_id|>";
  const std::vector<int32_t> want_chat = tok.encode(chat, {.allow_special = true});
  const std::vector<int32_t> want_text = tok.encode("Plain text <|eot_id|> stays text.");
  const std::vector<int32_t> want = packed(want_chat, want_text, end_of_text_id(tok));
  EXPECT_EQ(tokenize_corpus(tok, jsonl, 2, {}, chat_format_by_name("llama3.1")), want);
  // Llama 3.2's format asks for today's date; training data gets the fixed one, the same ids.
  EXPECT_EQ(tokenize_corpus(tok, jsonl, 1, {}, chat_format_by_name("llama3.2")), want);
  // The special-token names in the text line stayed ordinary text (no <|eot_id|> id in it).
  const int32_t eot_id = *tok.token_to_id("<|eot_id|>");
  EXPECT_EQ(std::count(want_text.begin(), want_text.end(), eot_id), 0);
  EXPECT_EQ(std::count(want_chat.begin(), want_chat.end(), eot_id), 3);
}

void expect_refused(const std::function<void()>& f, const std::string& where, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected " << what;
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(where), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  }
}

TEST(JsonlCorpus, BadLinesAreRefusedNamingFileAndLine) {
  const BpeTokenizer tok = load_tokenizer_json(test::project_tokenizer_path());
  const ByteTokenizer bytes;
  test::TempDir dir("jsonl_bad");
  const std::string good = R"({"text": "fine"})" "\n";
  const ChatFormat f = chat_format_by_name("llama3.1");
  const std::pair<std::string, std::string> cases[] = {
      {"{\"text\": \"unterminated}", "invalid JSON"},
      {"[1, 2]", "not a JSON object"},
      {R"({"txt": "typo"})", "neither"},
      {R"({"text": "a", "messages": []})", "both"},
      {R"({"text": 3})", "\"text\" is not a string"},
      {R"({"messages": []})", "empty list"},
      {R"({"messages": "hi"})", "not a list"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})", "unknown role \"tool\""},
      {R"({"messages": [{"role": "user", "content": 5}]})", "no string \"content\""},
      {R"({"messages": [{"content": "x"}]})", "no string \"role\""},
  };
  int i = 0;
  for (const auto& [line, what] : cases) {
    const std::string p = write(dir.path / ("bad" + std::to_string(i++) + ".jsonl"), good + good + line + "\n");
    expect_refused([&] { tokenize_corpus(tok, p, 1, {}, f); }, p + ":3", what);
  }
  // A chat needs special tokens: refused for the byte tokenizer and without a chat format.
  const std::string chat = write(dir.path / "chat.jsonl", good + R"({"messages": [{"role": "user", "content": "x"}]})" "\n");
  expect_refused([&] { tokenize_corpus(bytes, chat, 1); }, chat + ":2", "byte tokenizer");
  expect_refused([&] { tokenize_corpus(tok, chat, 1); }, chat + ":2", "needs a chat format");
  // Text lines are fine for the byte tokenizer: the bytes of each, packed.
  const std::string text = write(dir.path / "text.jsonl", good + R"({"text": "ok"})" "\n");
  EXPECT_EQ(tokenize_corpus(bytes, text, 1), packed({'f', 'i', 'n', 'e'}, {'o', 'k'}, kEndOfTextToken));
}

}  // namespace
}  // namespace llama4d
