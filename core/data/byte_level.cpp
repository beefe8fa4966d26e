#include "core/data/byte_level.h"

#include <array>

#include "core/data/utf8.h"

namespace llama4d {

namespace {

// Built once: the forward table and its inverse over the first 512 code points (every
// character of the alphabet is below U+0144).
struct Tables {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 512> to_byte{};
  Tables() {
    to_byte.fill(-1);
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      to_char[size_t(b)] = printable(b) ? char32_t(b) : next++;
      to_byte[size_t(to_char[size_t(b)])] = int16_t(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_level_char(uint8_t byte) { return tables().to_char[byte]; }

std::optional<uint8_t> byte_level_byte(char32_t c) {
  if (c >= 512 || tables().to_byte[c] < 0) return std::nullopt;
  return uint8_t(tables().to_byte[c]);
}

std::string to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) append_utf8(out, byte_level_char(static_cast<uint8_t>(b)));
  return out;
}

std::optional<std::string> from_byte_level(std::string_view text) {
  if (find_invalid_utf8(text) >= 0) return std::nullopt;
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const std::optional<uint8_t> b = byte_level_byte(next_code_point(text, i));
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
  }
  return out;
}

}  // namespace llama4d
