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
// backends/cpu/CMakeLists.txt). OpenMP keeps this setting per calling thread, so call it from
// the thread that runs the ops.
void set_backend_threads(int n) {
  if (n < 1) throw InputError("thread count must be at least 1, got " + std::to_string(n));
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

}  // namespace llama4d::ops
