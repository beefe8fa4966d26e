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
// Memory per rank: its shard plus its partner's, in two generations (the newest copy and the one
// before), about 4 x (3 x params x sizeof(T)) / ranks (every plan's shards are 1/ranks of the
// state on average: each element is written by one rank).
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
  // partner. A holder keeps the two latest copies it received: a failure in the middle of a take
  // (some holders have the new copy, some only the previous one) still leaves a whole copy.
  void take(ParallelTrainer<T>& trainer, ProcessGroup& world);
  // The steps done of the newest copy that every shard still has a living holder of (0: none).
  int64_t step() const;
  // The memory of these ranks is gone: what they held (own shards and partners' copies).
  void lose(const std::vector<int>& ranks);
  void lose_node(int node);
  // "" when some copy is whole among the living holders; otherwise which shard of the newest
  // copy is lost and on which two ranks it was.
  std::string why_unrecoverable() const;
  // Assembles the newest whole copy into `image` (then ParallelTrainer::load_state). Error if
  // there is none.
  void restore_into(TrainingStateImage<T>& image) const;
  // Bytes this rank holds now (own shards and partners' copies, both generations).
  int64_t bytes_held(int rank) const;

 private:
  struct Copy {
    int64_t steps_done = -1;  // -1: none
    int64_t optimizer_steps = 0;
    LlamaConfig cfg;
    TrainOptions options;
    StateShard<T> own, partners;  // partners: the shard of the rank whose partner this rank is
  };
  struct Holder {
    bool alive = false;
    Copy newest, previous;
  };
  int previous(int rank) const { return (rank - gpus_per_node_ + ranks_) % ranks_; }
  // Rank r's shard of the copy after `steps` steps from a living holder, or null.
  const StateShard<T>* shard(int r, int64_t steps) const;
  const Copy* copy_at(int holder, int64_t steps) const;
  int64_t last_taken_ = -1;  // steps done of the newest copy taken (written by rank 0's thread)

  int ranks_, gpus_per_node_;
  int64_t every_;
  TrainingStateImage<T> scratch_;  // where take() lays a copy out
  std::vector<Holder> holders_;    // each touched by its own rank's thread during take()
};

extern template class MemoryCopies<float>;
extern template class MemoryCopies<double>;

}  // namespace llama4d
