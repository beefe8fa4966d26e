#pragma once
// Model FLOPs of one training token, the numerator of model FLOP utilisation (MFU).
#include <cstdint>

#include "core/model/checkpointing.h"
#include "core/model/config.h"

namespace llama4d {

// 6 * N_matmul + 12 * L * (nh * hd) * T   per token (forward + backward = 3x forward), where
//   N_matmul = weights that take part in matrix multiplies: every projection of every layer and
//              the LM head (an embedding lookup is not a matmul; RMSNorm gains are negligible);
//   12 L nh hd T = attention scores q k^T and the weighted sum p v: 2 matmuls x 2 FLOP per
//              multiply-add x T keys x nh*hd, times 3 for the backward. Counted over the full
//              T x T square, the convention of the PaLM paper (Chowdhery et al. 2022, App. B),
//              although a causal kernel skips about half of it.
double training_flops_per_token(const LlamaConfig& cfg, int64_t seq_len);
int64_t matmul_parameters(const LlamaConfig& cfg);

// FLOPs per token that activation checkpointing adds by running forward work again: the
// numerator of hardware FLOP utilisation (HFU) is training + recompute, MFU's is training only
// (the distinction of Chowdhery et al. 2022, App. B). Counted with the same conventions:
//   full, every:k  every block's forward once more, except the down projection of each
//                  segment's top block (its output is not read again):
//                  2 N_blocks + 4 L nh hd T - 2 C I ceil(L / k)
//   selective      the attention core's forward (q k^T and p v): 4 L nh hd T
//                  (RMSNorm and SwiGLU recomputation is elementwise, O(C) per token, left out)
double recompute_flops_per_token(const LlamaConfig& cfg, int64_t seq_len, const Checkpointing& ac);

}  // namespace llama4d
