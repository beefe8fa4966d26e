#include "core/parallel/zero_optimizer.h"

#include "core/optim/grad_clip.h"
#include "core/optim/segmented_norm.h"
#include "core/parallel/dp_common.h"
#include "core/comm/traffic_labels.h"

namespace llama4d {

template <class T>
ShardedAdamW<T>::ShardedAdamW(Llama<T>& model, const ShardLayout& layout, int rank, const AdamWConfig& adamw)
    : model_(model), layout_(layout), rank_(rank) {
  MemoryTracker* mem = &model.memory();
  for (size_t s = 0; s < layout.segments().size(); ++s) {
    const Piece p = layout.piece(s, rank);
    adamw_.push_back(p.numel() ? std::make_unique<AdamW<T>>(adamw, model.param_specs(), p.begin, p.end, mem) : nullptr);
  }
}

// Chunk partials of this rank's gradient pieces, gathered from every shard rank and added
// segment by segment, chunk by chunk: the single-device order, so the same bits.
template <class T>
double ShardedAdamW<T>::grad_sum_squares(ProcessGroup& shard, const DataParallelGroups& groups,
                                         const PieceOf& grads) const {
  const auto& segs = layout_.segments();
  const int n = shard.size();
  std::vector<int64_t> counts(size_t(n), 0);
  std::vector<double> mine;
  // A tied embedding's copy is counted by the first stage only.
  auto partials = [&](size_t s, int r) {
    return counts_segment(model_, int(s)) ? num_chunk_partials(layout_.piece(s, r).numel()) : 0;
  };
  for (size_t s = 0; s < segs.size(); ++s) {
    for (int r = 0; r < n; ++r) counts[size_t(r)] += partials(s, r);
    if (counts_segment(model_, int(s))) append_chunk_partials(mine, grads(s), layout_.piece(s, rank_).numel());
  }
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<double> all(static_cast<size_t>(total));
  AllGatherOptions o{.label = std::string(label::kGradNormPartials)};
  shard.all_gather_v(all.data(), mine.data(), counts, DType::f64, o)->wait();
  // `all` is rank-major; walk it segment-major.
  std::vector<int64_t> cursor(size_t(n), 0);
  for (int r = 1; r < n; ++r) cursor[size_t(r)] = cursor[size_t(r - 1)] + counts[size_t(r - 1)];
  std::vector<double> ordered;
  ordered.reserve(size_t(total));
  for (size_t s = 0; s < segs.size(); ++s)
    for (int r = 0; r < n; ++r) {
      const int64_t k = partials(s, r);
      ordered.insert(ordered.end(), all.begin() + cursor[size_t(r)], all.begin() + cursor[size_t(r)] + k);
      cursor[size_t(r)] += k;
    }
  // Tensor parallelism: the replicas among this shard group's pieces.
  return global_grad_sum_squares(groups, model_, ordered, [&] {
    double replicas = 0;
    for (size_t s = 0; s < segs.size(); ++s) {
      const Piece p = layout_.piece(s, rank_);
      replicas += replica_sum_squares(model_.param_specs(), p.begin, p.end, grads(s));
    }
    AllReduceOptions r{.label = "grad-norm replicas"};
    shard.all_reduce(&replicas, 1, DType::f64, ReduceOp::sum, r)->wait();
    return replicas;
  });
}

template <class T>
void ShardedAdamW<T>::step(const PieceOf& weights, const PieceOf& grads, double clip_coef, double lr) {
  for (size_t s = 0; s < adamw_.size(); ++s) {
    if (!adamw_[s]) continue;
    T* g = grads(s);
    apply_grad_clip(g, layout_.piece(s, rank_).numel(), clip_coef);
    adamw_[s]->step(weights(s), g, lr);
  }
  ++steps_;
}

template <class T>
void ShardedAdamW<T>::save(TrainingCheckpointWriter<T>& ckpt, const PieceOf& weights) const {
  for (size_t s = 0; s < layout_.segments().size(); ++s) {
    const Piece p = layout_.piece(s, rank_);
    if (p.numel() == 0 || !counts_segment(model_, int(s))) continue;  // a tied copy: the first stage writes it
    ckpt.params(p.begin, p.end, weights(s));
    ckpt.exp_avg(p.begin, p.end, adamw_[s]->exp_avg().data());
    ckpt.exp_avg_sq(p.begin, p.end, adamw_[s]->exp_avg_sq().data());
  }
}

template <class T>
void ShardedAdamW<T>::load(const TrainingCheckpointReader<T>& ckpt) {
  for (size_t s = 0; s < adamw_.size(); ++s)
    if (adamw_[s]) {
      const Piece p = layout_.piece(s, rank_);
      ckpt.exp_avg(p.begin, p.end, adamw_[s]->mutable_exp_avg());
      ckpt.exp_avg_sq(p.begin, p.end, adamw_[s]->mutable_exp_avg_sq());
      adamw_[s]->set_step_count(ckpt.optimizer_steps());
    }
  steps_ = ckpt.optimizer_steps();
}

template class ShardedAdamW<float>;
template class ShardedAdamW<double>;

}  // namespace llama4d
