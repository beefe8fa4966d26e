#pragma once
// Timing a square fp32 GEMM, shared by the backends' peak probe (ops::measure_peak_gemm_flops)
// and bench's reference BLAS, so both time the same operands the same way.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace llama4d {

// a and b of an n x n x n product, deterministic values in [-1, 1): the rate does not depend on
// them, only denormals would.
struct GemmTimingOperands {
  explicit GemmTimingOperands(int64_t n) : n(n) {
    if (n < 1) throw InputError("GEMM size must be at least 1, got " + std::to_string(n));
    const size_t count = static_cast<size_t>(n * n);
    a.resize(count), b.resize(count), c.resize(count);
    uint32_t state = 12345u;
    for (size_t i = 0; i < count; ++i) {
      state = state * 1664525u + 1013904223u;
      a[i] = static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
      state = state * 1664525u + 1013904223u;
      b[i] = static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
    }
  }
  double flops() const { return 2.0 * double(n) * double(n) * double(n); }
  int64_t n;
  std::vector<float> a, b, c;
};

// Runs `product` once to warm up (caches, thread pools), then repeatedly for about `seconds`,
// and returns the best FLOP/s seen.
template <class F>
double best_gemm_rate(const GemmTimingOperands& g, double seconds, F&& product) {
  if (!(seconds >= 0)) throw InputError("GEMM timing budget must be >= 0 seconds");
  using Clock = std::chrono::steady_clock;
  product();
  double best = 0;
  const auto start = Clock::now();
  do {
    const auto t0 = Clock::now();
    product();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (dt > 0) best = std::max(best, g.flops() / dt);
  } while (std::chrono::duration<double>(Clock::now() - start).count() < seconds);
  return best;
}

}  // namespace llama4d
