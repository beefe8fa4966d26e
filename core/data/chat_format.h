#pragma once
// Llama 3's instruct (chat) format, as token ids:
//
//   <|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nSYSTEM<|eot_id|>
//   <|start_header_id|>user<|end_header_id|>\n\nUSER<|eot_id|>
//   <|start_header_id|>assistant<|end_header_id|>\n\n          (the generation prompt)
//
// A model directory states its format as a Jinja template (tokenizer_config.json's
// "chat_template"), which Hugging Face renders with a Python Jinja engine. There is no
// maintained C++ Jinja engine in Debian, and a partial one would render some templates wrongly
// without saying so; instead the templates Meta shipped are recognised by their exact text and
// their output is written here, and any other template is refused (InputError naming it).
// tests/transformers holds the ids equal to transformers' apply_chat_template.
//
// The two layouts Meta's templates produce for plain system / user / assistant messages:
//   kLlama3_0 (Meta-Llama-3-*-Instruct): <|begin_of_text|> before the first message; each
//     message's header and its content with surrounding whitespace trimmed (Jinja's `trim`,
//     Python's str.strip()), then <|eot_id|>. A system message is an ordinary message.
//   kLlama3_1 (Llama 3.1, 3.2, 3.3 Instruct): <|begin_of_text|>, then always a system header
//     whose content is "Cutting Knowledge Date: December 2023\nToday Date: <date>\n\n" followed
//     by the first message's trimmed content when that message is the system's; then each other
//     message as kLlama3_0 does.
// Both end with the generation prompt when asked.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/tokenizer.h"

namespace llama4d {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

enum class ChatLayout { kLlama3_0, kLlama3_1 };

struct ChatFormat {
  ChatLayout layout = ChatLayout::kLlama3_1;
  std::string name;  // "llama3.0", "llama3.1", "llama3.2", for messages and --json
  // kLlama3_1's "Today Date:" when none is given to encode_chat: Llama 3.1's and 3.3's templates
  // say "26 Jul 2024"; Llama 3.2's ask the renderer for today's date (transformers'
  // strftime_now("%d %b %Y")), marked by an empty string here.
  std::string default_date;
};

// The format of a chat_template's text: one of Meta's templates (exact text), else
// InputError naming `source`, the template's first line and its length.
ChatFormat recognise_chat_template(std::string_view chat_template, const std::string& source);

// A format by name: "llama3.0", "llama3.1" (also 3.3) or "llama3.2"; InputError otherwise.
ChatFormat chat_format_by_name(const std::string& name);

// Today's date as Llama 3.2's template writes it ("02 Dec 2026"), in local time as transformers'
// strftime_now.
std::string chat_today();

struct ChatEncodeOptions {
  bool add_generation_prompt = true;
  std::string date;  // kLlama3_1's date; empty: the format's default_date, else chat_today()
};

// The ids of `messages` in `format`. The header and end tokens are looked up by name in `tok`
// (InputError if it lacks one); each stretch of text between them is encoded as ordinary text
// (EncodeOptions::allow_special false), so a message cannot inject a control token. For text
// without special-token names this is exactly what rendering the template and encoding the
// result gives. InputError for a role other than system, user or assistant.
std::vector<int32_t> encode_chat(const Tokenizer& tok, const ChatFormat& format, const std::vector<ChatMessage>& messages,
                                 const ChatEncodeOptions& opt = {});

// Python's str.strip(): `text` without leading and trailing Unicode whitespace (the characters
// Python's str.isspace() accepts). `text` must be valid UTF-8.
std::string python_strip(std::string_view text);

}  // namespace llama4d
