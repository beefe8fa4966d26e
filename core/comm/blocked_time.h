#pragma once
// Wall seconds the calling thread has spent in communication since it started: blocked in
// Work::wait() (core/comm/work.h), and running a blocking call inline (core/comm/comm_stream.cpp),
// which is where it waits for its peers. A virtual GPU's rank is one thread (an MPI rank, one process), so this is the rank's
// time waiting on communication and on its peers: what straggler detection subtracts from a
// step's wall time (core/parallel/straggler_detector.h).
namespace llama4d {

double blocked_seconds_on_this_thread();
// For the two places above.
void add_blocked_seconds(double seconds);

}  // namespace llama4d
