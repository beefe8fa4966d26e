#pragma once
// A failure on one rank that every rank of a group learns of, so that no rank waits in a
// collective for a rank that has already given up: each rank runs its part capturing what it
// threw, then one all-reduce tells all of them the lowest rank that failed. Used where one rank
// does work the others need before they go on (a checkpoint's phases, --init's staging under MPI).
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "core/comm/process_group.h"

namespace llama4d {

// Runs fn; 0 if it returned, 1 if it threw, with the exception kept in `error` to rethrow later.
template <class Fn>
int32_t capture_failure(std::exception_ptr& error, Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
    return 0;
  } catch (...) {
    error = std::current_exception();
    return 1;
  }
}

// Collective over `group`: the lowest rank whose `failed` is set, or -1 when none is. `label`
// names the all-reduce in the traffic log and the flight recorder.
int first_failed_rank(ProcessGroup& group, int32_t failed, const std::string& label);

}  // namespace llama4d
