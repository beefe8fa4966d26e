#pragma once
// The CUDA backend's op tests: each op runs on the CPU backend and on the GPU with the same
// inputs, and the results are compared. Without a usable GPU (this machine has none, or no
// driver) every test reports a skip that says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "../ops/op_test_util.h"
#include "backends/cuda/cuda_kernels.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/tensor/bf16_rounding.h"

namespace llama4d::test {

// Why the CUDA backend cannot run here ("" when it can).
inline std::string gpu_unusable() {
  try {
    ops::select_compute_backend("cuda");
    ops::select_compute_backend("cpu");
    return "";
  } catch (const InputError& e) {
    return e.what();
  }
}

#define LLAMA4D_REQUIRE_GPU()                                         \
  do {                                                                \
    const std::string why = ::llama4d::test::gpu_unusable();          \
    if (!why.empty()) GTEST_SKIP() << "no GPU to test on: " << why;   \
  } while (0)

// The compute capability's major number of the process's GPU (8: A100, 9: H100).
inline int gpu_major() {
  int device = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  return major;
}

// The `calls` calls made between the two tallies (cuda::gemm_unit_calls or attention_unit_calls)
// ran on the tensor cores if `tensor_cores`, else on CUDA cores: right results alone cannot tell.
inline void expect_unit_calls(cuda::UnitCalls before, cuda::UnitCalls after, int64_t calls, bool tensor_cores,
                              const std::string& what) {
  EXPECT_EQ(after.tensor_cores - before.tensor_cores, tensor_cores ? calls : 0) << what << ": calls on tensor cores";
  EXPECT_EQ(after.cuda_cores - before.cuda_cores, tensor_cores ? 0 : calls) << what << ": calls on CUDA cores";
}

// The CUDA backend is active for the guard's lifetime, the CPU backend after.
class OnGpu {
 public:
  OnGpu() { ops::select_compute_backend("cuda"); }
  ~OnGpu() { ops::select_compute_backend("cpu"); }
  OnGpu(const OnGpu&) = delete;
  OnGpu& operator=(const OnGpu&) = delete;
};

// Device memory of the backend active at construction (create it inside an OnGpu scope), filled
// from host values or zeros; host() copies it back.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& values) : DeviceBuffer(int64_t(values.size())) {
    ops::device_memcpy(data_, values.data(), bytes());
  }
  explicit DeviceBuffer(int64_t n) : backend_(&ops::compute_backend()), n_(n) {
    data_ = static_cast<T*>(backend_->device_alloc(bytes()));
    const std::vector<T> zeros(size_t(n), T{});
    if (n > 0) backend_->device_memcpy(data_, zeros.data(), bytes());
  }
  ~DeviceBuffer() { backend_->device_free(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() { return data_; }
  std::vector<T> host() const {
    std::vector<T> out(static_cast<size_t>(n_));
    if (n_ > 0) backend_->device_memcpy(out.data(), data_, bytes());
    return out;
  }

 private:
  int64_t bytes() const { return n_ * int64_t(sizeof(T)); }
  const ops::ComputeBackend* backend_;
  int64_t n_;
  T* data_ = nullptr;
};

// Random values in [lo, hi) as T, reproducible from the seed.
template <class T>
std::vector<T> random_values(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return cast_to<T>(random_vector(n, seed, lo, hi));
}

// Random values in [lo, hi) rounded to bf16 values (what bf16 mixed precision's products read).
inline std::vector<float> bf16_values(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::vector<float> x = random_values<float>(n, seed, lo, hi);
  for (float& e : x) e = nearest_bf16(e);
  return x;
}

// The tolerances against the CPU backend: fp32 within 1e-5, fp64 within 1e-12, relative
// to the reference tensor's largest magnitude (a tensor-level measure, so an element near zero
// after cancellation is not held to a relative bound it cannot meet).
template <class T>
constexpr double kGpuTolerance = sizeof(T) == 4 ? 1e-5 : 1e-12;

template <class T>
void expect_close(const std::vector<T>& got, const std::vector<T>& want, const std::string& what,
                  double tolerance = kGpuTolerance<T>) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0, scale = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::abs(double(want[i])));
    const double d = std::abs(double(got[i]) - double(want[i]));
    if (!(d <= worst)) worst = d, worst_at = i;  // NaN counts as the worst
  }
  EXPECT_LE(worst, tolerance * std::max(scale, 1e-30))
      << what << ": element " << worst_at << " is " << got[worst_at] << ", the CPU backend gives "
      << want[worst_at] << " (largest reference magnitude " << scale << ")";
}

template <class T>
void expect_bitwise(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", the CPU backend gives " << want[i];
      return;
    }
}

}  // namespace llama4d::test
