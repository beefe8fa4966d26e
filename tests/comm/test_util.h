#pragma once
// Helpers shared by the communication tests (tests/comm, tests/nccl).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>

#include "core/error.h"

namespace llama4d::test {

// Runs fn on another thread and requires it to return within `seconds`: a hang fails the test
// (and ends the process, since a hung thread cannot be joined) instead of stalling CI.
template <class F>
void within_deadline(double seconds, F&& fn) {
  std::packaged_task<void()> task(std::forward<F>(fn));
  std::future<void> done = task.get_future();
  std::thread worker(std::move(task));
  if (done.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    ADD_FAILURE() << "did not finish within " << seconds << " s: a hang";
    std::fprintf(stderr, "fatal: test body hung for %.1f s\n", seconds);
    std::fflush(stderr);
    std::_Exit(1);
  }
  worker.join();
  done.get();  // rethrows a failure of fn
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The message of the llama4d error fn throws, or "(no error)".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace llama4d::test
