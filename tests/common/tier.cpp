#include "tests/common/tier.h"

#include <cstdio>
#include <cstring>
#include <string_view>

namespace llama4d::test {

namespace {

struct Declaration {
  std::string pattern;
  Tier tier;
  bool matched = false;
};

// Filled by static initialisers before main; read once by list_tests_if_asked.
std::vector<Declaration>& declarations() {
  static std::vector<Declaration> all;
  return all;
}

// '*' matches a run of characters without '/', everything else itself.
bool matches(std::string_view pattern, std::string_view name) {
  if (pattern.empty()) return name.empty();
  if (pattern.front() == '*') {
    for (size_t n = 0;; ++n) {
      if (matches(pattern.substr(1), name.substr(n))) return true;
      if (n == name.size() || name[n] == '/') return false;
    }
  }
  return !name.empty() && pattern.front() == name.front() && matches(pattern.substr(1), name.substr(1));
}

}  // namespace

const char* tier_name(Tier tier) {
  switch (tier) {
    case Tier::quick: return "quick";
    case Tier::sanitizer: return "sanitizer";
    case Tier::full: return "full";
  }
  return "?";
}

bool declare_tier(std::string pattern, Tier tier) {
  declarations().push_back({std::move(pattern), tier});
  return true;
}

bool declare_tiers(const std::vector<std::pair<std::string, Tier>>& patterns) {
  for (const auto& [pattern, tier] : patterns) declare_tier(pattern, tier);
  return true;
}

bool declare_case_tiers(const std::string& suite, Tier fallback, const std::vector<std::pair<std::string, Tier>>& cases) {
  declare_tier(suite + ".*/*", fallback);
  for (const auto& [name, tier] : cases) declare_tier(suite + ".*/" + name, tier);
  return true;
}

int list_tests_if_asked(int argc, char** argv) {
  bool asked = false;
  for (int i = 1; i < argc; ++i) asked = asked || std::strcmp(argv[i], "--llama4d_list_tests") == 0;
  if (!asked) return -1;
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const testing::TestInfo& info = *suite.GetTestInfo(t);
      const std::string name = std::string(suite.name()) + "." + info.name();
      if (name.find("DISABLED_") != std::string::npos) continue;
      Tier tier = Tier::quick;
      for (Declaration& d : declarations())
        if (matches(d.pattern, name)) tier = d.tier, d.matched = true;
      std::printf("%s\t%s\n", name.c_str(), tier_name(tier));
    }
  }
  int stale = 0;
  for (const Declaration& d : declarations())
    if (!d.matched) {
      std::fprintf(stderr, "tier declared for '%s' (%s), which names no test of this binary\n", d.pattern.c_str(),
                   tier_name(d.tier));
      ++stale;
    }
  return stale ? 1 : 0;
}

}  // namespace llama4d::test
