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

namespace llama4d {

namespace {

// Lead byte -> length of its sequence and the allowed range of the second byte (0 = not a
// lead byte). The same table as find_invalid_utf8's branches.
struct Lead {
  int len;
  unsigned char lo, hi;
};

Lead lead_of(unsigned char b0) {
  if (b0 < 0x80) return {1, 0, 0};
  if (b0 >= 0xC2 && b0 <= 0xDF) return {2, 0x80, 0xBF};
  if (b0 == 0xE0) return {3, 0xA0, 0xBF};
  if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) return {3, 0x80, 0xBF};
  if (b0 == 0xED) return {3, 0x80, 0x9F};
  if (b0 == 0xF0) return {4, 0x90, 0xBF};
  if (b0 >= 0xF1 && b0 <= 0xF3) return {4, 0x80, 0xBF};
  if (b0 == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

std::string replace_invalid_utf8(std::string_view bytes, bool hold_tail, size_t* consumed) {
  std::string out;
  out.reserve(bytes.size());
  const size_t n = bytes.size();
  auto at = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  size_t i = 0;
  while (i < n) {
    const Lead lead = lead_of(at(i));
    if (lead.len == 1) {
      out.push_back(bytes[i++]);
      continue;
    }
    if (lead.len == 0) {  // a byte no sequence starts with: a subpart of its own
      out += kReplacement;
      ++i;
      continue;
    }
    size_t k = 1;  // bytes of the sequence seen to be well formed so far
    while (k < size_t(lead.len) && i + k < n) {
      const unsigned char b = at(i + k);
      const bool ok = k == 1 ? (b >= lead.lo && b <= lead.hi) : (b >= 0x80 && b <= 0xBF);
      if (!ok) break;
      ++k;
    }
    if (k == size_t(lead.len)) {
      out.append(bytes.substr(i, k));
    } else if (i + k == n && hold_tail) {
      break;  // cut short by the end: more bytes may complete it
    } else {
      out += kReplacement;  // the maximal subpart bytes[i, i + k)
    }
    i += k;
  }
  if (consumed) *consumed = i;
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t next_code_point(std::string_view text, size_t& i) {
  const unsigned char b0 = static_cast<unsigned char>(text[i]);
  const int len = lead_of(b0).len;
  char32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + size_t(k)]) & 0x3F);
  i += size_t(len < 1 ? 1 : len);
  return cp;
}

}  // namespace llama4d
