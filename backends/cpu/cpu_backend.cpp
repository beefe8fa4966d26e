// The CPU compute backend's table (core/ops.h): its kernels, memory and thread control, registered
// as "cpu" when this library is linked.
#include <string>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_kernels.h"

namespace llama4d::cpu {

template <class T>
ops::Kernels<T> kernels() {
  return {
      .matmul_forward = &matmul_forward<T>,
      .matmul_backward = &matmul_backward<T>,
      .rmsnorm_forward = &rmsnorm_forward<T>,
      .rmsnorm_backward = &rmsnorm_backward<T>,
      .rope_forward = &rope_forward<T>,
      .rope_backward = &rope_backward<T>,
      .attention_forward = &attention_forward<T>,
      .attention_backward = &attention_backward<T>,
      .attention_merge = &attention_merge<T>,
      .swiglu_forward = &swiglu_forward<T>,
      .swiglu_backward = &swiglu_backward<T>,
      .embedding_forward = &embedding_forward<T>,
      .embedding_backward = &embedding_backward<T>,
      .add_forward = &add_forward<T>,
      .accumulate = &accumulate<T>,
      .cross_entropy_forward = &cross_entropy_forward<T>,
      .cross_entropy_backward = &cross_entropy_backward<T>,
      .vocab_slice_max_and_target = &vocab_slice_max_and_target<T>,
      .vocab_slice_sum_exp = &vocab_slice_sum_exp<T>,
      .cross_entropy_from_stats = &cross_entropy_from_stats<T>,
      .cross_entropy_backward_slice = &cross_entropy_backward_slice<T>,
      .scale = &scale<T>,
      .fill = &fill<T>,
      .copy = &copy<T>,
      .add_scaled = &add_scaled<T>,
      .adamw_update = &adamw_update<T>,
      .sum_squares_chunks = &sum_squares_chunks<T>,
      .sum_losses = &sum_losses<T>,
      .embedding_forward_rows = &embedding_forward_rows<T>,
      .embedding_backward_rows = &embedding_backward_rows<T>,
      .all_finite = &all_finite<T>,
  };
}

namespace {

int threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Sets the OpenMP team size of every kernel (Eigen runs single-threaded inside our tasks, see
// backends/cpu/CMakeLists.txt). OpenMP keeps this setting per calling thread, and Eigen reads
// it per thread as long as no one fixed Eigen's global count, so other threads are unaffected.
void set_threads(int n) {
#ifdef _OPENMP
  omp_set_num_threads(n);
#else
  (void)n;
#endif
}

const ops::ComputeBackend kCpu = {
    .name = "cpu",
    .f32 = kernels<float>(),
    .f64 = kernels<double>(),
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
