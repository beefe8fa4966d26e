#pragma once
// UTF-8 validation, so a corpus in the wrong encoding (Latin-1, UTF-16) is rejected with the
// place it goes wrong instead of silently training on mojibake.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace llama4d {

// Byte offset of the first byte that does not start a well-formed UTF-8 sequence (RFC 3629,
// table 3-7 of the Unicode standard): no overlong forms, no UTF-16 surrogates (U+D800..DFFF),
// nothing above U+10FFFF, no truncated sequence at the end. -1 when `bytes` is all valid.
int64_t find_invalid_utf8(std::string_view bytes);

// `bytes` with each ill-formed part replaced by U+FFFD, one per "maximal subpart" (Unicode
// 15, section 3.9, "U+FFFD Substitution of Maximal Subparts"): a lead byte with the valid
// continuation bytes that follow it until the first byte that cannot continue it. This is what
// Python's bytes.decode("utf-8", "replace") and Rust's String::from_utf8_lossy produce, so text
// cleaned here is the str Hugging Face's tokenizers would have been given. Valid input is
// returned unchanged.
//
// With `hold_tail`, a last sequence that is cut short but could still be completed by more bytes
// is left out instead of replaced, and *consumed (when given) says how many bytes were used: the
// streaming decoder's way to hold back half a character until its other bytes arrive.
std::string replace_invalid_utf8(std::string_view bytes, bool hold_tail = false, size_t* consumed = nullptr);

// Appends the UTF-8 encoding of code point `cp` (at most U+10FFFF, not a surrogate).
void append_utf8(std::string& out, char32_t cp);

// The code point starting at text[i], advancing i past it. `text` must be valid UTF-8 there.
char32_t next_code_point(std::string_view text, size_t& i);

}  // namespace llama4d
