#pragma once
// Where a step's time goes, op by op: while an OpProfile lives, every kernel of the active
// compute backend (core/ops.h) is timed from call to return, and its calls, seconds and FLOPs
// are summed per kernel. `llama4d bench --profile` prints the table; with --threads-sweep it
// shows which ops stop gaining from more cores, which one number per step cannot (Amdahl: the
// ops that stay flat, and the host time outside every op, bound the speedup).
//
// It wraps the backend's kernel table, not the model: the model, strategies and results do not
// change (the same kernels run on the same memory, so the bits are the same). On a backend with
// stream order (a GPU) each op waits for its kernels before the clock stops, so a profiled step
// runs as `bench --wait-every-op` does, not as fast as a queued one.
#include <cstdint>
#include <string>
#include <vector>

namespace llama4d::ops {

struct ComputeBackend;

// One kernel's totals since the profile started or was last taken.
struct OpTime {
  std::string op;      // its name in ops::Kernels: matmul_forward, attention_backward, ...
  int64_t calls = 0;   // fp32 and fp64 calls together
  double seconds = 0;  // wall time from call to return, summed over calls (and calling threads)
  double flops = 0;    // what core/ops.h's FLOP counts give (products and attention), else 0
};

class OpProfile {
 public:
  // Times the active backend's kernels from now on. One at a time: InputError if one lives.
  // Install it while no other thread calls ops (a single-rank step, between steps).
  OpProfile();
  // The backend as it was comes back.
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  // The kernels called since the start or the last take(), in ops::Kernels' order, and zeroes
  // the totals.
  std::vector<OpTime> take();

 private:
  const ComputeBackend* timed_;  // the backend whose kernels are timed
};

}  // namespace llama4d::ops
