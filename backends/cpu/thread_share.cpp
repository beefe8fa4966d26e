// Per-thread compute thread counts, for virtual GPUs (ranks as threads of one process).
#include "backends/cpu/cpu_common.h"
#include "core/error.h"
#include "core/ops.h"

namespace llama4d::ops {

// OpenMP's team size is a per-thread setting, and Eigen reads it per thread as long as no one
// fixed Eigen's global count; so this changes nothing for other threads.
void set_backend_threads_for_this_thread(int n) {
  if (n < 1) throw InputError("thread count must be at least 1, got " + std::to_string(n));
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

}  // namespace llama4d::ops
