#include "core/data/utf8.h"

namespace llama4d {

int64_t find_invalid_utf8(std::string_view bytes) {
  const int64_t n = int64_t(bytes.size());
  auto at = [&](int64_t i) { return static_cast<unsigned char>(bytes[size_t(i)]); };
  int64_t i = 0;
  while (i < n) {
    const unsigned char b0 = at(i);
    if (b0 < 0x80) {  // ASCII: the common case
      ++i;
      continue;
    }
    // Lead byte -> sequence length and the allowed range of the SECOND byte. Narrowing the
    // second byte's range is what excludes overlongs (E0, F0), surrogates (ED) and values
    // above U+10FFFF (F4); every later continuation byte is plain 80..BF.
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      len = 2;
    } else if (b0 == 0xE0) {
      len = 3, lo = 0xA0;
    } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
      len = 3;
    } else if (b0 == 0xED) {
      len = 3, hi = 0x9F;
    } else if (b0 == 0xF0) {
      len = 4, lo = 0x90;
    } else if (b0 >= 0xF1 && b0 <= 0xF3) {
      len = 4;
    } else if (b0 == 0xF4) {
      len = 4, hi = 0x8F;
    } else {
      return i;  // 80..C1 (stray continuation or overlong 2-byte lead) or F5..FF
    }
    if (i + len > n) return i;  // truncated at the end of the text
    const unsigned char b1 = at(i + 1);
    if (b1 < lo || b1 > hi) return i;
    for (int k = 2; k < len; ++k) {
      const unsigned char bk = at(i + k);
      if (bk < 0x80 || bk > 0xBF) return i;
    }
    i += len;
  }
  return -1;
}

}  // namespace llama4d
