#pragma once
// One transformer block of Llama 3, as an explicit forward/backward pair:
//   h   = x + o_proj( attention( rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1) ) ),  n1 = rmsnorm(x)
//   out = h + down_proj( silu(gate_proj(n2)) * up_proj(n2) ),                         n2 = rmsnorm(h)
// Shapes: x, h, out [B, T, C]; q [B, T, nh, hd]; k, v [B, T, nkv, hd]; gate, up [B, T, I].
// A mixture-of-experts block (BlockDims::E > 0, Mixtral's) replaces the SwiGLU by
//   out = h + moe(n2)                                                 (core/model/moe.h)
// with E experts of width I, k per token, through the BlockComm's moe point (one device's layer
// by default, expert parallelism's over an ep group).
#include <array>
#include <cstdint>
#include <string>

#include "core/model/bf16_parking.h"
#include "core/model/moe.h"
#include "core/model/rope.h"
#include "core/tensor/buffer.h"
#include "core/tensor/dtype.h"

namespace llama4d {

// What the products of a model read: under bf16 mixed precision every operand is rounded to bf16
// first (the rounding points below), so a backend may read them as bf16 (tensor cores).
inline ops::GemmOperands gemm_operands(bool bf16) { return bf16 ? ops::GemmOperands::bf16 : ops::GemmOperands::as_stored; }

// Sizes one block works with, and where its tokens sit in their sequences. Tensor/context
// parallelism shrink nh, nkv, I (or seq) to the local shard and keep everything else.
struct BlockDims {
  int64_t B = 0, seq = 0;      // batch rows, tokens per row ([B, T] in shape comments)
  int64_t C = 0;               // hidden size
  int64_t nh = 0, nkv = 0, hd = 0;
  int64_t I = 0;               // SwiGLU intermediate size (each expert's, in a mixture of experts)
  double eps = 1e-5;
  // Mixture of experts: E > 0 experts, k per token, the load-balancing loss's weight (0: not
  // added to the loss). E = 0: the dense SwiGLU.
  int64_t E = 0, k = 0;
  double aux_coef = 0.0;
  // The backward's d(objective)/d(this block's load-balancing loss) (moe_backward's aux_scale).
  double aux_scale = 0.0;
  bool moe() const { return E > 0; }
  MoeDims moe_dims() const { return {.BT = BT(), .C = C, .I = I, .E = E, .k = k, .aux_coef = aux_coef}; }
  // Sequence parallelism: the residual stream (x, h, the block's output and their gradients)
  // and the RMSNorms hold only this rank's rows [row0(), row0() + rows()) of the B*T tokens
  // (flattened, batch row by batch row);
  // the communication points gather the normed rows before the column-parallel matmuls and
  // reduce-scatter the row-parallel outputs back to them. sp = 1: every row everywhere.
  int64_t sp = 1, sp_rank = 0;
  // Context parallelism (Llama 3's load-balanced split): each sequence of cp·seq tokens is cut into
  // 2·cp chunks of seq/2 and this rank holds chunks cp_rank and 2·cp-1-cp_rank, so every rank does
  // the same causal-attention work. Its seq tokens per row are those two chunks, one after the
  // other; RoPE and causality use each token's true position. cp = 1: the whole sequence.
  int64_t cp = 1, cp_rank = 0;
  // Document masking: [B, cp·seq] the document of every position of each WHOLE row (this rank's
  // tokens and, under context parallelism, every other rank's), ids never decreasing along a
  // row; a token attends only to earlier tokens of its own document. Null: no document mask.
  const int32_t* doc = nullptr;
  // bf16 mixed precision (Llama::set_bf16_compute): every activation and activation gradient the
  // block stores is rounded to bf16 once it is complete (after its last accumulation and its
  // communication point), so it holds what a bf16 tensor would. The statistics kept for the
  // backward (rstd, lse) and the weight gradients stay in T, as fp32 does in Llama 3's recipe.
  bool bf16 = false;
  ops::GemmOperands operands() const { return gemm_operands(bf16); }
  int64_t BT() const { return B * seq; }
  int64_t cp_chunk() const { return seq / 2; }  // tokens per chunk (cp > 1)
  // The first true position of this rank's part (0 or 1) of a row.
  int64_t cp_part_start(int64_t part) const { return (part == 0 ? cp_rank : 2 * cp - 1 - cp_rank) * cp_chunk(); }
  int64_t rows() const { return sequence_row0(BT(), sp, sp_rank + 1) - row0(); }
  int64_t row0() const { return sequence_row0(BT(), sp, sp_rank); }
  // Rank r of sp holds rows [BT·r/sp, BT·(r+1)/sp): any BT splits (a rank gets at most one row more).
  static int64_t sequence_row0(int64_t BT, int64_t sp, int64_t r) { return BT * r / sp; }
};

// x[n] rounded to bf16 in place when `bf16` (mixed precision), else untouched.
template <class T>
inline void round_if_bf16(T* x, int64_t n, bool bf16) {
  if (bf16) ops::round_to_bf16(x, n);
}

// Pointers into a unit's parameter (or gradient) segment.
template <class T>
struct BlockWeights {
  T* ln1 = nullptr;    // [C]          input_layernorm
  T* wq = nullptr;     // [nh*hd, C]
  T* wk = nullptr;     // [nkv*hd, C]
  T* wv = nullptr;     // [nkv*hd, C]
  T* wo = nullptr;     // [C, nh*hd]
  T* ln2 = nullptr;    // [C]          post_attention_layernorm
  T* wgate = nullptr;  // [I, C]
  T* wup = nullptr;    // [I, C]
  T* wdown = nullptr;  // [C, I]
  T* moe = nullptr;    // mixture of experts (BlockDims::moe()): the router and experts, MoeWeights' layout;
                       // wgate, wup, wdown are then null
};
// The nine tensors of a block segment, laid out consecutively in params.h order (a mixture of
// experts: the seven attention tensors, then the MoE layer's).
template <class T>
BlockWeights<T> block_weights(T* segment, const BlockDims& d);

// What the forward keeps for the backward (for one block). The block's input x is kept by the
// caller (it is the previous unit's output). Which tensors are held depends on the activation
// checkpointing policy (core/model/checkpointing.h); all are allocated on the rank's tracker.
template <class T>
struct BlockActivations {
  // Kept by every policy that keeps this block at all (selective keeps only these):
  Buffer<T> q, k, v;             // [B,T,nh,hd], [B,T,nkv,hd] x2 (q, k after RoPE)
  Buffer<T> h;                   // [rows,C] residual stream after attention (rows = B*T / sp)
  Buffer<T> gate, up;            // [B,T,I] x2
  // Recomputable from the above and x (dropped by selective, rebuilt in its backward):
  Buffer<T> n1, rstd1;           // [B,T,C] (gathered under sequence parallelism), [rows]
  Buffer<T> att, lse;            // [B,T,nh,hd], [B,nh,T]
  Buffer<T> n2, rstd2;           // [B,T,C], [rows]
  Buffer<T> act;                 // [B,T,I] silu(gate) * up
  // Mixture of experts (instead of gate, up, act): the router's and the experts' activations,
  // kept by every policy that keeps the block (selective recomputes none of them); in T also
  // under bf16 (which the MoE layer does not run yet).
  MoeActivations<T> moe;

  // bf16 mixed precision (core/model/bf16_parking.h): after the block's forward every held
  // tensor but rstd1, lse, rstd2 waits as bf16, in the order of bf16_valued(); unpark_bf16
  // restores them before the backward.
  std::array<Buffer<bf16>, 10> parked;  // q, k, v, h, gate, up, n1, att, n2, act

  void allocate(MemoryTracker* memory, const BlockDims& d);               // every tensor
  void allocate_recomputable(MemoryTracker* memory, const BlockDims& d);  // the second group
  void release_recomputable();
  void park_bf16(MemoryTracker* memory);
  void unpark_bf16(MemoryTracker* memory);
  void reset();
  // Whether q (kept by every policy) or n1 (only by a complete block) is held, in T or parked.
  bool holds_anything() const { return !q.empty() || !parked[0].empty(); }
  bool complete() const { return !n1.empty() || !parked[6].empty(); }
  int64_t bytes() const;  // in T and parked

 private:
  std::array<NamedTensor<T>, 10> bf16_valued();  // the order of `parked`
};

// Backward temporaries, shared by all blocks of one backward pass (scratch category).
// block_backward uses all of them; block_backward_input only dact, datt and (sequence parallelism)
// dn (the gradients the weight pass reads go to the micro-batch's BlockWeightGradInputs
// instead); block_backward_weight
// only gk, gv, gnorm, which every pass allocates on first use.
template <class T>
struct BlockScratch {
  Buffer<T> dn, dh, dq, dk, dv, datt, dgate, dup, dact;
  Buffer<T> gk, gv;  // [nkv*hd, C] replicated key/value heads only (BlockComm::sums_key_value_weight_grads)
  Buffer<T> gnorm;   // [C] sequence parallelism only (BlockComm::norm_weight_grads)
  MemoryTracker* memory = nullptr;  // where gk, gv, gnorm are allocated on first use
  void allocate(MemoryTracker* memory, const BlockDims& d);             // for block_backward
  void allocate_input_pass(MemoryTracker* memory, const BlockDims& d);  // for block_backward_input
  void reset();
};

// What a block's weight gradients are computed from, kept from its input-gradient pass to its
// weight-gradient pass (the "B" and "W" of zero-bubble pipeline schedules, Qi et al. 2023): the
// gradient of every matmul's output and every RMSNorm's output, and the inputs of those matmuls
// and norms. Charged to the rank's tracker as activations. dn1 and dn2 hold this rank's rows
// only (under sequence parallelism the input pass sums them over every row in scratch first);
// ddown and dattn every row, which their weight gradients read.
template <class T>
struct BlockWeightGradInputs {
  // Output gradients, written by block_backward_input:
  Buffer<T> ddown;       // [B,T,C] d(down_proj output), every row
  Buffer<T> dgate, dup;  // [B,T,I] d(gate_proj output), d(up_proj output)
  Buffer<T> dn2;         // [rows,C] d(n2), this rank's rows: the gate/up input gradient, the norm's dy
  Buffer<T> dattn;       // [B,T,C] d(o_proj output), every row
  Buffer<T> dq, dk, dv;  // [B,T,nh,hd], [B,T,nkv,hd] x2: d(q/k/v_proj output), RoPE undone
  Buffer<T> dn1;         // [rows,C] d(n1), this rank's rows (all BT without sequence parallelism)
  // Inputs, moved from the block's activations and its input by take_inputs:
  Buffer<T> act, n2, att, n1;  // [B,T,I], [B,T,C], [B,T,nh*hd], [B,T,C]: of down, gate/up, o, q/k/v
  Buffer<T> h, rstd2, x, rstd1;  // [rows,C], [rows] x2, [rows,C]: the two RMSNorms' inputs, 1/rms

  // bf16 mixed precision: between the input and the weight pass all but rstd2 and rstd1 wait as
  // bf16, in the order of bf16_valued() (core/model/bf16_parking.h).
  std::array<Buffer<bf16>, 15> parked;

  // The output gradients (owner names them for out-of-memory messages: "layer 3").
  void allocate(MemoryTracker* memory, const BlockDims& d, const std::string& owner);
  // Moves the matmul and norm inputs out of a (whose other tensors the caller frees) and x.
  void take_inputs(BlockActivations<T>& a, Buffer<T>& x);
  void park_bf16(MemoryTracker* memory) { park_all_bf16(bf16_valued(), parked, memory); }
  void unpark_bf16(MemoryTracker* memory) { unpark_all_bf16(bf16_valued(), parked, memory); }
  void reset();
  bool holds_anything() const { return !ddown.empty() || !parked[0].empty(); }
  int64_t bytes() const;  // in T and parked

 private:
  std::array<NamedTensor<T>, 15> bf16_valued() {
    return {{{&ddown, "d(down_proj out)"}, {&dgate, "d(gate_proj out)"}, {&dup, "d(up_proj out)"}, {&dn2, "dn2"},
             {&dattn, "d(o_proj out)"}, {&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}, {&dn1, "dn1"}, {&act, "act"},
             {&n2, "n2"}, {&att, "att"}, {&n1, "n1"}, {&h, "h"}, {&x, "x"}}};
  }
};

// Named communication points inside a block, no-ops here. Tensor and sequence parallelism
// (which split the matmuls and the sequence) and context parallelism (which exchanges keys and
// values around attention) fill them in without editing the block's math. Each forward point
// has its backward twin, called on the gradient of the same tensor. Every point works in place
// on a [B,T,C] buffer; with sequence parallelism (d.sp > 1) this rank's rows of it are
// [d.row0(), d.row0() + d.rows()).
template <class T>
class BlockComm {
 public:
  virtual ~BlockComm() = default;
  // n1 / n2 [B,T,C] as they enter the q/k/v (gate/up) projections. With sequence parallelism
  // only this rank's rows are filled on entry; the point gathers the others (and its backward
  // reduce-scatters the gradient down to this rank's rows).
  virtual void attention_input(T* n1, const BlockDims& d) {}
  virtual void attention_input_backward(T* dn1, const BlockDims& d) {}
  virtual void mlp_input(T* n2, const BlockDims& d) {}
  virtual void mlp_input_backward(T* dn2, const BlockDims& d) {}
  // The o_proj (down_proj) output [B,T,C] before it joins the residual stream. With sequence
  // parallelism only this rank's rows are read afterwards (a reduce-scatter), and the backward
  // point receives the gradient in this rank's rows and gathers the others.
  virtual void attention_output(T* y, const BlockDims& d) {}
  virtual void attention_output_backward(T* dy, const BlockDims& d) {}
  virtual void mlp_output(T* y, const BlockDims& d) {}
  virtual void mlp_output_backward(T* dy, const BlockDims& d) {}
  // Sequence parallelism: the RMSNorm gains' gradient g[C] from this rank's rows, per
  // micro-batch; every rank must end with the sum over the ranks' rows before it accumulates.
  virtual void norm_weight_grads(T* g, const BlockDims& d) {}
  // Context parallelism (d.cp > 1): this rank holds only some of each sequence's tokens. The
  // point computes its queries' causal attention over the whole sequence's keys and values,
  // fetching the other ranks' (gathered, or passed around a ring):
  //   q [B,T,nh,hd], k, v [B,T,nkv,hd] after RoPE -> out [B,T,nh,hd], lse (B·nh·T values, in
  //   the point's own layout: only its backward reads them).
  // The backward ADDS into dq, dk, dv [B,T,...] this rank's tokens' gradients, every rank's
  // queries included. Called only when d.cp > 1 (the block attends locally otherwise); the
  // defaults throw: context parallelism needs a communication that implements them.
  virtual void attention(T* out, T* lse, const T* q, const T* k, const T* v, const BlockDims& d);
  virtual void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                                  const T* out, const T* lse, const BlockDims& d);
  // Tensor parallelism with key/value heads held by several ranks (tp > nkv): gk, gv [nkv*hd, C]
  // are this micro-batch's k_proj / v_proj weight gradients on this rank; every replica of a
  // head must end with the sum over its replicas before they accumulate. Per micro-batch, so
  // gradients accumulated from earlier micro-batches are never summed twice.
  virtual bool sums_key_value_weight_grads() const { return false; }
  virtual void key_value_weight_grads(T* gk, T* gv, const BlockDims& d) {}
  // Mixture of experts: the MoE layer itself, out[BT,C] = moe(x[BT,C]) and its backward
  // (core/model/moe.h's contracts), on one device by default. Expert parallelism
  // (core/parallel/expert_parallel.h) runs it over an ep group with this rank's experts only,
  // and says so (shards_experts), which a model holding a shard of the experts requires.
  virtual void moe(T* out, MoeActivations<T>& a, const MoeWeights<T>& w, const T* x, const MoeDims& d,
                   MemoryTracker* memory) {
    moe_forward(out, a, w, x, d, memory);
  }
  virtual void moe_backward(T* dx, const MoeWeights<T>& g, const T* dout, const MoeActivations<T>& a,
                            const MoeWeights<T>& w, const T* x, const MoeDims& d, double aux_scale,
                            MemoryTracker* memory) {
    llama4d::moe_backward(dx, g, dout, a, w, x, d, aux_scale, memory);
  }
  virtual bool shards_experts() const { return false; }
};

// Where attention reads keys/values from when decoding with a cache: the block appends this
// call's k, v at positions [len, len + T) and attends over [0, len + T).
template <class T>
struct BlockKvCache {
  T* k = nullptr;  // [B, max_len, nkv, hd]
  T* v = nullptr;
  int64_t len = 0, max_len = 0;
};

// out[B,T,C] = block(x); fills every tensor of `a` (which must be allocated). pos_start is the
// absolute position of token 0 (for RoPE and causality). comm may be null (no communication).
// out may be null when only the activations are wanted: recomputing the top block of a
// checkpointed segment, whose output is never read again, stops before down_proj (saving
// 2·C·I FLOPs per token).
template <class T>
void block_forward(T* out, BlockActivations<T>& a, const BlockWeights<T>& w, const T* x, const BlockDims& d,
                   const RopeTables<T>& rope, int64_t pos_start, BlockComm<T>* comm = nullptr,
                   BlockKvCache<T>* cache = nullptr);

// Rebuilds the recomputable tensors of `a` (n1, rstd1, att, lse, n2, rstd2, act) from x and
// the kept ones: the backward half of selective checkpointing. Same ops, same inputs, so the
// same bits as the forward produced.
template <class T>
void block_recompute_selective(BlockActivations<T>& a, const BlockWeights<T>& w, const T* x, const BlockDims& d,
                               const RopeTables<T>& rope, int64_t pos_start, BlockComm<T>* comm = nullptr);

// dx[B,T,C] = d(out)/d(x)^T dout (OVERWRITTEN); weight gradients ACCUMULATE into g.
// dx may alias dout: dout is consumed first.
template <class T>
void block_backward(T* dx, const BlockWeights<T>& g, const T* dout, const BlockActivations<T>& a,
                    const BlockWeights<T>& w, const T* x, const BlockDims& d, const RopeTables<T>& rope,
                    int64_t pos_start, BlockScratch<T>& s, BlockComm<T>* comm = nullptr);

// block_backward split in two, for zero-bubble pipeline schedules. The input pass computes dx
// (the same bits, by the same op calls minus the weight gradients) and leaves the output
// gradients in `keep` (allocated; the caller then moves the inputs in with keep.take_inputs).
// It makes the activation communication calls (mlp/attention _output_backward, _input_backward,
// attention_backward). s needs allocate_input_pass.
template <class T>
void block_backward_input(T* dx, BlockWeightGradInputs<T>& keep, const T* dout, const BlockActivations<T>& a,
                          const BlockWeights<T>& w, const T* x, const BlockDims& d, const RopeTables<T>& rope,
                          int64_t pos_start, BlockScratch<T>& s, BlockComm<T>* comm = nullptr);
// The weight pass: ACCUMULATES into g what block_backward would, by the same op calls in the same
// order (so input then weight is bitwise block_backward), with the weight-gradient communication
// calls (norm_weight_grads, key_value_weight_grads). Reads no parameter and recomputes nothing.
// s needs only `memory` set.
template <class T>
void block_backward_weight(const BlockWeights<T>& g, const BlockWeightGradInputs<T>& in, const BlockDims& d,
                           BlockScratch<T>& s, BlockComm<T>* comm = nullptr);

}  // namespace llama4d
