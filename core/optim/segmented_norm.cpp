#include "core/optim/segmented_norm.h"

#include <algorithm>

#include "core/error.h"
#include "core/ops.h"
#include "core/optim/grad_clip.h"

namespace llama4d {

std::vector<Segment> param_segments(const std::vector<ParamSpec>& specs) {
  std::vector<Segment> segs;
  const int64_t total = specs.back().offset + specs.back().numel;
  int max_layer = -1;
  for (const ParamSpec& p : specs) max_layer = std::max(max_layer, p.layer);
  const ParamSpec& embed = find_param(specs, "model.embed_tokens.weight");
  segs.push_back({embed.offset, embed.offset + embed.numel, 0});
  for (int l = 0; l <= max_layer; ++l) {
    const ParamRange r = layer_param_range(specs, l);
    segs.push_back({r.begin, r.end, l + 1});
  }
  segs.push_back({segs.back().end, total, max_layer + 2});
  for (size_t i = 1; i < segs.size(); ++i)
    if (segs[i].begin != segs[i - 1].end) throw Error("param_segments: parameters are not laid out contiguously");
  return segs;
}

template <class T>
void append_chunk_partials(std::vector<double>& out, const T* g, int64_t numel) {
  const size_t at = out.size();
  out.resize(at + size_t(num_chunk_partials(numel)));
  ops::sum_squares_chunks(out.data() + at, g, numel, kNormChunk);
}

template <class T>
double segmented_grad_sum_squares(const std::vector<Segment>& segments, const T* flat_grads) {
  std::vector<double> partials;
  for (const Segment& s : segments) append_chunk_partials(partials, flat_grads + s.begin, s.numel());
  return combine_chunk_sums(partials.data(), int64_t(partials.size()));
}

template <class T>
double replica_sum_squares(const std::vector<ParamSpec>& specs, int64_t begin, int64_t end, const T* g) {
  double total = 0;
  for (const SpecOverlap& o : overlapping_specs(specs, begin, end)) {
    const ParamSpec& p = *o.spec;
    // Replicas are the slice's elements outside [counted_begin, counted_hi()): two flat ranges.
    const std::pair<int64_t, int64_t> replicas[] = {{p.offset, p.offset + p.counted_begin},
                                                    {p.offset + p.counted_hi(), p.offset + p.numel}};
    for (const auto& [rb, re] : replicas) {
      const int64_t lo = std::max(rb, o.lo), hi = std::min(re, o.hi);
      if (lo >= hi) continue;
      double partial = 0;
      ops::sum_squares_chunks(&partial, g + (lo - begin), hi - lo, hi - lo);
      total += partial;
    }
  }
  return total;
}

template void append_chunk_partials<float>(std::vector<double>&, const float*, int64_t);
template void append_chunk_partials<double>(std::vector<double>&, const double*, int64_t);
template double replica_sum_squares<float>(const std::vector<ParamSpec>&, int64_t, int64_t, const float*);
template double replica_sum_squares<double>(const std::vector<ParamSpec>&, int64_t, int64_t, const double*);
template double segmented_grad_sum_squares<float>(const std::vector<Segment>&, const float*);
template double segmented_grad_sum_squares<double>(const std::vector<Segment>&, const double*);

}  // namespace llama4d
