#pragma once
// Pre-tokenization: cutting text into the pieces BPE merges within, with a regular expression
// as Hugging Face's `Split` pre-tokenizer does (behavior "Isolated": every match is a piece, and
// so is any text between two matches).
//
// Why PCRE2: Llama 3's pattern needs Unicode properties (\p{L}, \p{N}) and a negative lookahead
// (`\s+(?!\S)`, which leaves the last space of a run to the next word). RE2 and std::regex have
// no lookahead (std::regex has no \p{..} either); PCRE2 has both, a JIT compiler that makes
// this the fast part of encoding, and it is a Debian package (libpcre2-dev).
//
// Hugging Face compiles the pattern with Oniguruma, whose \s is not PCRE2's: Oniguruma's takes
// U+0085 (NEL) and every Z (separator) character besides \t..\r; PCRE2's, even in UCP mode,
// leaves out U+0085. So the pattern is rewritten before PCRE2 compiles it: \s becomes that
// exact class. \w, \W, \b, \B, \h and \H (whose sets also differ between the two engines) and
// \S inside a bracket class are refused rather than guessed.
//
// Unicode version: PCRE2's property tables are its own (Debian bookworm's 10.42: Unicode
// 14.0), Oniguruma's too. A character assigned in a later Unicode version than PCRE2's is not a
// letter here (it is for Hugging Face if Oniguruma knows it), so such text can split differently.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace llama4d {

// Llama 3's pre-tokenization pattern, as in Meta's tokenizer.py (`pat_str`) and the Split of
// its tokenizer.json.
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's, which a ByteLevel pre-tokenizer with use_regex=true applies.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The PCRE2 pattern that matches what `oniguruma_pattern` matches under Oniguruma (above);
// InputError naming the construct for one it cannot translate.
std::string oniguruma_to_pcre2(std::string_view oniguruma_pattern);

// A compiled pattern. Copies share the compiled code; split() may run on many threads at once.
class RegexSplitter {
 public:
  // Compiles `pattern` (Oniguruma syntax, as tokenizer.json holds it) in UTF + UCP mode and
  // JIT-compiles it where PCRE2 has a JIT for this machine. InputError naming the pattern and
  // PCRE2's message when it does not compile.
  explicit RegexSplitter(std::string_view pattern);

  // Appends to `pieces` the [begin, end) byte ranges of text's pieces, in order, covering all of
  // `text`; no piece is empty. `text` must be valid UTF-8 (the caller checks: PCRE2 is told
  // not to). An empty match is not a piece (Hugging Face drops empty pieces too).
  void split(std::string_view text, std::vector<std::pair<size_t, size_t>>& pieces) const;

  const std::string& pattern() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace llama4d
