#include "core/data/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace llama4d {

namespace {

// Oniguruma's \s in Unicode mode: \t \n \v \f \r, NEL, and the separators Zs, Zl, Zp.
constexpr std::string_view kSpaceItems = R"(\t-\r\x{85}\p{Z})";

}  // namespace

std::string oniguruma_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;  // inside [...]; PCRE2 classes do not nest (POSIX [:name:] aside)
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      switch (e) {
        case 's':
          if (in_class) {
            out += kSpaceItems;
          } else {
            out += '[';
            out += kSpaceItems;
            out += ']';
          }
          break;
        case 'S':
          if (in_class)
            throw InputError("pre-tokenizer pattern: \\S inside a bracket class is not supported (pattern " +
                             std::string(p) + ")");
          out += "[^";
          out += kSpaceItems;
          out += ']';
          break;
        case 'w': case 'W': case 'b': case 'B': case 'h': case 'H':
          throw InputError(std::string("pre-tokenizer pattern: \\") + e +
                           " means different characters in Oniguruma (Hugging Face's engine) and PCRE2; "
                           "not supported (pattern " + std::string(p) + ")");
        default:
          out += '\\';
          out += e;
      }
      continue;
    }
    if (in_class) {
      if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:] inside a class
        const size_t end = p.find(":]", i + 2);
        if (end == std::string_view::npos) throw InputError("pre-tokenizer pattern: unclosed [: in " + std::string(p));
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
      if (c == '[') throw InputError("pre-tokenizer pattern: nested bracket class not supported (pattern " + std::string(p) + ")");
      if (c == ']') in_class = false;
      out += c;
      continue;
    }
    out += c;
    if (c == '[') {
      in_class = true;
      // A ']' first in the class (after an optional '^') is a literal, as in both engines.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
    }
  }
  return out;
}

struct RegexSplitter::Impl {
  std::string pattern;
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

namespace {

// Per-thread match state: PCRE2's match data and a JIT stack larger than the 32 KiB default,
// created on a thread's first split and freed when the thread ends. Matching never needs more
// than the whole match's offsets.
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (context && stack) pcre2_jit_stack_assign(context, nullptr, stack);
    if (!data || !context) throw Error("PCRE2: out of memory creating match data");
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  ThreadMatchState(const ThreadMatchState&) = delete;
  ThreadMatchState& operator=(const ThreadMatchState&) = delete;
};

ThreadMatchState& match_state() {
  thread_local ThreadMatchState state;
  return state;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

RegexSplitter::RegexSplitter(std::string_view pattern) {
  auto impl = std::make_shared<Impl>();
  impl->pattern = std::string(pattern);
  const std::string translated = oniguruma_to_pcre2(pattern);
  int err = 0;
  PCRE2_SIZE err_at = 0;
  // UTF: the subject is UTF-8 and a character is one unit. UCP: \d, \s and [[:alpha:]] follow
  // Unicode properties, and caseless matching uses Unicode case folding ('s' also matches 'ſ',
  // U+017F, as in Oniguruma).
  impl->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                             PCRE2_UTF | PCRE2_UCP, &err, &err_at, nullptr);
  if (!impl->code)
    throw InputError("pre-tokenizer pattern does not compile (" + pcre2_message(err) + " at offset " +
                     std::to_string(err_at) + "): " + std::string(pattern));
  // No JIT for this CPU (or a PCRE2 built without one) is not an error: pcre2_match interprets.
  (void)pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE);
  impl_ = std::move(impl);
}

const std::string& RegexSplitter::pattern() const { return impl_->pattern; }

void RegexSplitter::split(std::string_view text, std::vector<std::pair<size_t, size_t>>& pieces) const {
  ThreadMatchState& st = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0, gap = 0;  // next search start; start of the text not yet in a piece
  while (at < text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), at, PCRE2_NO_UTF_CHECK, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw Error("pre-tokenizer: PCRE2 match failed (" + pcre2_message(rc) + ") on " +
                            std::to_string(text.size()) + " bytes with pattern " + impl_->pattern);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t begin = ov[0], end = ov[1];
    if (end == begin) {  // an empty match: no piece; search again one character on
      at = begin + 1;
      while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
      continue;
    }
    if (begin > gap) pieces.emplace_back(gap, begin);
    pieces.emplace_back(begin, end);
    gap = at = end;
  }
  if (gap < text.size()) pieces.emplace_back(gap, text.size());
}

}  // namespace llama4d
