#pragma once
// Helpers shared by the CPU kernels (private to backends/cpu; the model never includes this).
//
// Determinism is a design rule here: later lessons prove that parallel strategies compute
// bitwise the same gradients as one device, so every kernel must give the same bits for the
// same inputs whatever the thread count, the buffer alignment or the split of a loop into
// SIMD body and scalar tail. Hence:
// - reductions use a fixed lane pattern (reduce_* below), never an order that depends on where
//   the first aligned element sits;
// - exp is written in plain arithmetic (exp_det) so a SIMD lane and a scalar tail perform the
//   same IEEE operations;
// - work is split so each output element is produced by one thread in a fixed order.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace llama4d::cpu {

// Runs f(i) for i in [0, n) on the OpenMP team when `parallel` is true. Static schedule:
// callers make every f(i) write disjoint outputs, so the split never changes results.
template <class F>
void parallel_for(int64_t n, bool parallel, F&& f) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel && n > 1)
#endif
  for (int64_t i = 0; i < n; ++i) f(i);
}

// Same with a dynamic schedule: for items of uneven cost (causal attention blocks) or few
// large ones (GEMM tiles), where a thread that is late (a busy machine) must not hold up the rest.
template <class F>
void parallel_for_dynamic(int64_t n, bool parallel, F&& f) {
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) if (parallel && n > 1)
#endif
  for (int64_t i = 0; i < n; ++i) f(i);
}

// Per-thread scratch memory that grows and is reused, so kernels called in a loop neither
// allocate nor zero-fill (and take no page faults) per call. `slot` separates the buffers one
// kernel needs at the same time. Contents are undefined on return.
template <class T>
T* scratch(int slot, int64_t count) {
  constexpr int kSlots = 8;
  thread_local std::vector<T> buffers[kSlots];
  std::vector<T>& buf = buffers[slot];
  if (static_cast<int64_t>(buf.size()) < count) {
    buf.clear();
    buf.shrink_to_fit();
    buf.resize(static_cast<size_t>(count));
  }
  return buf.data();
}

// Elementwise loops are cut into chunks this large (32 KiB of floats, an L1's worth): [2,048 x
// 288] is 72 chunks, enough for 16 threads. Loops shorter than kParallelElements stay on the
// calling thread, where a fork would cost more than the work. Elementwise results do not
// depend on either constant.
inline constexpr int64_t kElementChunk = 1 << 13;
inline constexpr int64_t kParallelElements = 1 << 15;

// Applies f(begin, end) over [0, n) in kElementChunk pieces, in parallel when n is large.
template <class F>
void parallel_chunks(int64_t n, F&& f) {
  const int64_t chunks = (n + kElementChunk - 1) / kElementChunk;
  parallel_for(chunks, n >= kParallelElements, [&](int64_t c) {
    const int64_t begin = c * kElementChunk;
    f(begin, std::min(n, begin + kElementChunk));
  });
}

// Fixed-pattern reductions. One 64-byte vector of lanes (16 floats / 8 doubles, one AVX-512
// register; GCC splits it on narrower ISAs) accumulates elements i = l (mod lanes) in lane l,
// and the lanes are then added in order. The pattern depends only on n, never on alignment.
template <class T>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(64)));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(64)));
};
template <class T>
using Vec64 = typename VecOf<T>::type;
template <class T>
inline constexpr int kLanes = static_cast<int>(64 / sizeof(T));

// Loads lanes from p; a tail shorter than a vector is padded with `fill`. (Vectors travel by
// reference: passing 64-byte vectors by value has a different ABI with and without AVX-512.)
template <class T>
inline void load_lanes(Vec64<T>& v, const T* p, int64_t count, T fill) {
  if (count >= kLanes<T>) {
    std::memcpy(&v, p, sizeof(v));
  } else {
    for (int l = 0; l < kLanes<T>; ++l) v[l] = l < count ? p[l] : fill;
  }
}

template <class T>
inline T sum_lanes(const Vec64<T>& v) {
  T s = 0;
  for (int l = 0; l < kLanes<T>; ++l) s += v[l];
  return s;
}

// sum_i a[i] * b[i]
template <class T>
inline T reduce_dot(const T* a, const T* b, int64_t n) {
  Vec64<T> acc = {}, va = {}, vb = {};
  for (int64_t i = 0; i < n; i += kLanes<T>) {
    load_lanes(va, a + i, n - i, T(0));
    load_lanes(vb, b + i, n - i, T(0));
    acc += va * vb;
  }
  return sum_lanes<T>(acc);
}

// sum_i a[i]
template <class T>
inline T reduce_sum(const T* a, int64_t n) {
  Vec64<T> acc = {}, va = {};
  for (int64_t i = 0; i < n; i += kLanes<T>) {
    load_lanes(va, a + i, n - i, T(0));
    acc += va;
  }
  return sum_lanes<T>(acc);
}

// max_i a[i] for n >= 1 (max is exact, so the order is irrelevant; lanes are for speed).
template <class T>
inline T reduce_max(const T* a, int64_t n) {
  Vec64<T> acc = {}, va = {};
  load_lanes(acc, a, n, a[0]);
  for (int64_t i = kLanes<T>; i < n; i += kLanes<T>) {
    load_lanes(va, a + i, n - i, a[0]);
    acc = va > acc ? va : acc;
  }
  T m = acc[0];
  for (int l = 1; l < kLanes<T>; ++l) m = acc[l] > m ? acc[l] : m;
  return m;
}

// exp(x) for x <= 88 (float) / 709 (double), results below the smallest normal flushed to 0.
// Cody-Waite reduction x = n ln2 + r with |r| <= ln2/2, then a Taylor polynomial (degree 7 for
// float, 13 for double: truncation error below half an ulp), scaled by 2^n built from bits.
// Plain arithmetic only, so loops calling it vectorise and every lane computes the same bits
// as the scalar tail (std::exp in a tail would differ from any SIMD exp in the last ulp).
inline float exp_det(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 split so n * kLn2Hi is exact (Cephes)
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr float kLow = -87.3f;         // exp(kLow) is just above FLT_MIN
  const float xc = std::min(std::max(x, kLow), 88.0f);
  const float t = xc * kLog2e + kShift;
  const float n = t - kShift;
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShift);
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float two_n = std::bit_cast<float>((ni + 127) << 23);
  return p * two_n * static_cast<float>(x >= kLow);  // arithmetic select: no branch to vectorise
}

inline double exp_det(double x) {
  constexpr double kLog2e = 1.4426950408889634074;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // fdlibm's split of ln 2
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kShift = 6755399441055744.0;  // 1.5 * 2^52
  constexpr double kLow = -708.0;                // exp(kLow) is just above DBL_MIN
  const double xc = std::min(std::max(x, kLow), 709.0);
  const double t = xc * kLog2e + kShift;
  const double n = t - kShift;
  const int64_t ni = std::bit_cast<int64_t>(t) - std::bit_cast<int64_t>(kShift);
  const double r = (xc - n * kLn2Hi) - n * kLn2Lo;
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const double two_n = std::bit_cast<double>((ni + 1023) << 52);
  return p * two_n * static_cast<double>(x >= kLow);
}

// dst[j] = exp(src[j] * a - c) for j < n (dst may equal src). Kept out of line so GCC sees a
// plain loop and vectorises it whatever the caller's surrounding control flow looks like.
template <class T>
[[gnu::noinline]] void exp_affine(T* dst, const T* src, int64_t n, T a, T c) {
  for (int64_t j = 0; j < n; ++j) dst[j] = exp_det(src[j] * a - c);
}

// sum_j exp(row[j] - m) for j < V. The exps go through a small buffer so the exp loop
// vectorises and the sum keeps the fixed lane pattern (j mod lanes).
template <class T>
T sum_exp_shifted(const T* row, int64_t V, T m) {
  constexpr int64_t kPiece = 256;  // a multiple of the lane count, so lanes stay j mod lanes
  T buf[kPiece];
  Vec64<T> acc = {}, v = {};
  for (int64_t j0 = 0; j0 < V; j0 += kPiece) {
    const int64_t n = std::min(kPiece, V - j0);
    exp_affine(buf, row + j0, n, T(1), m);
    for (int64_t j = 0; j < n; j += kLanes<T>) {
      load_lanes(v, buf + j, n - j, T(0));
      acc += v;
    }
  }
  return sum_lanes<T>(acc);
}

// drow[j] += scale * exp(row[j] - lse) for j < V: the softmax part of the cross-entropy gradient,
// a piece at a time so the probabilities are never stored.
template <class T>
void add_scaled_exp_shifted(T* drow, const T* row, int64_t V, T lse, T scale) {
  constexpr int64_t kPiece = 256;
  T buf[kPiece];
  for (int64_t j0 = 0; j0 < V; j0 += kPiece) {
    const int64_t n = std::min(kPiece, V - j0);
    exp_affine(buf, row + j0, n, T(1), lse);
    for (int64_t j = 0; j < n; ++j) drow[j0 + j] += scale * buf[j];
  }
}

}  // namespace llama4d::cpu
