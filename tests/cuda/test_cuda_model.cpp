// The whole model on the GPU: the loss and every parameter's gradient of a forward and backward
// pass within the 1e-5 (fp32) of the CPU backend on the test shape, on `small` as close
// to the fp64 step as the CPU's fp32 is (and within 1e-12 in fp64), in bf16 mixed precision
// within bf16's rounding, and the same bits when the GPU repeats the step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../model/model_test_util.h"
#include "core/model/config.h"
#include "core/model/llama.h"
#include "cuda_test_util.h"

namespace llama4d {
namespace {

template <class T>
struct Step {
  LossSum loss;
  std::vector<T> grads;
};

// One forward + backward on the active backend; the gradients come back to the host.
template <class T>
Step<T> step(const LlamaConfig& cfg, const test::Batch& b, bool bf16) {
  Llama<T> m(cfg);
  m.set_bf16_compute(bf16);
  m.init_weights(11);
  test::perturb_params(m, 12);
  m.zero_grad();
  Step<T> s;
  s.loss = m.forward(b.tokens.data(), b.targets.data(), b.B, b.seq);
  m.backward(T(1) / T(s.loss.tokens));
  s.grads.resize(size_t(m.num_params()));
  ops::device_memcpy(s.grads.data(), m.grads(), m.num_params() * int64_t(sizeof(T)));
  return s;
}

// bf16: the same roundings on both devices, but the GPU sums its products in another order, so a
// rounding can land a whole bf16 step (2^-8) away. The bounds are those bf16 mixed precision is
// held to against fp64 (tests/model/bf16_compute_test.cpp). On an H200 the tiny step's worst
// gradient was 1.2e-7 from the CPU's: the same roundings landed the same way.
template <class T>
void expect_gpu_step_matches_cpu(const LlamaConfig& cfg, int64_t B, int64_t Tlen, const char* what, bool bf16 = false) {
  const test::Batch b = test::make_batch(B, Tlen, cfg.vocab_size, 13, true);
  const Step<T> cpu = step<T>(cfg, b, bf16);
  Step<T> gpu, again;
  {
    test::OnGpu on;
    gpu = step<T>(cfg, b, bf16);
    again = step<T>(cfg, b, bf16);
  }
  const double loss_tolerance = bf16 ? 2e-2 : test::kGpuTolerance<T>;
  const double grad_tolerance = bf16 ? 1e-1 : test::kGpuTolerance<T>;
  EXPECT_EQ(gpu.loss.tokens, cpu.loss.tokens);
  EXPECT_NEAR(gpu.loss.loss_sum, cpu.loss.loss_sum, loss_tolerance * std::abs(cpu.loss.loss_sum)) << what;
  double worst = 0;
  std::string worst_name;
  for (const ParamSpec& p : llama_param_specs(cfg)) {
    const double rel = test::rel_error(gpu.grads.data() + p.offset, cpu.grads.data() + p.offset, p.numel);
    EXPECT_LE(rel, grad_tolerance) << what << ": " << p.name;
    if (rel > worst) worst = rel, worst_name = p.name;
  }
  EXPECT_EQ(std::memcmp(&again.loss.loss_sum, &gpu.loss.loss_sum, sizeof(double)), 0) << what << ": loss repeats";
  test::expect_bitwise(again.grads, gpu.grads, std::string(what) + ": gradients repeat");
  std::printf("%s: loss %.9g (GPU) vs %.9g (CPU), worst gradient error %.3g in %s\n", what, gpu.loss.loss_sum,
              cpu.loss.loss_sum, worst, worst_name.c_str());
}

TEST(CudaModel, TinyStepMatchesTheCpuFp32) {
  LLAMA4D_REQUIRE_GPU();
  expect_gpu_step_matches_cpu<float>(test::tiny_config(false, true), 2, 7, "tiny fp32");
}

TEST(CudaModel, TinyTiedStepMatchesTheCpuFp64) {
  LLAMA4D_REQUIRE_GPU();
  expect_gpu_step_matches_cpu<double>(test::tiny_config(true, false), 2, 7, "tiny tied fp64");
}

TEST(CudaModel, TinyStepMatchesTheCpuBf16) {
  LLAMA4D_REQUIRE_GPU();
  expect_gpu_step_matches_cpu<float>(test::tiny_config(true, true), 2, 7, "tiny tied bf16", true);
}

// On `small` the 1e-5 cannot hold for any fp32 implementation: the CPU backend's own
// fp32 step is 2e-4..4e-4 (tensor-relative) from the same step in fp64 (measured here: worst
// 3.7e-4, layers.5 q_proj), because six layers of 2 x 128 tokens add up that much fp32
// rounding. So the GPU is held to what fp32 can give: each gradient at most three times as far
// from the fp64 step as the CPU's fp32 gradient is (plus 1e-6 of slack for a tensor the CPU
// happens to round well; on an H200 the worst ratio was 1.7, layers.1 q_proj). A wrong kernel
// moves a tensor by far more than fp32's rounding; the fp64 step on the GPU, where rounding is
// 2^-29 times smaller, must match the CPU's within 1e-12 (measured there: 4.8e-13).
TEST(CudaModel, SmallStepIsAsCloseToFp64AsTheCpusFp32) {
  LLAMA4D_REQUIRE_GPU();
  const LlamaConfig cfg = LlamaConfig::preset("small");
  const test::Batch b = test::make_batch(2, 128, cfg.vocab_size, 13, true);
  const Step<double> exact = step<double>(cfg, b, false);
  const Step<float> cpu = step<float>(cfg, b, false);
  Step<float> gpu, again;
  {
    test::OnGpu on;
    gpu = step<float>(cfg, b, false);
    again = step<float>(cfg, b, false);
  }
  EXPECT_EQ(gpu.loss.tokens, exact.loss.tokens);
  EXPECT_NEAR(gpu.loss.loss_sum, cpu.loss.loss_sum, 1e-5 * std::abs(cpu.loss.loss_sum));
  double worst_ratio = 0;
  std::string worst_name;
  for (const ParamSpec& p : llama_param_specs(cfg)) {
    const double gpu_error = test::rel_error(gpu.grads.data() + p.offset, exact.grads.data() + p.offset, p.numel);
    const double cpu_error = test::rel_error(cpu.grads.data() + p.offset, exact.grads.data() + p.offset, p.numel);
    EXPECT_LE(gpu_error, 3 * cpu_error + 1e-6) << p.name << ": the CPU's fp32 is " << cpu_error << " from fp64";
    if (gpu_error / cpu_error > worst_ratio) worst_ratio = gpu_error / cpu_error, worst_name = p.name;
  }
  EXPECT_EQ(std::memcmp(&again.loss.loss_sum, &gpu.loss.loss_sum, sizeof(double)), 0) << "loss repeats";
  test::expect_bitwise(again.grads, gpu.grads, "small fp32: gradients repeat");
  std::printf("small fp32: loss %.9g (GPU) vs %.9g (CPU) vs %.12g (fp64); worst GPU/CPU distance to fp64 %.3g in %s\n",
              gpu.loss.loss_sum, cpu.loss.loss_sum, exact.loss.loss_sum, worst_ratio, worst_name.c_str());
}

TEST(CudaModel, SmallStepMatchesTheCpuFp64) {
  LLAMA4D_REQUIRE_GPU();
  expect_gpu_step_matches_cpu<double>(LlamaConfig::preset("small"), 2, 128, "small fp64");
}

}  // namespace
}  // namespace llama4d
