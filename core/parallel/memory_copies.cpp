#include "core/parallel/memory_copies.h"

#include <algorithm>

#include "core/comm/traffic_labels.h"
#include "core/error.h"

namespace llama4d {

template <class T>
MemoryCopies<T>::MemoryCopies(int ranks, int gpus_per_node, int64_t every)
    : ranks_(ranks), gpus_per_node_(gpus_per_node), every_(every), holders_(size_t(std::max(ranks, 0))) {
  if (every < 1) throw InputError("--memory-copy-every must be >= 1 step, got " + std::to_string(every));
  if (gpus_per_node < 1) throw InputError("--gpus-per-node must be >= 1, got " + std::to_string(gpus_per_node));
  if (ranks % gpus_per_node != 0)
    throw InputError("in-memory copies: " + std::to_string(ranks) + " ranks are not a whole number of nodes of " +
                     std::to_string(gpus_per_node) + " (--gpus-per-node)");
  if (ranks / gpus_per_node < 2)
    throw InputError("in-memory copies: the replica group of 2 must span 2 nodes, but " + std::to_string(ranks) +
                     " ranks at " + std::to_string(gpus_per_node) + " per node (--gpus-per-node) make " +
                     std::to_string(ranks / gpus_per_node) + " node");
}

template <class T>
void MemoryCopies<T>::take(ParallelTrainer<T>& trainer, ProcessGroup& world) {
  if (world.size() != ranks_)
    throw Error("in-memory copies laid out for " + std::to_string(ranks_) + " ranks, taken on " +
                std::to_string(world.size()));
  trainer.save_state(scratch_);  // collective: every rank has written its shard on return
  const int r = world.rank();
  Copy c;
  c.steps_done = scratch_.steps_done();
  c.optimizer_steps = scratch_.optimizer_steps();
  c.cfg = scratch_.config();
  c.options = scratch_.options();
  c.own = scratch_.written_by(r);
  c.partners = scratch_.written_by(previous(r), /*with_data=*/false);
  // Sends are buffered (they never wait for the receiver), so send-then-recv cannot deadlock.
  const SendOptions so{.label = std::string(label::kInMemoryCopy)};
  const RecvOptions ro{.label = std::string(label::kInMemoryCopy)};
  if (!c.own.data.empty()) world.send(c.own.data.data(), int64_t(c.own.data.size()), dtype_of<T>(), partner(r), so)->wait();
  if (!c.partners.data.empty())
    world.recv(c.partners.data.data(), int64_t(c.partners.data.size()), dtype_of<T>(), previous(r), ro)->wait();
  // Kept before the closing collective: a peer may fail the job while this rank waits in it.
  Holder& h = holders_[size_t(r)];
  h.previous = std::move(h.newest);
  h.newest = std::move(c);
  h.alive = true;
  if (r == 0) last_taken_ = h.newest.steps_done;
  // Once every rank arrived nobody reads the laid-out copy any more: rank 0 frees it.
  int32_t done = 1;
  AllReduceOptions b{.label = std::string(label::kInMemoryCopyTaken)};
  world.all_reduce(&done, 1, DType::i32, ReduceOp::min, b)->wait();
  if (r == 0) scratch_.release();
}

template <class T>
const typename MemoryCopies<T>::Copy* MemoryCopies<T>::copy_at(int holder, int64_t steps) const {
  const Holder& h = holders_[size_t(holder)];
  if (!h.alive) return nullptr;
  if (h.newest.steps_done == steps) return &h.newest;
  if (h.previous.steps_done == steps) return &h.previous;
  return nullptr;
}

template <class T>
const StateShard<T>* MemoryCopies<T>::shard(int r, int64_t steps) const {
  if (const Copy* c = copy_at(r, steps)) return &c->own;
  if (const Copy* c = copy_at(partner(r), steps)) return &c->partners;
  return nullptr;
}

template <class T>
int64_t MemoryCopies<T>::step() const {
  // Candidates: every generation a living holder has, newest first.
  std::vector<int64_t> steps;
  for (const Holder& h : holders_)
    if (h.alive)
      for (int64_t s : {h.newest.steps_done, h.previous.steps_done})
        if (s >= 0) steps.push_back(s);
  std::sort(steps.rbegin(), steps.rend());
  for (int64_t s : steps) {
    bool whole = true;
    for (int r = 0; r < ranks_ && whole; ++r) whole = shard(r, s) != nullptr;
    if (whole) return s;
  }
  return 0;
}

template <class T>
void MemoryCopies<T>::lose(const std::vector<int>& ranks) {
  for (int r : ranks)
    if (r >= 0 && r < ranks_) holders_[size_t(r)] = Holder{};
}

template <class T>
void MemoryCopies<T>::lose_node(int node) {
  std::vector<int> ranks;
  for (int i = 0; i < gpus_per_node_; ++i) ranks.push_back(node * gpus_per_node_ + i);
  lose(ranks);
}

template <class T>
std::string MemoryCopies<T>::why_unrecoverable() const {
  const int64_t newest = last_taken_;
  if (newest < 0) return "no in-memory copy has been taken yet";
  if (step() > 0) return "";
  for (int r = 0; r < ranks_; ++r)
    if (!shard(r, newest)) {
      const int p = partner(r);
      return "the in-memory copy of rank " + std::to_string(r) + "'s shard (step " + std::to_string(newest) +
             ") is lost: it was held by rank " + std::to_string(r) + " (node " + std::to_string(node_of(r)) +
             ") and its partner rank " + std::to_string(p) + " (node " + std::to_string(node_of(p)) +
             "), and both failed";
    }
  return "no in-memory copy is whole";  // unreachable: a copy with every shard held is whole
}

template <class T>
void MemoryCopies<T>::restore_into(TrainingStateImage<T>& image) const {
  const int64_t s = step();
  if (s <= 0) throw Error("cannot restore from memory: " + why_unrecoverable());
  const Copy* meta = nullptr;
  for (int h = 0; h < ranks_ && !meta; ++h) meta = copy_at(h, s);
  image.create(meta->cfg, meta->optimizer_steps, s, meta->options);
  for (int r = 0; r < ranks_; ++r) image.put(r, *shard(r, s));
}

template <class T>
int64_t MemoryCopies<T>::bytes_held(int rank) const {
  const Holder& h = holders_.at(size_t(rank));
  size_t n = 0;
  for (const Copy* c : {&h.newest, &h.previous}) n += c->own.data.size() + c->partners.data.size();
  return int64_t(n * sizeof(T));
}

template class MemoryCopies<float>;
template class MemoryCopies<double>;

}  // namespace llama4d
