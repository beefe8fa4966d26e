#pragma once
// The model's initial weights, a pure function of the seed and each element's place in the whole
// model: matrices ~ N(0, 0.02), RMSNorm gains = 1. Draw j of the generator can be computed
// directly (splitmix64 is counter-based), so any range of the flat buffer, a tensor-parallel
// slice's or a ZeRO-3 piece's, gets exactly the values one device gives those elements.
#include <cstdint>
#include <vector>

#include "core/model/params.h"

namespace llama4d {

// Flat elements [begin, end) of the buffer `specs` describes, into host memory out[end - begin].
template <class T>
void init_param_values(const std::vector<ParamSpec>& specs, uint64_t seed, int64_t begin, int64_t end, T* out);

// The same into device memory (staged through the host in chunks, so the generator stays one
// host function whatever the backend).
template <class T>
void init_param_device_values(const std::vector<ParamSpec>& specs, uint64_t seed, int64_t begin, int64_t end,
                              T* device_out);

}  // namespace llama4d
