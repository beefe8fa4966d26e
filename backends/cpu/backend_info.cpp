// Backend identity and thread control, for reports and the --threads flag.
#include <string>

#include "backends/cpu/cpu_common.h"
#include "core/error.h"
#include "core/ops.h"

namespace llama4d::ops {

const char* backend_name() { return "cpu"; }

int backend_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Sets the OpenMP team size of every kernel (Eigen runs single-threaded inside our tasks, see
// backends/cpu/CMakeLists.txt). OpenMP keeps this setting per calling thread, and Eigen reads
// it per thread as long as no one fixed Eigen's global count, so other threads are unaffected.
void set_backend_threads(int n) {
  if (n < 1 || n > kMaxBackendThreads)
    throw InputError("thread count must be in [1, " + std::to_string(kMaxBackendThreads) + "], got " + std::to_string(n));
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

}  // namespace llama4d::ops
