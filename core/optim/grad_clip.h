#pragma once
// Global gradient-norm clipping, as torch.nn.utils.clip_grad_norm_ does it:
//   norm      = sqrt(sum over every gradient element of g^2)
//   clip_coef = min(1, max_norm / (norm + 1e-6))
//   g        *= clip_coef            (only when clip_coef < 1: unclipped grads stay bitwise)
// Llama 2 clipped at 1.0 (Touvron et al. 2023, Sec. 2.2).
//
// The sum of squares itself is taken in a fixed order that sharded strategies can reproduce
// (core/optim/segmented_norm.h): chunk partials from ops::sum_squares_chunks, added here in
// order by combine_chunk_sums. Clipping is split in steps so shards combine partials between
// them: partials -> combine_chunk_sums -> clip_coefficient -> apply_grad_clip on each shard.
#include <cstdint>

namespace llama4d {

// partials[count] added in index order.
double combine_chunk_sums(const double* partials, int64_t count);

// min(1, max_norm / (sqrt(total_sum_sq) + 1e-6)). NaN in, NaN out (the trainer should check the
// norm and skip the step); an infinite norm gives 0 as in PyTorch. Throws InputError unless
// max_norm > 0 and total_sum_sq >= 0.
double clip_coefficient(double total_sum_sq, double max_norm);

// g[n] *= clip_coef when clip_coef < 1 (the product in T, ops::scale); leaves g untouched
// otherwise.
template <class T>
void apply_grad_clip(T* g, int64_t n, double clip_coef);

}  // namespace llama4d
