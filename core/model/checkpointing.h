#pragma once
// Activation checkpointing policies: which of a block's forward activations are kept for its
// backward and which are recomputed (see lessons/03-activation-checkpointing).
//
//   none       keep everything the backward reads (per block: n1, rstd1, q, k, v, att, lse, h,
//              n2, rstd2, gate, up, act, and the block's input).
//   selective  keep the block input and the matmul outputs q, k, v, h, gate, up; recompute the
//              cheap parts in backward: both RMSNorm outputs (n1, n2 and their rstd), the
//              attention core (att and its log-sum-exp, from q, k, v) and the SwiGLU product
//              act. After Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
//              Transformer Models", which recomputes the attention core because its memory grows
//              with T^2 while its FLOPs are small; here attention already stores only the
//              log-sum-exp, so what selective saves is the elementwise outputs.
//   full       keep only each block's input; rerun the whole block's forward in its backward
//              (one extra forward: +1/3 of the training FLOPs of the blocks).
//   every:k    keep the input of every k-th block (blocks 0, k, 2k, ...); in backward, rerun a
//              run of k blocks from its kept input and keep the run's activations
//              while it is differentiated (Chen et al. 2016, "Training Deep Nets with Sublinear
//              Memory Cost"). full == every:1. Memory ~ (L/k) x + k (x + A) for an input x and a
//              block's activations A, least near k = sqrt(L x / (x + A)); Chen et al.'s sqrt(L)
//              assumes A ~ x, but a Llama block stores ~15x its input, so here the best k is
//              small (1 on `small`): lessons/03 measures it. Always one extra forward.
// Every policy gives bit-identical gradients: a recomputed tensor is produced by the same ops
// on the same inputs as the original.
#include <string>
#include <string_view>

namespace llama4d {

struct Checkpointing {
  enum class Kind { none, selective, every };
  Kind kind = Kind::none;
  int every = 1;  // Kind::every: keep the input of blocks l with l % every == 0

  // "none", "selective", "full", "every:K" (K >= 1) or "every:sqrt" (K = ceil(sqrt(L))).
  // InputError for anything else. num_layers resolves "sqrt".
  static Checkpointing parse(std::string_view spec, int num_layers);
  std::string describe() const;  // the canonical spec: "none", "selective", "full", "every:2"

  bool recomputes_blocks() const { return kind == Kind::every; }
  // Is block `layer`'s input kept from forward to backward? (first = first block of the range)
  bool keeps_input(int layer, int first_block) const {
    return kind != Kind::every || layer == first_block || layer % every == 0;
  }
};

}  // namespace llama4d
