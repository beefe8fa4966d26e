#pragma once
// Moving a running job onto another plan without the disk: the stage boundary of a training
// recipe (more data-parallel ranks when the batch grows, context parallelism when sequences do,
// another ZeRO stage) and the restore of a replaced rank both move trainer state this way.
//
//   InMemoryReshard<T> move;
//   // inside plan A's launch, on every rank of A (collective over A's world):
//   move.capture(trainer_a);
//   // inside plan B's launch, on every rank of B (collective over B's world):
//   StateMoves moved = move.restore(trainer_b);
//
// capture() is ParallelTrainer::save_state: every rank of A writes the share a checkpoint would
// get from it into one TrainingStateImage (the whole, unsharded tensors, in T). restore() is
// load_state: every rank of B reads exactly the flat ranges it keeps, through the strategy code
// that reads a checkpoint. So the state B ends with is, byte for byte, what saving A to disk and
// resuming on B gives (tests/parallel/state_move_test.cpp checks it at each kind of boundary).
// Ranks are matched by world rank: bytes_moved[r] counts what B's rank r read that A's rank r
// had not written, i.e. what a real cluster would send to device r.
//
// Ranks of A and B must live in this process (virtual GPUs); MPI ranks have no shared image.
// The image holds the whole state once (params + two moments), not a copy per rank.
#include "core/parallel/parallel_trainer.h"
#include "core/train/state_image.h"

namespace llama4d {

template <class T>
class InMemoryReshard {
 public:
  // Collective over a's world. Throws on every rank if any rank failed (as save_checkpoint).
  void capture(ParallelTrainer<T>& a) { a.save_state(image_); }
  // Collective over b's world; b must be built for the same model and resumable options. Returns
  // the bytes each rank of b received from another rank. Throws on every rank if any failed.
  StateMoves restore(ParallelTrainer<T>& b) {
    b.load_state(image_);  // ends with a collective: every rank of b has read its share
    return image_.moves();
  }
  const TrainingStateImage<T>& image() const { return image_; }

 private:
  TrainingStateImage<T> image_;
};

}  // namespace llama4d
