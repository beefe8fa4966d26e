#pragma once
// GPT-2's byte-level alphabet, which Llama 3's tokenizer.json uses for its vocabulary and merges:
// every byte 0..255 stands for one printable Unicode character, so a vocabulary of arbitrary byte
// strings can be written as JSON text. Printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC,
// U+00AE..U+00FF) stand for themselves; the other 68 (controls, space, U+00A0, U+00AD) take
// U+0100, U+0101, ... in byte order, so a space is U+0120 'Ġ' and a newline U+010A 'Ċ'.
//
// The tokenizer works on bytes internally; this table is only the codec between tokenizer.json's
// spelling of a token and the token's bytes.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace llama4d {

// The character that stands for `byte`.
char32_t byte_level_char(uint8_t byte);

// The byte a character stands for, or nullopt for a character outside the alphabet.
std::optional<uint8_t> byte_level_byte(char32_t c);

// `bytes` spelled in the alphabet (UTF-8 of the 256 characters).
std::string to_byte_level(std::string_view bytes);

// The bytes a byte-level spelling stands for; nullopt when `text` is not valid UTF-8 or holds a
// character outside the alphabet (a token that byte-level pre-tokenization can never produce).
std::optional<std::string> from_byte_level(std::string_view text);

}  // namespace llama4d
