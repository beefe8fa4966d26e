# Run after a test binary is linked (cmake -P): asks it for its tests and their tiers
# (--llama4d_list_tests, tests/common/tier.h) and writes the CTest file that registers each as
# one CTest test, named as GoogleTest names it, labelled with its area, its tier, and the two
# together (area:tier, for a preset that takes one tier of an area).
#   -D BINARY=<test binary> -D AREA=<label> -D OUTPUT=<file to write>
#   -D TIMEOUT=<seconds> -D ENVIRONMENT=<NAME=value|NAME=value> -D PROPERTIES=<prop|value|...>
#   ('|' separates: a ';' would split the argument on the way here)
execute_process(COMMAND ${BINARY} --llama4d_list_tests
                OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE result TIMEOUT 60)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${BINARY} --llama4d_list_tests failed (${result}):\n${errors}")
endif()

string(REPLACE "|" ";" environment "${ENVIRONMENT}")
string(REPLACE "|" " " properties "${PROPERTIES}")
set(script "# Written by tests/common/discover_tests.cmake from ${BINARY}\n")
string(REPLACE "\n" ";" lines "${listing}")
set(count 0)
foreach(line IN LISTS lines)
  if(line STREQUAL "")
    continue()
  endif()
  string(REPLACE "\t" ";" fields "${line}")
  list(GET fields 0 name)
  list(GET fields 1 tier)
  string(APPEND script
    "add_test([==[${name}]==] [==[${BINARY}]==] [==[--gtest_filter=${name}]==])\n"
    "set_tests_properties([==[${name}]==] PROPERTIES LABELS [==[${AREA};${tier};${AREA}:${tier}]==] TIMEOUT ${TIMEOUT}"
    " ENVIRONMENT [==[${environment}]==] SKIP_REGULAR_EXPRESSION [==[\\[  SKIPPED \\]]==] ${properties})\n")
  math(EXPR count "${count} + 1")
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "${BINARY} lists no tests")
endif()
file(WRITE "${OUTPUT}" "${script}")
