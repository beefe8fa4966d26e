#pragma once
// Helpers for the op tests: random inputs, central finite differences and error measures.
// Every gradient test uses the scalar objective L = sum(dout * out) with a random dout, so the
// backward called with that dout must return dL/dinput, which finite differences estimate
// independently of the code under test.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "core/ops.h"

namespace llama4d::test {

// Uniform values in [lo, hi), reproducible from the seed.
inline std::vector<double> random_vector(size_t n, uint64_t seed, double lo = -1.0,
                                         double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(gen);
  return v;
}

template <class T>
std::vector<T> cast_to(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  long double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<long double>(a[i]) * b[i];
  return static_cast<double>(s);
}

// Central finite-difference gradient of `objective` with respect to x, at the listed
// element indices (every element when `indices` is empty); other entries are 0.
// x is perturbed in place and restored.
inline std::vector<double> fd_gradient(const std::function<double()>& objective,
                                       std::vector<double>& x, std::vector<size_t> indices = {},
                                       double h = 1e-5) {
  if (indices.empty())
    for (size_t i = 0; i < x.size(); ++i) indices.push_back(i);
  std::vector<double> g(x.size(), 0.0);
  for (size_t i : indices) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = objective();
    x[i] = saved - h;
    const double down = objective();
    x[i] = saved;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

// A reproducible random subset of [0, n) of at most `count` indices (all when n <= count).
inline std::vector<size_t> sample_indices(size_t n, size_t count, uint64_t seed) {
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  if (n <= count) return all;
  std::mt19937_64 gen(seed);
  std::shuffle(all.begin(), all.end(), gen);
  all.resize(count);
  std::sort(all.begin(), all.end());
  return all;
}

// max |a - ref| / max |ref| (over `indices` when given): the tensor-level relative error.
template <class A>
double max_rel_error(const std::vector<A>& a, const std::vector<double>& ref,
                     const std::vector<size_t>& indices = {}) {
  double num = 0, den = 0;
  auto visit = [&](size_t i) {
    // A NaN is the largest error, not none (std::max would drop it).
    const double d = std::abs(static_cast<double>(a[i]) - ref[i]);
    num = std::isnan(d) ? HUGE_VAL : std::max(num, d);
    den = std::max(den, std::abs(ref[i]));
  };
  if (indices.empty()) {
    for (size_t i = 0; i < ref.size(); ++i) visit(i);
  } else {
    for (size_t i : indices) visit(i);
  }
  return num / std::max(den, 1e-300);
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](T x, T y) {
           return std::memcmp(&x, &y, sizeof(T)) == 0;
         });
}

// Runs `body` with the backend set to `threads` threads, then restores the previous count.
template <class F>
void with_threads(int threads, F&& body) {
  const int saved = ops::backend_threads();
  ops::set_backend_threads(threads);
  body();
  ops::set_backend_threads(saved);
}

}  // namespace llama4d::test
