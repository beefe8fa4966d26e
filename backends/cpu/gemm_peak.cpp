// Peak fp32 GEMM rate of this backend, the denominator of model FLOP utilisation. bf16 operands
// run the same GEMM (matmul.cpp), so their peak is measured the same way.
#include <algorithm>

#include "backends/cpu/cpu_kernels.h"
#include "core/gemm_timing.h"
#include "core/ops.h"

namespace llama4d::cpu {

double measure_peak_gemm_flops(int64_t n, double seconds, GemmOperands operands) {
  GemmTimingOperands g(n);
  float *a = g.a.data(), *b = g.b.data(), *c = g.c.data();
  // The three products of a linear layer, each timed for a third of the budget: out = inp @ W^T,
  // dinp += dout @ W, dW += dout^T @ inp. Their rates differ by what the kernel must repack.
  const double forward = best_gemm_rate(g, seconds / 3, [&] { cpu::matmul_forward<float>(c, a, b, n, n, n, operands); });
  const double input_grad = best_gemm_rate(g, seconds / 3, [&] {
    cpu::matmul_backward<float>(c, nullptr, a, nullptr, b, n, n, n, operands, GradWrite::add);
  });
  const double weight_grad = best_gemm_rate(g, seconds / 3, [&] {
    cpu::matmul_backward<float>(nullptr, c, a, b, nullptr, n, n, n, operands, GradWrite::add);
  });
  return std::max({forward, input_grad, weight_grad});
}

}  // namespace llama4d::cpu
