#pragma once
// How a flag's value is read, the same on every command and lesson: a number follows
// core/parse_number.h's rule (decimal, finite, within the type and the flag's bounds, not empty;
// negative only where a flag says what a negative means), and no value of any flag may be empty
// (`--data ''` is an error, not "the default"). Header-only, for the CLI and the lessons alike.
//
// Numeric flags are added with add_number; check_flag_values(app), run on the whole app before it
// parses, refuses an app with a numeric flag added another way (a std::logic_error naming it, so
// every test that runs a command catches it) and gives every other option the non-empty rule.
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/parse_number.h"

namespace llama4d::cli {

inline constexpr const char* kNumberRule = "llama4d-number";
inline constexpr const char* kMayBeEmpty = "llama4d-may-be-empty";

// The text of `v` that CLI11's own conversion reads back as exactly `v`: integers in decimal
// (CLI11 reads a leading 0 as octal), reals in hexadecimal (strtold reads them exactly).
template <Number T>
std::string exact_text(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%a", double(v));
    return buf;
  } else {
    return std::to_string(v);
  }
}

// The validator of one numeric flag: the rule, then [lo, hi]; on success the text becomes
// exact_text of the value read.
template <Number T>
CLI::Validator number_rule(T lo, T hi) {
  CLI::Validator v(
      [lo, hi](std::string& text) -> std::string {
        T value{};
        std::optional<std::string> why = read_number(std::string_view(text), value);
        if (!why) why = outside(value, lo, hi);
        if (why) return "'" + text + "' " + *why;
        text = exact_text(value);
        return std::string();
      },
      "");
  v.name(kNumberRule);
  return v;
}

// A numeric flag whose value lies in [lo, hi] (by default any value >= 0 the type holds).
template <Number T>
CLI::Option* add_number(CLI::App& cmd, const std::string& name, T& value, const std::string& help,
                        std::type_identity_t<T> lo = 0, std::type_identity_t<T> hi = std::numeric_limits<T>::max()) {
  return cmd.add_option(name, value, help)->transform(number_rule<T>(lo, hi));
}

// The same for a list of numbers (comma-separated).
template <Number T>
CLI::Option* add_numbers(CLI::App& cmd, const std::string& name, std::vector<T>& values, const std::string& help,
                         std::type_identity_t<T> lo = 0, std::type_identity_t<T> hi = std::numeric_limits<T>::max()) {
  return cmd.add_option(name, values, help)->delimiter(',')->transform(number_rule<T>(lo, hi));
}

// A byte count: a whole number under the rule, then optionally K, M or G (2^10, 2^20, 2^30; any
// case, a trailing B or iB allowed: 4K, 4KB, 4KiB), within [lo, hi].
inline CLI::Option* add_size(CLI::App& cmd, const std::string& name, int64_t& value, const std::string& help,
                             int64_t lo = 0, int64_t hi = std::numeric_limits<int64_t>::max()) {
  CLI::Validator rule(
      [lo, hi](std::string& text) -> std::string {
        size_t digits = 0;
        while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
        std::string unit = text.substr(digits);
        for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
        int shift = -1;
        for (const auto& [name, bits] : {std::pair{"", 0}, {"B", 0}, {"K", 10}, {"KB", 10}, {"KIB", 10}, {"M", 20},
                                         {"MB", 20}, {"MIB", 20}, {"G", 30}, {"GB", 30}, {"GIB", 30}})
          if (unit == name) shift = bits;
        if (shift < 0 || digits == 0) return "'" + text + "' is not a byte count (a whole number, then K, M or G)";
        int64_t n = 0;
        std::optional<std::string> why = read_number(std::string_view(text).substr(0, digits), n);
        if (!why && n > (std::numeric_limits<int64_t>::max() >> shift)) why = "is out of range";
        if (!why) why = outside(int64_t(n << shift), lo, hi);
        if (why) return "'" + text + "' " + *why;
        text = std::to_string(n << shift);
        return std::string();
      },
      "SIZE");
  rule.name(kNumberRule);
  return cmd.add_option(name, value, help)->transform(rule);
}

// For the rare flag whose empty value means something (and says what in its help).
inline CLI::Validator may_be_empty() {
  CLI::Validator v([](std::string&) { return std::string(); }, "");
  v.name(kMayBeEmpty);
  return v;
}

inline bool has_validator(CLI::Option& opt, const char* name) {
  try {
    return opt.get_validator(name) != nullptr;
  } catch (const CLI::OptionNotFound&) {
    return false;
  }
}

// See the top of this file. Runs on `app` and every subcommand below it.
inline void check_flag_values(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_items_expected_min() == 0 || !opt->nonpositional()) continue;  // a flag: takes no value
    const std::string type = opt->get_type_name().substr(0, opt->get_type_name().find(':'));
    const bool numeric = type == "INT" || type == "UINT" || type == "FLOAT";
    if (numeric && !has_validator(*opt, kNumberRule))
      throw std::logic_error("option " + opt->get_name() + " of '" + app.get_name() +
                             "' is a number not added with add_number (cli/flag_values.h)");
    if (!numeric && !has_validator(*opt, kMayBeEmpty))
      opt->check(CLI::Validator([](std::string& text) { return text.empty() ? std::string("'' is empty") : ""; },
                                ""));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) check_flag_values(*sub);
}

}  // namespace llama4d::cli
