#pragma once
// UTF-8 validation, so a corpus in the wrong encoding (Latin-1, UTF-16) is rejected with the
// place it goes wrong instead of silently training on mojibake.
#include <cstdint>
#include <string_view>

namespace llama4d {

// Byte offset of the first byte that does not start a well-formed UTF-8 sequence (RFC 3629,
// table 3-7 of the Unicode standard): no overlong forms, no UTF-16 surrogates (U+D800..DFFF),
// nothing above U+10FFFF, no truncated sequence at the end. -1 when `bytes` is all valid.
int64_t find_invalid_utf8(std::string_view bytes);

}  // namespace llama4d
