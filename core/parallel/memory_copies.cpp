#include "core/parallel/memory_copies.h"

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
  StateShard<T> mine = scratch_.written_by(r);
  StateShard<T> theirs = scratch_.written_by(previous(r), /*with_data=*/false);
  // Sends are buffered (they never wait for the receiver), so send-then-recv cannot deadlock.
  const SendOptions so{.label = std::string(label::kInMemoryCopy)};
  const RecvOptions ro{.label = std::string(label::kInMemoryCopy)};
  if (!mine.data.empty()) world.send(mine.data.data(), int64_t(mine.data.size()), dtype_of<T>(), partner(r), so)->wait();
  if (!theirs.data.empty())
    world.recv(theirs.data.data(), int64_t(theirs.data.size()), dtype_of<T>(), previous(r), ro)->wait();
  // Nobody reads the laid-out copy past this point: rank 0 records its steps and frees it.
  int32_t done = 1;
  AllReduceOptions b{.label = std::string(label::kInMemoryCopyTaken)};
  world.all_reduce(&done, 1, DType::i32, ReduceOp::min, b)->wait();
  if (r == 0) {
    cfg_ = scratch_.config();
    steps_done_ = scratch_.steps_done();
    optimizer_steps_ = scratch_.optimizer_steps();
    options_ = scratch_.options();
    taken_ = true;
    scratch_.release();
  }
  Holder& h = holders_[size_t(r)];  // only this rank's thread touches its holder
  h.own = std::move(mine);
  h.partners = std::move(theirs);
  h.alive = true;
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
  if (!taken_) return "no in-memory copy has been taken yet";
  for (int r = 0; r < ranks_; ++r) {
    const int p = partner(r);
    if (!holders_[size_t(r)].alive && !holders_[size_t(p)].alive)
      return "the in-memory copy of rank " + std::to_string(r) + "'s shard (step " + std::to_string(steps_done_) +
             ") is lost: it was held by rank " + std::to_string(r) + " (node " + std::to_string(node_of(r)) +
             ") and its partner rank " + std::to_string(p) + " (node " + std::to_string(node_of(p)) +
             "), and both failed";
  }
  return "";
}

template <class T>
void MemoryCopies<T>::restore_into(TrainingStateImage<T>& image) const {
  const std::string why = why_unrecoverable();
  if (!why.empty()) throw Error("cannot restore from memory: " + why);
  image.create(cfg_, optimizer_steps_, steps_done_, options_);
  for (int r = 0; r < ranks_; ++r) {
    const Holder& own = holders_[size_t(r)];
    image.put(r, own.alive ? own.own : holders_[size_t(partner(r))].partners);
  }
}

template <class T>
int64_t MemoryCopies<T>::bytes_held(int rank) const {
  const Holder& h = holders_.at(size_t(rank));
  return int64_t((h.own.data.size() + h.partners.data.size()) * sizeof(T));
}

template class MemoryCopies<float>;
template class MemoryCopies<double>;

}  // namespace llama4d
