#include "core/parallel/zero_reduce.h"

#include "core/error.h"
#include "core/ops.h"
#include "core/parallel/dp_common.h"
#include "core/comm/traffic_labels.h"

namespace llama4d {

template <class T>
ShardedGradReducer<T>::ShardedGradReducer(Llama<T>& model, const ShardLayout& layout, int rank, ProcessGroup& shard,
                                          ProcessGroup* replicate, bool shard_grads, bool reduce_in_bf16)
    : model_(model), layout_(layout), rank_(rank), shard_(shard), replicate_(replicate), shard_grads_(shard_grads),
      bf16_(reduce_in_bf16) {
  const size_t nseg = layout.segments().size();
  const int64_t shard_n = layout.shard_numel(rank);
  MemoryTracker* mem = &model.memory();
  if (shard_grads) grad_shard_ = Buffer<T>(mem, MemoryCategory::grads, shard_n, "gradient shard");
  if (reduce_in_bf16)
    wire_recv_ = Buffer<bf16>(mem, MemoryCategory::comm_buffers, shard_n, "reduce-scatter output (bf16)");
  else if (shard_grads)
    grad_recv_ = Buffer<T>(mem, MemoryCategory::comm_buffers, shard_n, "reduce-scatter output");
  wire_send_.resize(nseg);
  reduce_work_.resize(nseg);
  replica_work_.resize(nseg);
  grads_freed_.assign(nseg, 0);
  accumulated_.assign(nseg, 0);
}

template <class T>
T* ShardedGradReducer<T>::reduced(size_t s) {
  const Piece p = layout_.piece(s, rank_);
  return shard_grads_ ? grad_shard_.data() + p.shard_offset : model_.grads() + p.begin;
}

template <class T>
void ShardedGradReducer<T>::begin_step() {
  std::fill(accumulated_.begin(), accumulated_.end(), 0);
}

template <class T>
void ShardedGradReducer<T>::start(size_t s) {
  const std::string unit = unit_name(layout_.segments()[s].unit, model_.num_layers());
  ReduceScatterOptions o{.async_op = true, .label = label::grads(unit)};
  in_flight_.push_back(s);
  reduced_this_pass_.push_back(s);
  T* full = model_.unit_grads(int(s));
  if (!full) throw Error("ZeRO: unit " + std::to_string(s) + " produced no gradient to reduce");
  grads_freed_[s] = 0;
  const int64_t shard_offset = layout_.piece(s, rank_).shard_offset;
  if (bf16_) {
    wire_send_[s] = bf16_wire(model_.memory(), full, layout_.segments()[s].numel(), "bf16 " + o.label);
    free_full_grad_once(s);  // ZeRO-2/3: the copy is all the reduction reads
    reduce_work_[s] = shard_.reduce_scatter_v(wire_recv_.data() + shard_offset, wire_send_[s].data(),
                                              layout_.piece_counts(s), DType::bf16, ReduceOp::sum, o);
  } else {
    T* out = shard_grads_ ? grad_recv_.data() + shard_offset : model_.grads() + layout_.piece(s, rank_).begin;
    reduce_work_[s] = shard_.reduce_scatter_v(out, full, layout_.piece_counts(s), dtype_of<T>(), ReduceOp::sum, o);
  }
  if (replicate_) start_replica_reduce(s, unit);
}

// HSDP: this rank's piece of segment s, [piece numel] in the reduce-scatter output, summed in
// place across the replicas. Queued now, right behind its reduce-scatter: the rank's comm
// stream runs it as soon as the reduce-scatter landed (stream order, as FSDP2 orders its
// all-reduce after its reduce-scatter). Queuing it when a poll first sees the reduce-scatter
// done instead would order the two groups' collectives differently on different ranks, and
// one FIFO stream per rank (as NCCL's) can then deadlock: A waits for B in the shard group
// while B waits for C in its replica group, ... Every replica of a shard rank holds the same
// pieces, so an empty one is skipped by the whole replica group alike.
template <class T>
void ShardedGradReducer<T>::start_replica_reduce(size_t s, const std::string& unit) {
  const Piece p = layout_.piece(s, rank_);
  if (p.numel() == 0) return;
  AllReduceOptions o{.async_op = true, .label = label::grads_across_replicas(unit)};
  if (bf16_)
    replica_work_[s] = replicate_->all_reduce(wire_recv_.data() + p.shard_offset, p.numel(), DType::bf16, ReduceOp::sum, o);
  else
    replica_work_[s] = replicate_->all_reduce(grad_recv_.data() + p.shard_offset, p.numel(), dtype_of<T>(), ReduceOp::sum, o);
}

// A reduction that finished frees its unit's full gradient right away (ZeRO-2/3): that is where
// ZeRO-2 saves memory, since later units' backward runs without it. Freeing follows this
// laptop's threads (a poll), but the compute waits for a result only at fixed points (the rate
// limit, the end of the backward), so the simulated clock never depends on timing.
template <class T>
void ShardedGradReducer<T>::free_full_grad_once(size_t s) {
  if (shard_grads_ && !grads_freed_[s]) model_.free_unit_grads(int(s));
  grads_freed_[s] = 1;
}

template <class T>
void ShardedGradReducer<T>::done(size_t s) {
  reduce_work_[s]->wait();  // rethrows a failure, joins the simulated clocks
  reduce_work_[s].reset();
  free_full_grad_once(s);
  wire_send_[s].reset();
}

template <class T>
void ShardedGradReducer<T>::poll() {
  for (size_t s = 0; s < reduce_work_.size(); ++s)
    if (reduce_work_[s] && reduce_work_[s]->is_completed()) {
      reduce_work_[s]->collect();  // rethrows a failure; the clock waits later, at a fixed point
      free_full_grad_once(s);
      wire_send_[s].reset();
    }
}

template <class T>
void ShardedGradReducer<T>::throttle() {
  poll();
  while (in_flight_.size() > kMaxInFlight) {
    if (reduce_work_[in_flight_.front()]) done(in_flight_.front());
    in_flight_.pop_front();
  }
}

// Every micro-batch, like the reduce-scatters: acc += (sum over replicas of (sum over dp_shard)),
// the order the equivalence harness replays. Per segment: a pipeline rank with several model
// chunks reduces one chunk's units per pass. ZeRO-1 in f32 reduced in place, once per step.
template <class T>
void ShardedGradReducer<T>::finish_pass() {
  for (size_t s = 0; s < reduce_work_.size(); ++s)
    if (reduce_work_[s]) done(s);
  in_flight_.clear();
  std::vector<size_t> reduced_now;
  reduced_now.swap(reduced_this_pass_);
  if (!shard_grads_ && !bf16_) return;
  for (size_t s : reduced_now) {
    if (replica_work_[s]) {
      replica_work_[s]->wait();  // rethrows a failure (a peer's timeout at worst), joins the simulated clocks
      replica_work_[s].reset();
    }
    const Piece p = layout_.piece(s, rank_);
    T* acc = reduced(s);
    if (bf16_)
      ops::from_bf16(acc, wire_recv_.data() + p.shard_offset, p.numel(), accumulated_[s] != 0);
    else if (accumulated_[s])
      ops::accumulate(acc, grad_recv_.data() + p.shard_offset, p.numel());
    else
      ops::copy(acc, grad_recv_.data() + p.shard_offset, p.numel());
    accumulated_[s] = 1;
  }
}

template class ShardedGradReducer<float>;
template class ShardedGradReducer<double>;

}  // namespace llama4d
