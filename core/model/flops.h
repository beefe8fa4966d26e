#pragma once
// Model FLOPs of one training token, the numerator of model FLOP utilisation (MFU).
#include <cstdint>

#include "core/model/checkpointing.h"
#include "core/model/config.h"
#include "core/model/units.h"

namespace llama4d {

// 6 * N_matmul + 12 * L * (nh * hd) * T   per token (forward + backward = 3x forward), where
//   N_matmul = weights that take part in matrix multiplies: every projection of every layer and
//              the LM head (an embedding lookup is not a matmul; RMSNorm gains are negligible);
//              in a mixture of experts, those a token multiplies: the router [E, C] and its k
//              experts' SwiGLUs, k·3·I·C (ffn_matmul_parameters);
//   12 L nh hd T = attention scores q k^T and the weighted sum p v: 2 matmuls x 2 FLOP per
//              multiply-add x T keys x nh*hd, times 3 for the backward. Counted over the full
//              T x T square, the convention of the PaLM paper (Chowdhery et al. 2022, App. B),
//              although a causal kernel skips about half of it.
double training_flops_per_token(const LlamaConfig& cfg, int64_t seq_len);
int64_t matmul_parameters(const LlamaConfig& cfg);
// A layer's FFN weights one token multiplies: 3·I·C dense, E·C + k·3·I·C a mixture of experts.
int64_t ffn_matmul_parameters(const LlamaConfig& cfg);

// FLOPs per token that activation checkpointing adds by running forward work again: the
// numerator of hardware FLOP utilisation (HFU) is training + recompute, MFU's is training only
// (the distinction of Chowdhery et al. 2022, App. B). Counted with the same conventions:
//   full, every:k  every block's forward once more, except the down projection of each
//                  segment's top block (its output is not read again):
//                  2 N_blocks + 4 L nh hd T - 2 C I ceil(L / k)   (a mixture of experts' layer is
//                  recomputed whole: no down projection left out)
//   selective      the attention core's forward (q k^T and p v): 4 L nh hd T
//                  (RMSNorm and SwiGLU recomputation is elementwise, O(C) per token, left out)
double recompute_flops_per_token(const LlamaConfig& cfg, int64_t seq_len, const Checkpointing& ac);

// What one unit's ops do for a micro-batch of B rows x T tokens on one device: the FLOPs the
// simulated clock charges (core/ops.h), with attention over the T(T+1)/2 causal (query, key)
// pairs each head really scores rather than MFU's full square:
//   block forward   2·BT·C·(q + 2 kv) + 2·BT·q·C + 3 · 2·BT·C·I   + 4·hd·B·nh·T(T+1)/2
//                   (a mixture of experts: 2·BT·(E·C + k·3·I·C) in place of 3 · 2·BT·C·I)
//   block backward  2x the forward's products (input and weight gradients) + 10·hd·B·nh·T(T+1)/2
//   head            2·BT·C·V forward, twice that backward; the embedding: none (a lookup)
// (q = nh·hd, kv = nkv·hd). Checkpointing adds, inside backward: full / every:k run a block's
// forward again (the top block of a segment stops before down_proj: forward - down_proj);
// selective runs attention's forward again (attention_forward).
struct UnitFlops {
  double forward = 0, backward = 0;
  double attention_forward = 0;  // part of forward: q·k and p·v
  double down_proj = 0;          // part of forward: the last product of the block
};
UnitFlops unit_flops(const LlamaConfig& cfg, int64_t B, int64_t T, int unit);

}  // namespace llama4d
