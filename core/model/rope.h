#pragma once
// Rotary position embedding tables: cos/sin[max_pos, hd/2] for the rotate-half convention.
// Frequencies are computed in double and rounded once to T, so the fp32 and fp64 models see
// the same angles up to rounding.
#include <cstdint>
#include <vector>

#include "core/model/config.h"
#include "core/tensor/backend_array.h"

namespace llama4d {

// inv_freq[i] = theta^(-2i/hd) for i in [0, hd/2), then Llama 3.1's rope_scaling if present:
// long wavelengths (> original_max_position_embeddings / low_freq_factor) are slowed by
// `factor`, short ones (< original / high_freq_factor) are kept, and the band in between is
// interpolated smoothly. (Llama 3.1 model card / HF `rope_type: "llama3"`.)
std::vector<double> rope_inverse_frequencies(const LlamaConfig& cfg);

// The tables live in the compute backend's memory, which the rope kernels read (on a GPU, not
// the host's heap); made when the model is, so after the backend is chosen.
template <class T>
struct RopeTables {
  int64_t max_pos = 0, half = 0;  // half = hd / 2
  BackendArray<T> cos, sin;       // [max_pos, half]
};

template <class T>
RopeTables<T> make_rope_tables(const LlamaConfig& cfg, int64_t max_pos);

}  // namespace llama4d
