// backend_name, thread control and the peak-GEMM probe.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/ops/op_test_util.h"

namespace llama4d::test {
namespace {

TEST(BackendInfo, NameAndThreads) {
  EXPECT_STREQ(ops::backend_name(), "cpu");
  const int saved = ops::backend_threads();
  EXPECT_GE(saved, 1);
  ops::set_backend_threads(3);
#ifdef _OPENMP
  EXPECT_EQ(ops::backend_threads(), 3);
#else
  EXPECT_EQ(ops::backend_threads(), 1);  // built without OpenMP: always one thread
#endif
  EXPECT_THROW(ops::set_backend_threads(0), InputError);
  ops::set_backend_threads(saved);
  EXPECT_EQ(ops::backend_threads(), saved);
}

TEST(BackendInfo, PeakGemmProbeReportsAPlausibleRate) {
  const double flops = ops::measure_peak_gemm_flops(64, 0.01);
  EXPECT_GT(flops, 1e6);   // even a sanitizer build does a MFLOP/s
  EXPECT_LT(flops, 1e14);  // and no CPU does 100 TFLOP/s in fp32
  EXPECT_THROW(ops::measure_peak_gemm_flops(0, 0.01), InputError);
  EXPECT_THROW(ops::measure_peak_gemm_flops(8, -1.0), InputError);
}

}  // namespace
}  // namespace llama4d::test
