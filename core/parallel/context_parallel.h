#pragma once
// Context parallelism: the communication of one context-parallel rank, and how a batch is cut
// along the sequence. See context_parallel.cpp for the whole story, top to bottom.
#include <cstdint>
#include <string_view>

#include "core/comm/process_group.h"
#include "core/data/batch_sampler.h"
#include "core/model/block.h"
#include "core/tensor/buffer.h"

namespace llama4d {

// How a rank's queries reach the keys and values the other ranks hold.
//   allgather  Llama 3's choice: all-gather K and V, attend, reduce-scatter dK and dV.
//   ring       K/V blocks pass around the ring (Liu et al. 2023, "Ring Attention").
enum class ContextAlgo { allgather, ring };
std::string_view context_algo_name(ContextAlgo a);
ContextAlgo parse_context_algo(std::string_view name);  // InputError naming the choices

// Rank `rank` of `cp`'s tokens of every row of b: the sequence of T tokens is cut into 2·cp
// chunks of T/(2·cp) and the rank takes chunks rank and 2·cp-1-rank, in that order
// (BlockDims::cp). T must be a multiple of 2·cp (ParallelPlan::check_sequence).
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

  ProcessGroup& group() const { return cp_; }

 private:
  void ring_attention(T* out, T* lse, const T* q, const T* k, const T* v, const BlockDims& d);
  void ring_attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                               const T* lse, const BlockDims& d);
  // One step around the ring: `block` goes to rank r+1, the next arrives from r-1 (then swapped).
  void pass_on(Buffer<T>& block, Buffer<T>& next, int64_t elements, int step, const char* label);

  ProcessGroup& cp_;
  ContextAlgo algo_;
};

extern template class ContextParallelComm<float>;
extern template class ContextParallelComm<double>;

}  // namespace llama4d
