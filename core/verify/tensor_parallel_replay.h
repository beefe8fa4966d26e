#pragma once
// The one-device reference for tensor parallelism (with or without sequence parallelism).
//
// One device holds the whole weights. Every sum that tensor parallelism splits over its tp ranks
// is evaluated here the way those ranks evaluate it, on the ranks' slices cut by this file's own
// arithmetic (not the model's TpLayout), and the partial results are added in rank order 0, 1,
// ..., tp-1: the order of an `ordered` all-reduce or reduce-scatter. A tensor-parallel run with
// ordered reductions must then equal it bit for bit. The sums, in the order a rank adds them:
//   row-parallel outputs       o_proj and down_proj forward: per rank att_r @ Wo[:, r]^T over its
//                              heads' columns (and act_r @ Wdown[:, r]^T), then the ranks' partials;
//   column-parallel input      per rank dn_r = dq_r @ Wq_r + dk_r @ Wk_r + dv_r @ Wv_r (then
//   gradients                  dgate_r @ Wgate_r + dup_r @ Wup_r), each accumulated in that order
//                              into a zeroed buffer, then the ranks' dn_r;
//   vocabulary-parallel loss   per rank its slice's max, sum of exp(logit - global max) and target
//                              logit; the maxima combined (exact), the sums in rank order; the
//                              LM head's input gradient as the column-parallel ones;
//   embedding                  per rank the lookup of the ids in its rows (zeros elsewhere), summed;
//   replicated key/value heads each rank's k/v weight gradient covers its own query heads; the
//                              replicas' gradients are summed in rank order (zeros from ranks
//                              without the head), then added to the accumulated gradient;
//   SP norm gains              under sequence parallelism each rank's gain gradient covers its rows
//                              [BT·r/tp, BT·(r+1)/tp); they are summed in rank order, then added.
// Everything else (RMSNorm, RoPE, attention per head, SwiGLU, the residual adds, the weight
// gradients of column slices) is computed per element or per row and has the same bits however
// the rows or heads are cut. The gradient norm is rebuilt from each rank's own flat layout:
// see tensor_parallel_grad_sum_squares.
#include <cstdint>
#include <memory>
#include <vector>

#include "core/data/batch_sampler.h"
#include "core/model/config.h"
#include "core/model/params.h"
#include "core/tensor/backend_array.h"
#include "core/model/rope.h"
#include "core/parallel/plan.h"

namespace llama4d {

// The replay covers tensor parallelism without context parallelism (whose attention adds its
// partial results in another order: held to measured bounds instead).
inline bool uses_tensor_parallel_replay(const ParallelPlan& plan) { return plan.size("tp") > 1 && plan.size("cp") == 1; }

template <class T>
class TensorParallelReplay {
 public:
  // params: the whole model's flat parameters (llama_param_specs(cfg) order), read at every
  // forward. separate_tied_head: with tied embeddings under pipeline parallelism the LM head's
  // part of the embedding's gradient accumulates apart (tied_head_part), as its stage keeps it.
  // bf16: mixed precision (Llama::set_bf16_compute): the weights are read rounded to bf16, and
  // each activation and activation gradient is rounded when complete, at the points block.cpp and
  // head.cpp round it (a split sum: after its ranks' partials are added).
  TensorParallelReplay(const LlamaConfig& cfg, int tp, bool sequence_parallel, const T* params,
                       bool separate_tied_head, bool bf16);
  ~TensorParallelReplay();

  void zero_grad();
  // One micro-batch's forward and backward; gradients accumulate. Returns the loss summed over
  // its counted tokens.
  double forward_backward(const Batch& b, T loss_scale);
  // The accumulated gradient in the whole flat layout.
  std::vector<T> grads() const;
  const BackendArray<T>& tied_head_part() const { return head_part_; }

  struct Slice;  // what tp rank r holds (tensor_parallel_replay.cpp)

 private:
  struct Pass;  // one forward_backward, phase by phase

  LlamaConfig cfg_;
  int tp_;
  bool sp_;
  bool bf16_;
  const T* params_;
  std::vector<ParamSpec> specs_;  // the whole model's (llama_param_specs(cfg))
  RopeTables<T> rope_;
  std::vector<Slice> slices_;
  BackendArray<T> grads_;      // whole flat layout; o_proj's and down_proj's columns live apart:
  std::vector<BackendArray<T>> wo_grads_, wdown_grads_;  // [layer * tp + r]: rank r's [C, cols]
  BackendArray<T> head_part_;  // [V, C] (separate_tied_head only)
};

// What a rank holds of a whole flat buffer (laid out by whole_specs), in the rank's own flat
// order: its specs name some of the same tensors (a pipeline rank's stages), each whole or a
// tensor-parallel slice.
template <class T>
std::vector<T> slice_of_whole(const std::vector<ParamSpec>& local, const std::vector<ParamSpec>& whole_specs,
                              const std::vector<T>& whole);

// The sum of squares of the gradient `whole` (flat, llama_param_specs(cfg)) as the ranks of
// `plan` compute it when tp > 1: each tensor-parallel rank takes the chunk partials of its own
// flat slice layout (core/optim/segmented_norm.h) and subtracts the replicas it does not count
// (pipeline stages and ZeRO pieces adding theirs in their own order), then the tp ranks' values
// are added in rank order.
template <class T>
double tensor_parallel_grad_sum_squares(const LlamaConfig& cfg, const ParallelPlan& plan, const std::vector<T>& whole);

}  // namespace llama4d
