// Selecting the CUDA backend: refused with the reason where no GPU can run it, and where one
// can, memory that round-trips host <-> device and the reports of an active backend.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "cuda_test_util.h"

namespace llama4d {
namespace {

TEST(CudaBackend, IsLinkedAndNamed) {
  const std::vector<std::string> names = ops::compute_backend_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "cuda"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "cpu"), names.end());
}

// Without a GPU, selecting it fails with the reason and leaves the CPU backend active; with one,
// it succeeds. Either way the test checks something on every machine.
TEST(CudaBackend, SelectionSucceedsOrNamesWhyNot) {
  const std::string why = test::gpu_unusable();
  if (why.empty()) {
    test::OnGpu gpu;
    EXPECT_STREQ(ops::backend_name(), "cuda");
  } else {
    EXPECT_NE(why.find("--device cuda: "), std::string::npos) << why;
    EXPECT_GT(why.size(), std::string("--device cuda: ").size()) << "the reason must be stated";
    EXPECT_STREQ(ops::backend_name(), "cpu");
  }
  EXPECT_STREQ(ops::backend_name(), "cpu");
}

TEST(CudaBackend, MemoryRoundTripsAndFreesToTheCache) {
  LLAMA4D_REQUIRE_GPU();
  test::OnGpu gpu;
  const std::vector<float> values = test::random_values<float>(1000, 1);
  std::vector<float> back(values.size());
  void* a = ops::device_alloc(int64_t(values.size() * sizeof(float)));
  void* b = ops::device_alloc(int64_t(values.size() * sizeof(float)));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  ops::device_memcpy(a, values.data(), int64_t(values.size() * sizeof(float)));  // host -> device
  ops::device_memcpy(b, a, int64_t(values.size() * sizeof(float)));              // device -> device
  ops::device_memcpy(back.data(), b, int64_t(values.size() * sizeof(float)));    // device -> host
  EXPECT_EQ(back, values);
  ops::device_free(a);
  void* again = ops::device_alloc(int64_t(values.size() * sizeof(float)));
  EXPECT_EQ(again, a) << "a freed block of the same size is handed out again";
  ops::device_free(again);
  ops::device_free(b);
  ops::device_release_cached();
  EXPECT_EQ(ops::device_alloc(0), nullptr);
  EXPECT_THROW(ops::device_alloc(-1), InputError);
  EXPECT_THROW(ops::device_alloc(int64_t(1) << 60), OutOfMemoryError);
}

TEST(CudaBackend, PeakGemmRateIsMeasured) {
  LLAMA4D_REQUIRE_GPU();
  test::OnGpu gpu;
  const double flops = ops::measure_peak_gemm_flops(512, 0.05);
  EXPECT_GT(flops, 1e9) << "an H100-class GPU does far more than a GFLOP/s";
  std::printf("cuda GEMM (fp32, 512^3, the three products): %.1f TFLOP/s\n", flops / 1e12);
}

}  // namespace
}  // namespace llama4d
