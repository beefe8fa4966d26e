#pragma once
// The one rule for a number a person writes: a flag's value, a --mesh size, an item of a list
// such as --pp-layers 1,2,2,1 or --costs 1,1,1.
//   - decimal, as written: an optional '-' and the digits 0-9 ("010" is ten, never octal; no '+',
//     spaces, hex, or "true");
//   - for a real number also a fraction and an exponent ("0.5", ".5", "3e-4", "15.6e12"), and
//     finite: no nan, inf, or a value beyond a double's range;
//   - within the type (an int, an int64_t, a uint64_t: never clamped or wrapped) and within the
//     caller's [lo, hi];
//   - not empty.
// Anything else is an InputError naming what was read and the text as it was written.
#include <charconv>
#include <cmath>
#include <concepts>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "core/error.h"

namespace llama4d {

namespace number_detail {

inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Digits from `at`: where they end.
inline size_t skip_digits(std::string_view s, size_t at) {
  while (at < s.size() && is_digit(s[at])) ++at;
  return at;
}

// Whether all of `s` is -?D+ (integers) or -?(D+(.D*)?|.D+)([eE][+-]?D+)? (reals).
inline bool well_formed(std::string_view s, bool real) {
  size_t at = (!s.empty() && s[0] == '-') ? 1 : 0;
  const size_t int_end = skip_digits(s, at);
  bool digits = int_end > at;
  at = int_end;
  if (!real) return digits && at == s.size();
  if (at < s.size() && s[at] == '.') {
    const size_t frac_end = skip_digits(s, at + 1);
    digits = digits || frac_end > at + 1;
    at = frac_end;
  }
  if (!digits) return false;
  if (at < s.size() && (s[at] == 'e' || s[at] == 'E')) {
    ++at;
    if (at < s.size() && (s[at] == '+' || s[at] == '-')) ++at;
    const size_t exp_end = skip_digits(s, at);
    if (exp_end == at) return false;
    at = exp_end;
  }
  return at == s.size();
}

template <class T>
std::string show(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
  } else {
    return std::to_string(v);
  }
}

}  // namespace number_detail

template <class T>
concept Number = (std::integral<T> && !std::same_as<T, bool> && !std::same_as<T, char>) || std::floating_point<T>;

// Why `text` is not a T under the rule, or nullopt when it is one; the value in `out`.
template <Number T>
std::optional<std::string> read_number(std::string_view text, T& out) {
  constexpr bool real = std::is_floating_point_v<T>;
  if (text.empty()) return "is empty";
  if (!number_detail::well_formed(text, real) || (std::is_unsigned_v<T> && text[0] == '-'))
    return std::string("is not ") + (real ? "a decimal number" : std::is_unsigned_v<T> ? "a whole number >= 0" : "a whole decimal number");
  T v{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range || (real && !std::isfinite(double(v))))
    return "is out of range [" + number_detail::show(std::numeric_limits<T>::lowest()) + ", " +
           number_detail::show(std::numeric_limits<T>::max()) + "]";
  if (ec != std::errc() || end != text.data() + text.size()) return "is not a decimal number";
  out = v;
  return std::nullopt;
}

// Why `v` is outside [lo, hi], or nullopt.
template <Number T>
std::optional<std::string> outside(T v, T lo, T hi) {
  if (v >= lo && v <= hi) return std::nullopt;
  if (hi == std::numeric_limits<T>::max()) return "must be >= " + number_detail::show(lo);
  if (lo == std::numeric_limits<T>::lowest()) return "must be <= " + number_detail::show(hi);
  return "must be in [" + number_detail::show(lo) + ", " + number_detail::show(hi) + "]";
}

// `text` as a T in [lo, hi]; InputError "<what> '<text>' <why>" otherwise.
template <Number T>
T parse_number(std::string_view text, const std::string& what, T lo = std::numeric_limits<T>::lowest(),
               T hi = std::numeric_limits<T>::max()) {
  T v{};
  std::optional<std::string> why = read_number(text, v);
  if (!why) why = outside(v, lo, hi);
  if (why) throw InputError(what + " '" + std::string(text) + "' " + *why);
  return v;
}

}  // namespace llama4d
