#pragma once
// Context parallelism: the communication of one context-parallel rank, and how a batch is cut
// along the sequence. See context_parallel.cpp for the whole story, top to bottom.
#include <cstdint>
#include <string_view>

#include "core/comm/process_group.h"
#include "core/data/batch_sampler.h"
#include "core/model/block.h"
#include "core/parallel/context_algo.h"

namespace llama4d {

// Rank `rank` of `cp`'s tokens of every row of b: the sequence of T tokens is cut into 2·cp
// chunks of T/(2·cp) and the rank takes chunks rank and 2·cp-1-rank, in that order
// (BlockDims::cp). Document ids, if any, stay those of the whole rows (Batch::docs). T must be
// a multiple of 2·cp (ParallelPlan::check_sequence).
Batch context_slice(const Batch& b, int cp, int rank);

// Fills in the block's attention point for a rank of the context-parallel group `cp`. Every call
// is collective over the group.
template <class T>
class ContextParallelComm final : public BlockComm<T> {
 public:
  ContextParallelComm(ProcessGroup& cp, ContextAlgo algo);

  void attention(T* out, T* lse, const T* q, const T* k, const T* v, const BlockDims& d) override;
  void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                          const T* lse, const BlockDims& d) override;

 private:
  void ring_attention(T* out, T* lse, const T* q, const T* k, const T* v, const BlockDims& d);
  void ring_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                               const T* lse, const BlockDims& d);
  // One hop around the ring: `block` goes to rank r+1, the next arrives from rank r-1.
  void pass_on(const T* block, T* next, int64_t elements, int step, std::string_view label);

  ProcessGroup& cp_;
  ContextAlgo algo_;
};

extern template class ContextParallelComm<float>;
extern template class ContextParallelComm<double>;

}  // namespace llama4d
