#pragma once
// How ZeRO / FSDP cut the flat parameter buffer into per-rank shards.
//
// The flat buffer is first split into SEGMENTS (core/optim/segmented_norm.h), the units FSDP
// gathers and frees together. Each segment [b, e) is cut into n equal PIECES of S elements, rank r owning [b + r*S, b + (r+1)*S)
// clipped to e (the last pieces come up short, or empty: that shortfall is the "padding" of
// FSDP, which pads instead):
//     S = ceil((e - b) / n) rounded up to a multiple of kShardAlign.
// Why the alignment: the gradient norm is summed in fixed chunks of kShardAlign elements from
// each segment's start (segmented_grad_sum_squares). Piece boundaries fall on chunk boundaries,
// so each rank computes exactly the chunk partials a single device computes, and gathering them
// in order reproduces the single-device norm bit for bit (needed for bitwise-equal clipping).
#include <cstdint>
#include <vector>

#include "core/model/params.h"
#include "core/optim/segmented_norm.h"

namespace llama4d {

// Pieces start on gradient-norm chunk boundaries (see above).
inline constexpr int64_t kShardAlign = kNormChunk;

struct Piece {
  int64_t begin = 0, end = 0;  // flat range (may be empty)
  int64_t shard_offset = 0;    // where it sits in its rank's shard buffer
  int64_t numel() const { return end - begin; }
};

class ShardLayout {
 public:
  ShardLayout(const std::vector<ParamSpec>& specs, int num_shards);
  // Segments as a rank holds them (a pipeline rank's are empty for the units it does not hold).
  ShardLayout(std::vector<Segment> segments, int num_shards);

  int num_shards() const { return n_; }
  const std::vector<Segment>& segments() const { return segments_; }
  int64_t piece_size(size_t seg) const { return piece_size_[seg]; }  // S of that segment
  Piece piece(size_t seg, int rank) const;
  // Elements rank r owns in all (its shard buffer length).
  int64_t shard_numel(int rank) const;
  // Elements of each rank's piece of `seg`, for reduce_scatter_v / all_gather_v.
  std::vector<int64_t> piece_counts(size_t seg) const;

 private:
  int n_;
  std::vector<Segment> segments_;
  std::vector<int64_t> piece_size_;
  std::vector<std::vector<int64_t>> shard_offset_;  // [segment][rank]
};

}  // namespace llama4d
