#pragma once
// Cost tiers of the tests. Every GoogleTest test gets three CTest labels: its area (the folder
// under tests/), its tier, and both as area:tier; the presets in CMakePresets.json choose by label:
//
//   quick      seconds at most: every preset runs it (the default for a test that says nothing);
//   sanitizer  slower, and one of the cases the sanitizer presets keep: together with the quick
//              tests they run every strategy, composition and backend once;
//   full       slower, and proving what a quick or sanitizer case proves on another size, order
//              or combination: the release preset only.
//
// The tier is declared where the test is written:
//   TEST(Suite, Name) { ... }
//   LLAMA4D_TIER(Suite, Name, full);   // why, in a comment
// and for a parametrised suite, where it is instantiated (a default for its cases, then the
// cases that differ, by name):
//   LLAMA4D_INSTANTIATE(Prefix, Suite, kCases, full, {{"case_a", Tier::sanitizer}});
// A declaration that names no test is an error when the test binary lists its tests (at build
// time), so a renamed test cannot leave its tier behind.
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace llama4d::test {

enum class Tier { quick, sanitizer, full };

const char* tier_name(Tier tier);

// Tests whose full GoogleTest name matches `pattern` get `tier`; '*' matches any run of
// characters other than '/'. When several patterns match, the last declared wins. Returns true
// (for static initialisers).
bool declare_tier(std::string pattern, Tier tier);

// Several patterns at once, in order.
bool declare_tiers(const std::vector<std::pair<std::string, Tier>>& patterns);

// A parametrised suite "Prefix/Suite": `fallback` for every case, then `cases` by case name.
bool declare_case_tiers(const std::string& suite, Tier fallback,
                        const std::vector<std::pair<std::string, Tier>>& cases);

// The test binary's main: with --llama4d_list_tests it prints "full_name<TAB>tier" for every
// test instead of running them, and fails naming any declaration that matches no test.
// Returns -1 when the flag is absent (run the tests), else the exit code. Call it after
// testing::InitGoogleTest.
int list_tests_if_asked(int argc, char** argv);

// The name of a case: its `name` member (GoogleTest's name generator).
struct CaseName {
  template <class Case>
  std::string operator()(const testing::TestParamInfo<Case>& info) const {
    return info.param.name;
  }
};

}  // namespace llama4d::test

#define LLAMA4D_TIER(suite, name, tier)                                                       \
  [[maybe_unused]] static const bool llama4d_tier_##suite##_##name = ::llama4d::test::declare_tier( \
      #suite "." #name, ::llama4d::test::Tier::tier)

// INSTANTIATE_TEST_SUITE_P over the container `cases` (elements with a `name`), with their tiers.
#define LLAMA4D_INSTANTIATE(prefix, suite, cases, fallback, ...)                                       \
  INSTANTIATE_TEST_SUITE_P(prefix, suite, ::testing::ValuesIn(cases), ::llama4d::test::CaseName{});    \
  [[maybe_unused]] static const bool llama4d_tiers_##prefix##_##suite = ::llama4d::test::declare_case_tiers( \
      #prefix "/" #suite, ::llama4d::test::Tier::fallback, __VA_ARGS__)
