#include "core/data/chat_format.h"

#include <ctime>

#include "core/data/hash.h"
#include "core/data/utf8.h"
#include "core/error.h"

namespace llama4d {

namespace {

// Meta's chat templates, known by the FNV-1a hash (hash.h) and length of their exact text.
struct KnownTemplate {
  uint64_t hash;
  size_t length;
  const char* name;
};

// Meta-Llama-3-8B-Instruct's and -70B-Instruct's template (one line, 393 bytes); Llama 3.1
// Instruct's (4,614 bytes: "Today Date: 26 Jul 2024" unless the caller sets date_string, and
// tool-calling branches for builtin_tools, custom tools and ipython/tool messages, which
// encode_chat refuses; tests/tokenizer/llama3.1_chat_template.jinja); and Llama 3.2 Instruct's
// (data/tokenizer/chat_template.jinja, 3,827 bytes). tests/tokenizer/chat_format_test.cpp hashes
// both files, so an edit of either side fails there.
constexpr KnownTemplate kKnown[] = {
    {0x32844fd43eab01d2ull, 393, "llama3.0"},
    {0x60848a05837ce656ull, 4614, "llama3.1"},
    {0x0ac29b9538e2befaull, 3827, "llama3.2"},
};

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

int32_t special_id(const Tokenizer& tok, const char* name) {
  const std::optional<int32_t> id = tok.token_to_id(name);
  if (!id || !tok.is_special(*id))
    throw InputError("tokenizer " + tok.describe() + " has no special token " + name + ", which Llama 3's chat format needs");
  return *id;
}

// Ids of a chat in the making: control tokens by id, the text between them encoded in one piece
// (what the template's rendered string gives once its control tokens are cut out of it).
class ChatIds {
 public:
  ChatIds(const Tokenizer& tok) : tok_(tok) {}
  void special(const char* name) {
    flush();
    ids_.push_back(special_id(tok_, name));
  }
  void text(std::string_view s) { text_ += s; }
  // <|start_header_id|>role<|end_header_id|>\n\n
  void header(std::string_view role) {
    special("<|start_header_id|>");
    text(role);
    special("<|end_header_id|>");
    text("\n\n");
  }
  std::vector<int32_t> take() {
    flush();
    return std::move(ids_);
  }

 private:
  void flush() {
    if (text_.empty()) return;
    const std::vector<int32_t> ids = tok_.encode(text_);  // allow_special false: text stays text
    ids_.insert(ids_.end(), ids.begin(), ids.end());
    text_.clear();
  }
  const Tokenizer& tok_;
  std::vector<int32_t> ids_;
  std::string text_;
};

void check_role(const ChatMessage& m) {
  if (m.role == "tool" || m.role == "ipython")
    throw InputError("chat message role \"" + m.role + "\": tool calling (Llama 3.1's ipython and tool messages, "
                     "builtin_tools, custom tools) is not implemented; only system, user and assistant messages are");
  if (m.role != "system" && m.role != "user" && m.role != "assistant")
    throw InputError("chat message role \"" + m.role + "\": only system, user and assistant are supported");
  if (find_invalid_utf8(m.content) >= 0) throw InputError("a " + m.role + " chat message is not valid UTF-8");
}

}  // namespace

std::string python_strip(std::string_view text) {
  size_t begin = 0, end = text.size();
  while (begin < end) {
    size_t i = begin;
    if (!is_python_space(next_code_point(text, i))) break;
    begin = i;
  }
  // Backwards: step over continuation bytes to each character's first byte.
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    size_t i = start;
    if (!is_python_space(next_code_point(text, i))) break;
    end = start;
  }
  return std::string(text.substr(begin, end - begin));
}

ChatFormat chat_format_by_name(const std::string& name) {
  if (name == "llama3.0") return {ChatLayout::kLlama3_0, name, ""};
  if (name == "llama3.1") return {ChatLayout::kLlama3_1, name, "26 Jul 2024"};
  if (name == "llama3.2") return {ChatLayout::kLlama3_1, name, ""};
  throw InputError("chat format \"" + name + "\": known formats are llama3.0, llama3.1 (also 3.3) and llama3.2");
}

ChatFormat recognise_chat_template(std::string_view chat_template, const std::string& source) {
  const uint64_t h = hash_bytes(chat_template);
  for (const KnownTemplate& k : kKnown)
    if (k.hash == h && k.length == chat_template.size()) return chat_format_by_name(k.name);
  const std::string first_line(chat_template.substr(0, std::min(chat_template.find('\n'), size_t(60))));
  throw InputError(source + ": chat_template (" + std::to_string(chat_template.size()) + " bytes, starting \"" +
                   first_line + "\") is not one of Meta's Llama 3 templates this build renders (llama3.0, llama3.1, llama3.2); "
                   "pass --chat-format llama3.0|llama3.1|llama3.2 to use one of those layouts instead");
}

std::string chat_today() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  std::strftime(buf, sizeof buf, "%d %b %Y", &local);
  return buf;
}

std::vector<int32_t> encode_chat(const Tokenizer& tok, const ChatFormat& format, const std::vector<ChatMessage>& messages,
                                 const ChatEncodeOptions& opt) {
  for (const ChatMessage& m : messages) check_role(m);
  ChatIds out(tok);
  size_t first = 0;
  if (format.layout == ChatLayout::kLlama3_0) {
    if (!messages.empty()) out.special("<|begin_of_text|>");
  } else {
    out.special("<|begin_of_text|>");
    const std::string date = !opt.date.empty() ? opt.date : !format.default_date.empty() ? format.default_date : chat_today();
    out.header("system");
    out.text("Cutting Knowledge Date: December 2023\nToday Date: " + date + "\n\n");
    if (!messages.empty() && messages[0].role == "system") {
      out.text(python_strip(messages[0].content));
      first = 1;
    }
    out.special("<|eot_id|>");
  }
  for (size_t i = first; i < messages.size(); ++i) {
    out.header(messages[i].role);
    out.text(python_strip(messages[i].content));
    out.special("<|eot_id|>");
  }
  if (opt.add_generation_prompt) out.header("assistant");
  return out.take();
}

}  // namespace llama4d
