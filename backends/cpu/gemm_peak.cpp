// Peak fp32 GEMM rate of this backend, the denominator of model FLOP utilisation.
#include <chrono>
#include <string>
#include <vector>

#include "backends/cpu/cpu_common.h"
#include "core/error.h"
#include "core/ops.h"

namespace llama4d::ops {

double measure_peak_gemm_flops(int64_t n, double seconds) {
  if (n < 1) throw InputError("GEMM size must be at least 1, got " + std::to_string(n));
  if (!(seconds >= 0)) throw InputError("GEMM timing budget must be >= 0 seconds");
  const size_t count = static_cast<size_t>(n * n);
  std::vector<float> a(count), b(count), c(count);
  // Deterministic values in [-1, 1): the rate does not depend on them, only denormals would.
  uint32_t state = 12345u;
  for (size_t i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    a[i] = static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
    state = state * 1664525u + 1013904223u;
    b[i] = static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
  }
  using Clock = std::chrono::steady_clock;
  const double flops =
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  // The exact product the model runs for a linear layer: out = inp @ weight^T.
  matmul_forward<float>(c.data(), a.data(), b.data(), n, n, n);  // warm-up (caches, threads)
  double best = 0;
  const auto start = Clock::now();
  do {
    const auto t0 = Clock::now();
    matmul_forward<float>(c.data(), a.data(), b.data(), n, n, n);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (dt > 0) best = std::max(best, flops / dt);
  } while (std::chrono::duration<double>(Clock::now() - start).count() < seconds);
  return best;
}

}  // namespace llama4d::ops
