#pragma once
// Global gradient-norm clipping, as torch.nn.utils.clip_grad_norm_ does it:
//   norm      = sqrt(sum over every gradient element of g^2)
//   clip_coef = min(1, max_norm / (norm + 1e-6))
//   g        *= clip_coef            (only when clip_coef < 1: unclipped grads stay bitwise)
// Llama 2 clipped at 1.0 (Touvron et al. 2023, Sec. 2.2).
//
// Split in steps so sharded strategies can combine partial sums between them:
//   single rank:  s = local_grad_sum_squares(g, n);  c = clip_coefficient(s, max_norm);
//                 apply_grad_clip(g, n, c)            (or clip_grad_norm(g, n, max_norm))
//   sharded:      s_r = local_grad_sum_squares(shard, n_r); all-reduce(sum) s_r -> s; then as above.
// The all-reduce adds the partials in another order than the single-rank sum, so the total can
// differ in its last bits. For a bitwise match, shard at multiples of kSumSquaresChunk, gather
// every rank's chunk_sum_squares partials in flat order and call combine_chunk_sums on them:
// that is exactly the single-rank order.
//
// The summation order is fixed by the code, never by the thread count: the buffer is cut into
// chunks of kSumSquaresChunk elements from its first element; each chunk is summed in double by
// kSumSquaresLanes interleaved accumulators (element i to lane i % lanes) added lane 0 first;
// chunk sums are then added in chunk order. Threads only decide who computes which chunk.
#include <cstdint>

namespace llama4d {

constexpr int64_t kSumSquaresChunk = 4096;
constexpr int64_t kSumSquaresLanes = 8;

// Number of chunks chunk_sum_squares writes for n elements: ceil(n / kSumSquaresChunk).
constexpr int64_t num_sum_squares_chunks(int64_t n) {
  return (n + kSumSquaresChunk - 1) / kSumSquaresChunk;
}

// partials[num_sum_squares_chunks(n)] = per-chunk sums of g[n]^2, in double.
template <class T>
void chunk_sum_squares(double* partials, const T* g, int64_t n);

// partials[count] added in index order.
double combine_chunk_sums(const double* partials, int64_t count);

// Sum of squares of g[n] in double (deterministic, see above). Deliberately not
// ops::sum_squares: its order belongs to the backend and may follow the thread count.
template <class T>
double local_grad_sum_squares(const T* g, int64_t n);

// min(1, max_norm / (sqrt(total_sum_sq) + 1e-6)). NaN in, NaN out (the trainer should check the
// norm and skip the step); an infinite norm gives 0 as in PyTorch. Throws InputError unless
// max_norm > 0 and total_sum_sq >= 0.
double clip_coefficient(double total_sum_sq, double max_norm);

// g[n] *= clip_coef when clip_coef < 1 (the product in T); leaves g untouched otherwise.
template <class T>
void apply_grad_clip(T* g, int64_t n, double clip_coef);

// Single-rank convenience: all three steps. Returns the norm BEFORE clipping, like PyTorch.
template <class T>
double clip_grad_norm(T* g, int64_t n, double max_norm);

}  // namespace llama4d
