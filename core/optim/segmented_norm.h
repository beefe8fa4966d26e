#pragma once
// The gradient norm every strategy computes in the same order, so clipping is bitwise equal
// whether the gradient lives on one rank or in shards.
//
// The flat parameter buffer (core/model/params.h) is split into SEGMENTS, one per model unit
// (core/model/units.h): [embedding], [layer 0], ..., [layer L-1], [final norm + LM head]. The
// sum of squares is taken in chunks of kNormChunk elements counted from each segment's start;
// chunk partials are added in segment order, then chunk order. A shard that starts on a chunk
// boundary (core/parallel/shard_layout.h guarantees it) computes exactly the partials a single
// device does, so gathering them in order reproduces the single-device norm bit for bit.
#include <cstdint>
#include <vector>

#include "core/model/params.h"

namespace llama4d {

// 512: small enough that a shard boundary costs little padding, large enough that the partials
// are few (one double per 2 KiB of fp32 gradient).
inline constexpr int64_t kNormChunk = 512;

struct Segment {
  int64_t begin = 0, end = 0;  // [begin, end) of the flat buffer
  int unit = 0;                // the model unit owning it (segment index == unit index)
  int64_t numel() const { return end - begin; }
};

// [embedding], layers in order, [everything after the last layer].
std::vector<Segment> param_segments(const std::vector<ParamSpec>& specs);

// Number of partials append_chunk_partials writes for numel elements.
constexpr int64_t num_chunk_partials(int64_t numel) { return (numel + kNormChunk - 1) / kNormChunk; }

// Appends the chunk partials of g[numel] (g at a chunk boundary): one double per kNormChunk elements.
template <class T>
void append_chunk_partials(std::vector<double>& out, const T* g, int64_t numel);

// Tensor parallelism: the sum of squares of the elements of flat [begin, end) (g[end - begin] their
// gradient) that this rank does not count because another tensor-parallel rank holds the same
// values and counts them (ParamSpec::counted_begin/end: RMSNorm gains, replicated key/value
// heads). A rank subtracts it from its sum before the group adds up; 0 without slicing.
template <class T>
double replica_sum_squares(const std::vector<ParamSpec>& specs, int64_t begin, int64_t end, const T* g);

// Sum of squares of a full flat gradient buffer in the canonical order described above.
template <class T>
double segmented_grad_sum_squares(const std::vector<Segment>& segments, const T* flat_grads);

}  // namespace llama4d
