// The CPU compute backend's table (core/ops.h): its kernels, memory and thread control, registered
// as "cpu" when this library is linked.
#include <string>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_kernels.h"

namespace llama4d::cpu {

namespace {

int threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Sets the OpenMP team size of every kernel. OpenMP keeps this setting per calling thread, so
// other threads (other virtual GPUs) are unaffected.
void set_threads(int n) {
#ifdef _OPENMP
  omp_set_num_threads(n);
#else
  (void)n;
#endif
}

const ops::ComputeBackend kCpu = {
    .name = "cpu",
    .unusable_reason = [] { return std::string(); },  // any machine that runs this program
    .f32 = kernel_table<float>(),
    .f64 = kernel_table<double>(),
    .device_alloc = &device_alloc,
    .device_free = &device_free,
    .device_release_cached = &device_release_cached,
    .device_memcpy = &device_memcpy,
    .measure_peak_gemm_flops = &measure_peak_gemm_flops,
    .threads = &threads,
    .set_threads = &set_threads,
};

const bool kRegistered = (ops::register_compute_backend(&kCpu), true);

}  // namespace

}  // namespace llama4d::cpu
