#pragma once
// Expert parallelism: the experts of a mixture-of-experts layer (core/model/moe.h) sharded over
// the ranks of an `ep` group, each rank routing its own tokens. See expert_parallel.cpp for the
// steps, and its memory and traffic formulas.
#include <cstdint>
#include <vector>

#include "core/comm/process_group.h"
#include "core/model/moe.h"

namespace llama4d {

// The experts rank r of an ep group of size P holds: [r·E/P, (r+1)·E/P). InputError naming both
// unless P divides E.
struct ExpertShard {
  int64_t first = 0, count = 0;
  static ExpertShard of(const MoeDims& d, int ep_size, int ep_rank);
};

// What the expert-parallel forward keeps for the backward.
template <class T>
struct ExpertParallelActivations {
  MoeActivations<T> moe;           // the token side (router, dispatch, returned outputs ys)
  ExpertRows held;                 // the rows this rank's experts computed, in local-expert order
  Buffer<int32_t> from_received;   // [held rows] the received row each local-expert-order row is
  Buffer<int32_t> to_received;     // [held rows] the local-expert-order row of each received row
  std::vector<int64_t> send_rows;  // [P] rows this rank sends to each rank (and gets back)
  std::vector<int64_t> recv_rows;  // [P] rows this rank receives from each rank (and returns)
  std::vector<int64_t> global_counts;  // [E] rows routed to each expert over the whole ep group
  void reset();
};

// out[BT,C] = moe(x[BT,C]) with this rank's experts only: w.gate is the whole router [E, C],
// w's experts the shard's (ExpertShard::of(d, ep.size(), ep.rank())). Every rank of ep calls it.
template <class T>
void moe_forward_expert_parallel(T* out, ExpertParallelActivations<T>& a, const MoeWeights<T>& w, const T* x,
                                 const MoeDims& d, ProcessGroup& ep, MemoryTracker* memory);
// dx[BT,C] written over; g.gate and the shard's experts' gradients ACCUMULATE (g.gate from this
// rank's tokens only: summing it over the group is the data-parallel reduction's job).
template <class T>
void moe_backward_expert_parallel(T* dx, const MoeWeights<T>& g, const T* dout, const ExpertParallelActivations<T>& a,
                                  const MoeWeights<T>& w, const T* x, const MoeDims& d, double aux_scale,
                                  ProcessGroup& ep, MemoryTracker* memory);

}  // namespace llama4d
