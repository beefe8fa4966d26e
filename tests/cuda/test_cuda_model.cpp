// The whole model on the GPU: the loss and every parameter's gradient of a forward and backward
// pass within the 1e-5 (fp32) of the CPU backend, on the test shape and on `small`, in
// bf16 mixed precision within bf16's rounding, and the same bits when the GPU repeats the step.
#include <gtest/gtest.h>

#include <cstdio>
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
  s.loss = m.forward(b.tokens.data(), b.targets.data(), b.B, b.T);
  m.backward(T(1) / T(s.loss.tokens));
  s.grads.resize(size_t(m.num_params()));
  ops::device_memcpy(s.grads.data(), m.grads(), m.num_params() * int64_t(sizeof(T)));
  return s;
}

// bf16: the same roundings on both devices, but the GPU sums its products in another order, so a
// rounding can land a whole bf16 step (2^-8) away. The bounds are those bf16 mixed precision is
// held to against fp64 (tests/model/bf16_compute_test.cpp); not yet measured on a GPU.
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

TEST(CudaModel, SmallStepMatchesTheCpuFp32) {
  LLAMA4D_REQUIRE_GPU();
  expect_gpu_step_matches_cpu<float>(LlamaConfig::preset("small"), 2, 128, "small fp32");
}

}  // namespace
}  // namespace llama4d
