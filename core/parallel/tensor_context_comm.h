#pragma once
// A rank in both a tensor-parallel and a context-parallel group (--mesh tp=2,cp=2): the block's
// communication points go to the group that owns them. The two strategies touch disjoint points,
// because they split different axes of the same activations:
//   tensor parallelism splits heads and the MLP's width: q [B,T,nh/tp,hd], gate [B,T,I/tp], and
//     (with SP) the residual rows; its points are the projections' inputs and outputs;
//   context parallelism splits the sequence: T = S/cp tokens per row; its only point is the
//     attention itself, which it computes for this rank's heads against every rank's keys.
// So a tp x cp rank attends with its nh/tp query heads and nkv/tp (or replicated) key/value heads
// over the cp group's tokens, and Llama 3 placed the two groups innermost (tp, then cp) because
// both communicate inside every layer.
#include "core/model/block.h"
#include "core/parallel/context_parallel.h"
#include "core/parallel/tensor_parallel.h"

namespace llama4d {

template <class T>
class TensorContextComm final : public BlockComm<T> {
 public:
  TensorContextComm(TensorParallelComm<T>& tp, ContextParallelComm<T>& cp) : tp_(tp), cp_(cp) {}

  void attention_input(T* n1, const BlockDims& d) override { tp_.attention_input(n1, d); }
  void attention_input_backward(T* dn1, const BlockDims& d) override { tp_.attention_input_backward(dn1, d); }
  void mlp_input(T* n2, const BlockDims& d) override { tp_.mlp_input(n2, d); }
  void mlp_input_backward(T* dn2, const BlockDims& d) override { tp_.mlp_input_backward(dn2, d); }
  void attention_output(T* y, const BlockDims& d) override { tp_.attention_output(y, d); }
  void attention_output_backward(T* dy, const BlockDims& d) override { tp_.attention_output_backward(dy, d); }
  void mlp_output(T* y, const BlockDims& d) override { tp_.mlp_output(y, d); }
  void mlp_output_backward(T* dy, const BlockDims& d) override { tp_.mlp_output_backward(dy, d); }
  void norm_weight_grads(T* g, const BlockDims& d) override { tp_.norm_weight_grads(g, d); }
  bool sums_key_value_weight_grads() const override { return tp_.sums_key_value_weight_grads(); }
  void key_value_weight_grads(T* gk, T* gv, const BlockDims& d) override { tp_.key_value_weight_grads(gk, gv, d); }

  void attention(T* out, T* lse, const T* q, const T* k, const T* v, const BlockDims& d) override {
    cp_.attention(out, lse, q, k, v, d);
  }
  void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                          const T* lse, const BlockDims& d) override {
    cp_.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, d);
  }

 private:
  TensorParallelComm<T>& tp_;
  ContextParallelComm<T>& cp_;
};

}  // namespace llama4d
