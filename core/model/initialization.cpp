#include "core/model/initialization.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <thread>
#include <vector>

#include "core/ops.h"

namespace llama4d {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// splitmix64: its k-th output depends only on seed + k * golden, so draw j of a stream can be
// computed without drawing the j before it (what sharded initialisation needs).
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += kGolden);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Standard normal draw j of the stream `seed` by Box-Muller over outputs 2j+1 and 2j+2
// (std::normal_distribution is implementation-defined; we want the same weights everywhere).
double normal_draw(uint64_t seed, int64_t j) {
  uint64_t state = seed + uint64_t(2 * j) * kGolden;
  const double u1 = (double(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = double(splitmix64(state) >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}


// Elements [begin, end) of the flat parameter buffer into out[0, end - begin).
template <class T>
void draw_range(const std::vector<ParamSpec>& specs, uint64_t seed, int64_t begin, int64_t end, T* out) {
  // Draw j of a matrix is the one its element j of the WHOLE tensor gets on one device, so a
  // tensor-parallel slice, or a pipeline rank's stages, hold exactly the values of that part of the model.
  for (const ParamSpec& p : specs) {
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    const bool gain = p.shape.size() == 1;  // RMSNorm gains start at 1 and draw nothing
    if (lo < hi)
      for_each_whole_run(p, lo - p.offset, hi - p.offset, [&](int64_t at, int64_t whole, int64_t n) {
        for (int64_t i = 0; i < n; ++i)
          out[p.offset + at + i - begin] = gain ? T(1) : T(0.02 * normal_draw(seed, p.first_draw + whole + i));
      });
  }
}

// Elements per host thread at least: a draw costs about 20 ns (a log, a cosine and a square
// root), so a piece takes a few milliseconds, well above starting a thread.
constexpr int64_t kDrawsPerThread = int64_t(1) << 16;

}  // namespace

template <class T>
void init_param_values(const std::vector<ParamSpec>& specs, uint64_t seed, int64_t begin, int64_t end, T* out) {
  // Every element is drawn from its own index alone, so contiguous pieces on the calling thread's
  // compute threads give the same values as one thread. That helps a rank that owns several
  // cores (one-device training, bench, a replay): `medium`'s 91M draws took 1.5 s on one core
  // here. Virtual GPUs that share the cores draw on one thread each.
  const int64_t n = std::max<int64_t>(end - begin, 0);
  const int64_t threads = std::clamp<int64_t>(n / kDrawsPerThread, 1, ops::backend_threads());
  if (threads == 1) return draw_range(specs, seed, begin, end, out);
  const int64_t piece = (n + threads - 1) / threads;
  std::vector<std::jthread> team;  // joined when this returns, or if starting one throws
  team.reserve(size_t(threads - 1));
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t lo = begin + t * piece, hi = std::min(end, lo + piece);
    if (lo < hi) team.emplace_back([&specs, seed, lo, hi, out, begin] { draw_range(specs, seed, lo, hi, out + (lo - begin)); });
  }
  draw_range(specs, seed, begin, std::min(end, begin + piece), out);
}

template <class T>
void init_param_device_values(const std::vector<ParamSpec>& specs, uint64_t seed, int64_t begin, int64_t end,
                              T* device_out) {
  constexpr int64_t kChunk = int64_t(1) << 20;  // host staging: 4-8 MiB at a time
  std::vector<T> host(size_t(std::min(kChunk, std::max<int64_t>(end - begin, 0))));
  for (int64_t b = begin; b < end; b += kChunk) {
    const int64_t e = std::min(end, b + kChunk);
    init_param_values(specs, seed, b, e, host.data());
    ops::device_memcpy(device_out + (b - begin), host.data(), (e - b) * int64_t(sizeof(T)));
  }
}

#define LLAMA4D_INIT(T)                                                                                   \
  template void init_param_values<T>(const std::vector<ParamSpec>&, uint64_t, int64_t, int64_t, T*); \
  template void init_param_device_values<T>(const std::vector<ParamSpec>&, uint64_t, int64_t, int64_t, T*);
LLAMA4D_INIT(float)
LLAMA4D_INIT(double)
#undef LLAMA4D_INIT

}  // namespace llama4d
