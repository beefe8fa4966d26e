#pragma once
// Expert parallelism: the experts of a mixture-of-experts layer (core/model/moe.h) sharded over
// the ranks of an `ep` group, each rank routing its own tokens. See expert_parallel.cpp for the
// steps, and its memory and traffic formulas.
#include <cstdint>
#include <vector>

#include "core/comm/process_group.h"
#include "core/model/block.h"
#include "core/model/moe.h"

namespace llama4d {

// out[BT,C] = moe(x[BT,C]) with this rank's experts only: w.gate is the whole router [E, C],
// w's experts the shard's (ExpertShard::of(d, ep.size(), ep.rank())). Every rank of ep calls it.
template <class T>
void moe_forward_expert_parallel(T* out, MoeActivations<T>& a, const MoeWeights<T>& w, const T* x,
                                 const MoeDims& d, ProcessGroup& ep, MemoryTracker* memory);
// dx[BT,C] written over; g.gate and the shard's experts' gradients ACCUMULATE (g.gate from this
// rank's tokens only: summing it over the group is the data-parallel reduction's job).
template <class T>
void moe_backward_expert_parallel(T* dx, const MoeWeights<T>& g, const T* dout, const MoeActivations<T>& a,
                                  const MoeWeights<T>& w, const T* x, const MoeDims& d, double aux_scale,
                                  ProcessGroup& ep, MemoryTracker* memory);

// The model's mixture-of-experts point (BlockComm::moe) filled with the two above over `ep`:
// what a rank whose model holds ExpertShard::of(d, ep.size(), ep.rank()) runs its MoE layers
// with. Every other point is the block's no-op (no tensor or context parallelism with it yet).
template <class T>
class ExpertParallelComm final : public BlockComm<T> {
 public:
  explicit ExpertParallelComm(ProcessGroup& ep) : ep_(ep) {}
  void moe(T* out, MoeActivations<T>& a, const MoeWeights<T>& w, const T* x, const MoeDims& d,
           MemoryTracker* memory) override {
    moe_forward_expert_parallel(out, a, w, x, d, ep_, memory);
  }
  void moe_backward(T* dx, const MoeWeights<T>& g, const T* dout, const MoeActivations<T>& a, const MoeWeights<T>& w,
                    const T* x, const MoeDims& d, double aux_scale, MemoryTracker* memory) override {
    moe_backward_expert_parallel(dx, g, dout, a, w, x, d, aux_scale, ep_, memory);
  }
  bool shards_experts() const override { return true; }
  ProcessGroup& group() { return ep_; }

 private:
  ProcessGroup& ep_;
};

}  // namespace llama4d
