#include "core/model/rope.h"

#include <cmath>
#include <numbers>

namespace llama4d {

std::vector<double> rope_inverse_frequencies(const LlamaConfig& cfg) {
  const int64_t half = cfg.head_dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[size_t(i)] = 1.0 / std::pow(cfg.rope_theta, double(2 * i) / double(cfg.head_dim));
  if (!cfg.rope_scaling) return inv_freq;

  const RopeScaling& s = *cfg.rope_scaling;
  const double old_len = double(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_len / s.low_freq_factor;    // longer than this: slow down
  const double high_freq_wavelen = old_len / s.high_freq_factor;  // shorter than this: keep
  for (double& f : inv_freq) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_freq_wavelen) {
      f = f / s.factor;
    } else if (wavelen >= high_freq_wavelen) {
      // Between the two: blend the scaled and unscaled frequency by how many full turns the
      // original context holds at this wavelength.
      const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1.0 - smooth) * f / s.factor + smooth * f;
    }
  }
  return inv_freq;
}

template <class T>
RopeTables<T> make_rope_tables(const LlamaConfig& cfg, int64_t max_pos) {
  RopeTables<T> t;
  t.max_pos = max_pos;
  t.half = cfg.head_dim / 2;
  const std::vector<double> inv_freq = rope_inverse_frequencies(cfg);
  std::vector<T> cos(size_t(max_pos * t.half)), sin(cos.size());
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < t.half; ++i) {
      const double angle = double(p) * inv_freq[size_t(i)];
      cos[size_t(p * t.half + i)] = T(std::cos(angle));
      sin[size_t(p * t.half + i)] = T(std::sin(angle));
    }
  t.cos = BackendArray<T>(cos), t.sin = BackendArray<T>(sin);  // where the rope kernels read them
  return t;
}

template RopeTables<float> make_rope_tables<float>(const LlamaConfig&, int64_t);
template RopeTables<double> make_rope_tables<double>(const LlamaConfig&, int64_t);

}  // namespace llama4d
