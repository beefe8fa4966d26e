// The main of every test binary without its own: GoogleTest's, plus the listing of tests with
// their tiers that the build turns into CTest tests (tests/common/discover_tests.cmake).
#include "tests/common/tier.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (const int listed = llama4d::test::list_tests_if_asked(argc, argv); listed >= 0) return listed;
  return RUN_ALL_TESTS();
}
