#pragma once
// ZeRO's gradient reduction (zero.cpp, fsdp.cpp): each unit's full gradient [segment] is
// reduce-scattered over the shard group the moment it is final, so rank r receives only the sum
// of its own piece (ShardLayout). Asynchronous, overlapping the backward of the units below;
// at most kMaxInFlight units wait at once, as FSDP limits them.
//
//   ZeRO-1  at the last micro-batch only, in place: the received piece is left inside the full
//           gradient buffer, which stays whole (Residency::whole);
//   ZeRO-2/3 every micro-batch (with --reduce-once at the last only), into a receive buffer,
//           then added to the gradient shard (acc = S_0, acc += S_1, ...); the unit's full
//           gradient is freed once reduced;
//   HSDP    behind each reduce-scatter, the rank's piece all-reduced over the replicas.
//
// --grad-reduce-in-bf16 (DataParallelConfig::bf16_grad_reduce): the full gradient is rounded
// into a bf16 copy as its reduction starts, and that copy is what the collectives move and sum
// (half the bytes); the received bf16 piece is widened into the f32 destination, so micro-batches
// still accumulate in f32. ZeRO-1 then receives into a bf16 buffer too and widens its pieces once.
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/model/llama.h"
#include "core/parallel/shard_layout.h"
#include "core/tensor/buffer.h"

namespace llama4d {

template <class T>
class ShardedGradReducer {
 public:
  // shard_grads: ZeRO-2/3 (a gradient shard, full gradients freed); false: ZeRO-1 (in place).
  // replicate: HSDP's replica group, or null.
  ShardedGradReducer(Llama<T>& model, const ShardLayout& layout, int rank, ProcessGroup& shard,
                     ProcessGroup* replicate, bool shard_grads, bool reduce_in_bf16);

  // This rank's summed gradient of its piece of segment s [piece numel]: in the gradient shard,
  // or (ZeRO-1) inside the model's full gradient buffer.
  T* reduced(size_t s);
  // ZeRO-2/3: the whole gradient shard, this rank's pieces back to back.
  T* shard() { return grad_shard_.data(); }
  // Before the step's first backward: the shard holds no micro-batch's sum yet.
  void begin_step();
  // Segment s's full gradient is final: start its reduce-scatter (and, under HSDP, the replica
  // all-reduce right behind it on the comm stream).
  void start(size_t s);
  // Frees the full gradients (and bf16 copies) of reductions that finished, then waits for the
  // oldest while more than kMaxInFlight are in flight.
  void throttle();
  // Frees what finished, without waiting (before a unit's backward).
  void poll();
  // After a reducing backward pass: waits for its reductions and adds every received piece to
  // the gradient shard, in segment order.
  void finish_pass();

  static constexpr size_t kMaxInFlight = 2;

 private:
  void start_replica_reduce(size_t s, const std::string& unit);
  void free_full_grad_once(size_t s);
  void done(size_t s);  // waits for s's reduce-scatter and frees what only it read

  Llama<T>& model_;
  const ShardLayout& layout_;
  int rank_;
  ProcessGroup& shard_;
  ProcessGroup* replicate_;
  bool shard_grads_, bf16_;
  Buffer<T> grad_shard_, grad_recv_;     // ZeRO-2/3: the accumulated shard, the receive buffer
  Buffer<bf16> wire_recv_;               // bf16 reductions: the reduce-scatter's output
  std::vector<Buffer<bf16>> wire_send_;  // [segment] its bf16 full gradient while being reduced
  std::vector<std::shared_ptr<Work>> reduce_work_, replica_work_;  // [segment]
  std::vector<uint8_t> grads_freed_;     // [segment] its full gradient was freed
  std::vector<uint8_t> accumulated_;     // [segment] the shard holds a micro-batch's sum this step
  std::deque<size_t> in_flight_;         // segments with a reduce-scatter in flight, oldest first
  std::vector<size_t> reduced_this_pass_;
};

extern template class ShardedGradReducer<float>;
extern template class ShardedGradReducer<double>;

}  // namespace llama4d
