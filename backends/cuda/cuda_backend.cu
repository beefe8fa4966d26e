// The CUDA compute backend's table (core/ops.h): its kernels, memory and identity, registered as
// "cuda" when this library is linked. Registering touches no CUDA call: the driver is loaded
// only when --device cuda is chosen (or a test asks), so a binary with this backend runs on
// machines without a GPU.
#include <string>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/lt_gemm.cuh"
#include "backends/cuda/no_gpu_reason.h"

namespace llama4d::cuda {

namespace {

__global__ void probe_kernel(int* out) { *out = 1; }

// Asks the driver for a GPU and runs one kernel on it: that also catches a GPU older than the
// architectures this build carries (CMAKE_CUDA_ARCHITECTURES), whose launch fails with "no
// kernel image is available".
std::string unusable_reason() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return no_gpu_reason(e);
  if (count == 0) return "no CUDA GPU is visible (check CUDA_VISIBLE_DEVICES)";
  int* flag = nullptr;
  e = cudaMalloc(&flag, sizeof(int));
  if (e == cudaSuccess) {
    probe_kernel<<<1, 1, 0, stream()>>>(flag);
    e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream());
    cudaFree(flag);
  }
  if (e != cudaSuccess) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    return std::string("GPU 0 (") + prop.name + ", compute capability " + std::to_string(prop.major) + "." +
           std::to_string(prop.minor) + ") cannot run this build's kernels: " + cudaGetErrorString(e) +
           " (configure with -DCMAKE_CUDA_ARCHITECTURES=<its architecture>)";
  }
  return "";
}

// GPU kernels use no host threads; the count is kept per calling thread, as the CPU backend
// keeps it, so reports show what was asked for.
thread_local int host_threads = 1;
int threads() { return host_threads; }
void set_threads(int n) { host_threads = n; }

// ops::QueuedOps (cuda_common.cuh's QueueOnly for the calling thread). Where the GPU cannot
// share managed memory with the host while kernels run (concurrentManagedAccess 0: any host
// touch of a managed page then faults), ops keep waiting: "may return early" allows that.
bool set_queue_only(bool on) {
  static const bool shares_managed_memory = [] {
    int device = 0, concurrent = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, device), "concurrentManagedAccess");
    return concurrent != 0;
  }();
  const bool was = queue_only();
  queue_only() = on && shares_managed_memory;
  return was;
}

void synchronize() { check(cudaStreamSynchronize(stream()), "synchronize"); }

const ops::ComputeBackend kCuda = {
    .name = "cuda",
    .unusable_reason = &unusable_reason,
    .f32 = kernel_table<float>(),
    .f64 = kernel_table<double>(),
    .device_alloc = &device_alloc,
    .device_free = &device_free,
    .device_release_cached = &device_release_cached,
    .device_memcpy = &device_memcpy,
    .collective_reduce = &collective_reduce,
    .measure_peak_gemm_flops = &measure_peak_gemm_flops,
    .set_queue_only = &set_queue_only,
    .synchronize = &synchronize,
    .threads = &threads,
    .set_threads = &set_threads,
    .set_kernel_mode = &set_kernel_mode,
    .kernel_mode = &kernel_mode,
};

const bool kRegistered = (ops::register_compute_backend(&kCuda), true);

}  // namespace

}  // namespace llama4d::cuda
