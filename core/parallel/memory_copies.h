#pragma once
// In-memory copies of the training state, for recovery without the disk (Gemini: Wang et al.,
// "GEMINI: Fast Failure Recovery in Distributed Training with In-Memory Checkpoints", SOSP 2023).
//
// Every K steps each rank keeps its shard of the state (the elements it writes into a checkpoint:
// its ZeRO pieces of weights and moments, its 1/dp of a replicated buffer, its tensor-parallel
// slice, its pipeline stage's units) and a copy of one partner's, received by send/recv labelled
// "in-memory copy". Placement: a replica group of m = 2 spans 2 nodes (node = gpus_per_node
// consecutive ranks), in a ring of nodes: rank r's partner is r + gpus_per_node (mod ranks), the
// same local GPU on the next node. Losing any one node leaves every shard with a holder: the
// node's own shards are copied on the next node, and the copies it held are of the previous
// node's shards, whose owners are alive. Losing two neighbouring nodes loses the first one's
// shards; recovery then needs the disk, and why_unrecoverable() says which shard and holders.
//
// Memory per rank: its shard plus its partner's, about 2 x (3 x params x sizeof(T)) / ranks
// for a ZeRO plan (a replicated DP plan's shards are the same size, 1/dp of the buffer each).
// Traffic per copy: each rank sends its shard once (3 x params x sizeof(T) / ranks for ZeRO).
//
// Holders live in this process (virtual GPUs), outside any attempt of the supervised run, the
// way a Gemini copy lives in another machine's CPU memory; lose() models a rank's host memory
// going with it.
#include <cstdint>
#include <string>
#include <vector>

#include "core/parallel/parallel_trainer.h"
#include "core/train/state_image.h"

namespace llama4d {

template <class T>
class MemoryCopies {
 public:
  // InputError naming the problem: every < 1, gpus_per_node < 1, ranks not a whole number of
  // nodes, or fewer than 2 nodes (a replica group of 2 must span 2 nodes).
  MemoryCopies(int ranks, int gpus_per_node, int64_t every);

  int ranks() const { return ranks_; }
  int nodes() const { return ranks_ / gpus_per_node_; }
  int node_of(int rank) const { return rank / gpus_per_node_; }
  // Who holds the copy of rank's shard: the same GPU of the next node.
  int partner(int rank) const { return (rank + gpus_per_node_) % ranks_; }
  // Whether a copy is taken after step `step` (1-based steps done).
  bool due(int64_t step) const { return step % every_ == 0; }

  // Collective over `world` (trainer's, of size ranks()): every rank's shard kept and sent to its
  // partner. Replaces the previous copy on every holder.
  void take(ParallelTrainer<T>& trainer, ProcessGroup& world);
  // The steps done that the copies hold (0: none taken yet).
  int64_t step() const { return steps_done_; }
  bool empty() const { return !taken_; }
  // The memory of these ranks is gone: what they held (own shard and partner's copy).
  void lose(const std::vector<int>& ranks);
  void lose_node(int node);
  // "" when every shard of the last copy has a living holder; otherwise which shard is lost and
  // on which two ranks it was.
  std::string why_unrecoverable() const;
  // Assembles the last copy from the living holders into `image` (then ParallelTrainer::
  // load_state). Error if unrecoverable or empty.
  void restore_into(TrainingStateImage<T>& image) const;
  // Bytes this rank holds now (own shard + partner's copy).
  int64_t bytes_held(int rank) const;

 private:
  struct Holder {
    bool alive = false;
    StateShard<T> own, partners;  // partners: the shard of the rank whose partner this rank is
  };
  int previous(int rank) const { return (rank - gpus_per_node_ + ranks_) % ranks_; }

  int ranks_, gpus_per_node_;
  int64_t every_;
  TrainingStateImage<T> scratch_;  // where take() lays a copy out; released when done
  // What trainer_state.json would say of the last copy: every rank knows it, so it is not lost.
  bool taken_ = false;
  LlamaConfig cfg_;
  int64_t steps_done_ = 0, optimizer_steps_ = 0;
  TrainOptions options_;
  std::vector<Holder> holders_;
};

extern template class MemoryCopies<float>;
extern template class MemoryCopies<double>;

}  // namespace llama4d
