#pragma once
// A mixture-of-experts feed-forward layer (Mixtral's: Jiang et al. 2024, "Mixtral of Experts"),
// as an explicit forward/backward pair:
//   logits = x @ gate^T                                           [BT, E]
//   probs = softmax(logits); experts, weights = the k largest, renormalised to sum to 1   [BT, k]
//   out[t] = sum over j < k of weights[t, j] * expert_{experts[t, j]}(x[t])               [BT, C]
//   expert_e(x) = w2_e( silu(w1_e x) * w3_e x )      (a SwiGLU: w1 gate, w3 up, w2 down; [I, C], [C, I])
// Dropless: every token reaches its k experts. Its BT*k rows are dispatched in EXPERT ORDER
// (expert 0's rows first; within an expert, tokens in order, then choices in order), so an
// expert's products are one matmul over its contiguous rows, and that order is the one a single
// device processes them in, wherever the rows are computed.
//
// Load balancing, Switch Transformer's form (Fedus et al. 2022, eq. 4) for top-k as Hugging
// Face's load_balancing_loss_func computes it:
//   aux = coef * E * sum_e f_e * P_e,   f_e = (rows routed to e) / BT (summing to k),
//                                       P_e = mean over tokens of probs[t, e]
// f is a count (no gradient); P carries aux's gradient into every probability. It is computed
// per layer and per call (micro-batch), as Megatron-LM and torchtitan do; Hugging Face Mixtral
// pools every layer's logits into one f and P first, which is the same for one MoE layer only.
//
// Memory: the forward keeps probs [BT,E], weights [BT,k], the dispatched rows' input xs [BT*k,C],
// w1 and w3 outputs h1, h3 and act [BT*k,I] each, the expert outputs ys [BT*k,C] (for the
// weights' gradient): (E + k + 2·k·C + 3·k·I)·BT values of T, and three [BT*k] int32 index
// arrays. The backward's scratch: (E + k + 2·k·C + 3·k·I)·BT values of T, and E for aux's gradient.
#include <cstdint>
#include <vector>

#include "core/tensor/buffer.h"
#include "core/tensor/memory_tracker.h"

namespace llama4d {

struct MoeDims {
  int64_t BT = 0;     // tokens
  int64_t C = 0;      // hidden size
  int64_t I = 0;      // each expert's SwiGLU width (Hugging Face Mixtral's intermediate_size)
  int64_t E = 0;      // experts (num_local_experts)
  int64_t k = 0;      // experts per token (num_experts_per_tok)
  double aux_coef = 0.0;  // router_aux_loss_coef
  int64_t rows() const { return BT * k; }  // dispatched rows
  // InputError naming the first bad size (k outside [1, E] among them).
  void validate() const;
};

// The layer's parameters in Hugging Face Mixtral's order (block_sparse_moe.gate.weight, then
// experts.0.w1, w2, w3, experts.1...), one after the other in a segment.
template <class T>
struct MoeWeights {
  T* gate = nullptr;     // [E, C]
  T* experts = nullptr;  // E x (w1 [I, C], w2 [C, I], w3 [I, C])
  int64_t C = 0, I = 0;
  T* w1(int64_t e) const { return experts + e * 3 * I * C; }
  T* w2(int64_t e) const { return w1(e) + I * C; }
  T* w3(int64_t e) const { return w2(e) + C * I; }
};
template <class T>
MoeWeights<T> moe_weights(T* segment, const MoeDims& d);
// Parameters of one layer: E·C + 3·E·I·C.
int64_t moe_numel(const MoeDims& d);

// Where each dispatched row goes, on the host: the counts size the experts' products (and, under
// expert parallelism, what each rank sends).
struct MoeDispatch {
  std::vector<int32_t> experts;  // [BT*k] the expert of choice j of token t, at t*k + j
  std::vector<int64_t> counts;   // [E] rows routed to each expert
  std::vector<int64_t> begin;    // [E+1] expert e's rows are [begin[e], begin[e+1]) in expert order
  std::vector<int32_t> token;    // [BT*k] the token of each row, in expert order
  std::vector<int32_t> row;      // [BT*k] the row, in expert order, of choice t*k + j
};
// The stable counting sort by expert of the choices experts[BT*k] (each in [0, E); InputError
// otherwise): tokens in order within an expert, choices in order within a token.
MoeDispatch dispatch_in_expert_order(const std::vector<int32_t>& experts, int64_t E, int64_t k);

// The experts' side of the layer: rows in expert order, expert first + e's rows being
// [begin[e], begin[e] + counts[e]). One device holds every expert (first 0); under expert
// parallelism (core/parallel/expert_parallel.h) a rank holds a block of them and these are the
// rows it received.
struct ExpertRows {
  int64_t first = 0;             // the first expert held
  std::vector<int64_t> begin;    // per expert held
  std::vector<int64_t> counts;   // per expert held
  int64_t total() const { return begin.empty() ? 0 : begin.back() + counts.back(); }
};

// What the experts' forward keeps for the backward (activations on the rank's tracker).
template <class T>
struct ExpertActivations {
  Buffer<T> xs, h1, h3, act;  // [rows,C] (the caller fills xs), [rows,I] x3
  void reset();
};

// ys[rows,C] = each held expert's SwiGLU over its rows of a.xs (one matmul per expert and
// product); w's experts are the held ones (w.w1(0) is expert rows.first's).
template <class T>
void experts_forward(T* ys, ExpertActivations<T>& a, const MoeWeights<T>& w, const ExpertRows& rows, const MoeDims& d,
                     MemoryTracker* memory);
// dxs[rows,C] written over from dys[rows,C]; the held experts' weight gradients ACCUMULATE into g.
template <class T>
void experts_backward(T* dxs, const MoeWeights<T>& g, const T* dys, const ExpertActivations<T>& a,
                      const MoeWeights<T>& w, const ExpertRows& rows, const MoeDims& d, MemoryTracker* memory);

// The experts a rank holds. Under expert parallelism rank r of an ep group of size P holds
// [r·E/P, (r+1)·E/P) (ExpertShard::of: InputError naming both unless P divides E); count 0 means
// every expert (one device, data parallelism).
struct ExpertShard {
  int64_t first = 0, count = 0;
  static ExpertShard of(const MoeDims& d, int ep_size, int ep_rank);
  bool all() const { return count == 0; }
  bool holds(int64_t e) const { return all() || (e >= first && e < first + count); }
};

// Expert parallelism (core/parallel/expert_parallel.h): what the forward's exchange of rows
// with the other ranks of the ep group keeps for the backward. Empty on one device.
struct ExpertExchange {
  ExpertRows held;                     // the rows this rank's experts computed, in local-expert order
  Buffer<int32_t> from_received;       // [held rows] the received row each local-expert-order row is
  Buffer<int32_t> to_received;         // [held rows] the local-expert-order row of each received row
  std::vector<int64_t> send_rows;      // [P] rows this rank sends to each rank (and gets back)
  std::vector<int64_t> recv_rows;      // [P] rows this rank receives from each rank (and returns)
  std::vector<int64_t> global_counts;  // [E] rows routed to each expert over the whole ep group
  void reset();
};

// What the forward keeps for the backward, charged to the rank's tracker as activations.
template <class T>
struct MoeActivations {
  Buffer<T> probs, weights;             // [BT,E], [BT,k]
  Buffer<int32_t> experts, token, row;  // [BT*k] each: the router's choice, MoeDispatch's token and row
  Buffer<T> ys;                         // [BT*k,C] the experts' outputs, in this rank's expert order
  ExpertActivations<T> expert;          // one device: the experts' side, in the same order
  MoeDispatch dispatch;
  ExpertExchange exchange;              // expert parallelism only
  double aux_loss = 0.0;                // this call's load-balancing loss, coef included
  void reset();
};

// The token side, the same with or without expert parallelism: the router, the dispatch order
// (a.dispatch and its device copies) and the load-balancing loss; allocates a's router buffers
// and a.ys (filled by the experts later).
template <class T>
void moe_route(MoeActivations<T>& a, const MoeWeights<T>& w, const T* x, const MoeDims& d, MemoryTracker* memory);
// The token side's backward: dx[BT,C] (written over) = the dispatch's backward of dxs [BT*k,C]
// (the experts' input gradients in this rank's expert order) plus the router's, from dweights
// [BT,k] and the load-balancing loss (scaled by aux_scale, see moe_backward); the gate's
// gradient ACCUMULATES into g.gate.
template <class T>
void moe_route_backward(T* dx, const MoeWeights<T>& g, const T* dweights, const T* dxs, const MoeActivations<T>& a,
                        const MoeWeights<T>& w, const T* x, const MoeDims& d, double aux_scale, MemoryTracker* memory);

// out[BT,C] = moe(x[BT,C]), written over, on one device holding every expert; allocates and fills a.
template <class T>
void moe_forward(T* out, MoeActivations<T>& a, const MoeWeights<T>& w, const T* x, const MoeDims& d,
                 MemoryTracker* memory);

// dx[BT,C] = the input gradient (written over; no alias of dout); the weight gradients
// ACCUMULATE into g. aux_scale = d(total loss)/d(a.aux_loss): 1 when aux is added to the loss
// once, 1/M for the mean over M micro-batches. Temporaries are charged to memory as scratch.
template <class T>
void moe_backward(T* dx, const MoeWeights<T>& g, const T* dout, const MoeActivations<T>& a, const MoeWeights<T>& w,
                  const T* x, const MoeDims& d, double aux_scale, MemoryTracker* memory);

}  // namespace llama4d
