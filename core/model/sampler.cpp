#include "core/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace llama4d {

Sampler::Sampler(const SamplerOptions& opt) : opt_(opt), state_(opt.seed) {
  if (!(opt.temperature >= 0) || !std::isfinite(opt.temperature)) throw InputError("--temperature must be >= 0");
  if (!(opt.top_p > 0 && opt.top_p <= 1)) throw InputError("--top-p must lie in (0, 1]");
}

double Sampler::uniform() {
  // splitmix64 step; the top 53 bits give a double in [0, 1).
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

int32_t Sampler::next(std::span<const float> logits, int64_t allowed_vocab) {
  const int64_t V = std::min<int64_t>(int64_t(logits.size()), allowed_vocab);
  if (V < 1) throw InputError("sampler: empty vocabulary");
  if (opt_.temperature == 0.0)
    return int32_t(std::max_element(logits.begin(), logits.begin() + V) - logits.begin());

  // Softmax at temperature, in double.
  const double mx = *std::max_element(logits.begin(), logits.begin() + V);
  std::vector<double> p(static_cast<size_t>(V));
  double total = 0;
  for (int64_t i = 0; i < V; ++i) total += p[size_t(i)] = std::exp((double(logits[size_t(i)]) - mx) / opt_.temperature);
  // Nucleus: sort by probability, keep the head whose mass reaches top_p, renormalise.
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
  double kept = 0;
  size_t n_keep = 0;
  while (n_keep < order.size() && kept < opt_.top_p * total) kept += p[size_t(order[n_keep++])];
  double r = uniform() * kept;
  for (size_t i = 0; i < n_keep; ++i) {
    r -= p[size_t(order[i])];
    if (r < 0) return order[i];
  }
  return order[n_keep - 1];
}

}  // namespace llama4d
