// Softmax + cross-entropy over the vocabulary on the GPU, fused so the probabilities are never
// stored (backends/cpu/cross_entropy.cpp), and the pieces of the vocabulary-parallel loss that
// tensor parallelism combines across ranks (backends/cpu/vocab_parallel.cpp).
//
// A row's log-sum-exp is a row reduction: one block per row, the max and then the sum of
// exp(logit - max) through block_reduce's fixed tree, in T as the CPU sums. Everything else is
// element-wise: one thread per element in a grid-stride loop. No atomics anywhere.
//
// Targets. A target < 0 marks an ignored row (loss 0, no gradient). A target >= V is an input
// error the CPU throws before touching any output; a kernel cannot throw, so the whole-vocabulary
// ops first run a one-block kernel that finds the first such row on the device, the main kernel
// does nothing when there is one, and the host throws the CPU's InputError once the op has
// finished. The vocabulary-parallel pieces check no targets, as on the CPU (a target outside the
// slice belongs to another rank).
#include <algorithm>
#include <string>

#include "backends/cuda/cuda_common.cuh"
#include "backends/cuda/cuda_kernels.h"
#include "core/error.h"

namespace llama4d::cuda {
namespace {

struct MinOp {
  template <class T>
  __device__ T operator()(T a, T b) const { return a < b ? a : b; }
};

// *first_bad = the first row r with targets[r] >= V, or BT when every target is valid (or
// ignored). One block: integer min through block_reduce, exact in any order.
__global__ void first_bad_target_kernel(int64_t* first_bad, const int32_t* targets, int64_t BT, int64_t V) {
  int64_t* scratch = shared_scratch<int64_t>();
  int64_t bad = BT;
  for (int64_t r = threadIdx.x; r < BT; r += blockDim.x)
    if (targets[r] >= V && r < bad) bad = r;
  bad = block_reduce(bad, scratch, MinOp{});
  if (threadIdx.x == 0) *first_bad = bad;
}

// Device-side validation of targets[BT] against the vocabulary size V, for the ops the CPU
// validates (see the header). launch() queues the check; the op's main kernel skips all work
// when flag() < BT; throw_if_bad() (after finish_op) throws the CPU's InputError.
class TargetCheck {
 public:
  TargetCheck(const int32_t* targets, int64_t BT, int64_t V)
      : targets_(targets), BT_(BT), V_(V), flag_(static_cast<int64_t*>(device_alloc(sizeof(int64_t)))) {
    first_bad_target_kernel<<<1, kThreads, kThreads * sizeof(int64_t), stream()>>>(flag_, targets, BT, V);
  }
  ~TargetCheck() { device_free(flag_); }
  TargetCheck(const TargetCheck&) = delete;
  TargetCheck& operator=(const TargetCheck&) = delete;

  const int64_t* flag() const { return flag_; }

  void throw_if_bad(const char* op) const {
    int64_t first_bad = BT_;
    check(cudaMemcpyAsync(&first_bad, flag_, sizeof(first_bad), cudaMemcpyDefault, stream()), op);
    check(cudaStreamSynchronize(stream()), op);
    if (first_bad >= BT_) return;
    int32_t target = 0;
    check(cudaMemcpyAsync(&target, targets_ + first_bad, sizeof(target), cudaMemcpyDefault, stream()), op);
    check(cudaStreamSynchronize(stream()), op);
    throw InputError("cross-entropy target " + std::to_string(target) + " is outside the vocabulary of " +
                     std::to_string(V_));
  }

 private:
  const int32_t* targets_;
  int64_t BT_, V_;
  int64_t* flag_;
};

// log(sum_j exp(row[j])) over row[V], V >= 1, with the max subtracted first so exp never
// overflows (m + log(sum), the CPU's formula). Called by every thread of the block.
template <class T>
__device__ T row_logsumexp(const T* row, int64_t V, T* scratch) {
  T m = row[0];
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = MaxOp{}(m, row[j]);
  m = block_reduce(m, scratch, MaxOp{});
  T sum = T(0);
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += exp(row[j] - m);
  sum = block_reduce(sum, scratch, SumOp{});
  return m + log(sum);
}

// losses[BT] = logsumexp(logits[r]) - logits[r, targets[r]], 0 for ignored rows; logits[BT, V].
template <class T>
__global__ void cross_entropy_forward_kernel(T* losses, const T* logits, const int32_t* targets, int64_t BT, int64_t V,
                                             const int64_t* first_bad) {
  if (*first_bad < BT) return;  // the host throws; outputs stay untouched, as on the CPU
  T* scratch = shared_scratch<T>();
  for (int64_t r = blockIdx.x; r < BT; r += gridDim.x) {
    const int32_t t = targets[r];  // the same for the whole block: no thread skips a block_reduce
    if (t < 0) {
      if (threadIdx.x == 0) losses[r] = T(0);
      continue;
    }
    const T* row = logits + r * V;
    const T lse = row_logsumexp(row, V, scratch);
    if (threadIdx.x == 0) losses[r] = lse - row[t];
  }
}

// dlogits[BT, V] += scale * (softmax(logits[r]) - onehot(targets[r])) for non-ignored rows. The
// target's element is rounded twice, (d + scale * p) - scale, as the CPU adds the softmax term
// to the whole row and then subtracts scale at the target.
template <class T>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits, const int32_t* targets, T scale, int64_t BT,
                                              int64_t V, const int64_t* first_bad) {
  if (*first_bad < BT) return;
  T* scratch = shared_scratch<T>();
  for (int64_t r = blockIdx.x; r < BT; r += gridDim.x) {
    const int32_t t = targets[r];
    if (t < 0) continue;
    const T* row = logits + r * V;
    T* drow = dlogits + r * V;
    const T lse = row_logsumexp(row, V, scratch);
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      T d = drow[j] + scale * exp(row[j] - lse);
      if (j == t) d -= scale;
      drow[j] = d;
    }
  }
}

// row_max[BT] = max of the slice's row; target_logit[BT] = logits[r, targets[r] - vocab_begin]
// when the slice [vocab_begin, vocab_begin + V) holds the target, else 0. logits[BT, V], V >= 1.
template <class T>
__global__ void vocab_slice_max_and_target_kernel(T* row_max, T* target_logit, const T* logits, const int32_t* targets,
                                                  int64_t BT, int64_t V, int64_t vocab_begin) {
  T* scratch = shared_scratch<T>();
  for (int64_t r = blockIdx.x; r < BT; r += gridDim.x) {
    const T* row = logits + r * V;
    T m = row[0];
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = MaxOp{}(m, row[j]);
    m = block_reduce(m, scratch, MaxOp{});
    if (threadIdx.x == 0) {
      row_max[r] = m;
      const int64_t t = int64_t(targets[r]) - vocab_begin;
      target_logit[r] = targets[r] >= 0 && t >= 0 && t < V ? row[t] : T(0);
    }
  }
}

// sum_exp[BT] = sum_j exp(logits[r, j] - row_max[r]) over the slice's V columns, row_max the
// global max over all slices.
template <class T>
__global__ void vocab_slice_sum_exp_kernel(T* sum_exp, const T* logits, const T* row_max, int64_t BT, int64_t V) {
  T* scratch = shared_scratch<T>();
  for (int64_t r = blockIdx.x; r < BT; r += gridDim.x) {
    const T* row = logits + r * V;
    const T m = row_max[r];
    T sum = T(0);
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += exp(row[j] - m);
    sum = block_reduce(sum, scratch, SumOp{});
    if (threadIdx.x == 0) sum_exp[r] = sum;
  }
}

// lse[BT] = row_max + log(sum_exp); losses[BT] = lse - target_logit, 0 for ignored rows.
template <class T>
__global__ void cross_entropy_from_stats_kernel(T* losses, T* lse, const T* row_max, const T* sum_exp,
                                                const T* target_logit, const int32_t* targets, int64_t BT) {
  for (int64_t r = first_index(); r < BT; r += index_stride()) {
    const T l = row_max[r] + log(sum_exp[r]);
    lse[r] = l;
    losses[r] = targets[r] < 0 ? T(0) : l - target_logit[r];
  }
}

// dlogits[BT, V] += scale * (exp(logits - lse[r]) - onehot(targets[r] - vocab_begin)) over the
// slice, for non-ignored rows. The row's lse is given, so every element is independent: one
// thread per element, the target's element rounded twice as in cross_entropy_backward_kernel.
template <class T>
__global__ void cross_entropy_backward_slice_kernel(T* dlogits, const T* logits, const T* lse, const int32_t* targets,
                                                    T scale, int64_t n, int64_t V, int64_t vocab_begin) {
  for (int64_t i = first_index(); i < n; i += index_stride()) {
    const int64_t r = i / V, j = i % V;
    const int32_t t = targets[r];
    if (t < 0) continue;
    T d = dlogits[i] + scale * exp(logits[i] - lse[r]);
    if (int64_t(t) - vocab_begin == j) d -= scale;
    dlogits[i] = d;
  }
}

}  // namespace

template <class T>
void cross_entropy_forward(T* losses, const T* logits, const int32_t* targets, int64_t BT, int64_t V) {
  if (BT <= 0) return;
  const TargetCheck targets_ok(targets, BT, V);
  cross_entropy_forward_kernel<<<row_grid(BT), kThreads, kThreads * sizeof(T), stream()>>>(losses, logits, targets, BT,
                                                                                             V, targets_ok.flag());
  finish_op("cross_entropy_forward");
  targets_ok.throw_if_bad("cross_entropy_forward");
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, T scale, int64_t BT, int64_t V) {
  if (BT <= 0) return;
  const TargetCheck targets_ok(targets, BT, V);
  cross_entropy_backward_kernel<<<row_grid(BT), kThreads, kThreads * sizeof(T), stream()>>>(
      dlogits, logits, targets, scale, BT, V, targets_ok.flag());
  finish_op("cross_entropy_backward");
  targets_ok.throw_if_bad("cross_entropy_backward");
}

template <class T>
void vocab_slice_max_and_target(T* row_max, T* target_logit, const T* logits, const int32_t* targets, int64_t BT,
                                int64_t V, int64_t vocab_begin) {
  if (V < 1) throw Error("vocab_slice_max_and_target: empty vocabulary slice");
  if (BT <= 0) return;
  vocab_slice_max_and_target_kernel<<<row_grid(BT), kThreads, kThreads * sizeof(T), stream()>>>(
      row_max, target_logit, logits, targets, BT, V, vocab_begin);
  finish_op("vocab_slice_max_and_target");
}

template <class T>
void vocab_slice_sum_exp(T* sum_exp, const T* logits, const T* row_max, int64_t BT, int64_t V) {
  if (BT <= 0) return;
  vocab_slice_sum_exp_kernel<<<row_grid(BT), kThreads, kThreads * sizeof(T), stream()>>>(sum_exp, logits, row_max, BT,
                                                                                           V);
  finish_op("vocab_slice_sum_exp");
}

template <class T>
void cross_entropy_from_stats(T* losses, T* lse, const T* row_max, const T* sum_exp, const T* target_logit,
                              const int32_t* targets, int64_t BT) {
  if (BT <= 0) return;
  cross_entropy_from_stats_kernel<<<grid_for(BT), kThreads, 0, stream()>>>(losses, lse, row_max, sum_exp, target_logit,
                                                                           targets, BT);
  finish_op("cross_entropy_from_stats");
}

template <class T>
void cross_entropy_backward_slice(T* dlogits, const T* logits, const T* lse, const int32_t* targets, T scale,
                                  int64_t BT, int64_t V, int64_t vocab_begin) {
  const int64_t n = BT * V;
  if (n <= 0) return;
  cross_entropy_backward_slice_kernel<<<grid_for(n), kThreads, 0, stream()>>>(dlogits, logits, lse, targets, scale, n,
                                                                              V, vocab_begin);
  finish_op("cross_entropy_backward_slice");
}

#define LLAMA4D_INSTANTIATE(T)                                                                                      \
  template void cross_entropy_forward<T>(T*, const T*, const int32_t*, int64_t, int64_t);                           \
  template void cross_entropy_backward<T>(T*, const T*, const int32_t*, T, int64_t, int64_t);                       \
  template void vocab_slice_max_and_target<T>(T*, T*, const T*, const int32_t*, int64_t, int64_t, int64_t);         \
  template void vocab_slice_sum_exp<T>(T*, const T*, const T*, int64_t, int64_t);                                   \
  template void cross_entropy_from_stats<T>(T*, T*, const T*, const T*, const T*, const int32_t*, int64_t);         \
  template void cross_entropy_backward_slice<T>(T*, const T*, const T*, const int32_t*, T, int64_t, int64_t, int64_t);
LLAMA4D_INSTANTIATE(float)
LLAMA4D_INSTANTIATE(double)
#undef LLAMA4D_INSTANTIATE

}  // namespace llama4d::cuda
