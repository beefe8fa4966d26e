#include "core/model/head.h"

#include "core/model/block.h"
#include "core/ops.h"

namespace llama4d {

template <class T>
void HeadActivations<T>::allocate(MemoryTracker* m, int64_t BT, int64_t C, int64_t V, bool vocab_parallel,
                                  int64_t rows) {
  const auto act = MemoryCategory::activations;
  n = Buffer<T>(m, act, BT * C, "final norm"), rstd = Buffer<T>(m, act, rows < 0 ? BT : rows, "final norm rstd");
  logits = Buffer<T>(m, act, BT * V, vocab_parallel ? "logits (vocabulary slice)" : "logits");
  losses = Buffer<T>(m, act, BT, "token losses");
  if (vocab_parallel) lse = Buffer<T>(m, act, BT, "token log-sum-exp");
}

template <class T>
void HeadActivations<T>::reset() {
  for (Buffer<T>* b : {&n, &rstd, &logits, &losses, &lse}) b->reset();
}

template <class T>
int64_t HeadActivations<T>::bytes() const {
  return n.bytes() + rstd.bytes() + logits.bytes() + losses.bytes() + lse.bytes();
}

namespace {

// The rows of the B*T tokens this rank's residual stream holds (all of them without sequence
// parallelism), split as the blocks split them.
template <class T>
BlockDims sequence_rows(int64_t BT, int64_t C, const VocabComm<T>* vocab) {
  return {.B = BT, .T = 1, .C = C, .sp = vocab ? vocab->sequence_shards() : 1,
          .sp_rank = vocab ? vocab->sequence_rank() : 0};
}

}  // namespace

template <class T>
LossSum head_forward(HeadActivations<T>& a, const T* x, const T* norm_w, const T* lm_w, const int32_t* targets,
                     int64_t BT, int64_t C, int64_t V, double eps, VocabComm<T>* vocab) {
  const BlockDims d = sequence_rows(BT, C, vocab);
  const int64_t rows = d.rows(), mine = d.row0() * C, shards = d.sp;
  ops::rmsnorm_forward(a.n.data() + mine, a.rstd.data(), x, norm_w, rows, C, T(eps));
  if (shards > 1) vocab->gather_rows(a.n.data(), BT, C, "sequence-parallel head input: gather");
  ops::matmul_forward(a.logits.data(), a.n.data(), lm_w, BT, C, V);
  if (!targets) return {};
  if (vocab) {
    // Per token: the max over all columns, then the sum of exp(logit - max), then the target's
    // logit (from the one rank holding it): three all-reduces of BT numbers, never [BT, V].
    Buffer<T> row_max(a.n.memory(), MemoryCategory::scratch, BT, "vocab-parallel row max");
    Buffer<T> sum_exp(a.n.memory(), MemoryCategory::scratch, BT, "vocab-parallel sum of exp");
    Buffer<T> target(a.n.memory(), MemoryCategory::scratch, BT, "vocab-parallel target logit");
    ops::vocab_slice_max_and_target(row_max.data(), target.data(), a.logits.data(), targets, BT, V,
                                    vocab->vocab_begin());
    vocab->max(row_max.data(), BT, "vocab-parallel loss: max");
    ops::vocab_slice_sum_exp(sum_exp.data(), a.logits.data(), row_max.data(), BT, V);
    vocab->sum(sum_exp.data(), BT, "vocab-parallel loss: sum of exp");
    vocab->sum(target.data(), BT, "vocab-parallel loss: target logit");
    ops::cross_entropy_from_stats(a.losses.data(), a.lse.data(), row_max.data(), sum_exp.data(), target.data(),
                                  targets, BT);
  } else {
    ops::cross_entropy_forward(a.losses.data(), a.logits.data(), targets, BT, V);
  }
  // Summed in double in row order: deterministic, and exact enough to compare runs bitwise.
  LossSum sum;
  ops::sum_losses(&sum.loss_sum, &sum.tokens, a.losses.data(), targets, BT);
  return sum;
}

template <class T>
void head_backward(T* dx, T* dnorm_w, T* dlm_w, const HeadActivations<T>& a, const T* x, const T* norm_w,
                   const T* lm_w, const int32_t* targets, T loss_scale, int64_t BT, int64_t C, int64_t V,
                   MemoryTracker* memory, VocabComm<T>* vocab) {
  Buffer<T> dlogits(memory, MemoryCategory::scratch, BT * V, "backward dlogits");
  Buffer<T> dn(memory, MemoryCategory::scratch, BT * C, "backward dn (head)");
  ops::fill(dlogits.data(), T(0), BT * V);
  if (vocab)
    ops::cross_entropy_backward_slice(dlogits.data(), a.logits.data(), a.lse.data(), targets, loss_scale, BT, V,
                                      vocab->vocab_begin());
  else
    ops::cross_entropy_backward(dlogits.data(), a.logits.data(), targets, loss_scale, BT, V);
  ops::fill(dn.data(), T(0), BT * C);
  ops::matmul_backward(dn.data(), dlm_w, dlogits.data(), a.n.data(), lm_w, BT, C, V);
  const BlockDims d = sequence_rows(BT, C, vocab);
  const int64_t rows = d.rows(), mine = d.row0() * C, shards = d.sp;
  ops::fill(dx, T(0), rows * C);
  if (shards == 1) {
    if (vocab) vocab->sum(dn.data(), BT * C, "f backward: head input gradient");
    ops::rmsnorm_backward(dx, dnorm_w, dn.data(), x, norm_w, a.rstd.data(), BT, C);
    return;
  }
  // Sequence parallelism: the partial input gradients are reduce-scattered to the rows' owners,
  // and the final norm's gain gradient from this rank's rows is summed over the ranks.
  vocab->sum_to_rows(dn.data(), BT, C, "sequence-parallel head input gradient: reduce-scatter");
  Buffer<T> gain(memory, MemoryCategory::scratch, C, "backward final norm gain grad");
  ops::fill(gain.data(), T(0), C);
  ops::rmsnorm_backward(dx, gain.data(), dn.data() + mine, x, norm_w, a.rstd.data(), rows, C);
  vocab->sum(gain.data(), C, "sequence-parallel norm gain gradient");
  ops::accumulate(dnorm_w, gain.data(), C);
}

#define LLAMA4D_HEAD(T)                                                                                         \
  template struct HeadActivations<T>;                                                                           \
  template LossSum head_forward<T>(HeadActivations<T>&, const T*, const T*, const T*, const int32_t*, int64_t, \
                                   int64_t, int64_t, double, VocabComm<T>*);                                    \
  template void head_backward<T>(T*, T*, T*, const HeadActivations<T>&, const T*, const T*, const T*,           \
                                 const int32_t*, T, int64_t, int64_t, int64_t, MemoryTracker*, VocabComm<T>*);
LLAMA4D_HEAD(float)
LLAMA4D_HEAD(double)
#undef LLAMA4D_HEAD

}  // namespace llama4d
