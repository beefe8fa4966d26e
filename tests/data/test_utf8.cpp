// UTF-8 validation against hand-picked cases and a reference decoder written here that works by
// computing code points (the validator under test works by byte ranges instead).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/data/utf8.h"

namespace llama4d {
namespace {

// Offset of the first invalid sequence, by decoding: length from the lead byte's high bits,
// continuation bytes 10xxxxxx, then reject overlong, surrogate and > U+10FFFF code points.
int64_t reference_first_invalid(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    int len;
    uint32_t cp;
    if (b0 < 0x80) {
      len = 1, cp = b0;
    } else if ((b0 & 0xE0) == 0xC0) {
      len = 2, cp = b0 & 0x1F;
    } else if ((b0 & 0xF0) == 0xE0) {
      len = 3, cp = b0 & 0x0F;
    } else if ((b0 & 0xF8) == 0xF0) {
      len = 4, cp = b0 & 0x07;
    } else {
      return int64_t(i);
    }
    if (i + size_t(len) > s.size()) return int64_t(i);
    for (int k = 1; k < len; ++k) {
      const auto bk = static_cast<unsigned char>(s[i + size_t(k)]);
      if ((bk & 0xC0) != 0x80) return int64_t(i);
      cp = (cp << 6) | (bk & 0x3F);
    }
    const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return int64_t(i);
    i += size_t(len);
  }
  return -1;
}

TEST(Utf8, HandPickedCases) {
  struct Case {
    std::string bytes;
    int64_t expected;
  };
  const Case cases[] = {
      {"", -1},
      {"plain ASCII", -1},
      {"caf\xC3\xA9", -1},                 // é
      {"\xE2\x82\xAC", -1},                // €
      {"\xF0\x9F\x98\x80", -1},            // U+1F600
      {"\xEF\xBF\xBF", -1},                // U+FFFF
      {"\xF4\x8F\xBF\xBF", -1},            // U+10FFFF, the last code point
      {"abc\xFF", 3},                      // never valid
      {"\x80", 0},                         // stray continuation byte
      {"\xC0\xAF", 0},                     // overlong '/'
      {"a\xE0\x80\xAF", 1},                // overlong, 3 bytes
      {"\xED\xA0\x80", 0},                 // UTF-16 surrogate U+D800
      {"\xF4\x90\x80\x80", 0},             // U+110000
      {"ok\xE2\x82", 2},                   // truncated at the end
      {"\xC3\xA9\xC3(", 2},                // lead byte followed by ASCII
      {"latin-1 caf\xE9 au lait", 11},     // the classic wrong-encoding file
  };
  for (const Case& c : cases) {
    EXPECT_EQ(find_invalid_utf8(c.bytes), c.expected) << "case with " << c.bytes.size() << " bytes";
    EXPECT_EQ(reference_first_invalid(c.bytes), c.expected) << "reference disagrees with the table";
  }
}

TEST(Utf8, AllTwoByteStringsMatchTheReference) {
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      const std::string s = {static_cast<char>(a), static_cast<char>(b)};
      ASSERT_EQ(find_invalid_utf8(s), reference_first_invalid(s)) << std::hex << a << " " << b;
    }
  }
}

TEST(Utf8, RandomLongerStringsMatchTheReference) {
  // Biased towards bytes >= 0x80 so multi-byte sequences (valid and not) are common.
  uint64_t state = 2024;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<unsigned>(state >> 56);
  };
  for (int trial = 0; trial < 100000; ++trial) {
    std::string s;
    const unsigned len = 1 + next() % 6;
    for (unsigned i = 0; i < len; ++i) {
      const unsigned r = next();
      s.push_back(static_cast<char>(r < 64 ? r : 0x80 | (r & 0x7F)));
    }
    ASSERT_EQ(find_invalid_utf8(s), reference_first_invalid(s)) << "trial " << trial;
  }
}

TEST(Utf8, EveryCodePointEncodedByHandIsValid) {
  // Step through the code space (every 7th point plus the edges) and encode by the formula.
  for (uint32_t cp = 0; cp <= 0x10FFFF; cp += (cp < 0x1000 ? 1 : 7)) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    if (cp < 0x80) {
      s += char(cp);
    } else if (cp < 0x800) {
      s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += char(0xE0 | (cp >> 12)), s += char(0x80 | ((cp >> 6) & 0x3F)), s += char(0x80 | (cp & 0x3F));
    } else {
      s += char(0xF0 | (cp >> 18)), s += char(0x80 | ((cp >> 12) & 0x3F));
      s += char(0x80 | ((cp >> 6) & 0x3F)), s += char(0x80 | (cp & 0x3F));
    }
    ASSERT_EQ(find_invalid_utf8(s), -1) << std::hex << "U+" << cp;
  }
}

}  // namespace
}  // namespace llama4d
