#include "core/parallel/shard_layout.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace llama4d {

ShardLayout::ShardLayout(const std::vector<ParamSpec>& specs, int num_shards)
    : ShardLayout(param_segments(specs), num_shards) {}

ShardLayout::ShardLayout(std::vector<Segment> segments, int num_shards) : n_(num_shards), segments_(std::move(segments)) {
  if (num_shards < 1) throw InputError("number of shards must be >= 1");
  shard_offset_.assign(segments_.size(), std::vector<int64_t>(size_t(n_)));
  std::vector<int64_t> rank_offset(size_t(n_), 0);
  for (size_t s = 0; s < segments_.size(); ++s) {
    const int64_t len = segments_[s].numel();
    const int64_t even = (len + n_ - 1) / n_;
    piece_size_.push_back((even + kShardAlign - 1) / kShardAlign * kShardAlign);
    for (int r = 0; r < n_; ++r) {
      shard_offset_[s][size_t(r)] = rank_offset[size_t(r)];
      rank_offset[size_t(r)] += piece(s, r).numel();
    }
  }
}

Piece ShardLayout::piece(size_t seg, int rank) const {
  const Segment& s = segments_[seg];
  const int64_t S = piece_size_[seg];
  Piece p;
  p.begin = std::min(s.end, s.begin + rank * S);
  p.end = std::min(s.end, s.begin + (rank + 1) * S);
  p.shard_offset = shard_offset_.empty() ? 0 : shard_offset_[seg][size_t(rank)];
  return p;
}

int64_t ShardLayout::shard_numel(int rank) const {
  int64_t n = 0;
  for (size_t s = 0; s < segments_.size(); ++s) n += piece(s, rank).numel();
  return n;
}

std::vector<int64_t> ShardLayout::piece_counts(size_t seg) const {
  std::vector<int64_t> counts(static_cast<size_t>(n_));
  for (int r = 0; r < n_; ++r) counts[size_t(r)] = piece(seg, r).numel();
  return counts;
}

}  // namespace llama4d
