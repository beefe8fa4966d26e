// Buffer and vector ops: fills, copies, axpy, chunked sums of squares, the loss sum, bf16 rounding
// and conversion, and the finiteness check. Compiled with -ffp-contract=off (see CMakeLists.txt):
// a*b+c is never fused, so SIMD body and scalar tail round alike and the sums match core/optim's
// bit for bit.
#include <algorithm>
#include <cstring>
#include <string>

#include "backends/cpu/cpu_common.h"
#include "backends/cpu/cpu_kernels.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/tensor/bf16_rounding.h"
#include "core/tensor/dtype.h"

namespace llama4d::cpu {

template <class T>
void fill(T* x, T value, int64_t N) {
  cpu::parallel_chunks(N, [&](int64_t begin, int64_t end) { std::fill(x + begin, x + end, value); });
}

template <class T>
void copy(T* dst, const T* src, int64_t N) {
  cpu::parallel_chunks(N, [&](int64_t begin, int64_t end) {
    std::memcpy(dst + begin, src + begin, sizeof(T) * static_cast<size_t>(end - begin));
  });
}

template <class T>
void add_scaled(T* y, const T* x, T a, int64_t N) {
  cpu::parallel_chunks(N, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) y[i] += a * x[i];
  });
}

// Eight interleaved double accumulators, added lane 0 first: the order ops.h documents, which
// the sharded gradient norm (core/optim/segmented_norm.h) reproduces from any shard.
template <class T>
[[gnu::noinline]] static double chunk_squares(const T* x, int64_t n) {
  constexpr int64_t kLanes = 8;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) {
      const double v = static_cast<double>(x[i + j]);
      lane[j] += v * v;
    }
  for (int64_t j = 0; i < n; ++i, ++j) {
    const double v = static_cast<double>(x[i]);
    lane[j] += v * v;
  }
  double s = 0.0;
  for (int64_t j = 0; j < kLanes; ++j) s += lane[j];
  return s;
}

template <class T>
void sum_squares_chunks(double* partials, const T* x, int64_t N, int64_t chunk) {
  if (chunk <= 0) throw InputError("sum_squares_chunks: chunk must be > 0, got " + std::to_string(chunk));
  const int64_t chunks = (N + chunk - 1) / chunk;
  // Each partial is one thread's whole job, so the split never changes a bit.
  cpu::parallel_for(chunks, N >= cpu::kElementChunk, [&](int64_t k) {
    const int64_t begin = k * chunk;
    partials[k] = chunk_squares(x + begin, std::min(chunk, N - begin));
  });
}

// Serial on purpose: BT is a few thousand rows and the row order is the contract.
template <class T>
void sum_losses(double* loss_sum, int64_t* count, const T* losses, const int32_t* targets,
                int64_t BT) {
  double sum = 0.0;
  int64_t n = 0;
  for (int64_t i = 0; i < BT; ++i)
    if (targets[i] >= 0) {
      sum += static_cast<double>(losses[i]);
      ++n;
    }
  *loss_sum = sum;
  *count = n;
}

template <class T>
void round_to_bf16(T* x, int64_t N) {
  cpu::parallel_chunks(N, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] = nearest_bf16(x[i]);
  });
}

// The bf16 nearest x: rounded in T (nearest_bf16; a double is not rounded through a float), then
// narrowed to a float, which is exact, so float_to_bf16's rounding keeps it as it is.
template <class T>
bf16 bf16_of(T x) {
  return float_to_bf16(static_cast<float>(nearest_bf16(x)));
}

template <class T>
void to_bf16(bf16* out, const T* x, int64_t N) {
  cpu::parallel_chunks(N, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = bf16_of(x[i]);
  });
}

template <class T>
void from_bf16(T* y, const bf16* x, int64_t N, bool accumulate) {
  cpu::parallel_chunks(N, [&](int64_t begin, int64_t end) {
    if (accumulate)
      for (int64_t i = begin; i < end; ++i) y[i] += static_cast<T>(bf16_to_float(x[i]));
    else
      for (int64_t i = begin; i < end; ++i) y[i] = static_cast<T>(bf16_to_float(x[i]));
  });
}

// NaN and +-inf are exactly the values whose magnitude bits reach the all-ones exponent, so a
// max over integer magnitudes (which vectorises; isfinite in a loop does not) decides.
template <class T>
[[gnu::noinline]] static bool range_finite(const T* x, int64_t n) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  constexpr Bits kMagnitude = static_cast<Bits>(~Bits(0) >> 1);
  constexpr Bits kInf = sizeof(T) == 4 ? Bits(0x7f800000u) : Bits(0x7ff0000000000000ull);
  Bits largest = 0;
  for (int64_t i = 0; i < n; ++i) largest = std::max(largest, std::bit_cast<Bits>(x[i]) & kMagnitude);
  return largest < kInf;
}

template <class T>
bool all_finite(const T* x, int64_t N) {
  const int64_t chunks = (N + cpu::kElementChunk - 1) / cpu::kElementChunk;
  std::vector<unsigned char> ok(static_cast<size_t>(chunks));
  cpu::parallel_chunks(N, [&](int64_t begin, int64_t end) {
    ok[static_cast<size_t>(begin / cpu::kElementChunk)] = range_finite(x + begin, end - begin);
  });
  return std::all_of(ok.begin(), ok.end(), [](unsigned char f) { return f != 0; });
}

template void fill<float>(float*, float, int64_t);
template void fill<double>(double*, double, int64_t);
template void copy<float>(float*, const float*, int64_t);
template void copy<double>(double*, const double*, int64_t);
template void add_scaled<float>(float*, const float*, float, int64_t);
template void add_scaled<double>(double*, const double*, double, int64_t);
template void sum_squares_chunks<float>(double*, const float*, int64_t, int64_t);
template void sum_squares_chunks<double>(double*, const double*, int64_t, int64_t);
template void sum_losses<float>(double*, int64_t*, const float*, const int32_t*, int64_t);
template void sum_losses<double>(double*, int64_t*, const double*, const int32_t*, int64_t);
template void round_to_bf16<float>(float*, int64_t);
template void round_to_bf16<double>(double*, int64_t);
template void to_bf16<float>(bf16*, const float*, int64_t);
template void to_bf16<double>(bf16*, const double*, int64_t);
template void from_bf16<float>(float*, const bf16*, int64_t, bool);
template void from_bf16<double>(double*, const bf16*, int64_t, bool);
template bool all_finite<float>(const float*, int64_t);
template bool all_finite<double>(const double*, int64_t);

}  // namespace llama4d::cpu
