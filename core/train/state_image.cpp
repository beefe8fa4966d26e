#include "core/train/state_image.h"

#include <cmath>

#include "core/error.h"

namespace llama4d {

int64_t StateMoves::total_moved() const {
  int64_t s = 0;
  for (int64_t b : bytes_moved) s += b;
  return s;
}

int64_t StateMoves::total_read() const {
  int64_t s = 0;
  for (int64_t b : bytes_read) s += b;
  return s;
}

template <class T>
void TrainingStateImage<T>::create(const LlamaConfig& cfg, int64_t optimizer_steps, int64_t steps_done,
                                   const TrainOptions& options) {
  config_ = cfg, optimizer_steps_ = optimizer_steps, steps_done_ = steps_done, options_ = options;
  tensors_.clear();
  // The whole tensors, as the files hold them, whatever slices the ranks that fill them have.
  for (const ParamSpec& s : llama_param_specs(cfg)) {
    const size_t n = size_t(s.whole_numel());
    for (const std::string& key : {"model/" + s.name, "optimizer/exp_avg." + s.name, "optimizer/exp_avg_sq." + s.name})
      tensors_[key] = Tensor{std::vector<T>(n, T(0)), std::vector<int32_t>(n, -1)};
  }
  std::lock_guard<std::mutex> lock(mutex_);
  moves_ = StateMoves{};
  created_ = true;
}

template <class T>
typename TrainingStateImage<T>::Tensor& TrainingStateImage<T>::find(const std::string& key) {
  return const_cast<Tensor&>(static_cast<const TrainingStateImage&>(*this).find(key));
}

template <class T>
const typename TrainingStateImage<T>::Tensor& TrainingStateImage<T>::find(const std::string& key) const {
  const auto it = tensors_.find(key);
  if (it == tensors_.end()) throw InputError("training state image has no tensor '" + key + "'");
  return it->second;
}

namespace {
void check_flat_range(const std::vector<ParamSpec>& specs, int64_t begin, int64_t end, const char* verb) {
  const int64_t total = flat_numel(specs);
  if (begin < 0 || begin > end || end > total)
    throw InputError(std::string("training state image: cannot ") + verb + " flat elements [" +
                     std::to_string(begin) + ", " + std::to_string(end) + ") of " + std::to_string(total) +
                     " parameters");
}
}  // namespace

template <class T>
void TrainingStateImage<T>::write(int rank, const std::string& file, const std::vector<ParamSpec>& specs,
                                  int64_t begin, int64_t end, const T* data, const std::string& prefix) {
  if (!created_) throw Error("training state image written before create()");
  check_flat_range(specs, begin, end, "write");
  // Only the elements this rank counts: replicas (tensor-parallel RMSNorm gains, shared KV
  // heads) are another rank's to write, so every element has exactly one writer.
  for (const SpecOverlap& p : overlapping_specs(specs, begin, end)) {
    const ParamSpec& s = *p.spec;
    Tensor& t = find(file + "/" + prefix + s.name);
    const int64_t lo = std::max(p.lo - s.offset, s.counted_begin), hi = std::min(p.hi - s.offset, s.counted_hi());
    for_each_whole_run(s, lo, hi, [&](int64_t at, int64_t whole, int64_t n) {
      const T* from = data + (s.offset + at - begin);
      for (int64_t i = 0; i < n; ++i) {
        t.data[size_t(whole + i)] = from[i];
        t.writer[size_t(whole + i)] = rank;
      }
    });
  }
}

template <class T>
void TrainingStateImage<T>::read(int rank, const std::string& file, const std::vector<ParamSpec>& specs,
                                 int64_t begin, int64_t end, T* out, const std::string& prefix) const {
  if (!created_) throw InputError("training state image is empty (nothing was saved into it)");
  check_flat_range(specs, begin, end, "read");
  int64_t moved = 0, read = 0;
  for (const SpecOverlap& p : overlapping_specs(specs, begin, end)) {
    const ParamSpec& s = *p.spec;
    const std::string key = file + "/" + prefix + s.name;
    const Tensor& t = find(key);
    for_each_whole_run(s, p.lo - s.offset, p.hi - s.offset, [&](int64_t at, int64_t whole, int64_t n) {
      T* to = out + (s.offset + at - begin);
      for (int64_t i = 0; i < n; ++i) {
        const T x = t.data[size_t(whole + i)];
        if (!std::isfinite(x))
          throw InputError("training state image: tensor '" + prefix + s.name + "' holds " +
                           (std::isnan(x) ? "NaN" : "inf") + " at element " + std::to_string(whole + i));
        to[i] = x;
        if (t.writer[size_t(whole + i)] != rank) ++moved;
      }
      read += n;
    });
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (moves_.bytes_moved.size() <= size_t(rank)) {
    moves_.bytes_moved.resize(size_t(rank) + 1, 0);
    moves_.bytes_read.resize(size_t(rank) + 1, 0);
  }
  moves_.bytes_moved[size_t(rank)] += moved * int64_t(sizeof(T));
  moves_.bytes_read[size_t(rank)] += read * int64_t(sizeof(T));
}

template <class T>
const std::vector<T>& TrainingStateImage<T>::tensor(const std::string& file, const std::string& name) const {
  return find(file + "/" + name).data;
}

template <class T>
StateShard<T> TrainingStateImage<T>::written_by(int rank, bool with_data) const {
  StateShard<T> shard;
  for (const auto& [key, t] : tensors_)
    for (size_t i = 0; i < t.writer.size();) {
      if (t.writer[i] != rank) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < t.writer.size() && t.writer[j] == rank) ++j;
      shard.runs.push_back({key, int64_t(i), int64_t(j - i)});
      if (with_data) shard.data.insert(shard.data.end(), t.data.begin() + int64_t(i), t.data.begin() + int64_t(j));
      i = j;
    }
  if (!with_data) {
    int64_t n = 0;
    for (const auto& r : shard.runs) n += r.count;
    shard.data.resize(size_t(n));
  }
  return shard;
}

template <class T>
void TrainingStateImage<T>::put(int rank, const StateShard<T>& shard) {
  if (!created_) throw Error("training state image: put() before create()");
  size_t at = 0;
  for (const auto& r : shard.runs) {
    Tensor& t = find(r.key);
    if (r.begin < 0 || r.count < 0 || size_t(r.begin + r.count) > t.data.size() || at + size_t(r.count) > shard.data.size())
      throw InputError("training state image: a shard's run [" + std::to_string(r.begin) + ", " +
                       std::to_string(r.begin + r.count) + ") lies outside tensor '" + r.key + "'");
    for (int64_t i = 0; i < r.count; ++i) {
      t.data[size_t(r.begin + i)] = shard.data[at + size_t(i)];
      t.writer[size_t(r.begin + i)] = rank;
    }
    at += size_t(r.count);
  }
}

template <class T>
void TrainingStateImage<T>::release() {
  tensors_.clear();
}

template <class T>
StateMoves TrainingStateImage<T>::moves() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return moves_;
}

template <class T>
int64_t TrainingStateImage<T>::bytes() const {
  int64_t n = 0;
  for (const auto& [key, t] : tensors_) n += int64_t(t.data.size() * sizeof(T));
  return n;
}

template struct StateShard<float>;
template struct StateShard<double>;
template class TrainingStateImage<float>;
template class TrainingStateImage<double>;

}  // namespace llama4d
