#pragma once
// One transformer block of Llama 3, as an explicit forward/backward pair:
//   h   = x + o_proj( attention( rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1) ) ),  n1 = rmsnorm(x)
//   out = h + down_proj( silu(gate_proj(n2)) * up_proj(n2) ),                         n2 = rmsnorm(h)
// Shapes: x, h, out [B, T, C]; q [B, T, nh, hd]; k, v [B, T, nkv, hd]; gate, up [B, T, I].
#include <cstdint>
#include <vector>

#include "core/model/rope.h"

namespace llama4d {

// Sizes one block works with. Tensor/context parallelism later shrink nh, nkv, I (or T) to
// the local shard and keep everything else.
struct BlockDims {
  int64_t B = 0, T = 0;        // batch rows, tokens per row
  int64_t C = 0;               // hidden size
  int64_t nh = 0, nkv = 0, hd = 0;
  int64_t I = 0;               // SwiGLU intermediate size
  double eps = 1e-5;
  int64_t BT() const { return B * T; }
};

// Pointers into the flat parameter (or gradient) buffer for one layer.
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
};

// Everything the forward keeps for the backward (for one layer).
template <class T>
struct BlockActivations {
  std::vector<T> n1, rstd1;      // [B,T,C], [B,T]
  std::vector<T> q, k, v;        // [B,T,nh,hd], [B,T,nkv,hd] x2 (q, k after RoPE)
  std::vector<T> att, lse;       // [B,T,nh,hd], [B,nh,T]
  std::vector<T> h;              // [B,T,C] residual stream after attention
  std::vector<T> n2, rstd2;      // [B,T,C], [B,T]
  std::vector<T> gate, up, act;  // [B,T,I] x3 (act = silu(gate) * up)
  std::vector<T> out;            // [B,T,C] block output

  void resize(const BlockDims& d);
  int64_t bytes() const;
};

// Backward temporaries, shared by all layers (only one layer runs backward at a time).
template <class T>
struct BlockScratch {
  std::vector<T> dn, dh, dq, dk, dv, datt, dgate, dup, dact;
  void resize(const BlockDims& d);
};

// Where attention reads keys/values from when decoding with a cache: the block appends this
// call's k, v at positions [len, len + T) and attends over [0, len + T).
template <class T>
struct BlockKvCache {
  T* k = nullptr;  // [B, max_len, nkv, hd]
  T* v = nullptr;
  int64_t len = 0, max_len = 0;
};

// out = block(x). pos_start is the absolute position of token 0 (for RoPE and causality).
template <class T>
void block_forward(BlockActivations<T>& a, const BlockWeights<T>& w, const T* x, const BlockDims& d,
                   const RopeTables<T>& rope, int64_t pos_start, BlockKvCache<T>* cache = nullptr);

// dx[B,T,C] = d(out)/d(x)^T dout (OVERWRITTEN); weight gradients ACCUMULATE into g.
// dx may alias dout: dout is consumed first.
template <class T>
void block_backward(T* dx, const BlockWeights<T>& g, const T* dout, const BlockActivations<T>& a,
                    const BlockWeights<T>& w, const T* x, const BlockDims& d, const RopeTables<T>& rope,
                    int64_t pos_start, BlockScratch<T>& s);

}  // namespace llama4d
