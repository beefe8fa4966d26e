// backend_name, thread control, the peak-GEMM probe, and the run-time choice of compute backend
// the ops dispatch through (core/ops.h).
#include <gtest/gtest.h>

#include <utility>
#include <vector>

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

// A second backend: the CPU's table with matmul_forward and fill counted, so the test can see which
// backend an op reached.
int counted_matmuls = 0, counted_fills = 0;
void (*cpu_matmul)(float*, const float*, const float*, int64_t, int64_t, int64_t, ops::GemmOperands) = nullptr;
void (*cpu_fill)(float*, float, int64_t) = nullptr;

void counting_matmul(float* out, const float* inp, const float* weight, int64_t BT, int64_t C, int64_t OC,
                     ops::GemmOperands operands) {
  ++counted_matmuls;
  cpu_matmul(out, inp, weight, BT, C, OC, operands);
}
void counting_fill(float* x, float value, int64_t N) {
  ++counted_fills;
  cpu_fill(x, value, N);
}

// FLOPs reported by the dispatch, whichever backend runs the op.
struct CountingSink : ops::FlopSink {
  double flops = 0;
  void add_flops(double f) override { flops += f; }
};

TEST(ComputeBackend, OpsReachTheSelectedBackendOnly) {
  ASSERT_STREQ(ops::backend_name(), "cpu");
  static ops::ComputeBackend counting = ops::compute_backend();
  static bool registered = false;
  if (!registered) {
    cpu_matmul = counting.f32.matmul_forward;
    cpu_fill = counting.f32.fill;
    counting.name = "counting";
    counting.f32.matmul_forward = &counting_matmul;
    counting.f32.fill = &counting_fill;
    ops::register_compute_backend(&counting);
    registered = true;
  }
  EXPECT_EQ(ops::compute_backend_names(), (std::vector<std::string>{"cpu", "counting"}));

  const int64_t BT = 5, C = 7, OC = 3;
  std::vector<float> x(BT * C), w(OC * C), on_cpu(BT * OC), on_counting(BT * OC);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * float(i % 11) - 1.0f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.125f * float(i % 7) - 0.5f;
  CountingSink sink;
  ops::ScopedFlopSink guard(&sink);

  ops::matmul_forward(on_cpu.data(), x.data(), w.data(), BT, C, OC);
  EXPECT_EQ(counted_matmuls, 0);
  ops::select_compute_backend("counting");
  EXPECT_STREQ(ops::backend_name(), "counting");
  ops::matmul_forward(on_counting.data(), x.data(), w.data(), BT, C, OC);
  ops::fill(on_cpu.data(), 0.0f, 1);
  ops::copy(on_cpu.data(), on_counting.data(), 1);  // not wrapped: the CPU's kernel, reached through the table
  ops::select_compute_backend("cpu");
  ops::matmul_forward(on_cpu.data(), x.data(), w.data(), BT, C, OC);
  EXPECT_EQ(counted_matmuls, 1);
  EXPECT_EQ(counted_fills, 1);
  EXPECT_EQ(on_cpu, on_counting);
  EXPECT_EQ(sink.flops, 3 * ops::matmul_forward_flops(BT, C, OC));  // counted by the dispatch, on both
}

TEST(ComputeBackend, AnUnknownDeviceNamesTheLinkedOnes) {
  try {
    ops::select_compute_backend("cuda");
    FAIL() << "selected a backend this build does not have";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--device cuda: this build has no such compute backend (it has: cpu"),
              std::string::npos)
        << e.what();
  }
  EXPECT_STREQ(ops::backend_name(), "cpu");  // unchanged
}

TEST(ComputeBackend, ARegistrationWithAHoleOrATakenNameIsRefused) {
  ops::ComputeBackend holed = ops::compute_backend();
  holed.name = "holed";
  holed.f64.attention_merge = nullptr;
  EXPECT_THROW(ops::register_compute_backend(&holed), InputError);
  ops::ComputeBackend twin = ops::compute_backend();  // named "cpu" too
  EXPECT_THROW(ops::register_compute_backend(&twin), InputError);
  holed.f64.attention_merge = ops::compute_backend().f64.attention_merge;
  holed.device_memcpy = nullptr;
  EXPECT_THROW(ops::register_compute_backend(&holed), InputError);
  for (const std::string& name : ops::compute_backend_names()) EXPECT_NE(name, "holed");
}

// A stream-ordered backend's calls, as QueuedOps makes them.
std::vector<std::string> queue_calls;
bool queue_only_now = false;
bool record_set_queue_only(bool on) {
  queue_calls.push_back(on ? "queue" : "wait");
  return std::exchange(queue_only_now, on);
}
void record_synchronize() { queue_calls.push_back("synchronize"); }

TEST(ComputeBackend, QueuedOpsQueueUntilFinishedAndRestoreTheSetting) {
  ASSERT_STREQ(ops::backend_name(), "cpu");
  {
    ops::QueuedOps on_cpu;  // no stream order: nothing to set, nothing to wait for
    EXPECT_FALSE(on_cpu.queuing());
    on_cpu.finish();
  }
  static ops::ComputeBackend queued = ops::compute_backend();
  static bool registered = false;
  if (!registered) {
    queued.name = "queued";
    queued.set_queue_only = &record_set_queue_only;
    queued.synchronize = &record_synchronize;
    ops::register_compute_backend(&queued);
    registered = true;
  }
  ops::select_compute_backend("queued");
  queue_calls.clear();
  {
    ops::QueuedOps outer;  // sets queuing on, then asks again to learn what is in effect
    EXPECT_TRUE(queue_only_now);
    EXPECT_TRUE(outer.queuing());
    {
      ops::QueuedOps inner;
      inner.finish();
      EXPECT_TRUE(queue_only_now) << "an inner finish() ended the outer queueing";
      inner.finish();  // a second finish() does nothing
    }
    outer.finish();
  }
  EXPECT_FALSE(queue_only_now);
  EXPECT_EQ(queue_calls, (std::vector<std::string>{"queue", "queue", "queue", "queue", "queue", "synchronize", "wait",
                                                   "synchronize"}));
  // Unwinding through one restores the setting and waits too.
  queue_calls.clear();
  try {
    ops::QueuedOps guard;
    throw InputError("an op failed");
  } catch (const InputError&) {
  }
  EXPECT_FALSE(queue_only_now);
  EXPECT_EQ(queue_calls, (std::vector<std::string>{"queue", "queue", "wait", "synchronize"}));
  ops::select_compute_backend("cpu");

  ops::ComputeBackend half = ops::compute_backend();
  half.name = "half-queued";
  half.set_queue_only = &record_set_queue_only;
  EXPECT_THROW(ops::register_compute_backend(&half), InputError);
}

// A backend that can set a kernel mode must also say which one is in effect (reports read it),
// and the CPU, with one set of kernels, reports exact.
void ignore_kernel_mode(ops::KernelMode) {}
TEST(ComputeBackend, AKernelModeSetterNeedsItsGetter) {
  EXPECT_EQ(ops::kernel_mode(), ops::KernelMode::exact);
  EXPECT_STREQ(ops::kernel_mode_name(ops::kernel_mode()), "exact");
  EXPECT_STREQ(ops::kernel_mode_name(ops::KernelMode::fast), "fast");
  ops::ComputeBackend half = ops::compute_backend();
  half.name = "half-moded";
  half.set_kernel_mode = &ignore_kernel_mode;
  EXPECT_THROW(ops::register_compute_backend(&half), InputError);
}

}  // namespace
}  // namespace llama4d::test
