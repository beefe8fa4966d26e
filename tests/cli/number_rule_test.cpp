// The one rule for numbers on the command line (core/parse_number.h) and its CLI11 form
// (cli/flag_values.h): cases by hand, then a fuzz test against an independent reading of the
// grammar, and the value CLI11 finally stores against the value the rule read.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>

#include "cli/flag_values.h"
#include "core/error.h"
#include "core/parse_number.h"

namespace llama4d {
namespace {

template <class T>
bool reads(const std::string& text, T want) {
  T v{};
  return !read_number(std::string_view(text), v) && v == want;
}

template <class T>
bool refuses(const std::string& text) {
  T v{};
  return read_number(std::string_view(text), v).has_value();
}

TEST(NumberRule, DecimalAsWritten) {
  EXPECT_TRUE(reads<int64_t>("010", 10)) << "leading zeros are decimal, never octal";
  EXPECT_TRUE(reads<int64_t>("016", 16));
  EXPECT_TRUE(reads<int>("064", 64));
  EXPECT_TRUE(reads<int>("-7", -7));
  EXPECT_TRUE(reads<uint64_t>("18446744073709551615", std::numeric_limits<uint64_t>::max()));
  EXPECT_TRUE(reads<double>("3e-4", 3e-4));
  EXPECT_TRUE(reads<double>(".5", 0.5));
  EXPECT_TRUE(reads<double>("5.", 5.0));
  EXPECT_TRUE(reads<double>("15.6e12", 15.6e12));
  EXPECT_TRUE(reads<double>("010.5", 10.5));
  for (const char* bad : {"", " 1", "1 ", "+1", "0x10", "1e3", "1.0", "true", "1_000", "--1", "-", "１"})
    EXPECT_TRUE(refuses<int64_t>(bad)) << "'" << bad << "'";
  for (const char* bad : {"", "nan", "NaN", "inf", "-inf", "infinity", "0x1p3", "1e", "e5", ".", "-.", "1e+",
                          "1.2.3", "1e999", "-1e999", " 1"})
    EXPECT_TRUE(refuses<double>(bad)) << "'" << bad << "'";
  EXPECT_TRUE(refuses<uint64_t>("-0")) << "no sign on an unsigned number";
}

TEST(NumberRule, NeverClampedOrWrapped) {
  EXPECT_TRUE(refuses<int64_t>("9223372036854775808"));
  EXPECT_TRUE(reads<int64_t>("9223372036854775807", std::numeric_limits<int64_t>::max()));
  EXPECT_TRUE(refuses<int>("2147483648"));
  EXPECT_TRUE(refuses<int>("-2147483649"));
  EXPECT_TRUE(refuses<uint64_t>("18446744073709551616"));
  EXPECT_TRUE(refuses<int64_t>("99999999999999999999999999"));
}

TEST(NumberRule, ErrorsNameWhatAndTheText) {
  try {
    parse_number<int>("12x", "--pp-layers 1,12x: layer count", 0);
    ADD_FAILURE() << "accepted 12x";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "--pp-layers 1,12x: layer count '12x' is not a whole decimal number");
  }
  try {
    parse_number<int>("-1", "--steps", 0);
    ADD_FAILURE() << "accepted -1";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "--steps '-1' must be >= 0");
  }
  EXPECT_EQ(parse_number<int>("3", "--zero", 0, 3), 3);
  EXPECT_THROW(parse_number<int>("4", "--zero", 0, 3), InputError);
}

// The grammar read independently of core/parse_number.h: per character, with the value summed in
// 128 bits (integers) or by strtod (reals), so a disagreement is a bug in one of the two.
struct Oracle {
  bool ok = false;
  __int128 integer = 0;
  double real = 0;
};

Oracle oracle(const std::string& s, bool real) {
  Oracle o;
  size_t i = 0, digits = 0;
  if (i < s.size() && s[i] == '-') ++i;
  const size_t start = i;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    if (o.integer < (__int128(1) << 100)) o.integer = o.integer * 10 + (s[i] - '0');
    ++i, ++digits;
  }
  if (!real) {
    o.ok = digits > 0 && i == s.size();
    if (start == 1) o.integer = -o.integer;
    return o;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  }
  if (digits == 0) return o;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    size_t exp_digits = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++exp_digits;
    if (exp_digits == 0) return o;
  }
  if (i != s.size()) return o;
  o.real = std::strtod(s.c_str(), nullptr);
  o.ok = std::isfinite(o.real);
  return o;
}

std::string random_text(std::mt19937_64& rng) {
  static const std::string alphabet = "0123456789000-+.eE x\t_,n";
  std::string s;
  const size_t n = rng() % 24;
  for (size_t i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
  return s;
}

template <class T>
void fuzz_integers(std::mt19937_64& rng, int cases) {
  for (int c = 0; c < cases; ++c) {
    const std::string s = random_text(rng);
    const Oracle o = oracle(s, false);
    const bool in_range = o.ok && o.integer >= __int128(std::numeric_limits<T>::min()) &&
                          o.integer <= __int128(std::numeric_limits<T>::max()) &&
                          !(std::is_unsigned_v<T> && !s.empty() && s[0] == '-');
    T v{};
    const bool accepted = !read_number(std::string_view(s), v);
    ASSERT_EQ(accepted, in_range) << "'" << s << "'";
    if (accepted) {
      ASSERT_TRUE(__int128(v) == o.integer) << "'" << s << "'";
    }
  }
}

TEST(NumberRule, FuzzAgainstAnIndependentReading) {
  std::mt19937_64 rng(52);
  fuzz_integers<int>(rng, 100000);
  fuzz_integers<int64_t>(rng, 100000);
  fuzz_integers<uint64_t>(rng, 100000);
  for (int c = 0; c < 100000; ++c) {
    const std::string s = random_text(rng);
    const Oracle o = oracle(s, true);
    double v = 0;
    const bool accepted = !read_number(std::string_view(s), v);
    // Below the normal range (subnormals, "1e-999") the two libraries may differ on what is out of
    // range; anything accepted there must still be strtod's value.
    if (o.ok && std::fabs(o.real) < std::numeric_limits<double>::min()) {
      if (accepted) {
        ASSERT_EQ(v, o.real) << "'" << s << "'";
      }
      continue;
    }
    ASSERT_EQ(accepted, o.ok) << "'" << s << "'";
    if (accepted) {
      ASSERT_EQ(v, o.real) << "'" << s << "'";
    }
  }
}

// What CLI11 stores for a flag added with add_number is what the rule read: the validator hands
// CLI11 a text its own conversion (strtoll with base 0, strtold) reads back exactly.
template <class T>
void expect_cli_stores(const std::string& text, T lo, T hi) {
  T want{};
  const bool valid = !read_number(std::string_view(text), want) && !outside(want, lo, hi);
  CLI::App app;
  T got{};
  cli::add_number(app, "--x", got, "", lo, hi);
  std::vector<std::string> args = {"--x=" + text};  // reversed argv: CLI11 pops from the back
  try {
    app.parse(args);
    ASSERT_TRUE(valid) << "CLI accepted '" << text << "'";
    ASSERT_EQ(got, want) << "'" << text << "'";
  } catch (const CLI::ParseError& e) {
    ASSERT_FALSE(valid) << "CLI refused '" << text << "': " << e.what();
    ASSERT_NE(std::string(e.what()).find("--x"), std::string::npos) << e.what();
  }
}

TEST(NumberRule, CliStoresWhatTheRuleRead) {
  std::mt19937_64 rng(7);
  for (int c = 0; c < 4000; ++c) {
    const std::string s = random_text(rng);
    expect_cli_stores<int64_t>(s, 0, std::numeric_limits<int64_t>::max());
    expect_cli_stores<int>(s, -1, 1000);
    expect_cli_stores<uint64_t>(s, 0, std::numeric_limits<uint64_t>::max());
    expect_cli_stores<double>(s, 0, std::numeric_limits<double>::max());
  }
  for (const char* s : {"010", "0.1", "3e-4", "0.30000000000000004", "1e308", "4.9e-324", "2.2250738585072014e-308"})
    expect_cli_stores<double>(s, 0, std::numeric_limits<double>::max());
}

// Every option of an app whose type is a number must come through add_number; every other value
// may not be empty unless the option says what empty means.
TEST(NumberRule, AnAppWithANumberAddedAnotherWayIsRefused) {
  CLI::App app;
  int n = 0;
  app.add_option("--n", n, "");
  EXPECT_THROW(cli::check_flag_values(app), std::logic_error);

  CLI::App ok;
  std::string data, prompt;
  cli::add_number(ok, "--n", n, "");
  ok.add_option("--data", data, "");
  ok.add_option("--prompt", prompt, "")->check(cli::may_be_empty());
  cli::check_flag_values(ok);
  std::vector<std::string> args = {"", "--data"};  // reversed argv: CLI11 pops from the back
  EXPECT_THROW(ok.parse(args), CLI::ValidationError);
  args = {"", "--prompt"};
  EXPECT_NO_THROW(ok.parse(args));
}

}  // namespace
}  // namespace llama4d
