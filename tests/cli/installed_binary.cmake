# The binary runs where it is installed or copied: it finds the corpus beside it
# (<bin>/../share/llama4d/corpus), not the source tree's path compiled into it.
#   cmake -DBUILD=<build dir> -DBIN=<built llama4d> -DSOURCE=<source dir> -DWORK=<scratch dir>
#         -DLESSONS=<ON when the lesson programs are built> -P installed_binary.cmake
cmake_minimum_required(VERSION 3.22)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/elsewhere)

# Runs `llama4d eval` on a tiny fresh model from another working directory and checks that the
# corpus it read is `want`; leaves its stdout in `out`.
macro(expect_corpus binary want)
  execute_process(COMMAND ${binary} eval --preset tiny --seq-len 16 --max-windows 2 --threads 1 --json
                  WORKING_DIRECTORY ${WORK}/elsewhere
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${binary} eval exited ${rc}:\n${err}")
  endif()
  string(JSON data GET "${out}" data)
  file(REAL_PATH "${data}" data)
  file(REAL_PATH "${want}" want_real)
  if(NOT data STREQUAL want_real)
    message(FATAL_ERROR "${binary} read ${data}, expected ${want_real}")
  endif()
endmacro()

# 1. cmake --install: the CLI and the lessons in bin/, every corpus part and data/README.md in share/.
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD} --prefix ${WORK}/prefix
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc}):\n${out}${err}")
endif()
set(expected bin/llama4d share/llama4d/README.md)
if(LESSONS)  # the sanitizer presets build no lessons
  list(APPEND expected bin/lesson01_data_parallel bin/lesson06_context_parallel)
endif()
foreach(f ${expected})
  if(NOT EXISTS ${WORK}/prefix/${f})
    message(FATAL_ERROR "cmake --install did not install ${f}")
  endif()
endforeach()
file(GLOB source_parts RELATIVE ${SOURCE}/data/corpus ${SOURCE}/data/corpus/*.txt)
file(GLOB installed_parts RELATIVE ${WORK}/prefix/share/llama4d/corpus ${WORK}/prefix/share/llama4d/corpus/*.txt)
if(NOT source_parts STREQUAL installed_parts)
  message(FATAL_ERROR "installed corpus parts differ from data/corpus:\n${installed_parts}\nvs\n${source_parts}")
endif()
expect_corpus(${WORK}/prefix/bin/llama4d ${WORK}/prefix/share/llama4d/corpus)

# 2. A copy with a corpus of one distinct document beside it: it reads that document (a single
#    repeated byte has unigram entropy 0; the shipped corpus about 3 nats), not the source tree.
file(COPY ${BIN} DESTINATION ${WORK}/copy/bin)
file(WRITE ${WORK}/copy/share/llama4d/corpus/only.txt "")
foreach(i RANGE 7)
  file(APPEND ${WORK}/copy/share/llama4d/corpus/only.txt "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz")
endforeach()
expect_corpus(${WORK}/copy/bin/llama4d ${WORK}/copy/share/llama4d/corpus)
string(JSON entropy GET "${out}" unigram_entropy_nats)
if(NOT entropy EQUAL 0)
  message(FATAL_ERROR "the copy read another corpus than its own: unigram entropy ${entropy}, not 0")
endif()

file(REMOVE_RECURSE ${WORK})
message(STATUS "installed and copied binaries read their own corpus")
