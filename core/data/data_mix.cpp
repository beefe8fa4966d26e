#include "core/data/data_mix.h"

#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/parse_number.h"

namespace llama4d {

std::vector<MixEntry> parse_mix(std::string_view text) {
  if (text.empty()) throw InputError("data mix is empty: expected PATH=WEIGHT items joined by ','");
  std::vector<MixEntry> entries;
  size_t at = 0;
  while (true) {
    const size_t comma = text.find(',', at);
    const std::string_view item = text.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
    const size_t eq = item.rfind('=');
    if (eq == std::string_view::npos || eq == 0) {
      throw InputError("data mix item '" + std::string(item) + "' is not PATH=WEIGHT");
    }
    MixEntry e;
    e.path = std::string(item.substr(0, eq));
    e.weight = parse_number<double>(item.substr(eq + 1), "data mix weight of " + e.path);
    if (!(e.weight > 0)) throw InputError("data mix weight of " + e.path + " must be > 0, got " + std::string(item.substr(eq + 1)));
    entries.push_back(std::move(e));
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  return entries;
}

DataMix::DataMix(std::vector<MixSource> sources, int64_t seq_len) : sources_(std::move(sources)), seq_len_(seq_len) {
  if (sources_.empty()) throw InputError("data mix has no sources");
  double total = 0;
  for (const MixSource& s : sources_) {
    if (!(s.weight > 0) || !std::isfinite(s.weight)) {
      throw InputError("data mix source " + s.name + " has weight " + std::to_string(s.weight) +
                       "; a weight must be > 0 and finite");
    }
    if (int64_t(s.split.size()) <= seq_len) {
      throw InputError("data mix source " + s.name + " has " + std::to_string(s.split.size()) +
                       " tokens, fewer than one window of seq_len + 1 = " + std::to_string(seq_len + 1));
    }
    total += s.weight;
  }
  double run = 0;
  for (const MixSource& s : sources_) {
    run += s.weight;
    cumulative_.push_back(run / total);
  }
  cumulative_.back() = 1.0;  // rounding must never leave a u in [sum, 1) without a source
}

std::vector<double> DataMix::shares() const {
  std::vector<double> out(sources_.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = cumulative_[i] - (i ? cumulative_[i - 1] : 0.0);
  return out;
}

int64_t DataMix::source_of(uint64_t seed, int64_t step, int64_t row) const {
  const double u = double(row_hash(seed ^ kMixSalt, step, row) >> 11) * 0x1.0p-53;  // [0, 1)
  for (size_t i = 0; i < cumulative_.size(); ++i) {
    if (u < cumulative_[i]) return int64_t(i);
  }
  return int64_t(cumulative_.size()) - 1;  // unreachable: the last cumulative is 1 > u
}

Batch DataMix::sample_rows(uint64_t seed, int64_t step, int64_t row_begin, int64_t row_end,
                           std::vector<int64_t>* drawn) const {
  if (row_begin < 0 || row_end < row_begin) {
    throw InputError("bad row range [" + std::to_string(row_begin) + ", " + std::to_string(row_end) + ")");
  }
  if (drawn) drawn->resize(sources_.size(), 0);
  Batch b;
  b.B = row_end - row_begin;
  b.seq = seq_len_;
  b.tokens.resize(size_t(b.B * b.seq));
  b.targets.resize(size_t(b.B * b.seq));
  for (int64_t i = 0; i < b.B; ++i) {
    const int64_t row = row_begin + i;
    const int64_t src = source_of(seed, step, row);
    const TokenSpan split = sources_[size_t(src)].split;
    const int32_t* from = split.data() + window_start(int64_t(split.size()), seq_len_, seed, step, row);
    std::copy(from, from + seq_len_, b.tokens.begin() + i * seq_len_);
    std::copy(from + 1, from + 1 + seq_len_, b.targets.begin() + i * seq_len_);
    if (drawn) ++(*drawn)[size_t(src)];
  }
  return b;
}

DataMix DataMix::upsampled(const std::string& name, double factor) const {
  if (!(factor > 0) || !std::isfinite(factor)) {
    throw InputError("upsampling factor for " + name + " must be > 0 and finite, got " + std::to_string(factor));
  }
  std::vector<MixSource> sources = sources_;
  bool found = false;
  for (MixSource& s : sources) {
    if (s.name == name) {
      s.weight *= factor;
      found = true;
    }
  }
  if (!found) throw InputError("data mix has no source named " + name + " to upsample");
  return DataMix(std::move(sources), seq_len_);
}

std::vector<double> drawn_shares(const std::vector<int64_t>& drawn) {
  const int64_t total = std::accumulate(drawn.begin(), drawn.end(), int64_t(0));
  std::vector<double> out(drawn.size(), 0.0);
  if (total == 0) return out;
  for (size_t i = 0; i < drawn.size(); ++i) out[i] = double(drawn[i]) / double(total);
  return out;
}

}  // namespace llama4d
