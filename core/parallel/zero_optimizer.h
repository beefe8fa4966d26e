#pragma once
// ZeRO's optimizer (zero.cpp, fsdp.cpp): AdamW over this rank's pieces of the flat buffer only
// (ShardLayout: a piece of every unit's segment), so each rank keeps 1/N of the moments, 8N/dp
// bytes in fp32, instead of 8N. Every element's update depends on that element alone, so the
// pieces together take exactly the single-device step. The gradient norm that clipping needs is
// global: the pieces' chunk partials gathered over the shard group and added in the
// single-device order (core/optim/segmented_norm.h), so clipping is bitwise too.
#include <functional>
#include <memory>
#include <vector>

#include "core/comm/process_group.h"
#include "core/model/llama.h"
#include "core/optim/adamw.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/shard_layout.h"
#include "core/train/checkpoint_state.h"

namespace llama4d {

template <class T>
class ShardedAdamW {
 public:
  // Where this rank's piece of segment s lives: its summed gradient, or its weights.
  using PieceOf = std::function<T*(size_t s)>;

  // Moments for rank `rank`'s non-empty pieces, on the model's tracker.
  ShardedAdamW(Llama<T>& model, const ShardLayout& layout, int rank, const AdamWConfig& adamw);

  // The global squared gradient norm (collective over `shard` and the groups the norm spans).
  double grad_sum_squares(ProcessGroup& shard, const DataParallelGroups& groups, const PieceOf& grads) const;
  // Scales every piece's gradient by clip_coef (when < 1) and takes AdamW's step on its weights.
  void step(const PieceOf& weights, const PieceOf& grads, double clip_coef, double lr);
  int64_t steps() const { return steps_; }

  // A checkpoint's share of this rank: each piece's weights and moments (a tied copy of the
  // embedding, which the first stage writes, excepted).
  void save(TrainingCheckpointWriter<T>& ckpt, const PieceOf& weights) const;
  // The moments of every piece and the step count (the strategy reads the weights it keeps).
  void load(const TrainingCheckpointReader<T>& ckpt);

 private:
  Llama<T>& model_;
  const ShardLayout& layout_;
  int rank_;
  std::vector<std::unique_ptr<AdamW<T>>> adamw_;  // one per segment piece (null when empty)
  int64_t steps_ = 0;
};

extern template class ShardedAdamW<float>;
extern template class ShardedAdamW<double>;

}  // namespace llama4d
